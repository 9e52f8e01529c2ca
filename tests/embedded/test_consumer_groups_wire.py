"""KIP-848 APIs of the embedded cluster over TCP: ConsumerGroupHeartbeat and
ConsumerGroupDescribe, OffsetCommit/OffsetFetch v9 checked by member epoch, and a group id
that is already a classic group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.consumer import OffsetFetchResponse
from kafka.structs import TopicPartition

from epochguard._errors import ErrorCode
from epochguard.consumer import wire
from epochguard.consumer.group_messages import (
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatResponse,
)
from epochguard.testing import EmbeddedCluster

from .test_groups_wire import commit, to_coordinator
from .wire import Wire

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=2) as c:
        c.create_topic("t", partitions=2)
        yield c


def beat(w: Wire, version: int = 1, **fields: Any) -> wire.HeartbeatAnswer:
    request = wire.consumer_group_heartbeat_request(wire.MemberHeartbeat(**fields))
    request.API_VERSION = version
    return wire.read_consumer_group_heartbeat(w.call(request, ConsumerGroupHeartbeatResponse))


def join(w: Wire, member: str) -> wire.HeartbeatAnswer:
    return beat(
        w,
        group_id="g",
        member_id=member,
        member_epoch=0,
        rebalance_timeout_ms=10000,
        subscribed_topics=("t",),
        owned={},
    )


def test_heartbeat_join_assignment_and_describe(cluster: EmbeddedCluster) -> None:
    w = to_coordinator(cluster, "g")
    try:
        answer = join(w, "m1")
        # Kafka 4.3.1 answers a new group's first subscribed member with epoch 2.
        assert answer.error is None and answer.member_epoch == 2
        assert answer.assignment == {cluster.topic_id("t"): frozenset({0, 1})}
        assert answer.heartbeat_interval_ms > 0
        request = wire.consumer_group_describe_request(["g", "nope"])
        request.API_VERSION = 1
        g, nope = wire.read_consumer_group_describe(w.call(request, ConsumerGroupDescribeResponse))
        assert (g.state, g.group_epoch, g.assignment_epoch, g.assignor) == (
            "Stable",
            2,
            2,
            "uniform",
        )
        (m,) = g.members
        assert m.member_id == "m1" and m.subscribed_topics == ("t",)
        assert m.assignment == {TopicPartition("t", 0), TopicPartition("t", 1)}
        assert nope.error is not None and nope.error.errno == ErrorCode.GROUP_ID_NOT_FOUND
    finally:
        w.close()


def test_heartbeat_to_another_broker_is_not_coordinator(cluster: EmbeddedCluster) -> None:
    right = to_coordinator(cluster, "g")
    port = right.sock.getpeername()[1]
    right.close()
    other = next(
        b for b in cluster.broker_ids if not cluster.broker_address(b).endswith(f":{port}")
    )
    w = Wire.to(cluster, other)
    try:
        assert join(w, "m1").error is not None
        assert join(w, "m1").error.errno == ErrorCode.NOT_COORDINATOR  # type: ignore[union-attr]
    finally:
        w.close()


def test_member_offsets_checked_by_epoch(cluster: EmbeddedCluster) -> None:
    w = to_coordinator(cluster, "g")
    try:
        assert join(w, "m1").member_epoch == 2
        ok = commit(w, "g", "t", {0: (7, 0)}, version=9, generation=2, member="m1")
        assert ok == {0: 0}
        stale = commit(w, "g", "t", {0: (8, 0)}, version=9, generation=1, member="m1")
        assert stale == {0: ErrorCode.STALE_MEMBER_EPOCH}
        old = commit(w, "g", "t", {0: (8, 0)}, version=8, generation=2, member="m1")
        assert old == {0: ErrorCode.UNSUPPORTED_VERSION}
        for member, epoch, error in [
            ("m1", 2, 0),
            ("m1", 1, ErrorCode.STALE_MEMBER_EPOCH),
            ("zz", 2, ErrorCode.UNKNOWN_MEMBER_ID),
            (None, None, 0),
        ]:
            req = wire.member_offset_fetch_request("g", [TopicPartition("t", 0)], member, epoch)
            req.API_VERSION = 9
            top, parts = wire.read_member_offset_fetch(w.call(req, OffsetFetchResponse))
            assert (0 if top is None else top.errno) == error
            if not error:
                assert [(p.offset, p.leader_epoch) for p in parts] == [(7, 0)]
    finally:
        w.close()


def test_offsets_of_an_empty_classic_group_carry_over(cluster: EmbeddedCluster) -> None:
    w = to_coordinator(cluster, "g")
    try:
        # Offsets only (an empty classic group): the consumer group takes them over.
        assert commit(w, "g", "t", {1: (3, 0)}) == {1: 0}
        joined = join(w, "m1")
        assert joined.error is None
        req = wire.member_offset_fetch_request(
            "g", [TopicPartition("t", 1)], "m1", joined.member_epoch
        )
        req.API_VERSION = 9
        _top, parts = wire.read_member_offset_fetch(w.call(req, OffsetFetchResponse))
        assert [p.offset for p in parts] == [3]
    finally:
        w.close()
