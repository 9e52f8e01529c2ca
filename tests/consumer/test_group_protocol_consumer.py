"""EpochConsumer with ``group_protocol="consumer"`` (KIP-848) on the embedded cluster:
incremental assignment (members keep what they keep), commit-with-epochs on revoke,
committed epochs restored and validated on the new owner, fencing, regex subscriptions,
and a truncation detected by one member detected again by the member it moves to."""

from __future__ import annotations

import time
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka import ConsumerRebalanceListener
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.consumer.errors import ConsumerConfigError
from epochguard.consumer.group_consumer import ConsumerGroupMember
from epochguard.offsets.errors import LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.consumer_groups import (
    ConsumerGroupCoordinator,
    install_consumer_coordinator,
)

from .. import kip848_scenarios
from ..kip848_scenarios import Runner, member
from .conftest import TP0, diverge, read, setup_topic, unclean_elect

pytestmark = [pytest.mark.timeout(60)]

TOPIC = "kt"
GROUP = "kg"
N_PARTS = 4
ALL = {TopicPartition(TOPIC, p) for p in range(N_PARTS)}


def fast_coordinator(cluster: EmbeddedCluster, **kw: Any) -> ConsumerGroupCoordinator:
    """Short heartbeat interval (and session, when given) for this cluster's KIP-848 groups."""
    coord = ConsumerGroupCoordinator(heartbeat_interval_ms=100, **kw)
    cluster.call(lambda: install_consumer_coordinator(cluster.state, coord))
    return coord


class Recorder(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.events.append(("revoked", set(revoked)))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.events.append(("assigned", set(assigned)))


def wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def produce(cluster: EmbeddedCluster, per_partition: int, start: int = 0) -> None:
    for p in range(N_PARTS):
        cluster.append(TOPIC, p, [b"%d-%d" % (p, start + i) for i in range(per_partition)])


def test_config_names_and_values_are_checked() -> None:
    from epochguard.consumer.config import build_config

    assert build_config({})["group_protocol"] == "classic"
    assert build_config({"group_protocol": "CONSUMER"})["group_protocol"] == "consumer"
    with pytest.raises(ConsumerConfigError, match="group_protocol"):
        build_config({"group_protocol": "eager"})
    with pytest.raises(ConsumerConfigError, match="session_timeout_ms"):
        build_config({"group_protocol": "consumer", "session_timeout_ms": 10000})
    with pytest.raises(ConsumerConfigError, match="partition_assignment_strategy"):
        build_config({"group_protocol": "consumer", "partition_assignment_strategy": []})
    with pytest.raises(ConsumerConfigError, match="group_remote_assignor"):
        build_config({"group_remote_assignor": "range"})
    with pytest.raises(ConsumerConfigError, match="group_remote_assignor"):
        build_config({"group_protocol": "consumer", "group_remote_assignor": ""})


def test_a_joining_member_takes_partitions_without_stopping_the_other(
    cluster: EmbeddedCluster,
) -> None:
    fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    produce(cluster, 5)
    l1, l2 = Recorder(), Recorder()
    c1 = member(cluster, GROUP, enable_auto_commit=True, auto_commit_interval_ms=200)
    c1.subscribe([TOPIC], listener=l1)
    assert isinstance(c1._engine.group, ConsumerGroupMember)
    r1 = Runner(c1)
    r1.start()
    c2 = None
    try:
        wait(lambda: len(r1.records) == 5 * N_PARTS)
        assert c1.assignment() == ALL
        c2 = member(cluster, GROUP, enable_auto_commit=True, auto_commit_interval_ms=200)
        c2.subscribe([TOPIC], listener=l2)
        r2 = Runner(c2)
        r2.start()
        try:
            wait(lambda: len(c1.assignment()) == 2 and len(c2.assignment()) == 2)
            assert c1.assignment().isdisjoint(c2.assignment())
            produce(cluster, 5, start=5)
            wait(lambda: len(r1.records) + len(r2.records) == 10 * N_PARTS)
            seen = [(r.partition, r.offset) for r in r1.records + r2.records]
            assert len(seen) == len(set(seen)) == 10 * N_PARTS  # nothing twice
        finally:
            r2.finish()
        # Incremental: c1 gave up only what moved, and never everything.
        moved = c2.assignment()
        assert ("revoked", moved) in l1.events
        assert ("revoked", ALL) not in l1.events
        assert l2.events == [("assigned", moved)]
        # The revoked partitions were committed with their epochs before moving.
        for tp in moved:
            committed = c2.committed_with_epoch(tp)
            assert committed is not None and committed.leader_epoch == 0
        m = c2.metrics(raw=True)
        assert m is not None and m["heartbeats_sent"] > 0
        assert c2.group_metadata().generation_id >= 2
    finally:
        r1.finish()
        c1.close()
        if c2 is not None:
            c2.close()


def test_restored_committed_offsets_are_validated_before_delivery(
    cluster: EmbeddedCluster,
) -> None:
    """A committed position with an epoch is checked against the leader before records are
    handed out: the log was truncated behind the commit, so it is reported, not skipped."""
    fast_coordinator(cluster)
    old, new = setup_topic(cluster)
    with member(cluster, GROUP, on_truncation="raise") as c1:
        c1.subscribe(["t"])
        got = read(c1, 10)
        assert [r.offset for r in got] == list(range(10))
        diverge(cluster, old, new)
        assert [r.offset for r in read(c1, 5)] == list(range(10, 15))
        c1.commit()
        assert c1.committed_with_epoch(TP0) == EpochOffset(15, 0)
    unclean_elect(cluster, old, new)
    with member(cluster, GROUP, on_truncation="raise") as c2:
        c2.subscribe(["t"])
        with pytest.raises(LogTruncationError) as info:
            read(c2, 1)
        assert info.value.truncation_offsets() == {TP0: EpochOffset(10, 0)}


def test_truncation_seen_by_one_member_is_seen_by_the_next(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    old, new = setup_topic(cluster)
    c1 = member(cluster, GROUP, on_truncation="raise")
    c2 = None
    try:
        c1.subscribe(["t"])
        read(c1, 10)
        diverge(cluster, old, new)
        read(c1, 5)
        c1.commit()
        unclean_elect(cluster, old, new)
        with pytest.raises(LogTruncationError):
            read(c1, 1)
        # c1 stopped on the truncation (the application has not sought). It leaves; the
        # partition moves to c2, which must find the same truncation from the commit.
        c1.close()
        c2 = member(cluster, GROUP, on_truncation="raise")
        c2.subscribe(["t"])
        with pytest.raises(LogTruncationError) as info:
            read(c2, 1)
        assert info.value.truncation_offsets() == {TP0: EpochOffset(10, 0)}
        assert info.value.truncations[TP0].lost_count == 5
    finally:
        c1.close()
        if c2 is not None:
            c2.close()


def test_unclean_election_during_a_rebalance(cluster: EmbeddedCluster) -> None:
    """As on real Kafka (tests/apache_kafka/test_apache_kip848.py): the partition moves
    from c1 to c2 while it has no leader and its log is about to be truncated; c2 starts
    from c1's commit (15 under epoch 0), finds the divergence at 10 and reads the new
    leader's records there (policy rewind) instead of waiting at 15 or reading the new log
    as a continuation."""
    from epochguard.offsets.report import TruncationReport

    fast_coordinator(cluster)
    old, new = setup_topic(cluster)
    reports: list[TruncationReport] = []
    c1 = member(cluster, GROUP)
    c2 = member(cluster, GROUP, on_truncation="rewind", on_truncation_report=reports.append)
    r2 = Runner(c2)
    try:
        c1.subscribe(["t"])
        assert len(read(c1, 10)) == 10
        diverge(cluster, old, new)  # old alone appends 5 more
        assert len(read(c1, 5)) == 5
        c1.commit()
        c2.subscribe(["t"])
        r2.start()
        wait(lambda: c2._engine.group is not None and c2._engine.group.generation > 0)
        cluster.stop_broker(old)  # no leader now
        c1.close()  # the rebalance: t-0 moves to c2
        cluster.start_broker(new)
        cluster.elect_leader("t", 0, new, unclean=True)
        cluster.append("t", 0, [b"new-%d" % i for i in range(8)], batch_size=1)
        cluster.start_broker(old)
        wait(lambda: len(r2.records) >= 8)
        r2.finish()
        assert [(r.offset, r.value) for r in r2.records] == [
            (10 + i, b"new-%d" % i) for i in range(8)
        ]
        (report,) = reports
        assert report.divergence == EpochOffset(10, 0)
        assert report.lost_count == 5
    finally:
        if r2.is_alive():
            r2.stop.set()
            r2.join(10)
        c1.close()
        c2.close()


def test_fenced_member_drops_its_partitions_and_rejoins(cluster: EmbeddedCluster) -> None:
    coord = fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    produce(cluster, 3)
    listener = Recorder()
    with member(cluster, GROUP) as c1:
        c1.subscribe([TOPIC], listener=listener)
        assert len(read(c1, 3 * N_PARTS)) == 3 * N_PARTS
        group = c1._engine.group
        assert isinstance(group, ConsumerGroupMember)
        first_epoch = group.member_epoch
        # The coordinator forgets the member (as after a session expiry it did not see).
        cluster.call(lambda: coord.groups[GROUP].members.clear())
        # Every record delivered from here on: the polls that wait for the rejoin may
        # already read from the restored positions.
        got: list[Any] = []
        wait_polling(c1, lambda: ("revoked", ALL) in listener.events, sink=got)
        wait_polling(c1, lambda: c1.assignment() == ALL, sink=got)
        assert listener.events[-1] == ("assigned", ALL)
        assert group.member_epoch > first_epoch
        # Positions were dropped and restored from the (empty) commits: read from the start.
        produce(cluster, 1, start=3)
        got += read(c1, 4 * N_PARTS - len(got))
        assert sorted((r.partition, r.offset) for r in got) == [
            (p, o) for p in range(N_PARTS) for o in range(4)
        ]


def wait_polling(
    consumer: EpochConsumer, cond: Any, timeout: float = 20.0, sink: list[Any] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        for records in consumer.poll(timeout_ms=20).values():
            if sink is not None:
                sink.extend(records)


def test_regex_subscription_is_evaluated_by_the_broker(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    cluster.create_topic("orders-a", partitions=1, replication_factor=1)
    cluster.create_topic("orders-b", partitions=1, replication_factor=1)
    cluster.create_topic("xorders-a", partitions=1, replication_factor=1)
    with member(cluster, GROUP) as c1:
        c1.subscribe(pattern="orders-.*")
        wait_polling(
            c1,
            lambda: (
                c1.assignment() == {TopicPartition("orders-a", 0), TopicPartition("orders-b", 0)}
            ),
        )
        cluster.create_topic("orders-c", partitions=1, replication_factor=1)
        wait_polling(c1, lambda: TopicPartition("orders-c", 0) in c1.assignment())


def test_unsupported_assignor_is_raised_by_poll(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
    with member(cluster, GROUP, group_remote_assignor="nope") as c1:
        c1.subscribe([TOPIC])
        with pytest.raises(kerrors.UnsupportedAssignorError, match="nope"):
            wait_polling(c1, lambda: False, timeout=10)


def _stopped_for_good(c1: EpochConsumer, error: type[kerrors.KafkaError]) -> None:
    """The heartbeat thread has ended by itself and nothing restarts it: every later poll
    raises ``error`` again and sends no heartbeat."""
    group = c1._engine.group
    assert isinstance(group, ConsumerGroupMember)
    thread = group._heartbeats.task
    assert thread is not None
    thread.join(10)  # returns at once if it stopped; a retrying loop would still be alive
    assert not thread.is_alive(), "the heartbeat thread keeps retrying a fatal error"
    sent = group.heartbeats_sent
    for _ in range(3):
        with pytest.raises(error):
            c1.poll(timeout_ms=20)
    assert group.heartbeats_sent == sent
    assert group._heartbeats.task is thread and group.member_epoch == 0
    assert c1.assignment() == set()


def test_unsupported_assignor_stops_the_member_for_good(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
    with member(cluster, GROUP, group_remote_assignor="nope") as c1:
        c1.subscribe([TOPIC])
        with pytest.raises(kerrors.UnsupportedAssignorError, match="nope"):
            wait_polling(c1, lambda: False, timeout=10)
        _stopped_for_good(c1, kerrors.UnsupportedAssignorError)


def test_group_authorization_failure_loses_the_partitions_and_stops(
    cluster: EmbeddedCluster,
) -> None:
    """GROUP_AUTHORIZATION_FAILED on a heartbeat of a member that owns partitions (an ACL
    removed while it runs): they are lost (revoked without a commit), poll raises
    GroupAuthorizationFailedError, and the member stays stopped until close."""
    fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=1)
    events = Recorder()
    with member(cluster, GROUP) as c1:
        c1.subscribe([TOPIC], listener=events)
        wait_polling(c1, lambda: c1.assignment() == ALL)
        cluster.faults.inject_error(68, 30, count=1)  # ConsumerGroupHeartbeat
        with pytest.raises(kerrors.GroupAuthorizationFailedError):
            wait_polling(c1, lambda: False, timeout=10)
        assert events.events[-1] == ("revoked", ALL)
        _stopped_for_good(c1, kerrors.GroupAuthorizationFailedError)


def test_regex_the_broker_refuses_is_raised_by_poll(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
    with member(cluster, GROUP) as c1:
        c1.subscribe(pattern="(?=k)kt")  # valid for Python's re, not for RE2/J
        with pytest.raises(kerrors.KafkaError, match="not a valid regular expression"):
            wait_polling(c1, lambda: False, timeout=10)


def test_static_member_restart_gets_its_partitions_back_without_a_rebalance(
    cluster: EmbeddedCluster,
) -> None:
    coord = fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    c1 = member(cluster, GROUP, group_instance_id="i1")
    c2 = member(cluster, GROUP)
    try:
        c1.subscribe([TOPIC])
        c2.subscribe([TOPIC])
        deadline = time.monotonic() + 20
        while len(c1.assignment()) != 2 or len(c2.assignment()) != 2:
            assert time.monotonic() < deadline, (c1.assignment(), c2.assignment())
            c1.poll(timeout_ms=20)
            c2.poll(timeout_ms=20)
        held = c1.assignment()
        epoch = cluster.call(lambda: coord.groups[GROUP].group_epoch)
        c1.close()  # a static leave (epoch -2): the assignment waits for i1
        c1 = member(cluster, GROUP, group_instance_id="i1")
        c1.subscribe([TOPIC])
        wait_polling(c1, lambda: c1.assignment() == held)
        for _ in range(10):
            c2.poll(timeout_ms=20)
        assert len(c2.assignment()) == 2
        assert cluster.call(lambda: coord.groups[GROUP].group_epoch) == epoch
    finally:
        c1.close()
        c2.close()


# The scenarios tests/apache_kafka/test_apache_kip848.py runs on real Kafka, here.


def test_split_and_hand_over_as_on_real_kafka(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    kip848_scenarios.split_and_hand_over(cluster, "split", "gsplit")


def test_mixed_group_with_librdkafka_as_on_real_kafka(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    kip848_scenarios.mixed_group_with_librdkafka(cluster, "mixed", "gmix")


def test_member_that_stops_polling_leaves_and_rejoins_on_the_next_poll(
    cluster: EmbeddedCluster,
) -> None:
    coord = fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    listener = Recorder()
    with member(cluster, GROUP, max_poll_interval_ms=1000) as c1:
        c1.subscribe([TOPIC], listener=listener)
        wait_polling(c1, lambda: c1.assignment() == ALL)
        group = c1._engine.group
        assert isinstance(group, ConsumerGroupMember)
        # No poll() for longer than max_poll_interval_ms: the heartbeat thread leaves.
        wait(lambda: not cluster.call(lambda: coord.groups[GROUP].members), timeout=10)
        wait_polling(c1, lambda: ("revoked", ALL) in listener.events)
        wait_polling(c1, lambda: c1.assignment() == ALL)
        assert listener.events[-1] == ("assigned", ALL)


def test_static_member_restart_as_on_real_kafka(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    kip848_scenarios.static_member_restart(cluster, "static", "gstatic")


def test_deleted_topic_re_creation_is_reported_as_on_real_kafka(
    cluster: EmbeddedCluster,
) -> None:
    fast_coordinator(cluster)
    kip848_scenarios.deleted_topic_re_creation_is_reported(cluster, "gone", "ggone")


def test_groups_are_listed_by_type_as_on_real_kafka(cluster: EmbeddedCluster) -> None:
    fast_coordinator(cluster)
    kip848_scenarios.groups_are_listed_by_type(cluster, "listed", "glisted")


def test_unsubscribe_leaves_and_subscribe_joins_again(cluster: EmbeddedCluster) -> None:
    coord = fast_coordinator(cluster)
    cluster.create_topic(TOPIC, partitions=N_PARTS, replication_factor=2)
    with member(cluster, GROUP) as c1:
        c1.subscribe([TOPIC])
        wait_polling(c1, lambda: c1.assignment() == ALL)
        c1.unsubscribe()
        assert c1.assignment() == set()
        assert cluster.call(lambda: dict(coord.groups[GROUP].members)) == {}
        c1.subscribe([TOPIC])
        wait_polling(c1, lambda: c1.assignment() == ALL)
