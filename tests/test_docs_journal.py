"""README.md and docs/ are user guides, not a development journal.

They say what is, how to use it and its limits. Issue numbers, numbered work periods,
"part four", "run F", commit hashes, dates and times of day of measurements, and phrases
that narrate how a text or the code changed belong to git history and to the benchmarks'
READMEs, not here. ``journal_phrases`` is tested on both sides below (what it must flag,
what it must leave alone), so a pattern cannot silently stop matching or start flagging
ordinary prose.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_NUMBER_WORDS = "one|two|three|four|five|six|seven|eight|nine|ten"

#: (name, pattern, applies to code blocks too). Case-sensitive unless the pattern says so.
PATTERNS: tuple[tuple[str, re.Pattern[str], bool], ...] = (
    ("issue number", re.compile(r"(?i)\b(?:issues?|tickets?|PR|pull request)\s+#?\d+\b"), True),
    # "#12" as a reference: not a Markdown anchor ("(#10-logging)"), a heading, a colour.
    ("issue reference", re.compile(r"(?<![\w(/&#\]])#\d+\b(?![-\w])"), True),
    (
        "numbered work period",
        re.compile(r"(?i)\b(?:session|period|sprint|milestone|phase|round)\s+(?:\d+|[A-Z])\b"),
        False,
    ),
    ("part N", re.compile(rf"(?i)\bpart\s+(?:\d+|{_NUMBER_WORDS})\b"), True),
    # "run F", "runs A-I": a capital letter naming a run (never "run a test").
    ("named run", re.compile(r"\b[Rr]uns?\s+[A-Z](?:\s*(?:-|to|and)\s*[A-Z])?\b(?![\w/.'])"), True),
    (
        "history phrase",
        re.compile(
            r"(?i)\b(?:earlier|previous|older|former)\s+(?:note|version of this|profile|"
            r"measurement|benchmark run|run|draft)s?\b"
            r"|\b(?:before|after)\s+(?:this|that|the)\s+(?:change|fix|rewrite|refactor(?:ing)?)\b"
            r"|\((?:before|after)\)"
            r"|\bbefore and after\b"
            r"|\bwas (?:fixed|added|removed|rewritten) (?:in|by|on)\b"
            r"|\bthis (?:session|period)\b"
        ),
        False,
    ),
    # A date or a time of day in prose dates a measurement or a run (code blocks may show
    # timestamps in sample output; a generated benchmark table says when its current
    # figures were measured, see _GENERATED).
    ("date in prose", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"), False),
    ("time of day", re.compile(r"(?i)\b(?:at|from|until|by)\s+[0-2]?\d:[0-5]\d\b(?!:)"), False),
)

# 7-40 hex digits with at least one digit and one letter, not part of a UUID, a longer
# word, a hex literal or a path.
_HASH = re.compile(r"(?<![\w\-./])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w\-]|\.\w)")


#: Sections written by ``python -m benchmarks._tables`` from the result files.
_GENERATED = re.compile(r"<!-- (/?)table: [\w-]+ -->")


def journal_phrases(text: str) -> list[tuple[int, str, str]]:
    """``(line number, pattern name, matched text)`` for every journal phrase in ``text``."""
    found: list[tuple[int, str, str]] = []
    in_code = in_generated = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            in_code = not in_code
            continue
        if marker := _GENERATED.fullmatch(line.strip()):
            in_generated = not marker.group(1)
            continue
        for name, pattern, in_code_too in PATTERNS:
            if in_code and not in_code_too:
                continue
            if in_generated and name == "date in prose":
                continue
            found.extend((number, name, m.group(0)) for m in pattern.finditer(line))
        if not in_code:
            found.extend((number, "commit hash", m.group(0)) for m in _HASH.finditer(line))
    return found


def user_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_development_journal_in_user_docs(path: Path) -> None:
    hits = journal_phrases(path.read_text())
    assert not hits, "\n".join(f"{path.relative_to(ROOT)}:{n}: {k}: {t!r}" for n, k, t in hits)


@pytest.mark.parametrize(
    "text",
    [
        "Issue 10 is complete: every part of it is built.",
        "as tracked in issue #12",
        "fixed by #12, see there",
        "the numbered work period: session 8 read seeds 1-500",
        "in period 3 we measured",
        "### The 1 KB gap (part four)",
        "see part 2 of the profile",
        "runs A-I with times of day",
        "run F took 41 s",
        "Run C and run D disagree",
        "An earlier note here said the opposite.",
        "the earlier profile showed",
        "Earlier runs at load 12-38 fell short",
        "### Profile of a Spark query (before)",
        "measured before and after the lean path",
        "the fetcher before this change delivered nothing",
        "On the code of `34285fe`",
        "commit 894a666 and fedd86c.",
        "at 17:05 the rows were",
        "measured on 2026-11-25, all passing",
    ],
)
def test_journal_phrases_are_flagged(text: str) -> None:
    assert journal_phrases(text), text


@pytest.mark.parametrize(
    "text",
    [
        "Every part of the record is decoded; part of the log is lost.",
        "to run a test, run the suite; runs are seeded",
        "Run `make test` (it runs Apache Kafka).",
        "the fetch session's epoch; a session of 1,000 partitions",
        "see [Logging](#logging) and [groups](guides/groups.md#kip-848)",
        "## 3 partitions",
        "KIP-320, KIP-848 and Kafka 4.3.1; seed 2084 reproduces it",
        "a topic id such as 5f3e8a2c-1b4d-4c6e-9f00-123456789abc",
        "the C decoder, 0x7fffffff, and the file a1b2c3d.json",
        "records before the divergence point are kept; after the election it rewinds",
        "the default is 1048576 bytes; deadbeef is not a commit",
        "a timeout of 5:00 minutes",
    ],
)
def test_ordinary_prose_is_not_flagged(text: str) -> None:
    assert journal_phrases(text) == [], text


def test_generated_tables_may_date_their_figures_but_nothing_else_may() -> None:
    table = "<!-- table: x -->\n*Measured 2026-11-23.*\n<!-- /table: x -->\n"
    assert journal_phrases(table) == []
    assert journal_phrases(table + "Measured 2026-11-23.\n") == [(4, "date in prose", "2026-11-23")]
    assert journal_phrases("<!-- table: x -->\nrun F\n<!-- /table: x -->\n")


def test_code_blocks_may_show_sample_timestamps_but_not_issue_numbers() -> None:
    text = "```\n2026-11-25T10:00:00 truncation_detected at 10:00\n```\n"
    assert journal_phrases(text) == []
    assert journal_phrases("```python\n# see issue 12\n```\n")
