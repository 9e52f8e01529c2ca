"""Classic-protocol rebalances, eager vs cooperative (KIP-429), on the EmbeddedCluster: a
group of ``MEMBERS`` EpochConsumers on ``PARTITIONS`` partitions with a backlog, each member
reading at most ``BATCH`` records per poll (so none runs dry during the run), while a ninth
member joins and later leaves.

Per event and protocol:

* ``settle_s``: from the event until every partition is assigned to exactly one member
  again and no member is rebalancing.
* ``kept_pause``: for each member that kept partitions, the longest gap between two polls
  that returned records of partitions it kept, around the event; median and max over the
  members. ``baseline_gap`` is the same measure over the quiet seconds before the event.

Targets: cooperative keeps kept partitions' pause well below eager's (eager revokes
everything, restores every committed position and re-fetches); both settle within a few
seconds. KIP-848 is measured by its own benchmark (another module).
"""

from __future__ import annotations

import itertools
import os
import statistics
import threading
import time
from typing import Any

from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.structs import MemberState, TopicPartition

from epochguard import EpochConsumer
from epochguard.consumer import CooperativeStickyAssignor
from epochguard.testing import EmbeddedCluster

MEMBERS = int(os.environ.get("REBALANCE_MEMBERS", "8"))
PARTITIONS = int(os.environ.get("REBALANCE_PARTITIONS", "256"))
BACKLOG = int(os.environ.get("REBALANCE_BACKLOG", "600"))
BATCH = 5
TOPIC = "rb"


class _Member(threading.Thread):
    def __init__(self, cluster: EmbeddedCluster, name: str, assignor: Any) -> None:
        super().__init__(daemon=True, name=name)
        self.consumer = EpochConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            group_id="bench",
            partition_assignment_strategy=[assignor],
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=500,
            session_timeout_ms=30000,
            heartbeat_interval_ms=500,
            max_poll_interval_ms=60000,
            fetch_max_wait_ms=50,
            request_timeout_ms=20000,
        )
        self.consumer.subscribe([TOPIC])
        self.lock = threading.Lock()
        #: (when, partitions) of every poll that returned records
        self.deliveries: list[tuple[float, frozenset[int]]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with self.lock:
                got = self.consumer.poll(timeout_ms=20, max_records=BATCH)
            parts = frozenset(tp.partition for tp, recs in got.items() if recs)
            if parts:
                self.deliveries.append((time.monotonic(), parts))
            # Read slowly, so the backlog lasts the whole run.
            time.sleep(0.02)

    def assigned(self) -> set[TopicPartition]:
        with self.lock:
            return set(self.consumer.assignment())

    def stable(self) -> bool:
        with self.lock:
            return bool(self.consumer.group_metadata().state == MemberState.STABLE)

    def close(self) -> None:
        self.halt.set()
        self.join(30)
        self.consumer.close()


def _settled(members: list[_Member]) -> bool:
    sets = [m.assigned() for m in members]
    return (
        sum(map(len, sets)) == PARTITIONS
        and len(set().union(*sets)) == PARTITIONS
        and all(m.stable() for m in members)
    )


def _wait(cond: Any, timeout: float) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise RuntimeError("the group did not settle in time")
        time.sleep(0.02)
    return time.monotonic() - start


def _pauses(
    members: list[_Member], before: dict[int, set[TopicPartition]], start: float, end: float
) -> dict[str, float | int | None]:
    gaps = []
    for m in members:
        kept = {tp.partition for tp in before.get(id(m), set()) & m.assigned()}
        if not kept:
            continue
        times = [t for t, parts in list(m.deliveries) if parts & kept and start <= t <= end]
        times = [start, *times, end]
        gaps.append(max(b - a for a, b in itertools.pairwise(times)))
    if not gaps:
        return {"members": 0, "median_s": None, "max_s": None}
    return {
        "members": len(gaps),
        "median_s": round(statistics.median(gaps), 3),
        "max_s": round(max(gaps), 3),
    }


def _case(assignor: Any) -> dict[str, Any]:
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1)
        for p in range(PARTITIONS):
            cluster.append(TOPIC, p, [b"v"] * BACKLOG, batch_size=20)
        members = [_Member(cluster, f"m{i}", assignor) for i in range(MEMBERS)]
        out: dict[str, Any] = {}
        try:
            for m in members:
                m.start()
            out["form_s"] = round(_wait(lambda: _settled(members), 180), 3)
            time.sleep(4)
            for name in ("join", "leave"):
                before = {id(m): m.assigned() for m in members}
                start = time.monotonic()
                if name == "join":
                    extra = _Member(cluster, "extra", assignor)
                    members.append(extra)
                    extra.start()
                else:
                    gone = members.pop()
                    gone.close()
                settle = _wait(lambda: _settled(members), 180)
                time.sleep(4)
                out[name] = {
                    "settle_s": round(settle, 3),
                    "kept_pause": _pauses(members, before, start, start + settle + 1),
                    # The same gaps in the quiet seconds before the event: what the machine
                    # allows without any rebalance (a loaded host stretches every poll).
                    "baseline_gap": _pauses(members, before, start - 3, start),
                }
        finally:
            for m in members:
                m.close()
    return out


def run() -> dict[str, Any]:
    load_before = os.getloadavg()
    result = {
        "members": MEMBERS,
        "partitions": PARTITIONS,
        "backlog_per_partition": BACKLOG,
        "records_per_poll": BATCH,
        "eager_range": _case(RangePartitionAssignor),
        "cooperative_sticky": _case(CooperativeStickyAssignor),
    }
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result
