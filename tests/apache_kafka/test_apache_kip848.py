"""KIP-848 (``group.protocol=consumer``) on real Kafka 4.3.1: the message definitions
against a real coordinator's bytes, EpochConsumer members splitting and handing over
partitions with epochs, a mixed group with librdkafka, a truncation one member detected
detected again by the next owner, and an unclean election during a rebalance."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.structs import TopicPartition

from epochguard import EpochConsumer, EpochOffset, LogTruncationError
from epochguard.consumer import wire
from epochguard.consumer.group_messages import (
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatResponse,
)
from epochguard.offsets.report import TruncationReport
from epochguard.testing import produce
from epochguard.testing.apache_kafka import ApacheKafkaCluster

from .. import kip848_scenarios
from ..embedded.wire import Wire
from ..kip848_scenarios import Runner, member, wait
from .test_apache_unclean import B, drive_unclean_election, new_topic

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def poll_until(consumer: EpochConsumer, cond: Any, what: str, timeout: float = 60.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while not cond(got):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for recs in consumer.poll(timeout_ms=100).values():
            got += recs
    return got


# ------------------------------------------------------------ the messages, real bytes


def _raw_call(w: Wire, request: Any) -> bytes:
    """The response payload after its header (flexible: correlation id + tags)."""
    w.send(request)
    size = struct.unpack(">i", w._read(4))[0]
    payload = w._read(size)
    return payload[5:] if request.flexible_version_q(request.API_VERSION) else payload[4:]


@pytest.fixture
def coordinator_wire(cluster: ApacheKafkaCluster) -> Iterator[tuple[Wire, str]]:
    group = new_topic("g848")
    w = Wire(cluster.bootstrap_servers.split(",")[0])
    found = w.call(
        FindCoordinatorRequest(version=3, key=group, key_type=0), FindCoordinatorResponse
    )
    w.close()
    w = Wire(f"{found.host}:{found.port}")
    yield w, group
    w.close()


def test_our_messages_match_what_kafka_sends_and_accepts(
    cluster: ApacheKafkaCluster, coordinator_wire: tuple[Wire, str]
) -> None:
    w, group = coordinator_wire
    topic = new_topic("t848")
    cluster.create_topic(topic, partitions=2)
    join = wire.consumer_group_heartbeat_request(
        wire.MemberHeartbeat(
            group_id=group,
            member_id="m-0123456789abcdef01234",
            member_epoch=0,
            rebalance_timeout_ms=30000,
            subscribed_topics=(topic,),
            server_assignor="range",
            owned={},
        )
    )
    join.API_VERSION = 1
    answer: wire.HeartbeatAnswer | None = None
    deadline = time.monotonic() + 30
    while answer is None or not answer.assignment:
        assert time.monotonic() < deadline, f"no assignment: {answer}"
        raw = _raw_call(w, join)
        decoded = ConsumerGroupHeartbeatResponse.decode(raw, version=1)
        # Kafka's bytes decode and encode back to the same bytes.
        assert decoded.encode() == raw
        answer = wire.read_consumer_group_heartbeat(decoded)
        assert answer.error is None, answer
        if not answer.assignment:
            time.sleep(0.5)
            join = wire.consumer_group_heartbeat_request(
                wire.MemberHeartbeat(
                    group_id=group,
                    member_id="m-0123456789abcdef01234",
                    member_epoch=answer.member_epoch or 0,
                    owned={},
                )
            )
            join.API_VERSION = 1
    # Kafka 4.3.1 starts a group at epoch 1 and bumps it once for the first subscription
    # (the embedded coordinator follows: docs/guides/testing-groups.md).
    assert answer.member_epoch == 2
    assert list(answer.assignment.values()) == [frozenset({0, 1})]
    assert answer.heartbeat_interval_ms == 500

    describe = wire.consumer_group_describe_request([group])
    describe.API_VERSION = 1
    raw = _raw_call(w, describe)
    decoded = ConsumerGroupDescribeResponse.decode(raw, version=1)
    assert decoded.encode() == raw
    (g,) = wire.read_consumer_group_describe(decoded)
    assert (g.error, g.assignor) == (None, "range")
    (m,) = g.members
    assert m.member_id == "m-0123456789abcdef01234"
    assert m.target_assignment == {TopicPartition(topic, 0), TopicPartition(topic, 1)}

    leave = wire.consumer_group_heartbeat_request(
        wire.MemberHeartbeat(
            group_id=group,
            member_id="m-0123456789abcdef01234",
            member_epoch=answer.member_epoch,
            leave="dynamic",
        )
    )
    leave.API_VERSION = 1
    left = wire.read_consumer_group_heartbeat(
        ConsumerGroupHeartbeatResponse.decode(_raw_call(w, leave), version=1)
    )
    assert (left.error, left.member_epoch) == (None, None)


# ------------------------------------------------------------------ EpochConsumer groups


def test_members_split_and_hand_over_with_epochs(cluster: ApacheKafkaCluster) -> None:
    kip848_scenarios.split_and_hand_over(cluster, new_topic("split"), new_topic("gsplit"))


def test_mixed_group_with_librdkafka_consumer_protocol(cluster: ApacheKafkaCluster) -> None:
    kip848_scenarios.mixed_group_with_librdkafka(cluster, new_topic("mixed"), new_topic("gmix"))


def test_static_member_restart_causes_no_rebalance(cluster: ApacheKafkaCluster) -> None:
    kip848_scenarios.static_member_restart(cluster, new_topic("static"), new_topic("gstatic"))


def test_deleted_topic_re_creation_is_reported(cluster: ApacheKafkaCluster) -> None:
    kip848_scenarios.deleted_topic_re_creation_is_reported(
        cluster, new_topic("gone"), new_topic("ggone")
    )


def test_groups_are_listed_by_type(cluster: ApacheKafkaCluster) -> None:
    kip848_scenarios.groups_are_listed_by_type(cluster, new_topic("listed"), new_topic("glisted"))


def test_truncation_one_member_detected_is_detected_by_the_next(
    cluster: ApacheKafkaCluster,
) -> None:
    topic, group = new_topic("handover"), new_topic("ghandover")
    c1 = member(cluster, group, on_truncation="raise")
    c2: EpochConsumer | None = None

    def consume_everything() -> None:
        c1.subscribe([topic])
        poll_until(c1, lambda got: len(got) >= 8, "c1 reads a0..a4, d0..d2")
        c1.commit()

    try:
        t = drive_unclean_election(cluster, topic, before_election=consume_everything)
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        tp = TopicPartition(topic, 0)
        with pytest.raises(LogTruncationError) as first:
            poll_until(c1, lambda _got: False, "c1 detects the truncation")
        assert first.value.truncation_offsets() == {tp: EpochOffset(5, t.first_epoch)}
        c1.close()
        c2 = member(cluster, group, on_truncation="raise")
        c2.subscribe([topic])
        with pytest.raises(LogTruncationError) as second:
            poll_until(c2, lambda _got: False, "c2 detects the truncation")
        assert second.value.truncation_offsets() == {tp: EpochOffset(5, t.first_epoch)}
        assert second.value.truncations[tp].lost_count == 3
    finally:
        c1.close()
        if c2 is not None:
            c2.close()


def test_unclean_election_during_a_rebalance(cluster: ApacheKafkaCluster) -> None:
    """The partition moves from c1 to c2 while its log is being truncated: c2 starts from
    c1's commit (8 under the first epoch), finds the divergence at 5 and reads b0, b1 there
    (policy rewind) instead of waiting at 8 or reading the new log as a continuation."""
    topic, group = new_topic("rebal"), new_topic("grebal")
    reports: list[TruncationReport] = []
    c1 = member(cluster, group)
    c2 = member(cluster, group, on_truncation="rewind", on_truncation_report=reports.append)
    r2 = Runner(c2)

    def consume_then_second_member() -> None:
        c1.subscribe([topic])
        poll_until(c1, lambda got: len(got) >= 8, "c1 reads a0..a4, d0..d2")
        c1.commit()
        c2.subscribe([topic])
        r2.start()
        wait(lambda: c2._engine.group is not None and c2._engine.group.generation > 0, "c2 joins")

    try:
        t = drive_unclean_election(cluster, topic, before_election=consume_then_second_member)
        c1.close()  # the rebalance: t-0 moves to c2 while it has no leader
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        wait(lambda: len(r2.records) >= 2, "c2 reads b0, b1")
        assert [(r.offset, r.value) for r in r2.records] == [(5, b"b0"), (6, b"b1")]
        (report,) = reports
        assert report.divergence == EpochOffset(5, t.first_epoch)
        assert report.lost_count == 3
    finally:
        if r2.is_alive():
            r2.finish()
        c1.close()
        c2.close()


def test_regex_subscription_is_resolved_by_kafka(cluster: ApacheKafkaCluster) -> None:
    """The pattern goes to the coordinator (SubscribedTopicRegex, names empty) and Kafka
    assigns the matching topics, including one created after the subscription."""
    prefix = new_topic("rx")
    cluster.create_topic(f"{prefix}-a")
    cluster.create_topic(f"x{prefix}-b")  # does not match as a whole name
    with member(cluster, new_topic("grx")) as c1:
        c1.subscribe(pattern=f"{prefix}-.*")
        poll_until(
            c1,
            lambda _got: c1.assignment() == {TopicPartition(f"{prefix}-a", 0)},
            "the matching topic",
        )
        cluster.create_topic(f"{prefix}-c")
        poll_until(
            c1,
            lambda _got: TopicPartition(f"{prefix}-c", 0) in c1.assignment(),
            "a topic created later",
        )
