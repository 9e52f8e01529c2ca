"""Group management: rebalances with kafka-python's assignors, listeners, commit on revoke,
a mixed group with a librdkafka member, and bounded close."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kafka import ConsumerRebalanceListener
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.offsets.position import EpochOffset

from .conftest import make_consumer

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

TOPIC = "gt"
N_PARTS = 4


class Recorder(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.events.append(("revoked", set(revoked)))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.events.append(("assigned", set(assigned)))


class Runner(threading.Thread):
    """Polls one consumer in its own thread (joins block until every member joins)."""

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


def produce(cluster: Any, per_partition: int, start: int = 0) -> None:
    for p in range(N_PARTS):
        cluster.append(TOPIC, p, [b"%d-%d" % (p, start + i) for i in range(per_partition)])


def wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.mark.parametrize("strategy", [None, RoundRobinPartitionAssignor, StickyPartitionAssignor])
def test_rebalance_splits_partitions_and_commits_on_revoke(cluster: Any, strategy: Any) -> None:
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    produce(cluster, 5)
    kw: dict[str, Any] = {
        "group_id": "grp",
        "enable_auto_commit": True,
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 200,
        "max_poll_interval_ms": 10000,
        "auto_commit_interval_ms": 200,
    }
    if strategy is not None:
        kw["partition_assignment_strategy"] = [strategy]
    l1, l2 = Recorder(), Recorder()
    c1 = make_consumer(cluster, **kw)
    c1.subscribe([TOPIC], listener=l1)
    r1 = Runner(c1)
    r1.start()
    try:
        wait(lambda: len(r1.records) == 5 * N_PARTS)
        assert c1.assignment() == {TopicPartition(TOPIC, p) for p in range(N_PARTS)}
        c2 = make_consumer(cluster, **kw)
        c2.subscribe([TOPIC], listener=l2)
        r2 = Runner(c2)
        r2.start()
        try:
            wait(lambda: len(c1.assignment()) == 2 and len(c2.assignment()) == 2)
            assert c1.assignment().isdisjoint(c2.assignment())
            produce(cluster, 5, start=5)
            wait(lambda: len(r1.records) + len(r2.records) == 10 * N_PARTS)
            time.sleep(0.3)
            assert r1.error is None and r2.error is None
            seen = [(r.partition, r.offset) for r in r1.records + r2.records]
            assert len(seen) == len(set(seen)) == 10 * N_PARTS  # nothing twice
            assert ("revoked", {TopicPartition(TOPIC, p) for p in range(N_PARTS)}) in l1.events
            assert l2.events[-1] == ("assigned", c2.assignment())
            # Commit on revoke carried positions with epochs.
            tp = TopicPartition(TOPIC, 0)
            assert c1.committed_with_epoch(tp) is not None
            assert c1.committed_with_epoch(tp) == EpochOffset(c1.committed_with_epoch(tp).offset, 0)
        finally:
            r2.stop.set()
            r2.join(10)
            c2.close()
    finally:
        r1.stop.set()
        r1.join(10)
        c1.close()


def test_mixed_group_with_librdkafka_member(cluster: Any) -> None:
    from confluent_kafka import Consumer

    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    produce(cluster, 5)
    c1 = make_consumer(
        cluster,
        group_id="mixed",
        session_timeout_ms=6000,
        enable_auto_commit=True,
        heartbeat_interval_ms=200,
        max_poll_interval_ms=10000,
    )
    c1.subscribe([TOPIC])
    r1 = Runner(c1)
    r1.start()
    rd = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "mixed",
            "partition.assignment.strategy": "range",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    rd_records: list[Any] = []
    try:
        wait(lambda: len(r1.records) == 5 * N_PARTS)
        rd.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = rd.poll(0.1)
            if m is not None and not m.error():
                rd_records.append(m)
            if len(rd.assignment()) == 2 and len(c1.assignment()) == 2:
                break
        assert len(rd.assignment()) == 2 and len(c1.assignment()) == 2
        mine = {tp.partition for tp in c1.assignment()}
        theirs = {tp.partition for tp in rd.assignment()}
        assert mine.isdisjoint(theirs) and mine | theirs == set(range(N_PARTS))
        before = len(r1.records)
        produce(cluster, 3, start=5)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            len(r1.records) - before < 6 or sum(1 for m in rd_records if m.offset() >= 5) < 6
        ):
            m = rd.poll(0.1)
            if m is not None and not m.error():
                rd_records.append(m)
        assert len(r1.records) - before == 6
        assert {m.partition() for m in rd_records if m.offset() >= 5} == theirs
        assert r1.error is None
    finally:
        rd.close()
        r1.stop.set()
        r1.join(10)
        c1.close()


def test_close_is_bounded_with_every_broker_down(cluster: Any) -> None:
    cluster.create_topic(TOPIC, partitions=2, replication_factor=2)
    produce_two = [b"x"] * 3
    cluster.append(TOPIC, 0, produce_two)
    consumer = make_consumer(
        cluster,
        group_id="down",
        close_timeout_ms=2000,
        session_timeout_ms=6000,
        heartbeat_interval_ms=200,
    )
    consumer.subscribe([TOPIC])
    got = 0
    deadline = time.monotonic() + 10
    while got < 3 and time.monotonic() < deadline:
        got += sum(len(v) for v in consumer.poll(timeout_ms=50).values())
    assert got == 3
    for b in cluster.broker_ids:
        cluster.stop_broker(b)
    t0 = time.monotonic()
    assert consumer.poll(timeout_ms=300) == {}
    assert time.monotonic() - t0 < 3
    t0 = time.monotonic()
    consumer.close()
    assert time.monotonic() - t0 < 4


def test_heartbeats_keep_membership_between_polls(cluster: Any) -> None:
    cluster.create_topic(TOPIC, partitions=2, replication_factor=2)
    c = make_consumer(
        cluster,
        group_id="hb",
        session_timeout_ms=6000,
        heartbeat_interval_ms=300,
        max_poll_interval_ms=20000,
    )
    try:
        c.subscribe([TOPIC])
        wait(lambda: bool(c.poll(timeout_ms=50) or c.assignment()))
        assert len(c.assignment()) == 2
        sent = c.metrics(raw=True)["heartbeats_sent"]
        time.sleep(7.0)  # the application is busy for longer than the session timeout
        assert c.metrics(raw=True)["heartbeats_sent"] >= sent + 10
        c.poll(timeout_ms=100)
        assert len(c.assignment()) == 2
        assert c.metrics(raw=True)["rebalances"] == 1
    finally:
        c.close()


def test_max_poll_interval_exceeded_leaves_and_rejoins(cluster: Any) -> None:
    cluster.create_topic(TOPIC, partitions=2, replication_factor=2)
    c = make_consumer(
        cluster,
        group_id="mpi",
        session_timeout_ms=6000,
        heartbeat_interval_ms=100,
        max_poll_interval_ms=1000,
    )
    try:
        c.subscribe([TOPIC])
        wait(lambda: bool(c.poll(timeout_ms=50) or c.assignment()))
        time.sleep(1.8)  # longer than max_poll_interval_ms: the heartbeat thread leaves
        assert c._engine.group is not None and c._engine.group.member_id == ""
        wait(lambda: bool(c.poll(timeout_ms=50) or c.assignment()))
        assert len(c.assignment()) == 2
        assert c.metrics(raw=True)["rebalances"] == 2
    finally:
        c.close()


def test_poll_is_bounded_when_committed_offsets_are_unreachable(cluster: Any) -> None:
    cluster.create_topic(TOPIC, partitions=1, replication_factor=2)
    c = make_consumer(cluster, group_id="unreachable", close_timeout_ms=1000)
    try:
        c.assign([TopicPartition(TOPIC, 0)])
        for b in cluster.broker_ids:
            cluster.stop_broker(b)
        t0 = time.monotonic()
        assert c.poll(timeout_ms=200) == {}
        assert time.monotonic() - t0 < 3
    finally:
        t0 = time.monotonic()
        c.close()
        assert time.monotonic() - t0 < 3


def test_an_eager_rebalance_never_holds_poll_past_its_timeout(cluster: Any) -> None:
    """The coordinator holds a JoinGroup until every member has rejoined (up to
    ``max_poll_interval_ms``): poll(timeout_ms) returns on time meanwhile, as kafka-python's
    and Java's do, and the join goes on in the next poll. So one thread can drive three
    members of a group through a rebalance."""
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    kw: dict[str, Any] = {
        "group_id": "one-thread",
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 200,
        "max_poll_interval_ms": 30000,
    }
    members = [make_consumer(cluster, **kw) for _ in range(3)]
    try:
        longest = 0.0

        def poll_each(consumers: list[EpochConsumer]) -> None:
            nonlocal longest
            for c in consumers:
                t0 = time.monotonic()
                c.poll(timeout_ms=100)
                longest = max(longest, time.monotonic() - t0)

        for c in members:
            c.subscribe([TOPIC])

        def settled(consumers: list[EpochConsumer]) -> bool:
            poll_each(consumers)
            sizes = [len(c.assignment()) for c in consumers]
            return sum(sizes) == N_PARTS and min(sizes) > 0

        wait(lambda: settled(members[:2]))
        # A third member: both others must rejoin before anyone's JoinGroup is answered.
        wait(lambda: settled(members))
        assert sorted(len(c.assignment()) for c in members) == [1, 1, 2]
        assert longest < 5.0, f"a poll(timeout_ms=100) took {longest:.1f} s"
    finally:
        for c in members:
            c.close()


def test_a_new_member_joins_and_reads_within_its_first_poll() -> None:
    """Every new member's first JoinGroup is refused with MEMBER_ID_REQUIRED: the next goes
    out in the same poll, which then returns records rather than waiting out its timeout."""
    from epochguard.testing import EmbeddedCluster

    # One broker and defaults but these: more brokers' connections, and the quick test
    # settings' short backoffs and metadata age, wake a waiting poll on their own.
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=1)
        produce(cluster, 3)
        c = EpochConsumer(
            TOPIC,
            bootstrap_servers=cluster.bootstrap_servers,
            group_id="first-poll",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
        )
        try:
            got = c.poll(timeout_ms=20000)
            assert len(c.assignment()) == N_PARTS
            assert got, "the first poll returned nothing"
        finally:
            c.close()


def test_a_cooperative_rebalance_goes_on_while_members_read_a_backlog() -> None:
    """Without an IO thread (the default) a join step's answer is read only when a thread
    turns the connections, and a poll that hands out buffered records does not wait: the
    members that keep reading a backlog still take their JoinGroup answers in, so a new
    member gets its share."""
    from epochguard.consumer import CooperativeStickyAssignor
    from epochguard.testing import EmbeddedCluster

    parts = 64
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic(TOPIC, partitions=parts, replication_factor=1)
        for p in range(parts):
            cluster.append(TOPIC, p, [b"v"] * 300, batch_size=20)
        stop = threading.Event()

        def member() -> EpochConsumer:
            c = EpochConsumer(
                bootstrap_servers=cluster.bootstrap_servers,
                group_id="backlog",
                partition_assignment_strategy=[CooperativeStickyAssignor],
                auto_offset_reset="earliest",
                session_timeout_ms=30000,
                heartbeat_interval_ms=500,
                max_poll_interval_ms=60000,
            )
            assert not c.config["io_thread"]
            c.subscribe([TOPIC])
            return c

        def read(c: EpochConsumer) -> None:
            while not stop.is_set():
                c.poll(timeout_ms=20, max_records=5)  # a few records at a time: never dry
                time.sleep(0.02)

        members: list[EpochConsumer] = []
        readers: list[threading.Thread] = []

        def add() -> None:
            members.append(member())
            readers.append(threading.Thread(target=read, args=(members[-1],), daemon=True))
            readers[-1].start()

        def shared() -> bool:
            sizes = [len(c.assignment()) for c in members]
            return sum(sizes) == parts and min(sizes) > 0

        try:
            add()
            add()
            wait(shared)
            time.sleep(1.0)  # every member's buffers full
            add()
            wait(shared, timeout=20.0)
        finally:
            stop.set()
            for t in readers:
                t.join(10)
            for c in members:
                c.close()


@pytest.mark.parametrize("cooperative", [False, True], ids=["eager", "cooperative"])
def test_a_member_whose_pattern_matches_nothing_still_rejoins(
    cluster: Any, cooperative: bool
) -> None:
    """A member subscribed to a pattern whose topics were all deleted still takes part in
    the group's rebalances (with an empty subscription, as Java's and kafka-python's do):
    the others' rebalance does not wait ``max_poll_interval_ms`` for its JoinGroup."""
    cluster.create_topic("gone-1", partitions=2, replication_factor=2)
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    kw: dict[str, Any] = {
        "group_id": "mixed-subscriptions",
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 200,
        "max_poll_interval_ms": 300_000,
    }
    if cooperative:
        from epochguard.consumer import CooperativeStickyAssignor

        kw["partition_assignment_strategy"] = [CooperativeStickyAssignor]
    by_pattern, by_list, newcomer = (make_consumer(cluster, **kw) for _ in range(3))
    members = [by_pattern, by_list]
    try:
        by_pattern.subscribe(pattern="gone-.*")
        by_list.subscribe([TOPIC])

        def poll_all() -> None:
            for c in members:
                c.poll(timeout_ms=50)

        def settled(expected: int) -> bool:
            poll_all()
            return sum(len(c.assignment()) for c in members) == expected

        wait(lambda: settled(2 + N_PARTS))
        cluster.delete_topic("gone-1")
        wait(lambda: poll_all() or by_pattern.subscription() == set())
        wait(lambda: settled(N_PARTS))
        members.append(newcomer)
        newcomer.subscribe([TOPIC])
        wait(lambda: settled(N_PARTS) and min(len(c.assignment()) for c in members[1:]) > 0)
        assert by_pattern.assignment() == set()
    finally:
        for c in (by_pattern, by_list, newcomer):
            c.close()


def test_a_second_pattern_is_matched_without_waiting_for_the_metadata_refresh(
    cluster: Any,
) -> None:
    """A pattern is matched only against metadata asked for after ``subscribe()``: a second
    pattern asks for it at once rather than at the next refresh (``metadata_max_age_ms``,
    five minutes here), so the member rejoins with its new topics."""
    cluster.create_topic("first-1", partitions=2, replication_factor=2)
    cluster.create_topic("second-1", partitions=3, replication_factor=2)
    c = make_consumer(
        cluster,
        group_id="two-patterns",
        session_timeout_ms=6000,
        heartbeat_interval_ms=200,
        metadata_max_age_ms=300_000,
    )
    try:
        c.subscribe(pattern="first-.*")
        wait(lambda: c.poll(timeout_ms=50) is not None and len(c.assignment()) == 2)
        c.subscribe(pattern="second-.*")
        wait(lambda: c.poll(timeout_ms=50) is not None and len(c.assignment()) == 3, 10.0)
        assert {tp.topic for tp in c.assignment()} == {"second-1"}
    finally:
        c.close()
