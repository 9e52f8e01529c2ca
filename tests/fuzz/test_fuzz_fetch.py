"""Fuzzing Fetch answers end to end on the client side: a FetchResponse with arbitrary
partition fields (unknown error codes, absurd high watermarks, DivergingEpoch with -1s,
garbage or cut record bytes, odd aborted transactions) is encoded, sometimes garbled, decoded
as the connection does, read by ``wire.read_fetch`` and applied by the ``Fetcher``.

Nothing may escape but a typed error: a frame that does not decode fails the request (the
connection layer closes it), an answer that decodes is applied without raising, and damaged
records leave a ``CorruptRecordError`` naming the partition and offset for ``poll``."""

from __future__ import annotations

import struct
import uuid
from types import SimpleNamespace as NS
from typing import Any
from unittest.mock import Mock

from hypothesis import given
from hypothesis import strategies as st
from kafka.future import Future
from kafka.protocol.consumer import FetchResponse
from kafka.structs import TopicPartition

from epochguard.consumer import wire
from epochguard.consumer.config import build_config
from epochguard.consumer.errors import CorruptRecordError
from epochguard.consumer.fetcher import Fetcher, FetchSent, MetadataSent
from epochguard.offsets.events import FetchAction
from epochguard.offsets.policy import OffsetPolicy
from epochguard.offsets.state import PartitionState

from ..consumer.test_crecords import _fetches
from .conftest import fuzz

TP = TopicPartition("t", 0)
TID = uuid.UUID(int=0x1234)
P = FetchResponse.FetchableTopicResponse.PartitionData

_i32 = st.sampled_from([-(2**31), -2, -1, 0, 1, 2**31 - 1]) | st.integers(-(2**31), 2**31 - 1)
_i64 = st.sampled_from([-(2**63), -1, 0, 5, 2**63 - 1]) | st.integers(-(2**63), 2**63 - 1)
_error = st.sampled_from([0, 0, 0, 1, 3, 6, 74, 75, 100, 2, -1, 9999, -(2**15)]) | st.integers(
    -(2**15), 2**15 - 1
)


@st.composite
def _records(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.sampled_from(["valid", "valid", "cut", "garbage", "none", "empty"]))
    if kind == "none":
        return None
    if kind == "empty":
        return b""
    if kind == "garbage":
        return draw(st.binary(max_size=120))
    data = draw(_fetches())
    if kind == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    return data


@st.composite
def _answers(draw: st.DrawFn) -> tuple[int, bytes]:
    v = draw(st.integers(4, 16))
    part = P(
        version=v,
        partition_index=draw(st.sampled_from([0, 0, 0, 1, -1])),
        error_code=draw(_error),
        high_watermark=draw(_i64),
        last_stable_offset=draw(_i64),
        log_start_offset=draw(_i64),
        aborted_transactions=draw(
            st.none()
            | st.lists(
                st.builds(
                    lambda pid, off: P.AbortedTransaction(
                        version=v, producer_id=pid, first_offset=off
                    ),
                    _i64,
                    _i64,
                ),
                max_size=3,
            )
        ),
        preferred_read_replica=-1,
        records=draw(_records()),
    )
    if v >= 12 and draw(st.booleans()):
        part.diverging_epoch = P.EpochEndOffset(
            version=v,
            epoch=draw(st.sampled_from([-1, -1, 0, 2, 3]) | _i32),
            end_offset=draw(st.sampled_from([-1, -1, 0, 4, 12]) | _i64),
        )
    T = FetchResponse.FetchableTopicResponse
    topic = (
        T(version=v, topic_id=TID, partitions=[part])
        if v >= 13
        else T(version=v, topic="t", partitions=[part])
    )
    resp = FetchResponse(
        version=v,
        throttle_time_ms=0,
        error_code=draw(st.sampled_from([0, 0, 0, 70, 71, 9999])),
        session_id=0,
        responses=[topic],
    )
    resp.with_header(correlation_id=7)
    raw = bytearray(resp.encode(header=True, framed=False))
    # Garbling: bytes overwritten or the frame cut, as a broken proxy or a bit flip would.
    for _ in range(draw(st.integers(0, 2))):
        if draw(st.booleans()) and raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        else:
            del raw[draw(st.integers(0, len(raw))) :]
    return v, bytes(raw)


def _metadata() -> Any:
    part = NS(partition_index=0, leader_id=1, leader_epoch=3, error_code=0)
    topic = NS(name="t", error_code=0, topic_id=TID, is_internal=False, partitions=[part])
    return NS(topics=[topic], brokers=[])


def _fetcher() -> tuple[Fetcher, Any]:
    client = Mock()
    client.send.return_value = Future()
    f = Fetcher(
        client,
        build_config({}),
        OffsetPolicy(auto_offset_reset="earliest", on_truncation="raise"),
        None,
        None,
        lambda _e: None,
    )
    tracker = f.add_partition(TP)
    f._on_metadata(MetadataSent(0.0, ["t"]), Future().success(_metadata()))
    tracker.seek(5)
    f.after_input(TP)
    return f, tracker


@fuzz(300)
@given(answer=_answers())
def test_fuzzed_fetch_answers_are_applied_or_rejected_typed(answer: tuple[int, bytes]) -> None:
    version, raw = answer
    f, tracker = _fetcher()
    f.send_requests(0.0)
    assert tracker.state is PartitionState.FETCHING
    action = FetchAction(TP, 1, 5, 3, None, int(tracker._gen))
    try:
        decoded = FetchResponse.decode(raw, version=version, header=True)
    except Exception:
        # The connection layer closes the connection on a frame it cannot parse; the
        # request fails and is retried, which the transport tests cover.
        f._on_fetch(
            FetchSent(1, {TP: action}, {TID: "t"}), Future().failure(ConnectionError("bad"))
        )
    else:
        answer_ = wire.read_fetch(decoded, {TID: "t"})
        assert isinstance(answer_, wire.FetchAnswer)
        f._on_fetch(FetchSent(1, {TP: action}, {TID: "t"}), Future().success(decoded))
    f.process_completions()
    f.send_requests(1.0)
    got = f.fetched_records(1000, lambda _tp: True)
    for recs in got.values():
        assert all(r.offset >= 5 for r in recs)
    for tp, err in f.corrupt_errors.items():
        assert isinstance(err, CorruptRecordError)
        assert err.tp == tp == TP and err.offset == 5
        assert str(err).startswith("[Error 2] CorruptRecordError: t-0: cannot decode")


def test_diverging_epoch_of_minus_ones_is_no_divergence() -> None:
    part = P(
        version=12,
        partition_index=0,
        error_code=0,
        high_watermark=9,
        last_stable_offset=9,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=b"",
    )
    part.diverging_epoch = P.EpochEndOffset(version=12, epoch=-1, end_offset=-1)
    resp = FetchResponse(
        version=12,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[FetchResponse.FetchableTopicResponse(version=12, topic="t", partitions=[part])],
    )
    [p] = wire.read_fetch(resp, {}).partitions
    assert p.diverging is None and p.error is None


def test_unknown_error_code_is_a_typed_kafka_error() -> None:
    import kafka.errors as kerrors

    err = wire.error_from_wire(12345)
    assert err is not None and issubclass(err, kerrors.KafkaError)


def test_corrupt_answer_stops_only_its_partition_without_raising() -> None:
    f, tracker = _fetcher()
    f.send_requests(0.0)
    action = FetchAction(TP, 1, 5, 3, None, int(tracker._gen))
    bad = struct.pack(">qi", 5, -1) + b"\x00" * 60
    part = NS(
        partition_index=0,
        error_code=0,
        diverging_epoch=None,
        records=bad,
        high_watermark=10,
        aborted_transactions=None,
    )
    resp = NS(API_VERSION=12, error_code=0, responses=[NS(topic="t", partitions=[part])])
    f._on_fetch(FetchSent(1, {TP: action}, {}), Future().success(resp))
    err = f.corrupt_errors[TP]
    assert err.tp == TP and err.offset == 5 and "has size -1" in str(err)
    # Not fetched again until a seek; the position has not moved.
    f._client.send.reset_mock()
    f.send_requests(1.0)
    assert all(
        TP not in {(t.topic, p.partition) for t in c.args[1].topics for p in t.partitions}
        for c in f._client.send.call_args_list
        if c.args[1].__class__.__name__ == "FetchRequest"
    )
    assert tracker.position is not None and tracker.position.offset == 5
    f.clear_corrupt(TP)
    assert TP not in f.corrupt and TP not in f.corrupt_errors
