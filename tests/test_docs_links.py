"""Every relative link in README.md and docs/ leads to a file that exists and, with an
anchor, to a heading of that file (GitHub's anchors), so moving a page or renaming a
heading cannot leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for h in HEADING.findall(text):
        a = anchor(h)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [a or b for a, b in LINK.findall(text)]


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


#: Pages another change adds; a link to them is allowed before they exist.
PLANNED = {ROOT / "docs" / "install.md"}


@pytest.mark.parametrize("path", docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if dest in PLANNED and not dest.exists():
            continue
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment}")
    assert not broken, "\n".join(broken)


def test_anchor_follows_github() -> None:
    assert anchor('Column output (`record_format="columns"`)') == (
        "column-output-record_formatcolumns"
    )
    assert anchor("Fetch sessions (KIP-227)") == "fetch-sessions-kip-227"
    assert anchor("Security: SASL, TLS and ACLs") == "security-sasl-tls-and-acls"
