"""KIP-848 group scenarios run unchanged on both test clusters (EmbeddedCluster in
tests/consumer/test_group_protocol_consumer.py, real Kafka in
tests/apache_kafka/test_apache_kip848.py): members splitting a topic and handing partitions
over with epochs, and a mixed group with librdkafka (``group.protocol=consumer``).

``member`` is the tests' one KIP-848 member factory (the classic-protocol flavours of
tests/apache_kafka/test_apache_java_group.py override ``group_protocol``), ``Runner`` polls
a member on its own thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from kafka import ConsumerRebalanceListener

from epochguard.consumer import EpochConsumer
from epochguard.testing import Cluster, produce

PARTS = 4


def member(cluster: Cluster, group: str, **kw: Any) -> EpochConsumer:
    """An EpochConsumer in KIP-848 group ``group`` on either cluster, reading from the
    earliest offset without auto commits, with short metadata and retry intervals (tests
    wait on them); ``kw`` overrides any of it."""
    cfg: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "group_id": group,
        "group_protocol": "consumer",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 100,
        "metadata_max_age_ms": 500,
        "retry_backoff_ms": 50,
        "request_timeout_ms": 10000,
    }
    cfg.update(kw)
    return EpochConsumer(**cfg)


class Runner(threading.Thread):
    """Polls one consumer on its own thread, keeping what it reads."""

    def __init__(self, consumer: EpochConsumer) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.records: list[Any] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for recs in self.consumer.poll(timeout_ms=50).values():
                    self.records += recs
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(20)
        assert self.error is None, self.error


def wait(cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _produce(cluster: Cluster, topic: str, first: int, last: int) -> None:
    for p in range(PARTS):
        produce(cluster, topic, [f"{p}-{i}" for i in range(first, last)], partition=p)


def split_and_hand_over(cluster: Cluster, topic: str, group: str) -> None:
    """c1 reads everything; c2 joins; they end 2/2 with nothing read twice, and the moved
    partitions' commits (made on revoke) carry leader epochs."""
    cluster.create_topic(topic, partitions=PARTS)
    _produce(cluster, topic, 0, 5)
    c1 = member(cluster, group, enable_auto_commit=True, auto_commit_interval_ms=200)
    c2 = member(cluster, group, enable_auto_commit=True, auto_commit_interval_ms=200)
    r1, r2 = Runner(c1), Runner(c2)
    try:
        c1.subscribe([topic])
        r1.start()
        wait(lambda: len(r1.records) == 5 * PARTS, "c1 reads everything")
        c2.subscribe([topic])
        r2.start()
        wait(lambda: len(c1.assignment()) == 2 and len(c2.assignment()) == 2, "a 2/2 split")
        assert c1.assignment().isdisjoint(c2.assignment())
        _produce(cluster, topic, 5, 10)
        wait(lambda: len(r1.records) + len(r2.records) >= 10 * PARTS, "every record")
        seen = [(r.partition, r.offset) for r in r1.records + r2.records]
        assert len(seen) == len(set(seen)) == 10 * PARTS
        r2.finish()
        for tp in c2.assignment():
            committed = c2.committed_with_epoch(tp)
            assert committed is not None and committed.leader_epoch is not None
    finally:
        r1.finish()
        if r2.is_alive():
            r2.finish()
        c1.close()
        c2.close()


def mixed_group_with_librdkafka(cluster: Cluster, topic: str, group: str) -> None:
    """EpochConsumer and librdkafka (confluent-kafka, ``group.protocol=consumer``) in one
    group: both are assigned by the broker, split the partitions, read nothing twice."""
    from confluent_kafka import Consumer

    cluster.create_topic(topic, partitions=PARTS)
    _produce(cluster, topic, 0, 5)
    c1 = member(cluster, group, enable_auto_commit=True, auto_commit_interval_ms=200)
    r1 = Runner(c1)
    rd = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 200,
        }
    )
    rd_records: list[tuple[int, int]] = []

    def rd_poll() -> None:
        msg = rd.poll(0.1)
        if msg is not None and msg.error() is None:
            rd_records.append((msg.partition(), msg.offset()))

    try:
        c1.subscribe([topic])
        r1.start()
        wait(lambda: len(r1.records) == 5 * PARTS, "c1 reads everything")
        rd.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(c1.assignment()) != 2 or len(rd.assignment()) != 2:
            assert time.monotonic() < deadline, (c1.assignment(), rd.assignment())
            rd_poll()
        assert {tp.partition for tp in c1.assignment()}.isdisjoint(
            {tp.partition for tp in rd.assignment()}
        )
        _produce(cluster, topic, 5, 10)
        deadline = time.monotonic() + 60
        while len(r1.records) + len(rd_records) < 10 * PARTS:
            assert time.monotonic() < deadline, (len(r1.records), rd_records)
            rd_poll()
        seen = [(r.partition, r.offset) for r in r1.records] + rd_records
        assert len(seen) == len(set(seen)) == 10 * PARTS
    finally:
        r1.finish()
        c1.close()
        rd.close()


class _Events(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.events: list[tuple[str, set[Any]]] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.events.append(("revoked", set(revoked)))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.events.append(("assigned", set(assigned)))

    def replayed(self) -> set[Any]:
        """The assignment the callbacks so far describe (whole or incremental)."""
        held: set[Any] = set()
        for kind, parts in list(self.events):
            held = held | parts if kind == "assigned" else held - parts
        return held


def static_member_restart(cluster: Cluster, topic: str, group: str) -> None:
    """A static member (group_instance_id) closes and comes back within the session: it gets
    its partitions back and the other member's assignment never moves (no rebalance)."""
    cluster.create_topic(topic, partitions=PARTS)
    c1 = member(cluster, group, group_instance_id=f"{group}-i1")
    other = _Events()
    c2 = member(cluster, group)
    r1, r2 = Runner(c1), Runner(c2)
    try:
        c1.subscribe([topic])
        c2.subscribe([topic], listener=other)
        r1.start()
        r2.start()
        # The split, and c2's listener caught up with it: its callbacks run on its poll
        # thread after the assignment changes, and one landing late is no rebalance.
        wait(
            lambda: (
                len(c1.assignment()) == 2
                and len(c2.assignment()) == 2
                and other.replayed() == c2.assignment()
            ),
            "a 2/2 split, c2's listener told",
        )
        held, events = c1.assignment(), len(other.events)
        r1.finish()
        c1.close()  # leaves with epoch -2: the coordinator keeps its partitions for it
        c1 = member(cluster, group, group_instance_id=f"{group}-i1")
        r1 = Runner(c1)
        c1.subscribe([topic])
        r1.start()
        wait(lambda: c1.assignment() == held, "the restarted member's partitions back")
        time.sleep(1.0)  # a rebalance would reach c2 within two heartbeats
        assert other.events[events:] == []
        assert len(c2.assignment()) == 2
    finally:
        for r in (r1, r2):
            if r.is_alive():
                r.finish()
        c1.close()
        c2.close()


def groups_are_listed_by_type(cluster: Cluster, topic: str, group: str) -> None:
    """What Kafka 4.3.1 answers the classic admin APIs about a KIP-848 group (so that
    ``kafka-consumer-groups --list`` and lag tools built on kafka-python see it): ListGroups
    names it with type ``consumer`` (and filters by type), DescribeGroups refuses it with
    GROUP_ID_NOT_FOUND ("not a classic group"); a classic group next to it is described."""
    from kafka.admin import KafkaAdminClient

    cluster.create_topic(topic, partitions=PARTS)
    modern = member(cluster, group)
    classic = member(cluster, group + "-classic", group_protocol="classic")
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        modern.subscribe([topic])
        classic.subscribe([topic])

        def both_assigned() -> bool:
            modern.poll(timeout_ms=50)
            classic.poll(timeout_ms=50)
            return len(modern.assignment()) == len(classic.assignment()) == PARTS

        wait(both_assigned, "both groups assigned")
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed[group]["group_type"] == "consumer", listed
        assert listed[group]["protocol_type"] == "consumer"
        assert listed[group]["group_state"] == "Stable"
        assert listed[group + "-classic"]["group_type"] == "classic", listed
        described = admin.describe_groups([group, group + "-classic"])
        assert "GroupIdNotFoundError" in str(described[group]["error"]), described[group]
        assert described[group]["group_state"] == "Dead"
        assert described[group + "-classic"]["error"] is None
        assert described[group + "-classic"]["group_state"] == "Stable"
    finally:
        admin.close()
        modern.close()
        classic.close()


def deleted_topic_re_creation_is_reported(cluster: Cluster, topic: str, group: str) -> None:
    """Found by the 5,000-schedule chaos run: a topic deleted from under a KIP-848 group is
    revoked at once and Kafka deletes the group's commits with it (both measured on Kafka
    4.3.1). When the re-created topic came back there was nothing committed, and the member
    started over at the reset position as if the records it had read still existed. It now
    starts from where it stood in the old log, so the re-creation is reported first."""
    from kafka.structs import TopicPartition

    from epochguard.offsets.position import EpochOffset
    from epochguard.offsets.report import DetectedBy

    tp = TopicPartition(topic, 0)
    cluster.create_topic(topic, partitions=1)
    produce(cluster, topic, [f"old-{i}" for i in range(5)])
    c = member(cluster, group, on_truncation="rewind", allow_auto_create_topics=False)
    try:
        c.subscribe([topic])
        got: list[Any] = []

        def read(n: int) -> bool:
            for recs in c.poll(timeout_ms=50).values():
                got.extend(recs)
            return len(got) >= n

        wait(lambda: read(5), "the old records")
        c.commit()
        cluster.delete_topic(topic)
        wait(lambda: not read(6) and not c.assignment(), "the deleted topic revoked")
        assert c.committed(tp) is None  # gone with the topic
        cluster.create_topic(topic, partitions=1)
        produce(cluster, topic, [f"new-{i}" for i in range(8)])
        got.clear()
        wait(lambda: read(8), "the new records")
        assert [(r.offset, r.value) for r in got] == [(i, b"new-%d" % i) for i in range(8)]
        [rep] = c.truncation_reports()
        assert rep.detected_by is DetectedBy.TOPIC_RECREATED
        assert (rep.divergence, rep.lost_count) == (EpochOffset(0, None), 5)
    finally:
        c.close()
