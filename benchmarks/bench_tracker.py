"""Hot path of PartitionTracker: the per-batch ``on_records`` call and a fetch round."""

from __future__ import annotations

import timeit
from typing import Any

from epochguard.offsets import EpochOffset, FetchAction, PartitionTracker, TopicPartition


def _tracker() -> tuple[PartitionTracker, FetchAction]:
    tr = PartitionTracker(TopicPartition("bench", 0))
    tr.on_metadata(1, 5, "id")
    tr.seek(EpochOffset(0))
    action = tr.next_action(0.0)
    assert isinstance(action, FetchAction)
    return tr, action


def run() -> dict[str, Any]:
    n = 200_000
    tr, fetch = _tracker()
    state = {"off": 0}

    def records() -> None:
        off = state["off"]
        tr.on_records(fetch, off, off + 99, 5)
        state["off"] = off + 100

    per_batch = min(timeit.repeat(records, number=n, repeat=5)) / n

    def baseline() -> None:
        # The floor: what any driver does anyway (a call and three attribute stores).
        off = state["off"]
        state["off"] = off + 100

    floor = min(timeit.repeat(baseline, number=n, repeat=5)) / n

    tr2, first = _tracker()
    tr2.cancel(first)
    pos = {"off": 0}

    def round_trip() -> None:
        a = tr2.next_action(0.0)
        assert isinstance(a, FetchAction)
        off = pos["off"]
        tr2.on_records(a, off, off + 99, 5)
        pos["off"] = off + 100

    per_round = min(timeit.repeat(round_trip, number=n // 4, repeat=5)) / (n // 4)
    return {
        "on_records_ns_per_batch": round(per_batch * 1e9, 1),
        "driver_floor_ns": round(floor * 1e9, 1),
        "next_action_plus_on_records_ns": round(per_round * 1e9, 1),
        "batches": n,
    }
