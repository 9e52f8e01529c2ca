"""KIP-227 fetch sessions through EpochConsumer, the same tests on the EmbeddedCluster and on
real Kafka (``module_cluster`` is parametrized over both).

* Idle partitions are left out of incremental fetches: once quiet, a session fetch carries no
  partition at all, while a consumer with ``enable_incremental_fetch_sessions=False`` sends
  every partition each time; new records still arrive through the session.
* An unclean election of a partition held in a session: the truncation is reported exactly
  (divergence 5, 3 records lost), the new leader's records are delivered once, and the
  consumer goes on with incremental fetches against the new leader.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.testing import Cluster, EmbeddedCluster

from .epoch_subjects import consumer_config
from .test_unclean_truncation import eventually, produce

pytestmark = [pytest.mark.timeout(300)]

PARTITIONS = 12


def _send(cluster: Cluster, topic: str, values: dict[int, list[str]]) -> None:
    producer = KafkaProducer(
        bootstrap_servers=cluster.all_bootstrap_servers,
        acks=1,
        enable_idempotence=False,
        linger_ms=0,
    )
    try:
        for partition, vals in values.items():
            for v in vals:
                producer.send(topic, v.encode(), partition=partition).get(timeout=30)
    finally:
        producer.close(timeout=5)


def _metrics(consumer: EpochConsumer) -> dict[str, int]:
    m = consumer.metrics(raw=True)
    assert m is not None
    return m


def _read(consumer: EpochConsumer, n: int, timeout: float = 30.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"read {len(got)} of {n} records"
        for recs in consumer.poll(timeout_ms=100).values():
            got += recs
    return got


def _poll_until(consumer: EpochConsumer, cond: Callable[[], bool], what: str) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not reached; {_metrics(consumer)}"
        for recs in consumer.poll(timeout_ms=50).values():
            got += recs
    return got


def _quiet(consumer: EpochConsumer, requests: int = 6) -> tuple[int, int]:
    """Poll until ``requests`` fetches in a row carried no partition (every one idle in its
    session); returns the (fetch requests, partitions sent) counters then. Never reached when
    every fetch names its partitions."""
    state = {"base": _metrics(consumer)}

    def quiet() -> bool:
        m = _metrics(consumer)
        base = state["base"]
        if m["fetch_partitions_sent"] != base["fetch_partitions_sent"]:
            state["base"] = m
            return False
        return m["fetch_requests"] - base["fetch_requests"] >= requests

    assert not _poll_until(consumer, quiet, "quiet session")
    m = _metrics(consumer)
    return m["fetch_requests"], m["fetch_partitions_sent"]


def test_idle_partitions_are_left_out_of_incremental_fetches(module_cluster: Cluster) -> None:
    cluster = module_cluster
    topic = f"eg-sessions-idle-{os.getpid()}"
    cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=1)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    for tp in tps:
        eventually("a leader", lambda tp=tp: cluster.leader(topic, tp.partition))
    _send(cluster, topic, {p: [f"v{p}-0"] for p in range(PARTITIONS)})

    with_sessions = EpochConsumer(**consumer_config(cluster, auto_offset_reset="earliest"))
    without = EpochConsumer(
        **consumer_config(
            cluster, auto_offset_reset="earliest", enable_incremental_fetch_sessions=False
        )
    )
    try:
        for c in (with_sessions, without):
            c.assign(tps)
            assert sorted(r.value for r in _read(c, PARTITIONS)) == sorted(
                f"v{p}-0".encode() for p in range(PARTITIONS)
            )
        requests, sent = _quiet(with_sessions)
        assert _metrics(with_sessions)["incremental_fetch_requests"] > 0

        # Without sessions every fetch names its broker's partitions, each time.
        before = _metrics(without)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert not without.poll(timeout_ms=50)
        after = _metrics(without)
        full = after["fetch_requests"] - before["fetch_requests"]
        assert full > 0 and after["incremental_fetch_requests"] == 0
        assert after["fetch_partitions_sent"] - before["fetch_partitions_sent"] >= full

        # New records on three partitions arrive through the session, nothing else.
        _send(cluster, topic, {1: ["v1-1"], 5: ["v5-1", "v5-2"], 11: ["v11-1"]})
        got = _read(with_sessions, 4)
        assert sorted((r.partition, r.offset, r.value) for r in got) == [
            (1, 1, b"v1-1"),
            (5, 1, b"v5-1"),
            (5, 2, b"v5-2"),
            (11, 1, b"v11-1"),
        ]
        m = _metrics(with_sessions)
        # Only the partitions that moved were named again (each once or twice: when its
        # records were handed out, and when its fetch offset moved on).
        assert m["fetch_partitions_sent"] - sent <= 3 * 2
        assert m["fetch_requests"] > requests
        if isinstance(cluster, EmbeddedCluster):
            # One session per broker, holding exactly the partitions it leads.
            for broker in cluster.broker_ids:
                led = {(topic, p) for p in range(PARTITIONS) if cluster.leader(topic, p) == broker}
                held = [s for s in cluster.fetch_sessions(broker).values() if set(s) & led]
                assert len(held) == 1 and set(held[0]) == led
    finally:
        with_sessions.close()
        without.close()


def test_unclean_election_of_a_partition_in_a_session(module_cluster: Cluster) -> None:
    cluster = module_cluster
    topic = f"eg-sessions-unclean-{os.getpid()}"
    tp = TopicPartition(topic, 0)
    cluster.create_topic(topic, replication_factor=2, config={"min.insync.replicas": "1"})
    a = eventually("a leader", lambda: cluster.leader(topic, 0))
    (b,) = [r for r in cluster.replicas(topic, 0) if r != a]
    produce(cluster, topic, [f"a{i}" for i in range(5)])
    eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == 5)
    eventually("ISR [A, B]", lambda: sorted(cluster.isr(topic, 0)) == sorted([a, b]))

    reports: list[TruncationReport] = []
    consumer = EpochConsumer(
        **consumer_config(
            cluster,
            auto_offset_reset="earliest",
            on_truncation="rewind",
            on_truncation_report=reports.append,
        )
    )
    try:
        consumer.assign([tp])
        assert [r.value for r in _read(consumer, 5)] == [f"a{i}".encode() for i in range(5)]
        cluster.stop_broker(b)
        eventually("ISR [A]", lambda: cluster.isr(topic, 0) == [a])
        produce(cluster, topic, ["d0", "d1", "d2"])
        d = _read(consumer, 3)
        assert [(r.offset, r.value) for r in d] == [(5, b"d0"), (6, b"d1"), (7, b"d2")]
        first_epoch = d[-1].leader_epoch
        _quiet(consumer, requests=3)
        assert _metrics(consumer)["incremental_fetch_requests"] > 0

        cluster.stop_broker(a)
        eventually("no leader", lambda: cluster.leader(topic, 0) is None)
        cluster.start_broker(b)
        cluster.elect_leader(topic, 0, b, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        new_epoch = cluster.leader_epoch(topic, 0)

        after = _poll_until(consumer, lambda: bool(reports), "truncation reported")
        assert len(reports) == 1
        report = reports[0]
        assert report.divergence == EpochOffset(5, first_epoch)
        assert report.consumed_to == EpochOffset(8, first_epoch)
        assert report.lost_count == 3
        after += _read(consumer, 2 - len(after))
        assert [(r.offset, r.value, r.leader_epoch) for r in after] == [
            (5, b"b0", new_epoch),
            (6, b"b1", new_epoch),
        ]
        # The consumer goes on in a session with the new leader.
        incremental = _metrics(consumer)["incremental_fetch_requests"]
        _quiet(consumer, requests=3)
        assert _metrics(consumer)["incremental_fetch_requests"] > incremental
        if isinstance(cluster, EmbeddedCluster):
            held = [s for s in cluster.fetch_sessions(b).values() if (topic, 0) in s]
            # Added back after validation, fenced with the new leader epoch.
            assert [s[(topic, 0)] for s in held] == [(7, new_epoch)]
        assert consumer.position_with_epoch(tp) == EpochOffset(7, new_epoch)
        assert not consumer.poll(timeout_ms=200)
    finally:
        consumer.close()
        cluster.start_broker(a)
