"""``build/scenarios/summary.md``: what every client did in every scenario, on each cluster.

Built from the JSON the scenario tests record (reference clients in ``build/scenarios/``,
EpochConsumer per policy in ``build/scenarios/epochguard/``); every cell is derived from the
recorded events. Written at the end of a pytest session that ran scenarios (conftest.py),
or by ``python -m tests.scenarios.summary [results dir]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CLUSTERS = ("apache", "embedded")
#: Phases that come after the scenario's event (what the client did about it).
AFTER_PHASES = ("after", "after_restart", "after-first", "after-second")
REFERENCE_ORDER = ("kafka-python", "confluent-kafka", "java", "franz-go")

Event = dict[str, Any]


def _runs(offsets: list[int]) -> str:
    if not offsets:
        return ""
    out: list[str] = []
    start = prev = offsets[0]
    for o in [*offsets[1:], None]:
        if o is not None and o == prev + 1:
            prev = o
            continue
        out.append(str(start) if start == prev else f"{start}..{prev}")
        if o is not None:
            start = prev = o
    return ", ".join(out)


def _records(events: list[Event]) -> str:
    recs = [e for e in events if e["event"] == "record"]
    if not recs:
        return "no records"
    values = [str(e.get("value")) for e in recs]
    shown = ", ".join(values) if len(values) <= 4 else f"{values[0]}..{values[-1]}"
    return f"read {_runs([e['offset'] for e in recs])} ({shown})"


def describe_reference(client: str, phases: dict[str, list[Event]]) -> str:
    """A few words on what one reference client did after the scenario's event."""
    events = [e for p in AFTER_PHASES for e in phases.get(p, [])]
    notes: list[str] = []
    for e in events:
        kind = e["event"]
        if kind == "exception":
            text = e.get("text", "")
            if e.get("type") == "LogTruncationError" and "offset=" in text:
                at = text.split("offset=", 1)[1].split(",", 1)[0]
                notes.append(f"LogTruncationError (divergence {at})")
            else:
                notes.append(str(e.get("type") or text[:60]))
        elif kind == "error":
            text = e.get("text", "")
            detail = text.split(". Reset", 1)[0] if "broker end offset" in text else text[:70]
            notes.append(f"{e.get('code')}: {detail}")
        elif kind == "truncation":
            offsets = [v.get("offset") for v in e.get("divergent_offsets", {}).values()]
            notes.append(f"LogTruncationException (divergence {', '.join(map(str, offsets))})")
        elif kind == "out_of_range":
            notes.append("OffsetOutOfRangeException")
        elif kind == "fetch_error":
            notes.append(str(e.get("code")))
        elif kind == "data_loss":
            notes.append(
                f"ErrDataLoss (consumed to {e.get('consumed_to')}, reset to {e.get('reset_to')})"
            )
    unique = list(dict.fromkeys(notes))
    said = "; ".join(unique) if unique else "no error"
    return f"{said}; {_records(events)}"


def describe_epochguard(phases: dict[str, Any]) -> str:
    outcome = phases.get("outcome", {})
    events = [e for p in AFTER_PHASES for e in phases.get(p, [])]
    reports = [e for e in events if e["event"] == "truncation_report"]
    if reports:
        parts = []
        for r in reports:
            d = r.get("divergence")
            at = (
                "unknown"
                if d is None
                else str(d["offset"])
                + ("" if d.get("leader_epoch") is None else f"@e{d['leader_epoch']}")
            )
            parts.append(
                f"report: divergence {at}, {r.get('lost_count')} lost ({r.get('detected_by')})"
            )
        said = "; ".join(parts)
    else:
        said = "no report"
    errors = outcome.get("errors") or []
    if errors:
        said += f"; raised {', '.join(dict.fromkeys(errors))}"
    seeks = [e for e in events if e["event"] == "seek"]
    if seeks:
        said += "; app seeks to " + ", ".join(str(s.get("offset", s.get("to"))) for s in seeks)
    return f"{said}; {_records(events)}"


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def summarize(results: Path) -> str:
    scenarios: dict[str, dict[str, dict[str, str]]] = {}  # scenario -> row -> cluster -> cell

    def cell(scenario: str, row: str, cluster: str, text: str) -> None:
        scenarios.setdefault(scenario, {}).setdefault(row, {})[cluster] = text

    for path in sorted(results.glob("*.json")):
        name, _, cluster = path.stem.rpartition("-")
        data = _load(path)
        if cluster not in CLUSTERS or data is None or "clients" not in data:
            continue
        for client in REFERENCE_ORDER:
            if client in data["clients"]:
                cell(name, client, cluster, describe_reference(client, data["clients"][client]))
    for path in sorted((results / "epochguard").glob("*.json")):
        data = _load(path)
        if data is None or data.get("cluster") not in CLUSTERS:
            continue
        by_policy: dict[str, list[str]] = {}
        for subject, phases in data["clients"].items():
            policy = phases.get("outcome", {}).get("policy", subject)
            label = subject.rsplit("/", 1)[0]
            by_policy.setdefault(f"EpochConsumer {policy}", []).append(
                (f"{label}: " if len(data["clients"]) > 5 else "") + describe_epochguard(phases)
            )
        for row, texts in by_policy.items():
            cell(data["scenario"], row, data["cluster"], "<br>".join(texts))

    lines = [
        "# What each client did, per scenario and cluster",
        "",
        "Generated from the recorded events (tests/scenarios/summary.py). Reference "
        "clients run with auto.offset.reset none/error; their behaviour is recorded, not "
        "judged. EpochConsumer's is asserted by the scenario tests. The reference "
        "clients and EpochConsumer watch separately staged runs of each scenario (same "
        "steps; the positions they sat at may differ, see the JSON files); a cell lists "
        "what the client was told, then the records it read afterwards.",
        "",
    ]
    for scenario in sorted(scenarios):
        lines += [
            f"## {scenario}",
            "",
            "| client | " + " | ".join(CLUSTERS) + " |",
            "|---|" + "---|" * len(CLUSTERS),
        ]
        rows = scenarios[scenario]
        ordered = [r for r in REFERENCE_ORDER if r in rows] + sorted(
            r for r in rows if r not in REFERENCE_ORDER
        )
        for row in ordered:
            cells = [rows[row].get(c, "not run").replace("|", "/") for c in CLUSTERS]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_summary(results: Path) -> Path | None:
    if not results.is_dir():
        return None
    text = summarize(results)
    out = results / "summary.md"
    out.write_text(text + "\n")
    return out


if __name__ == "__main__":
    root = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else (Path(__file__).resolve().parents[2] / "build" / "scenarios")
    )
    written = write_summary(root)
    print(written or f"no results in {root}")
