"""KIP-429 cooperative rebalancing on both clusters: EpochConsumers with the
cooperative-sticky assignor keep the partitions they keep, give up only what moves (its
position committed with its epoch first), and a partition handed over after one member
detected its truncation is detected again by the next owner. A mixed group with
confluent-kafka's cooperative-sticky member shares the partitions."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from kafka import ConsumerRebalanceListener
from kafka.structs import TopicPartition

from epochguard.consumer import CooperativeStickyAssignor, EpochConsumer
from epochguard.consumer.records import ConsumerRecord
from epochguard.offsets import LogTruncationError
from epochguard.testing import ApacheKafkaCluster, Cluster, produce, wait_until

pytestmark = pytest.mark.timeout(300)


def _kind(cluster: Cluster) -> str:
    return "apache" if isinstance(cluster, ApacheKafkaCluster) else "embedded"


class Recorder(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.events.append(("revoked", frozenset(revoked)))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.events.append(("assigned", frozenset(assigned)))


class Member(threading.Thread):
    def __init__(self, cluster: Cluster, topic: str, group: str, **kw: Any) -> None:
        super().__init__(daemon=True)
        cfg: dict[str, Any] = {
            "bootstrap_servers": cluster.all_bootstrap_servers,
            "group_id": group,
            "partition_assignment_strategy": [CooperativeStickyAssignor],
            "auto_offset_reset": "earliest",
            "enable_auto_commit": True,
            "auto_commit_interval_ms": 200,
            "session_timeout_ms": 10000,
            "heartbeat_interval_ms": 300,
            "max_poll_interval_ms": 30000,
            "fetch_max_wait_ms": 100,
            "request_timeout_ms": 10000,
        }
        cfg.update(kw)
        self.consumer = EpochConsumer(**cfg)
        self.listener = Recorder()
        self.consumer.subscribe([topic], listener=self.listener)
        self.records: list[ConsumerRecord] = []
        self.errors: list[BaseException] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with self._lock:
                    got = self.consumer.poll(timeout_ms=50)
            except LogTruncationError as exc:
                self.errors.append(exc)
                continue
            except BaseException as exc:
                self.errors.append(exc)
                return
            for recs in got.values():
                self.records += recs

    def assigned(self) -> set[TopicPartition]:
        with self._lock:
            return set(self.consumer.assignment())

    def shut_down(self) -> None:
        self._halt.set()
        self.join(15)
        self.consumer.close()


def _produce_all(cluster: Cluster, topic: str, parts: int, start: int, n: int) -> None:
    for p in range(parts):
        produce(cluster, topic, [f"{p}-{i}" for i in range(start, start + n)], partition=p)


def test_a_joining_member_takes_only_what_moves(cluster: Cluster) -> None:
    topic = f"coop-{_kind(cluster)}-{os.getpid()}"
    parts = 6
    cluster.create_topic(topic, partitions=parts, replication_factor=1)
    _produce_all(cluster, topic, parts, 0, 5)
    first = Member(cluster, topic, f"g-{topic}")
    first.start()
    second: Member | None = None
    try:
        wait_until("first reads all", lambda: len(first.records) == 5 * parts, timeout=60)
        everything = first.assigned()
        assert len(everything) == parts
        second = Member(cluster, topic, f"g-{topic}")
        second.start()
        member2 = second
        wait_until(
            "split 3/3",
            lambda: len(first.assigned()) == 3 and len(member2.assigned()) == 3,
            timeout=60,
        )
        kept = first.assigned()
        moved = everything - kept
        assert member2.assigned() == moved
        # Cooperative: the first member only ever gave up what moved, never everything.
        revoked = [s for e, s in first.listener.events if e == "revoked"]
        assert revoked and all(s <= moved for s in revoked), first.listener.events
        _produce_all(cluster, topic, parts, 5, 3)
        wait_until(
            "the new records",
            lambda: len(first.records) + len(member2.records) == 8 * parts,
            timeout=60,
        )
        time.sleep(0.5)  # a duplicate would arrive within this window
        assert not first.errors and not member2.errors
    finally:
        first.shut_down()
        if second is not None:
            second.shut_down()
    seen = sorted((r.partition, r.offset) for r in first.records + member2.records)
    assert seen == sorted((p, i) for p in range(parts) for i in range(8)), (
        "every record exactly once: the moved partitions were committed before the hand-over"
    )
    assert {r.partition for r in member2.records} == {tp.partition for tp in moved}


def test_a_truncation_detected_by_one_member_is_detected_by_the_next_owner(
    cluster: Cluster,
) -> None:
    topic = f"coop-trunc-{_kind(cluster)}-{os.getpid()}"
    cluster.create_topic(topic, partitions=2, replication_factor=2)
    wait_until("leaders", lambda: all(cluster.leader(topic, p) is not None for p in (0, 1)))
    # Partition 1 is the one the cooperative-sticky assignor moves to a second member.
    leader = wait_until("p1 leader", lambda: cluster.leader(topic, 1))
    (follower,) = [r for r in cluster.replicas(topic, 1) if r != leader]
    _produce_all(cluster, topic, 2, 0, 10)
    wait_until("p1 replicated", lambda: cluster.log_end_offset(topic, 1, follower) == 10)
    group = f"g-{topic}"
    kw: dict[str, Any] = {"on_truncation": "raise", "enable_auto_commit": False}
    first = Member(cluster, topic, group, **kw)
    first.start()
    second: Member | None = None
    try:
        wait_until("first reads", lambda: len(first.records) == 20, timeout=60)
        cluster.stop_broker(follower)
        wait_until("ISR shrank", lambda: follower not in cluster.isr(topic, 1))
        produce(cluster, topic, [f"lost-{i}" for i in range(5)], partition=1)
        wait_until("first reads the doomed records", lambda: len(first.records) == 25)
        with first._lock:
            first.consumer.commit()  # 15@e0 on partition 1: past the coming divergence
        cluster.stop_broker(leader)
        cluster.start_broker(follower)
        cluster.elect_leader(topic, 1, follower, unclean=True)
        wait_until("unclean leader", lambda: cluster.leader(topic, 1) == follower)
        produce(cluster, topic, [f"new-{i}" for i in range(3)], partition=1)
        cluster.start_broker(leader)
        wait_until("first detects", lambda: bool(first.errors), timeout=60)
        (err,) = first.errors
        assert isinstance(err, LogTruncationError) and err.report.tp.partition == 1
        assert err.report.divergence is not None and err.report.divergence.offset == 10
        second = Member(cluster, topic, group, **kw)
        second.start()
        member2 = second
        wait_until(
            "partition 1 handed over",
            lambda: member2.assigned() == {TopicPartition(topic, 1)},
            timeout=60,
        )
        wait_until("the next owner detects it too", lambda: bool(member2.errors), timeout=60)
        (err2,) = member2.errors
        assert isinstance(err2, LogTruncationError)
        assert err2.report.divergence is not None and err2.report.divergence.offset == 10
        assert err2.report.consumed_to.offset == 15  # the committed position, with its epoch
        assert not [r for r in member2.records if r.partition == 1], "read past the loss"
    finally:
        first.shut_down()
        if second is not None:
            second.shut_down()


def test_mixed_group_with_confluent_kafka_cooperative_sticky(cluster: Cluster) -> None:
    from confluent_kafka import Consumer

    topic = f"coop-mixed-{_kind(cluster)}-{os.getpid()}"
    parts = 4
    cluster.create_topic(topic, partitions=parts, replication_factor=1)
    _produce_all(cluster, topic, parts, 0, 5)
    group = f"g-{topic}"
    ours = Member(cluster, topic, group)
    ours.start()
    rd = Consumer(
        {
            "bootstrap.servers": cluster.all_bootstrap_servers,
            "group.id": group,
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 300,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 200,
            "log_level": 0,
        }
    )
    theirs: list[Any] = []

    def rd_poll(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            m = rd.poll(0.05)
            if m is not None and not m.error():
                theirs.append(m)

    try:
        wait_until("ours reads all", lambda: len(ours.records) == 5 * parts, timeout=60)
        rd.subscribe([topic])
        wait_until(
            "split 2/2",
            lambda: (
                rd_poll(0.2) is None and len(rd.assignment()) == 2 and len(ours.assigned()) == 2
            ),
            timeout=60,
        )
        mine = {tp.partition for tp in ours.assigned()}
        their_parts = {tp.partition for tp in rd.assignment()}
        assert mine.isdisjoint(their_parts) and mine | their_parts == set(range(parts))
        revoked = [s for e, s in ours.listener.events if e == "revoked"]
        assert all(len(s) <= 2 for s in revoked), ours.listener.events  # never everything
        _produce_all(cluster, topic, parts, 5, 3)
        wait_until(
            "the new records",
            lambda: (
                rd_poll(0.1) is None
                and sum(1 for r in ours.records if r.offset >= 5)
                + sum(1 for m in theirs if m.offset() >= 5)
                == 3 * parts
            ),
            timeout=60,
        )
        assert not ours.errors
    finally:
        rd.close()
        ours.shut_down()
    assert {r.partition for r in ours.records if r.offset >= 5} == mine
    assert {m.partition() for m in theirs if m.offset() >= 5} == their_parts
