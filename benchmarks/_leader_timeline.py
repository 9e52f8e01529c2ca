"""Take apart a leader-change section's request timeline (the EmbeddedCluster's trace, kept
by ``benchmarks.leader_change`` as ``build/leader_change/<run>/<topic>-timeline.json``):
per client, the requests of each change from its start to the client's own signal, the most
frequent sequences of them, and the Fetch requests outside the changes by how they ended
(a full long-poll wait, woken by records, answered at once, cut by a stop).

    python -m benchmarks._leader_timeline build/leader_change/<run>/unclean-embedded-timeline.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.leader_change import API_NAMES, CLIENT_ID, FETCH_WAIT_S


def _ended(e: dict[str, Any]) -> float:
    return e.get("answered") or e["at"] + e.get("max_wait_ms", 1000) / 1000 + 0.1


def _signal(events: list[dict[str, Any]], change: dict[str, Any], marker: str | None) -> float:
    t0 = change["t0"]
    for e in events:
        if e.get("at", 0) < t0:
            continue
        if marker is None and ("report" in e or "value" in e):
            return float(e["at"])
        if marker is not None and e.get("value") == marker:
            return float(e["at"])
    return float("nan")


def _name(e: dict[str, Any]) -> str:
    return API_NAMES.get(e["api"], str(e["api"])) + ("!" if any(e.get("errors", [])) else "")


def _how(e: dict[str, Any]) -> str:
    answered = e.get("answered")
    if answered is None:
        return "cut by a stop"
    if any(e.get("errors", [])):
        return "error or diverging epoch"
    waited = answered - e["at"]
    if waited >= FETCH_WAIT_S * 0.9:
        return "full wait"
    return "woken by records" if waited >= 0.005 else "answered at once"


def take_apart(timeline: dict[str, Any]) -> str:
    changes, events, trace = timeline["changes"], timeline["events"], timeline["trace"]
    clean = "stopped" not in changes[0]
    lo, hi = changes[0]["start"] - 2.0, changes[-1]["t0"] + 1.5
    lines = [f"{len(changes)} {'clean' if clean else 'unclean'} changes"]
    for name, ev in events.items():
        mine = [e for e in trace if e["client"] == CLIENT_ID + name]
        windows = []
        for i, change in enumerate(changes):
            end = _signal(ev, change, f"marker-{i}" if clean else None)
            if end == end:  # not NaN: the client signalled
                windows.append((change["start"], end))
        sequences: Counter[str] = Counter()
        inside: set[int] = set()
        for start, end in windows:
            seq = [
                (i, e)
                for i, e in enumerate(mine)
                if start <= e["at"] <= end or e["at"] < start < _ended(e)
            ]
            inside.update(i for i, _ in seq)
            sequences[" ".join(_name(e) for _, e in seq)] += 1
        n = max(1, len(changes))
        outside = Counter(
            _how(e)
            for i, e in enumerate(mine)
            if e["api"] == 1 and i not in inside and lo <= e["at"] <= hi
        )
        per = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(outside.items()))
        lines.append(f"{name}: {len(windows)} changes signalled")
        for seq, count in sequences.most_common(4):
            lines.append(f"  {count:3} x  {seq}")
        total = sum(outside.values()) / n
        lines.append(f"  Fetch outside the changes per change: {total:.2f} ({per})")
    lines.append("(!: an answer with an error or a diverging epoch)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(take_apart(json.loads(Path(sys.argv[1]).read_text())))
