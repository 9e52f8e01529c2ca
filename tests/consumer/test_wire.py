"""The wire layer without sockets: requests go through kafka-python's real encoders and
decoders, answers are built with its real response classes, encoded and decoded, then read."""

from __future__ import annotations

import uuid
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import MetadataResponse
from kafka.structs import TopicPartition

from epochguard.consumer import wire

TP = TopicPartition("t", 0)
TID = uuid.UUID("3d9c1c57-5b43-4a8e-9a4f-6b1c3f0e2a11")


def _round_trip(message: Any, version: int) -> Any:
    """Encode with kafka-python at ``version`` and decode it again."""
    return type(message).decode(message.encode(version=version), version=version)


# ------------------------------------------------------------------------------ conversions


@pytest.mark.parametrize(
    ("epoch", "wire_value"), [(None, -1), (0, 0), (1, 1), (2**31 - 1, 2**31 - 1)]
)
def test_epoch_to_wire(epoch: int | None, wire_value: int) -> None:
    assert wire.epoch_to_wire(epoch) == wire_value


@pytest.mark.parametrize("bad", [-1, -2])
def test_negative_epochs_are_refused_going_out(bad: int) -> None:
    with pytest.raises(wire.WireValueError, match=f"leader epoch must be >= 0 or None.*{bad}"):
        wire.epoch_to_wire(bad)


@pytest.mark.parametrize(("value", "core"), [(-1, None), (None, None), (0, 0), (7, 7)])
def test_epoch_and_offset_from_wire(value: int | None, core: int | None) -> None:
    assert wire.epoch_from_wire(value) == core
    assert wire.offset_from_wire(value) == core
    assert wire.node_from_wire(value) == core


def test_topic_ids() -> None:
    assert wire.topic_id_from_wire(None) is None
    assert wire.topic_id_from_wire(wire.ZERO_UUID) is None
    assert wire.topic_id_from_wire(TID) == str(TID)
    assert wire.topic_id_to_wire(None) is None
    assert wire.topic_id_to_wire(str(wire.ZERO_UUID)) is None
    assert wire.topic_id_to_wire("not-a-uuid") is None
    assert wire.topic_id_to_wire(str(TID)) == TID


def test_error_codes_become_kafka_errors_classes() -> None:
    assert wire.error_from_wire(0) is None
    assert wire.error_from_wire(74) is kerrors.FencedLeaderEpochError
    assert wire.error_from_wire(-1) is kerrors.UnknownError
    unknown = wire.error_from_wire(31999)
    assert unknown is not None and issubclass(unknown, kerrors.KafkaError)
    assert unknown.errno == 31999  # the code survives for logs and events


# ---------------------------------------------------------------------------------- Fetch


def _params(**kw: Any) -> wire.FetchParams:
    base: dict[str, Any] = dict(
        max_wait_ms=500, min_bytes=1, max_bytes=50_000_000, partition_max_bytes=1_000_000
    )
    base.update(kw)
    return wire.FetchParams(read_committed=False, **base)


@pytest.mark.parametrize(
    ("cle", "lfe", "wire_cle", "wire_lfe"), [(0, 0, 0, 0), (None, None, -1, -1), (5, 3, 5, 3)]
)
def test_fetch_request_round_trip(
    cle: int | None, lfe: int | None, wire_cle: int, wire_lfe: int
) -> None:
    entry = wire.FetchEntry(TP, 42, cle, lfe, str(TID))
    request, names = wire.fetch_request([entry], _params())
    assert names == {TID: "t"}
    decoded = _round_trip(request, 13)
    assert isinstance(decoded, FetchRequest)
    [topic] = decoded.topics
    assert topic.topic_id == TID
    [p] = topic.partitions
    assert (p.partition, p.fetch_offset) == (0, 42)
    assert (p.current_leader_epoch, p.last_fetched_epoch) == (wire_cle, wire_lfe)


def test_fetch_falls_back_to_names_when_an_id_is_unknown() -> None:
    entries = [
        wire.FetchEntry(TP, 0, 0, None, str(TID)),
        wire.FetchEntry(TopicPartition("u", 1), 5, 2, 1, None),
    ]
    request, names = wire.fetch_request(entries, _params())
    # ``max_version`` is the class's; the cap given at construction is ``_max_version``.
    assert request._max_version == wire.FETCH_MAX_VERSION_BY_NAME
    assert names == {TID: "t"}
    decoded = _round_trip(request, 12)
    assert sorted(t.topic for t in decoded.topics) == ["t", "u"]
    request13, _ = wire.fetch_request(entries[:1], _params())
    assert request13._max_version == wire.FETCH_MAX_VERSION


def test_partitions_of_one_topic_under_two_ids_each_go_under_their_own() -> None:
    # One partition has seen the topic re-created, another not yet (or asks whether a leader
    # serves the other id): one entry per id, each partition under its own, also when
    # forgotten. Sent under the first id found, the other partition fetched another log.
    other = uuid.UUID("7d1c5b6e-0000-4000-8000-000000000002")
    entries = [
        wire.FetchEntry(TP, 3, 0, None, str(TID)),
        wire.FetchEntry(TopicPartition("t", 1), 7, 0, None, str(other)),
    ]
    forgotten = [(TopicPartition("t", 2), str(TID)), (TopicPartition("t", 3), str(other))]
    request, names = wire.fetch_request(entries, _params(), forgotten=forgotten, by_id=True)
    assert names == {TID: "t", other: "t"}
    decoded = _round_trip(request, 13)
    sent = {t.topic_id: [p.partition for p in t.partitions] for t in decoded.topics}
    assert sent == {TID: [0], other: [1]}
    gone = {t.topic_id: list(t.partitions) for t in decoded.forgotten_topics_data}
    assert gone == {TID: [2], other: [3]}


def _fetch_response(version: int, partition: Any, topic: Any) -> Any:
    FR = FetchResponse
    kw: dict[str, Any] = {"topic": topic} if version < 13 else {"topic_id": topic}
    response = FR(
        version=version,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[FR.FetchableTopicResponse(partitions=[partition], **kw)],
    )
    return _round_trip(response, version)


def _fetch_partition(error_code: int = 0, div: tuple[int, int] = (-1, -1)) -> Any:
    P = FetchResponse.FetchableTopicResponse.PartitionData
    return P(
        partition_index=0,
        error_code=error_code,
        high_watermark=10,
        last_stable_offset=10,
        log_start_offset=0,
        diverging_epoch=P.EpochEndOffset(epoch=div[0], end_offset=div[1]),
        current_leader=P.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1),
        snapshot_id=P.SnapshotId(end_offset=-1, epoch=-1),
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=b"",
    )


@pytest.mark.parametrize(
    ("div", "expected"),
    [
        ((-1, -1), None),
        ((0, 12), wire.EpochEnd(0, 12)),
        ((3, 0), wire.EpochEnd(3, 0)),
        ((-1, 7), wire.EpochEnd(None, 7)),
    ],
)
def test_fetch_answer_diverging_epoch(div: tuple[int, int], expected: wire.EpochEnd | None) -> None:
    answer = wire.read_fetch(_fetch_response(12, _fetch_partition(div=div), "t"), {})
    assert answer.error is None and answer.version == 12
    [p] = answer.partitions
    assert p.tp == TP and p.error is None and p.high_watermark == 10
    assert p.diverging == expected


def test_fetch_answer_errors_and_topic_ids() -> None:
    response = _fetch_response(13, _fetch_partition(error_code=75), TID)
    [p] = wire.read_fetch(response, {TID: "t"}).partitions
    assert p.tp == TP
    assert p.error is kerrors.UnknownLeaderEpochError and p.error_code == 75
    # An id the request did not carry cannot be named.
    [q] = wire.read_fetch(response, {}).partitions
    assert q.tp.topic == ""


# ------------------------------------------------------------------- OffsetForLeaderEpoch


def test_offset_for_leader_epoch_round_trip_at_epoch_0() -> None:
    request = wire.offset_for_leader_epoch_request([wire.EpochQuery(TP, 0, 0)])
    decoded = _round_trip(request, 4)
    assert isinstance(decoded, OffsetForLeaderEpochRequest)
    [p] = decoded.topics[0].partitions
    assert (p.partition, p.current_leader_epoch, p.leader_epoch) == (0, 0, 0)
    unknown = _round_trip(wire.offset_for_leader_epoch_request([wire.EpochQuery(TP, None, 4)]), 4)
    assert unknown.topics[0].partitions[0].current_leader_epoch == -1


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ((-1, -1), wire.EpochEnd(None, None)),
        ((0, 0), wire.EpochEnd(0, 0)),
        ((2, 9), wire.EpochEnd(2, 9)),
    ],
)
def test_offset_for_leader_epoch_answer(answer: tuple[int, int], expected: wire.EpochEnd) -> None:
    R = OffsetForLeaderEpochResponse
    T = R.OffsetForLeaderTopicResult
    response = R(
        version=4,
        throttle_time_ms=0,
        topics=[
            T(
                topic="t",
                partitions=[
                    T.EpochEndOffset(
                        error_code=0, partition=0, leader_epoch=answer[0], end_offset=answer[1]
                    )
                ],
            )
        ],
    )
    [(tp, error, end)] = wire.read_offset_for_leader_epoch(_round_trip(response, 4))
    assert (tp, error, end) == (TP, None, expected)


# ----------------------------------------------------------------------------- ListOffsets


@pytest.mark.parametrize(("epoch", "wire_value"), [(0, 0), (None, -1), (9, 9)])
def test_list_offsets_request_fences_at_every_known_epoch(
    epoch: int | None, wire_value: int
) -> None:
    request = wire.list_offsets_request([(TP, wire.EARLIEST_TIMESTAMP, epoch)], True, 1000)
    decoded = _round_trip(request, 4)
    assert isinstance(decoded, ListOffsetsRequest)
    assert decoded.isolation_level == 1
    [p] = decoded.topics[0].partitions
    assert (p.timestamp, p.current_leader_epoch) == (-2, wire_value)


def test_list_offsets_answer() -> None:
    T = ListOffsetsResponse.ListOffsetsTopicResponse
    parts = [
        T.ListOffsetsPartitionResponse(
            partition_index=0, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1
        ),
        T.ListOffsetsPartitionResponse(
            partition_index=1, error_code=74, timestamp=-1, offset=-1, leader_epoch=-1
        ),
        T.ListOffsetsPartitionResponse(
            partition_index=2, error_code=0, timestamp=5, offset=0, leader_epoch=0
        ),
    ]
    response = ListOffsetsResponse(
        version=4, throttle_time_ms=0, topics=[T(name="t", partitions=parts)]
    )
    a, b, c = wire.read_list_offsets(_round_trip(response, 4))
    assert (a.offset, a.leader_epoch, a.error) == (None, None, None)
    assert b.error is kerrors.FencedLeaderEpochError and b.error_code == 74
    assert (c.tp, c.offset, c.leader_epoch, c.timestamp) == (TopicPartition("t", 2), 0, 0, 5)


# -------------------------------------------------------------------------------- Metadata


def test_metadata_answer() -> None:
    R = MetadataResponse
    T = R.MetadataResponseTopic
    P = T.MetadataResponsePartition

    def part(index: int, leader: int, epoch: int, replicas: Any = (), offline: Any = ()) -> Any:
        return P(
            error_code=0,
            partition_index=index,
            leader_id=leader,
            leader_epoch=epoch,
            replica_nodes=list(replicas),
            isr_nodes=[],
            offline_replicas=list(offline),
        )

    response = R(
        version=12,
        throttle_time_ms=0,
        brokers=[],
        cluster_id=None,
        controller_id=1,
        topics=[
            T(
                error_code=0,
                name="t",
                topic_id=TID,
                is_internal=False,
                partitions=[
                    part(0, 1, 0),
                    part(1, -1, -1),
                    part(2, 3, 4, replicas=[1, 2, 3], offline=[2]),
                    part(3, 1, 4, replicas=[1, 2]),
                ],
            ),
            T(
                error_code=3,
                name="gone",
                topic_id=wire.ZERO_UUID,
                is_internal=False,
                partitions=[],
            ),
        ],
    )
    t, gone = wire.read_metadata(_round_trip(response, 12)).topics
    assert (t.name, t.topic_id, t.error) == ("t", str(TID), None)
    assert t.partitions == (
        wire.PartitionLeader(TP, 1, 0),
        wire.PartitionLeader(TopicPartition("t", 1), None, None),
        # KIP-392: a read replica may be any live replica, never an offline one.
        wire.PartitionLeader(TopicPartition("t", 2), 3, 4, (1, 3), (1, 2, 3)),
        wire.PartitionLeader(TopicPartition("t", 3), 1, 4, (1, 2), (1, 2)),
    )
    assert gone.topic_id is None and gone.error is kerrors.UnknownTopicOrPartitionError


def test_metadata_request_lists_topics_or_asks_for_all() -> None:
    some = wire.metadata_request(["a", "b"], False)
    assert [t.name for t in _round_trip(some, 12).topics] == ["a", "b"]
    assert _round_trip(wire.metadata_request(None, False), 12).topics is None


# ------------------------------------------------------------------------ group: offsets


@pytest.mark.parametrize(("epoch", "wire_value"), [(0, 0), (None, -1), (3, 3)])
def test_offset_commit_carries_the_epoch(epoch: int | None, wire_value: int) -> None:
    request = wire.offset_commit_request("g", [(TP, 10, epoch, "m")], None, "", None)
    decoded = _round_trip(request, 8)
    assert isinstance(decoded, OffsetCommitRequest)
    assert decoded.generation_id_or_member_epoch == -1
    [p] = decoded.topics[0].partitions
    assert (p.committed_offset, p.committed_leader_epoch, p.committed_metadata) == (
        10,
        wire_value,
        "m",
    )


# ------------------------------------------------------- group: offsets by topic id (v10)

OTHER_TID = uuid.UUID("0f4e9a2b-7c61-4d58-8e3a-5a9d2c7b1e64")


@pytest.mark.parametrize("member", [False, True])
def test_a_commit_names_topics_by_id_when_every_partition_has_one(member: bool) -> None:
    """v10 on the wire carries the ids and no names; the same request, negotiated down to a
    broker without v10, carries the names."""
    offsets = [(TP, 10, 2, "m"), (TopicPartition("t", 1), 11, 2, "")]
    ids = {tp: str(TID) for tp, *_ in offsets}
    request = (
        wire.member_offset_commit_request("g", offsets, "member", 4, ids)
        if member
        else wire.offset_commit_request("g", offsets, 3, "member", None, ids)
    )
    assert request._max_version == wire.OFFSETS_BY_ID_VERSION == 10
    by_id = _round_trip(request, 10)
    (topic,) = by_id.topics
    assert topic.topic_id == TID
    assert not hasattr(topic, "name") or topic.name in (None, "")
    assert [(p.partition_index, p.committed_offset) for p in topic.partitions] == [
        (0, 10),
        (1, 11),
    ]
    by_name = _round_trip(request, 9)
    assert [t.name for t in by_name.topics] == ["t"]


def test_one_partition_without_an_id_names_every_topic_by_name() -> None:
    offsets = [(TP, 10, 2, ""), (TopicPartition("u", 0), 5, None, "")]
    request = wire.offset_commit_request("g", offsets, None, "", None, {TP: str(TID)})
    assert request._max_version == 8
    assert sorted(t.name for t in _round_trip(request, 8).topics) == ["t", "u"]
    member = wire.member_offset_commit_request("g", offsets, "m", 1, {TP: str(TID)})
    assert member._max_version == wire.MEMBER_OFFSETS_MIN_VERSION


def test_two_incarnations_of_one_name_are_two_entries_by_id() -> None:
    """One partition has seen the re-creation, the other not yet: each commit goes under
    the id of the log it was read from."""
    other = TopicPartition("t", 1)
    topics, by_id = wire.commit_topics(
        [(TP, 10, 0, ""), (other, 3, 0, "")], {TP: str(TID), other: str(OTHER_TID)}
    )
    assert by_id
    assert sorted(
        (t.topic_id, [p.partition_index for p in t.partitions]) for t in topics
    ) == sorted([(TID, [0]), (OTHER_TID, [1])])


def test_an_id_that_is_not_a_uuid_names_the_topic_by_name() -> None:
    # Ids restored from stores written by other tools: the commit still goes, by name.
    topics, by_id = wire.commit_topics([(TP, 10, 0, "")], {TP: "not-a-uuid"})
    assert not by_id
    assert [t.name for t in topics] == ["t"]


def test_a_commit_answer_by_id_reads_its_errors() -> None:
    R = OffsetCommitResponse
    T = R.OffsetCommitResponseTopic
    P = T.OffsetCommitResponsePartition
    answer = R(
        version=10,
        throttle_time_ms=0,
        topics=[T(topic_id=TID, partitions=[P(partition_index=0, error_code=100)])],
    )
    assert wire.commit_errors(_round_trip(answer, 10)) == {kerrors.UnknownTopicIdError}


def test_offset_fetch_answer() -> None:
    R = OffsetFetchResponse
    T = R.OffsetFetchResponseTopic
    P = T.OffsetFetchResponsePartition
    response = R(
        version=7,
        throttle_time_ms=0,
        error_code=0,
        topics=[
            T(
                name="t",
                partitions=[
                    P(
                        partition_index=0,
                        committed_offset=5,
                        committed_leader_epoch=0,
                        metadata="x",
                        error_code=0,
                    ),
                    P(
                        partition_index=1,
                        committed_offset=-1,
                        committed_leader_epoch=-1,
                        metadata="",
                        error_code=0,
                    ),
                ],
            )
        ],
    )
    top, (a, b) = wire.read_offset_fetch(_round_trip(response, 7))
    assert top is None
    assert (a.tp, a.offset, a.leader_epoch, a.metadata) == (TP, 5, 0, "x")
    assert (b.offset, b.leader_epoch) == (None, None)


# ------------------------------------------------------------- Fetch: the request encoder

#: Every version the consumer sends: v4 (the lowest it asks for) to v17.
SENT_VERSIONS = range(wire.FETCH_MIN_VERSION, wire.FETCH_MAX_VERSION + 1)
OTHER = uuid.UUID("7d1c5b6e-0000-4000-8000-000000000002")


def _kafka_python_fetch(request: wire.FetchRequest, version: int) -> Any:
    """The same request built with kafka-python's classes, from what ours says it holds."""
    K = FetchRequest
    return K(
        version=version,
        replica_id=-1,
        max_wait_ms=request.max_wait_ms,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=request.isolation_level,
        session_id=request.session_id,
        session_epoch=request.session_epoch,
        topics=[
            K.FetchTopic(
                topic=t.topic,
                topic_id=t.topic_id,
                partitions=[K.FetchTopic.FetchPartition(**p._asdict()) for p in t.partitions],
            )
            for t in request.topics
        ],
        forgotten_topics_data=[
            K.ForgottenTopic(topic=f.topic, topic_id=f.topic_id, partitions=f.partitions)
            for f in request.forgotten_topics_data
        ],
        rack_id=request.rack_id,
    )


def _random_fetch(seed: int, by_id: bool) -> wire.FetchRequest:
    import random

    rng = random.Random(seed)
    entries = []
    for topic in rng.sample(["t", "tópic", "x" * 130, "u"], rng.randrange(0, 4)):
        tid = rng.choice([str(TID), str(OTHER)]) if by_id else rng.choice([None, str(TID)])
        for p in rng.sample(range(200), rng.choice([1, 2, 5, 130])):
            entries.append(
                wire.FetchEntry(
                    TopicPartition(topic, p),
                    rng.choice([0, 7, 2**40]),
                    rng.choice([None, 0, 5, 2**31 - 1]),
                    rng.choice([None, 0, 4]),
                    tid,
                )
            )
    forgotten = [
        (TopicPartition(rng.choice(["t", "gone"]), p), rng.choice([None, str(TID)]))
        for p in rng.sample(range(300), rng.choice([0, 1, 3, 140]))
    ]
    params = _params_with(
        read_committed=rng.random() < 0.5,
        rack_id=rng.choice(["", "rack-é", "r" * 200]),
        max_wait_ms=rng.choice([0, 500]),
        partition_max_bytes=rng.choice([1, 1 << 20]),
    )
    request, _ = wire.fetch_request(
        entries,
        params,
        session_id=rng.choice([0, 12345]),
        session_epoch=rng.choice([-1, 0, 9]),
        forgotten=forgotten,
        by_id=by_id,
    )
    return request


def _params_with(**kw: Any) -> wire.FetchParams:
    read_committed = kw.pop("read_committed", False)
    base: dict[str, Any] = dict(
        max_wait_ms=500, min_bytes=1, max_bytes=50_000_000, partition_max_bytes=1_000_000
    )
    base.update(kw)
    return wire.FetchParams(read_committed=read_committed, **base)


@pytest.mark.parametrize("version", SENT_VERSIONS)
@pytest.mark.parametrize("seed", range(6))
def test_fetch_request_bytes_equal_kafka_python_encoding(version: int, seed: int) -> None:
    request = _random_fetch(seed, by_id=version >= 13)
    theirs = _kafka_python_fetch(request, version)
    assert request.encode(version=version) == theirs.encode(version=version)
    # As a connection sends it: version negotiated, header (v2 from v12: tagged fields),
    # the frame's length first.
    for client_id in ("epochguard", None, "clïent"):
        request.API_VERSION = version
        request.with_header(correlation_id=seed * 1000 + version, client_id=client_id)
        theirs.with_header(correlation_id=seed * 1000 + version, client_id=client_id)
        assert request.encode(header=True, framed=True) == theirs.encode(header=True, framed=True)
        assert request.header is not None
        assert request.header.request_api_version == version
        assert request.header.correlation_id == seed * 1000 + version


def test_fetch_request_is_negotiated_and_answered_as_kafka_python_expects() -> None:
    from kafka.protocol.broker_version_data import BrokerVersionData

    entries = [wire.FetchEntry(TP, 0, 0, None, str(TID))]
    request, _ = wire.fetch_request(entries, _params_with())
    broker = BrokerVersionData(api_versions={1: (0, 15)})
    assert broker.api_version(request) == 15
    by_name, _ = wire.fetch_request([wire.FetchEntry(TP, 0, 0, None, None)], _params_with())
    assert broker.api_version(by_name) == wire.FETCH_MAX_VERSION_BY_NAME
    old = BrokerVersionData(api_versions={1: (0, 3)})
    with pytest.raises(kerrors.IncompatibleBrokerVersion):
        old.api_version(request)  # below v4: refused, as kafka-python's own request is
    request.API_VERSION = 15
    request.with_header(correlation_id=3, client_id="c")
    assert request.expect_response()
    header = request.header
    assert header is not None
    assert (header.request_api_key, header.request_api_version) == (1, 15)
    assert header.get_response_class() is FetchResponse[15]


def test_fetch_request_refuses_versions_it_does_not_encode() -> None:
    request, _ = wire.fetch_request([wire.FetchEntry(TP, 0, 0, None, str(TID))], _params_with())
    with pytest.raises(ValueError, match="Version required"):
        request.encode()
    with pytest.raises(ValueError, match="v3"):
        request.encode(version=3)
    with pytest.raises(ValueError, match="v18"):
        request.encode(version=18)


def test_fetch_request_refuses_negative_epochs() -> None:
    with pytest.raises(wire.WireValueError, match="leader epoch"):
        wire.fetch_request([wire.FetchEntry(TP, 0, -2, None, None)], _params_with())
    with pytest.raises(wire.WireValueError, match="last fetched epoch"):
        wire.fetch_request([wire.FetchEntry(TP, 0, 1, -1, None)], _params_with())
