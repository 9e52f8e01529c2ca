"""Rebalance cost by group protocol: a group of 8 EpochConsumers on a 256-partition topic
(on an in-process EmbeddedCluster and on a real Kafka 4.3.1 broker); a 9th member joins,
then leaves again.

For each event and protocol:

- ``settle_s``: from the event (the 9th member's ``subscribe`` + first ``poll``, or its
  ``close``) until every partition is assigned to exactly one member and the shares differ
  by at most one;
- ``kept_stop_s``: for the members that own a partition both before and after the event,
  how long such a partition was not assigned to them in between (revoked and assigned back:
  the time its consumption stopped), the worst member and the mean over members. Classic
  eager rebalancing revokes everything and reassigns after JoinGroup/SyncGroup; KIP-848
  revokes only what moves.

Heartbeat intervals are the same for both protocols (500 ms; Kafka's defaults are 3 s
classic, 5 s KIP-848), so the numbers compare the protocols, not their defaults.
``PROTOCOLS`` is a table: classic eager (range), classic cooperative-sticky (KIP-429) and
KIP-848. ``benchmarks/rebalance_pause.py`` measures the other side of the same events for
the classic protocol: the longest gap between polls that returned records of kept
partitions.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kafka import ConsumerRebalanceListener
from kafka.structs import TopicPartition

from epochguard.consumer import CooperativeStickyAssignor, EpochConsumer
from epochguard.testing import Cluster, EmbeddedCluster
from epochguard.testing.embedded.consumer_groups import (
    ConsumerGroupCoordinator,
    install_consumer_coordinator,
)

MEMBERS = 8
PARTITIONS = 256
TOPIC = "rebalance"
HEARTBEAT_MS = 500
TIMEOUT_S = 120.0
REPEATS = 3

#: protocol name -> EpochConsumer settings for it.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "classic_eager": {
        "group_protocol": "classic",
        "heartbeat_interval_ms": HEARTBEAT_MS,
        "session_timeout_ms": 10_000,
    },
    "classic_cooperative": {
        "group_protocol": "classic",
        "heartbeat_interval_ms": HEARTBEAT_MS,
        "session_timeout_ms": 10_000,
        "partition_assignment_strategy": [CooperativeStickyAssignor],
    },
    "kip848": {"group_protocol": "consumer"},
}


class _Ownership(ConsumerRebalanceListener):  # type: ignore[misc]
    """When each partition was revoked and assigned back (monotonic clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.revoked_at: dict[TopicPartition, float] = {}
        self.gaps: list[tuple[TopicPartition, float, float]] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        now = time.monotonic()
        with self.lock:
            for tp in revoked:
                self.revoked_at[tp] = now

    def on_partitions_assigned(self, assigned: Any) -> None:
        now = time.monotonic()
        with self.lock:
            for tp in assigned:
                start = self.revoked_at.pop(tp, None)
                if start is not None:
                    self.gaps.append((tp, start, now))


class _Member(threading.Thread):
    def __init__(self, cluster: Cluster, topic: str, group: str, settings: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.listener = _Ownership()
        self.consumer = EpochConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            max_poll_interval_ms=60_000,
            **settings,
        )
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.consumer.subscribe([self.topic], listener=self.listener)
            while not self.stop.is_set():
                self.consumer.poll(timeout_ms=50)
        except BaseException as exc:
            self.error = exc

    def owned(self) -> set[TopicPartition]:
        return self.consumer.assignment()

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        self.consumer.close()


def _wait(cond: Callable[[], bool], what: str) -> float:
    deadline = time.monotonic() + TIMEOUT_S
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rebalance benchmark: {what} not reached in {TIMEOUT_S:.0f}s")
        time.sleep(0.005)
    return time.monotonic()


def _balanced(members: list[_Member]) -> bool:
    shares = [m.owned() for m in members]
    sizes = [len(s) for s in shares]
    union = set().union(*shares)
    return len(union) == PARTITIONS == sum(sizes) and max(sizes) - min(sizes) <= 1


def _kept_stops(
    stayed: list[_Member], before: list[set[TopicPartition]], t0: float, t1: float
) -> list[float]:
    """Per member that kept partitions: the longest time one of them was not assigned."""
    out = []
    for m, had in zip(stayed, before, strict=True):
        kept = had & m.owned()
        if not kept:
            continue
        with m.listener.lock:
            gaps = [end - start for tp, start, end in m.listener.gaps if tp in kept and end >= t0]
            gaps += [t1 - start for tp, start in m.listener.revoked_at.items() if tp in kept]
        out.append(max(gaps, default=0.0))
    return out


def _event(stayed: list[_Member], act: Callable[[], list[_Member]]) -> dict[str, Any]:
    before = [m.owned() for m in stayed]
    t0 = time.monotonic()
    group = act()
    t1 = _wait(lambda: _balanced(group), "a balanced assignment")
    stops = _kept_stops(stayed, before, t0, t1)
    return {
        "settle_s": round(t1 - t0, 3),
        "kept_stop_max_s": round(max(stops, default=0.0), 3),
        "kept_stop_mean_s": round(statistics.fmean(stops), 3) if stops else 0.0,
        "members_that_kept": len(stops),
    }


def run_protocol(cluster: Cluster, name: str, run: int) -> dict[str, Any]:
    settings = PROTOCOLS[name]
    topic, group = f"{TOPIC}-{name}-{run}", f"bench-{name}-{run}"
    cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=1)
    members = [_Member(cluster, topic, group, settings) for _ in range(MEMBERS)]
    extra: _Member | None = None
    try:
        for m in members:
            m.start()
        _wait(lambda: _balanced(members), f"{MEMBERS} members sharing the topic")
        time.sleep(1.0)  # let heartbeats settle into their rhythm

        def join() -> list[_Member]:
            nonlocal extra
            extra = _Member(cluster, topic, group, settings)
            extra.start()
            return [*members, extra]

        joined = _event(members, join)
        time.sleep(1.0)

        def leave() -> list[_Member]:
            assert extra is not None
            extra.finish()
            return members

        left = _event(members, leave)
        errors = [repr(m.error) for m in [*members, extra] if m and m.error is not None]
        if errors:
            raise RuntimeError(f"members failed: {errors}")
        return {"join": joined, "leave": left}
    finally:
        for m in members:
            m.finish()
        if extra is not None and extra.is_alive():
            extra.finish()


@contextlib.contextmanager
def _embedded() -> Iterator[Cluster]:
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.call(
            lambda: install_consumer_coordinator(
                cluster.state, ConsumerGroupCoordinator(heartbeat_interval_ms=HEARTBEAT_MS)
            )
        )
        yield cluster


@contextlib.contextmanager
def _kafka() -> Iterator[Cluster]:
    from epochguard.testing.apache_kafka import ApacheKafkaCluster, ensure_kafka_jars

    # ApacheKafkaCluster's brokers heartbeat KIP-848 members every 500 ms (HEARTBEAT_MS).
    with ApacheKafkaCluster(brokers=1, jars=ensure_kafka_jars()) as cluster:
        yield cluster


#: cluster kind -> how to start one (one cluster per kind; a topic and group per run).
CLUSTERS: dict[str, Callable[[], contextlib.AbstractContextManager[Cluster]]] = {
    "embedded (in process, 1 broker)": _embedded,
    "Apache Kafka 4.3.1 (1 broker)": _kafka,
}


def run() -> dict[str, Any]:
    rows = []
    for kind, start in CLUSTERS.items():
        with start() as cluster:
            for name in PROTOCOLS:
                load_before = round(os.getloadavg()[0], 2)
                runs = [run_protocol(cluster, name, i) for i in range(REPEATS)]
                flat = [
                    {f"{event}_{k}": v for event, r in result.items() for k, v in r.items()}
                    for result in runs
                ]
                rows.append(
                    {
                        "cluster": kind,
                        "protocol": name,
                        # Medians of REPEATS runs; every run's numbers in "runs".
                        **{k: statistics.median(f[k] for f in flat) for k in flat[0]},
                        "runs": flat,
                        "load_avg_1m_before": load_before,
                        "load_avg_1m_after": round(os.getloadavg()[0], 2),
                    }
                )
    return {
        "members": MEMBERS,
        "partitions": PARTITIONS,
        "heartbeat_interval_ms": HEARTBEAT_MS,
        "repeats": REPEATS,
        "rows": rows,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
