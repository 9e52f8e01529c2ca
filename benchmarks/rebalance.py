"""Classic-protocol rebalances, eager vs cooperative (KIP-429), on the EmbeddedCluster: a
group of ``MEMBERS`` EpochConsumers on ``PARTITIONS`` partitions, records appended to every
partition every ``TICK_S`` while a ninth member joins and later leaves.

Per event and protocol:

* ``settle_s``: from the event until every partition is assigned to exactly one member
  again and no member is rebalancing.
* ``kept_pause``: for the members' partitions that did not move, the longest gap between
  two records delivered from the same partition around the event, median and max over those
  partitions (records arrive every ``TICK_S``, so an undisturbed partition shows ~TICK_S);
  ``baseline_gap`` is the same measure over the quiet seconds before the event.

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
TICK_S = 0.2
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
        self.deliveries: dict[int, list[float]] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with self.lock:
                got = self.consumer.poll(timeout_ms=20)
            now = time.monotonic()
            for tp, recs in got.items():
                if recs:
                    self.deliveries.setdefault(tp.partition, []).append(now)

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
        kept = before.get(id(m), set()) & m.assigned()
        for tp in kept:
            times = [t for t in m.deliveries.get(tp.partition, []) if start - 1 <= t <= end]
            if len(times) >= 2:
                gaps.append(max(b - a for a, b in itertools.pairwise(times)))
    if not gaps:
        return {"kept_partitions": 0, "median_s": None, "max_s": None}
    return {
        "kept_partitions": len(gaps),
        "median_s": round(statistics.median(gaps), 3),
        "max_s": round(max(gaps), 3),
    }


def _case(assignor: Any) -> dict[str, Any]:
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1)
        stop = threading.Event()

        def produce() -> None:
            n = 0
            while not stop.is_set():
                for p in range(PARTITIONS):
                    cluster.append(TOPIC, p, [b"%d" % n])
                n += 1
                stop.wait(TICK_S)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
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
                    "kept_pause": _pauses(members, before, start, time.monotonic()),
                    # The same gaps in the quiet seconds before the event: what the machine
                    # allows without any rebalance (a loaded host stretches every tick).
                    "baseline_gap": _pauses(members, before, start - 2, start),
                }
        finally:
            stop.set()
            for m in members:
                m.close()
    return out


def run() -> dict[str, Any]:
    load_before = os.getloadavg()
    result = {
        "members": MEMBERS,
        "partitions": PARTITIONS,
        "tick_s": TICK_S,
        "eager_range": _case(RangePartitionAssignor),
        "cooperative_sticky": _case(CooperativeStickyAssignor),
    }
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result
