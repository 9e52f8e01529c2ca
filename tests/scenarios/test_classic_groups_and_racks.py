"""Classic group protocols and follower fetching on both clusters, one cluster per kind
for the module: brokers in racks a, b, c with Kafka's rack-aware replica selector (group
members without ``client_rack`` read from leaders, as on any cluster).

KIP-392 follower fetching: an EpochConsumer with ``client_rack`` reads from the follower in
its rack. The follower goes away, the leader loses an unclean election: nothing is lost or
read twice without a report, and a truncation is detected even though the consumer was
reading from a follower when it happened.

KIP-345 static membership: a rolling restart of a static group, each member back within the
session timeout, causes no rebalance (every generation stays, no member rejoins) and every
member resumes from its committed positions.

KIP-429 cooperative rebalancing: EpochConsumers with the
cooperative-sticky assignor keep the partitions they keep, give up only what moves (its
position committed with its epoch first), and a partition handed over after one member
detected its truncation is detected again by the next owner. A mixed group with
confluent-kafka's cooperative-sticky member shares the partitions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import ConsumerRebalanceListener
from kafka.structs import MemberState, TopicPartition

from epochguard.consumer import CooperativeStickyAssignor, EpochConsumer
from epochguard.consumer.records import ConsumerRecord
from epochguard.offsets import LogTruncationError
from epochguard.testing import ApacheKafkaCluster, Cluster, EmbeddedCluster, produce, wait_until
from epochguard.testing.apache_kafka.pytest_support import require_real_kafka
from epochguard.testing.embedded.state import RACK_AWARE_REPLICA_SELECTOR
from epochguard.testing.helpers import WaitTimeout, describe_consumer

pytestmark = pytest.mark.timeout(300)

STATIC_PARTITIONS = 6
STATIC_MEMBERS = 3


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


def _commit_when_stable(member: Member) -> None:
    """Commit once the member is in a formed group: stopping a broker may move the group
    coordinator, and the member then rejoins; a commit during that join is refused with
    RebalanceInProgressError, as Java's."""

    deadline = time.monotonic() + 60
    while True:
        with member._lock:
            if member.consumer.group_metadata().state == MemberState.STABLE:
                member.consumer.commit()  # an error here fails the test
                return
        assert time.monotonic() < deadline, "the member never got back to a stable group"
        time.sleep(0.05)


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
        _commit_when_stable(first)  # 15@e0 on partition 1: past the coming divergence
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


def test_an_unclean_election_during_a_cooperative_rebalance_is_detected(cluster: Cluster) -> None:
    """The election happens while a second member joins and partition 1 moves to it:
    whatever the order (the old owner detects first and hands over its last commit, or the
    new owner restores that commit and then sees the election), the new owner reports the
    truncation and nobody reads the new leader's records as if they followed the lost ones."""
    topic = f"coop-during-{_kind(cluster)}-{os.getpid()}"
    cluster.create_topic(topic, partitions=2, replication_factor=2)
    wait_until("leaders", lambda: all(cluster.leader(topic, p) is not None for p in (0, 1)))
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
        _commit_when_stable(first)
        second = Member(cluster, topic, group, **kw)
        second.start()
        member2 = second
        cluster.stop_broker(leader)
        cluster.start_broker(follower)
        cluster.elect_leader(topic, 1, follower, unclean=True)
        wait_until("unclean leader", lambda: cluster.leader(topic, 1) == follower)
        produce(cluster, topic, [f"new-{i}" for i in range(3)], partition=1)
        cluster.start_broker(leader)
        wait_until(
            "partition 1 with the second member",
            lambda: TopicPartition(topic, 1) in member2.assigned(),
            timeout=60,
        )
        wait_until("the second member reports it", lambda: bool(member2.errors), timeout=60)
        err = member2.errors[0]
        assert isinstance(err, LogTruncationError), err
        assert err.report.tp.partition == 1
        assert err.report.divergence is not None and err.report.divergence.offset == 10
        time.sleep(0.5)  # a silently read record would arrive within this window
        read = [r.value for r in first.records + member2.records]
        assert not [v for v in read if v.startswith(b"new-")], "read past the loss silently"
    finally:
        first.shut_down()
        if second is not None:
            second.shut_down()


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_mixed_group_with_confluent_kafka(cluster: Cluster, strategy: str) -> None:
    # librdkafka's strategy names are the protocol names EpochConsumer's assignors send.
    from confluent_kafka import Consumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    cooperative = strategy == "cooperative-sticky"
    topic = f"{strategy}-mixed-{_kind(cluster)}-{os.getpid()}"
    parts = 4
    cluster.create_topic(topic, partitions=parts, replication_factor=1)
    _produce_all(cluster, topic, parts, 0, 5)
    group = f"g-{topic}"
    assignor = CooperativeStickyAssignor if cooperative else RangePartitionAssignor
    ours = Member(cluster, topic, group, partition_assignment_strategy=[assignor])
    ours.start()
    rd = Consumer(
        {
            "bootstrap.servers": cluster.all_bootstrap_servers,
            "group.id": group,
            "partition.assignment.strategy": strategy,
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
        if cooperative:
            assert all(len(s) <= 2 for s in revoked), ours.listener.events  # never everything
        else:  # eager: everything is given back before the join
            assert any(len(s) == parts for s in revoked), ours.listener.events
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


class StaticMember(threading.Thread):
    """One group member polling in its own thread (a join blocks until all members join)."""

    def __init__(self, cluster: Cluster, topic: str, group: str, instance: str) -> None:
        super().__init__(daemon=True, name=f"member-{instance}")
        self.consumer = EpochConsumer(
            bootstrap_servers=cluster.all_bootstrap_servers,
            group_id=group,
            group_instance_id=instance,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=20000,
            heartbeat_interval_ms=500,
            max_poll_interval_ms=60000,
            fetch_max_wait_ms=100,
            request_timeout_ms=10000,
        )
        self.consumer.subscribe([topic])
        self.records: list[ConsumerRecord] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                with self._lock:
                    got = self.consumer.poll(timeout_ms=50)
                for recs in got.values():
                    self.records += recs
        except BaseException as exc:
            self.error = exc

    def assigned(self) -> set[TopicPartition]:
        with self._lock:
            return set(self.consumer.assignment())

    def state(self) -> tuple[int, int]:
        """(generation, rebalances this member went through)."""
        with self._lock:
            m = self.consumer.metrics(raw=True)
            assert m is not None
            return self.consumer.group_metadata().generation_id, int(m["rebalances"])

    def shut_down(self) -> None:
        """Stop polling, commit what was delivered, close (a static member sends no
        LeaveGroup, so its partitions wait for it)."""
        self._halt.set()
        self.join(10)
        assert self.error is None, self.error
        if self.consumer.assignment():
            self.consumer.commit()
        self.consumer.close()


def test_rolling_restart_of_a_static_group_causes_no_rebalance(cluster: Cluster) -> None:
    topic = f"static-{_kind(cluster)}-{os.getpid()}"
    group = f"g-{topic}"
    cluster.create_topic(topic, partitions=STATIC_PARTITIONS, replication_factor=1)
    members = [StaticMember(cluster, topic, group, f"instance-{k}") for k in range(STATIC_MEMBERS)]
    for m in members:
        m.start()
    all_tps = {TopicPartition(topic, p) for p in range(STATIC_PARTITIONS)}

    def settled() -> bool:
        # Every member in the group with its share: a member whose join came late would
        # otherwise rebalance the group after the first records, and the partitions it
        # takes (nothing committed yet) would be read twice.
        sets = [m.assigned() for m in members]
        share = STATIC_PARTITIONS // STATIC_MEMBERS
        return all(len(s) == share for s in sets) and set().union(*sets) == all_tps

    wait_until("the group formed", settled, timeout=60)
    wait_until("one generation", lambda: len({m.state()[0] for m in members}) == 1)
    # The records come once the group has formed: its forming is not what is under test.
    for p in range(STATIC_PARTITIONS):
        produce(cluster, topic, [f"{p}-{i}" for i in range(5)], partition=p)
    try:
        wait_until(
            "first records", lambda: sum(len(m.records) for m in members) == 5 * STATIC_PARTITIONS
        )
    except WaitTimeout as exc:
        detail = {
            m.name: (sorted(str(tp) for tp in m.assigned()), len(m.records), repr(m.error))
            for m in members
        }
        raise AssertionError(
            f"{exc}: members (assignment, records, error) {detail}; "
            + "; ".join(describe_consumer(m.consumer) for m in members)
        ) from exc
    generation = members[0].state()[0]
    # How many joins each survivor went through while the group formed: must not grow.
    joins = {k: m.state()[1] for k, m in enumerate(members)}
    records: list[ConsumerRecord] = []
    for k in range(STATIC_MEMBERS):
        old = members[k]
        owned = old.assigned()
        old.shut_down()
        records += old.records
        new = StaticMember(cluster, topic, group, f"instance-{k}")
        members[k] = new
        new.start()
        wait_until(
            f"instance-{k} back", lambda new=new, owned=owned: new.assigned() == owned, timeout=30
        )
        joins[k] = 1  # the restarted member's own join
        # Nobody else noticed: same generation, no rejoin.
        states = {j: m.state() for j, m in enumerate(members)}
        assert states == {j: (generation, joins[j]) for j in range(STATIC_MEMBERS)}, (k, states)
    for p in range(STATIC_PARTITIONS):
        produce(cluster, topic, [f"{p}-{i}" for i in range(5, 8)], partition=p)
    wait_until(
        "the new records", lambda: sum(len(m.records) for m in members) == 3 * STATIC_PARTITIONS
    )
    time.sleep(0.5)  # a duplicate would arrive within this window
    for m in members:
        m.shut_down()
        records += m.records
    seen = sorted((r.partition, r.offset) for r in records)
    assert seen == sorted((p, i) for p in range(STATIC_PARTITIONS) for i in range(8)), (
        "every record exactly once across the restarts"
    )


# ------------------------------------------------------------------ follower fetching

RACKS = {0: "rack-a", 1: "rack-b", 2: "rack-c"}


@pytest.fixture(
    scope="module",
    params=["embedded", pytest.param("apache", marks=[pytest.mark.real_kafka, pytest.mark.slow])],
)
def rack_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster: Cluster
    if request.param == "apache":
        cluster = ApacheKafkaCluster(
            brokers=3,
            jars=require_real_kafka(),
            racks=RACKS,
            replica_selector=RACK_AWARE_REPLICA_SELECTOR,
        )
    else:
        cluster = EmbeddedCluster(
            brokers=3, first_broker_id=0, racks=RACKS, replica_selector=RACK_AWARE_REPLICA_SELECTOR
        )
    with cluster:
        yield cluster


@pytest.fixture
def cluster(rack_cluster: Cluster) -> Iterator[Cluster]:
    yield rack_cluster
    for broker_id in rack_cluster.broker_ids:
        if not rack_cluster.is_running(broker_id):
            rack_cluster.start_broker(broker_id)


def _topic(cluster: Cluster, name: str) -> tuple[str, int, int, int]:
    """A fresh RF=3 topic: (name, leader, the follower to read from, the other follower)."""
    kind = "apache" if isinstance(cluster, ApacheKafkaCluster) else "embedded"
    topic = f"ff-{name}-{kind}-{os.getpid()}"
    cluster.create_topic(topic, replication_factor=3, config={"min.insync.replicas": "1"})
    leader = wait_until("a leader", lambda: cluster.leader(topic, 0))
    wait_until("full ISR", lambda: len(cluster.isr(topic, 0)) == 3)
    near, other = (r for r in cluster.replicas(topic, 0) if r != leader)
    return topic, leader, near, other


def _consumer(cluster: Cluster, topic: str, rack: str, **kw: Any) -> EpochConsumer:
    cfg: dict[str, Any] = {
        "bootstrap_servers": cluster.all_bootstrap_servers,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "client_rack": rack,
        "fetch_max_wait_ms": 100,
        "metadata_max_age_ms": 1000,
        "retry_backoff_ms": 50,
        "request_timeout_ms": 5000,
        "on_truncation": "raise",
    }
    cfg.update(kw)
    consumer = EpochConsumer(**cfg)
    consumer.assign([TopicPartition(topic, 0)])
    return consumer


def _read(consumer: EpochConsumer, n: int, timeout: float = 30.0) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    wait_until(
        f"{n} records",
        lambda: (
            got.extend(r for rs in consumer.poll(timeout_ms=100).values() for r in rs)
            or len(got) >= n
        ),
        timeout=timeout,
        interval=0,
    )
    return got


def _resets(consumer: EpochConsumer) -> int:
    m = consumer.metrics(raw=True)
    assert m is not None
    return int(m["offset_resets"])


def _follower_fetches(consumer: EpochConsumer) -> int:
    m = consumer.metrics(raw=True)
    assert m is not None
    return int(m["fetches_from_followers"])


def test_reads_from_the_follower_in_its_rack_and_survives_it_going_away(cluster: Cluster) -> None:
    topic, _leader, near, _other = _topic(cluster, "away")
    produce(cluster, topic, [f"a{i}" for i in range(10)])
    consumer = _consumer(cluster, topic, RACKS[near])
    try:
        got = _read(consumer, 10)
        assert _follower_fetches(consumer) > 0, "never fetched from the follower in its rack"
        resets = _resets(consumer)  # the first position came from auto_offset_reset
        cluster.stop_broker(near)
        produce(cluster, topic, [f"b{i}" for i in range(10)])
        got += _read(consumer, 10)
        cluster.start_broker(near)
        wait_until("follower back in sync", lambda: len(cluster.isr(topic, 0)) == 3, timeout=60)
        before = _follower_fetches(consumer)
        produce(cluster, topic, [f"c{i}" for i in range(10)])
        got += _read(consumer, 10)
        wait_until(
            "fetching from the follower again",
            lambda: (
                consumer.poll(timeout_ms=100) is not None and _follower_fetches(consumer) > before
            ),
            timeout=30,
            interval=0,
        )
        m = consumer.metrics(raw=True)
        assert m is not None
    finally:
        consumer.close()
    assert [r.offset for r in got] == list(range(30))
    assert [r.value for r in got] == [f"{p}{i}".encode() for p in "abc" for i in range(10)]
    assert m["offset_resets"] == resets and m["truncations_detected"] == 0


def test_unclean_election_while_reading_from_a_follower_is_detected(cluster: Cluster) -> None:
    topic, leader, near, other = _topic(cluster, "unclean")
    produce(cluster, topic, [f"a{i}" for i in range(10)])
    wait_until("replicated", lambda: cluster.log_end_offset(topic, 0, other) == 10)
    consumer = _consumer(cluster, topic, RACKS[near])
    try:
        got = _read(consumer, 10)
        cluster.stop_broker(other)
        wait_until("ISR without the stopped follower", lambda: other not in cluster.isr(topic, 0))
        # The leader and the near follower have these; ``other`` will not.
        produce(cluster, topic, [f"d{i}" for i in range(5)])
        got += _read(consumer, 5)
        assert _follower_fetches(consumer) > 0
        cluster.stop_broker(near)
        cluster.stop_broker(leader)
        cluster.start_broker(other)
        cluster.elect_leader(topic, 0, other, unclean=True)
        wait_until("the unclean leader", lambda: cluster.leader(topic, 0) == other)
        produce(cluster, topic, [f"n{i}" for i in range(3)])
        cluster.start_broker(near)
        cluster.start_broker(leader)
        wait_until("replicas truncated", lambda: len(cluster.isr(topic, 0)) == 3, timeout=60)
        tp = TopicPartition(topic, 0)
        deadline = time.monotonic() + 30
        with pytest.raises(LogTruncationError) as info:
            while time.monotonic() < deadline:
                got.extend(r for rs in consumer.poll(timeout_ms=100).values() for r in rs)
        report = info.value.report
        assert report.divergence is not None and report.divergence.offset == 10
        assert report.lost_count == 5
        consumer.seek(tp, report.divergence)
        fresh = _read(consumer, 3)
    finally:
        consumer.close()
    assert [r.value for r in got] == [f"a{i}".encode() for i in range(10)] + [
        f"d{i}".encode() for i in range(5)
    ]
    assert [(r.offset, r.value) for r in fresh] == [(10 + i, f"n{i}".encode()) for i in range(3)]


def test_a_lagging_follower_does_not_hold_the_consumer_back() -> None:
    """EmbeddedCluster only: replication to the follower stops while the consumer reads from
    it (it serves up to its own high watermark); the choice expires, the leader no longer
    names it (out of the ISR), and the consumer reads the rest from the leader."""
    with EmbeddedCluster(
        brokers=3, first_broker_id=0, racks=RACKS, replica_selector=RACK_AWARE_REPLICA_SELECTOR
    ) as cluster:
        topic, _leader, near, _other = _topic(cluster, "lag")
        produce(cluster, topic, [f"a{i}" for i in range(10)])
        consumer = _consumer(cluster, topic, RACKS[near], metadata_max_age_ms=500)
        try:
            got = _read(consumer, 10)
            assert _follower_fetches(consumer) > 0
            resets = _resets(consumer)
            cluster.pause_replication(near)
            produce(cluster, topic, [f"b{i}" for i in range(10)])
            got += _read(consumer, 10)
            m = consumer.metrics(raw=True)
        finally:
            consumer.close()
        assert [r.offset for r in got] == list(range(20))
        assert m is not None and m["offset_resets"] == resets and m["truncations_detected"] == 0


def test_offset_out_of_range_from_the_follower_is_not_a_reset() -> None:
    """EmbeddedCluster only (fault injection): the follower answers OFFSET_OUT_OF_RANGE; the
    consumer goes back to the leader, validates, and neither skips nor re-reads."""
    from kafka.protocol.consumer import FetchRequest

    with EmbeddedCluster(
        brokers=3, first_broker_id=0, racks=RACKS, replica_selector=RACK_AWARE_REPLICA_SELECTOR
    ) as cluster:
        topic, _leader, near, _other = _topic(cluster, "oor")
        produce(cluster, topic, [f"a{i}" for i in range(10)])
        consumer = _consumer(cluster, topic, RACKS[near], auto_offset_reset="latest")
        consumer.seek(TopicPartition(topic, 0), 0)
        try:
            got = _read(consumer, 10)
            assert _follower_fetches(consumer) > 0
            cluster.faults.inject_error(FetchRequest.API_KEY, 1, count=1, broker=near)
            produce(cluster, topic, [f"b{i}" for i in range(10)])
            got += _read(consumer, 10)
            m = consumer.metrics(raw=True)
        finally:
            consumer.close()
        assert [r.offset for r in got] == list(range(20))
        assert m is not None and m["offset_resets"] == 0
        assert m["validations"] >= 2  # switching to the follower, and back to the leader
