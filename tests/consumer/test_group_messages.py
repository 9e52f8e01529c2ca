"""KIP-848 messages (ConsumerGroupHeartbeat, API 68; ConsumerGroupDescribe, API 69): byte
fixtures written field by field from the protocol definition, and the wire layer's reading
of them (-1 epochs, null assignments, error codes).

Flexible versions throughout: compact strings are ``uvarint(len + 1)`` then the bytes (0 is
null), compact arrays ``uvarint(count + 1)`` then the items (0 is null), a nullable struct
is ``int8`` -1 (null) or 1 then the struct, and every struct ends with a tagged-field
section (``00``: none)."""

from __future__ import annotations

import uuid

import kafka.errors as kerrors
import pytest
from kafka.protocol.consumer import OffsetCommitRequest, OffsetFetchRequest
from kafka.structs import TopicPartition

from epochguard.consumer import wire
from epochguard.consumer.group_messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)

TID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
TID_HEX = "00112233445566778899aabbccddeeff"


def _hex(*parts: str) -> bytes:
    return bytes.fromhex("".join(p.replace(" ", "") for p in parts))


# A member joining: group "g", member "m", epoch 0, no instance id, rack "r1", rebalance
# timeout 300000 ms, topics ["t"], no regex, assignor "uniform", owns nothing yet ([]).
JOIN_V1 = _hex(
    "02 67",  # GroupId "g"
    "02 6d",  # MemberId "m"
    "00000000",  # MemberEpoch 0
    "00",  # InstanceId null
    "03 7231",  # RackId "r1"
    "000493e0",  # RebalanceTimeoutMs 300000
    "02 02 74",  # SubscribedTopicNames ["t"]
    "00",  # SubscribedTopicRegex null (v1+)
    "08 756e69666f726d",  # ServerAssignor "uniform"
    "01",  # TopicPartitions []
    "00",  # tagged fields
)
# The same member leaving: epoch -1, everything else null / -1 ("unchanged").
LEAVE_V1 = _hex("02 67", "02 6d", "ffffffff", "00", "00", "ffffffff", "00", "00", "00", "00", "00")
# A member that owns partitions 0 and 2 of TID, regex "t.*".
OWNED_V1 = _hex(
    "02 67",
    "02 6d",
    "00000005",  # MemberEpoch 5
    "00",
    "00",
    "ffffffff",
    "00",  # SubscribedTopicNames null (unchanged)
    "04 742e2a",  # SubscribedTopicRegex "t.*"
    "00",
    "02",  # TopicPartitions: one topic
    TID_HEX,
    "03 00000000 00000002",  # Partitions [0, 2]
    "00",  # topic's tagged fields
    "00",
)
# The coordinator's answer: epoch 6, interval 5000 ms, assignment {TID: [1]}.
ANSWER_V1 = _hex(
    "00000000",  # ThrottleTimeMs
    "0000",  # ErrorCode
    "00",  # ErrorMessage null
    "02 6d",  # MemberId "m"
    "00000006",  # MemberEpoch 6
    "00001388",  # HeartbeatIntervalMs 5000
    "01",  # Assignment present
    "02",
    TID_HEX,
    "02 00000001",  # Partitions [1]
    "00",  # topic's tagged fields
    "00",  # Assignment's tagged fields
    "00",
)
# FENCED_MEMBER_EPOCH (110), no member id, epoch -1, no assignment.
FENCED_V1 = _hex("00000000", "006e", "07 66656e636564", "00", "ffffffff", "00001388", "ff", "00")


def test_join_request_bytes() -> None:
    req = wire.consumer_group_heartbeat_request(
        wire.MemberHeartbeat(
            group_id="g",
            member_id="m",
            member_epoch=0,
            rack_id="r1",
            rebalance_timeout_ms=300000,
            subscribed_topics=("t",),
            server_assignor="uniform",
            owned={},
        )
    )
    assert req.encode(version=1) == JOIN_V1
    back = ConsumerGroupHeartbeatRequest.decode(JOIN_V1, version=1)
    assert (back.group_id, back.member_id, back.member_epoch) == ("g", "m", 0)
    assert back.rack_id == "r1"
    assert back.subscribed_topic_names == ["t"]
    assert back.topic_partitions == []
    assert back.instance_id is None


def test_leave_request_bytes() -> None:
    hb = wire.MemberHeartbeat(group_id="g", member_id="m", member_epoch=7, leave="dynamic")
    assert wire.consumer_group_heartbeat_request(hb).encode(version=1) == LEAVE_V1


def test_static_leave_is_epoch_minus_two() -> None:
    hb = wire.MemberHeartbeat(
        group_id="g", member_id="m", member_epoch=7, leave="static", instance_id="i"
    )
    req = ConsumerGroupHeartbeatRequest.decode(
        wire.consumer_group_heartbeat_request(hb).encode(version=1), version=1
    )
    assert (req.member_epoch, req.instance_id) == (-2, "i")


def test_owned_partitions_and_regex_bytes() -> None:
    hb = wire.MemberHeartbeat(
        group_id="g",
        member_id="m",
        member_epoch=5,
        subscribed_regex="t.*",
        owned={str(TID): frozenset({2, 0})},
    )
    assert wire.consumer_group_heartbeat_request(hb).encode(version=1) == OWNED_V1


def test_v0_has_no_regex_field() -> None:
    req = ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="m",
        member_epoch=-1,
        instance_id=None,
        rack_id=None,
        rebalance_timeout_ms=-1,
        subscribed_topic_names=None,
        server_assignor=None,
        topic_partitions=None,
    )
    # v0 is v1 without the SubscribedTopicRegex byte.
    assert req.encode(version=0) == LEAVE_V1[:-3] + LEAVE_V1[-2:]


@pytest.mark.parametrize(
    ("hb", "message"),
    [
        (wire.MemberHeartbeat("g", "m", -1), "member epoch"),
        (wire.MemberHeartbeat("g", "m", 1, leave="static"), "instance id"),
        (wire.MemberHeartbeat("g", "m", 1, leave="later"), "leave"),
        (wire.MemberHeartbeat("g", "m", 1, rebalance_timeout_ms=-5), "rebalance timeout"),
        (wire.MemberHeartbeat("g", "m", 1, owned={"not-a-uuid": frozenset({0})}), "topic id"),
    ],
)
def test_bad_heartbeats_are_refused_by_name(hb: wire.MemberHeartbeat, message: str) -> None:
    with pytest.raises(wire.WireValueError, match=message):
        wire.consumer_group_heartbeat_request(hb)


def test_answer_bytes_are_read() -> None:
    answer = wire.read_consumer_group_heartbeat(
        ConsumerGroupHeartbeatResponse.decode(ANSWER_V1, version=1)
    )
    assert answer == wire.HeartbeatAnswer(
        error=None,
        error_message=None,
        member_id="m",
        member_epoch=6,
        heartbeat_interval_ms=5000,
        assignment={str(TID): frozenset({1})},
    )
    built = ConsumerGroupHeartbeatResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        member_id="m",
        member_epoch=6,
        heartbeat_interval_ms=5000,
        assignment=ConsumerGroupHeartbeatResponse.Assignment(
            topic_partitions=[
                ConsumerGroupHeartbeatResponse.Assignment.TopicPartitions(
                    topic_id=TID, partitions=[1]
                )
            ]
        ),
    )
    assert built.encode(version=1) == ANSWER_V1


def test_fenced_answer_converts_wire_values() -> None:
    answer = wire.read_consumer_group_heartbeat(
        ConsumerGroupHeartbeatResponse.decode(FENCED_V1, version=1)
    )
    assert answer.error is kerrors.FencedMemberEpochError
    assert answer.error_message == "fenced"
    # -1: out of the group; null member id and assignment: not given.
    assert (answer.member_epoch, answer.member_id, answer.assignment) == (None, None, None)


def test_an_empty_assignment_is_not_an_unchanged_one() -> None:
    R = ConsumerGroupHeartbeatResponse
    msg = R(
        throttle_time_ms=0,
        error_code=0,
        member_id=None,
        member_epoch=3,
        heartbeat_interval_ms=100,
        assignment=R.Assignment(topic_partitions=[]),
    )
    answer = wire.read_consumer_group_heartbeat(R.decode(msg.encode(version=1), version=1))
    assert answer.assignment == {}


def test_zero_topic_id_in_an_assignment_is_a_protocol_error() -> None:
    bad = ANSWER_V1.replace(bytes.fromhex(TID_HEX), bytes(16))
    with pytest.raises(kerrors.KafkaProtocolError, match="zero uuid"):
        wire.read_consumer_group_heartbeat(ConsumerGroupHeartbeatResponse.decode(bad, version=1))


# ---------------------------------------------------------------------- ConsumerGroupDescribe

DESCRIBE_REQ_V0 = _hex("02 02 67", "00", "00")  # GroupIds ["g"], no operations, no tags


def _describe_answer(version: int) -> bytes:
    member_type = "01" if version >= 1 else ""  # MemberType 1 (consumer), v1+
    return _hex(
        "00000000",  # ThrottleTimeMs
        "02",  # one group
        "0000",
        "00",
        "02 67",  # GroupId "g"
        "07 537461626c65",  # GroupState "Stable"
        "00000004",  # GroupEpoch 4
        "00000004",  # AssignmentEpoch 4
        "08 756e69666f726d",  # AssignorName "uniform"
        "02",  # one member
        "02 6d",  # MemberId
        "02 69",  # InstanceId "i"
        "00",  # RackId null
        "00000004",  # MemberEpoch
        "02 63",  # ClientId "c"
        "0b 2f3132372e302e302e31",  # ClientHost "/127.0.0.1"
        "02 02 74",  # SubscribedTopicNames ["t"]
        "00",  # SubscribedTopicRegex null
        "02",
        TID_HEX,
        "02 74",
        "02 00000000",
        "00",
        "00",  # Assignment {t: [0]}
        "02",
        TID_HEX,
        "02 74",
        "03 00000000 00000001",
        "00",
        "00",  # TargetAssignment {t: [0, 1]}
        member_type,
        "00",  # member's tags
        "80000000",  # AuthorizedOperations (not asked)
        "00",  # group's tags
        "00",
    )


def test_describe_request_bytes() -> None:
    assert wire.consumer_group_describe_request(["g"]).encode(version=0) == DESCRIBE_REQ_V0
    assert ConsumerGroupDescribeRequest.decode(DESCRIBE_REQ_V0, version=1).group_ids == ["g"]


@pytest.mark.parametrize("version", [0, 1])
def test_describe_answer_is_read(version: int) -> None:
    (group,) = wire.read_consumer_group_describe(
        ConsumerGroupDescribeResponse.decode(_describe_answer(version), version=version)
    )
    assert (group.group_id, group.state, group.group_epoch, group.assignor) == (
        "g",
        "Stable",
        4,
        "uniform",
    )
    (member,) = group.members
    assert member.instance_id == "i"
    assert member.rack_id is None
    assert member.assignment == {TopicPartition("t", 0)}
    assert member.target_assignment == {TopicPartition("t", 0), TopicPartition("t", 1)}


# ------------------------------------------------------------- offsets of a KIP-848 member


def test_member_offset_commit_carries_the_member_epoch_at_v9() -> None:
    req = wire.member_offset_commit_request("g", [(TopicPartition("t", 0), 10, 3, "")], "m", 7)
    back = OffsetCommitRequest.decode(req.encode(version=9), version=9)
    assert (back.generation_id_or_member_epoch, back.member_id) == (7, "m")
    assert back.topics[0].partitions[0].committed_leader_epoch == 3
    with pytest.raises(wire.WireValueError, match="member epoch"):
        wire.member_offset_commit_request("g", [], "m", -1)


def test_member_offset_fetch_names_the_member() -> None:
    req = wire.member_offset_fetch_request("g", [TopicPartition("t", 1)], "m", 4)
    (g,) = OffsetFetchRequest.decode(req.encode(version=9), version=9).groups
    assert (g.group_id, g.member_id, g.member_epoch) == ("g", "m", 4)
    anonymous = wire.member_offset_fetch_request("g", [TopicPartition("t", 1)], None, None)
    (g,) = OffsetFetchRequest.decode(anonymous.encode(version=9), version=9).groups
    assert (g.member_id, g.member_epoch) == (None, -1)


# ------------------------------------------------- bytes a Kafka 4.3.1 coordinator sent
# Captured from ApacheKafkaCluster (one broker, topic "fixture" with 2 partitions, member
# "member-fixture-0000000001" joining group "g" with the uniform assignor), after the header.

KAFKA_TOPIC_ID = "dcc5a011-6866-4ed6-aa40-15aac88aeb57"
KAFKA_JOIN_ANSWER = bytes.fromhex(
    "000000000000001a6d656d6265722d666978747572652d3030303030303030303100000002000001f401"
    "02dcc5a01168664ed6aa4015aac88aeb57030000000000000001000000"
)
KAFKA_DESCRIBE_ANSWER = bytes.fromhex(
    "0000000002000000026707537461626c65000000020000000208756e69666f726d021a6d656d6265722d"
    "666978747572652d303030303030303030310000000000020a776972652d746573740b2f3132372e302e"
    "302e310208666978747572650102dcc5a01168664ed6aa4015aac88aeb57086669787475726503000000"
    "0000000001000002dcc5a01168664ed6aa4015aac88aeb57086669787475726503000000000000000100"
    "000100800000000000"
)
KAFKA_FENCED_ANSWER = bytes.fromhex(
    "00000000006ea20154686520636f6e73756d65722067726f7570206d656d62657220686173206120677265"
    "61746572206d656d6265722065706f63682028393929207468616e20746865206f6e65206b6e6f776e2062"
    "79207468652067726f757020636f6f7264696e61746f72202832292e20546865206d656d626572206d7573"
    "74206162616e646f6e20616c6c2069747320706172746974696f6e7320616e642072656a6f696e2e0000"
    "00000000000000ff00"
)


def test_kafka_join_answer_reads_and_encodes_back() -> None:
    decoded = ConsumerGroupHeartbeatResponse.decode(KAFKA_JOIN_ANSWER, version=1)
    assert decoded.encode() == KAFKA_JOIN_ANSWER
    answer = wire.read_consumer_group_heartbeat(decoded)
    assert answer.error is None
    assert answer.member_id == "member-fixture-0000000001"
    assert answer.member_epoch == 2 and answer.heartbeat_interval_ms == 500
    assert answer.assignment == {KAFKA_TOPIC_ID: frozenset({0, 1})}


def test_kafka_describe_answer_reads_and_encodes_back() -> None:
    decoded = ConsumerGroupDescribeResponse.decode(KAFKA_DESCRIBE_ANSWER, version=1)
    assert decoded.encode() == KAFKA_DESCRIBE_ANSWER
    (group,) = wire.read_consumer_group_describe(decoded)
    assert (group.state, group.group_epoch, group.assignor) == ("Stable", 2, "uniform")
    (m,) = group.members
    assert m.subscribed_topics == ("fixture",)
    # Kafka describes "no regex" as the empty string, not null.
    assert m.subscribed_regex == ""
    both = {TopicPartition("fixture", 0), TopicPartition("fixture", 1)}
    assert m.assignment == m.target_assignment == both
    assert decoded.groups[0].members[0].member_type == 1


def test_kafka_fenced_answer_reads_and_encodes_back() -> None:
    decoded = ConsumerGroupHeartbeatResponse.decode(KAFKA_FENCED_ANSWER, version=1)
    assert decoded.encode() == KAFKA_FENCED_ANSWER
    answer = wire.read_consumer_group_heartbeat(decoded)
    assert answer.error is kerrors.FencedMemberEpochError
    assert answer.error_message is not None and "(99)" in answer.error_message
    assert (answer.member_id, answer.assignment) == (None, None)
