"""The EmbeddedCluster's own Fetch response writer gives kafka-python's bytes exactly, for
every version it serves, and leaves what it does not write to kafka-python."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse

from epochguard.testing.embedded.fetch_frame import fetch_response_parts

R = FetchResponse
T = R.FetchableTopicResponse
P = T.PartitionData

VERSIONS = range(4, 17)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
records = st.one_of(
    st.none(),
    st.binary(max_size=64),
    # Past the size that travels as its own buffer.
    st.integers(4096, 20000).map(lambda n: bytes(range(256)) * (n // 256) + b"x" * (n % 256)),
)


@st.composite
def answers(draw: Any, version: int) -> Any:
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = [
            P(
                version=version,
                partition_index=draw(i32),
                error_code=draw(st.integers(-(2**15), 2**15 - 1)),
                high_watermark=draw(i64),
                last_stable_offset=draw(i64),
                log_start_offset=draw(i64),
                aborted_transactions=None,
                preferred_read_replica=draw(i32),
                records=draw(records),
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
        if version >= 13:
            topics.append(
                T(
                    version=version,
                    topic_id=uuid.UUID(int=draw(st.integers(0, 2**128 - 1))),
                    partitions=parts,
                )
            )
        else:
            name = draw(st.text(min_size=0, max_size=20))
            topics.append(T(version=version, topic=name, partitions=parts))
    return R(
        version=version,
        throttle_time_ms=draw(i32),
        error_code=draw(st.integers(-(2**15), 2**15 - 1)),
        session_id=draw(i32),
        responses=topics,
    )


def _reference(response: Any, correlation_id: int) -> bytes:
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(data=st.data(), correlation_id=i32)
def test_same_bytes_as_kafka_python(version: int, data: Any, correlation_id: int) -> None:
    response = data.draw(answers(version))
    parts = fetch_response_parts(response, version, correlation_id)
    assert parts is not None
    assert b"".join(parts) == _reference(response, correlation_id)


def test_large_records_are_handed_on_uncopied() -> None:
    big = b"r" * 100_000
    p = P(
        version=12,
        partition_index=0,
        error_code=0,
        high_watermark=1,
        last_stable_offset=1,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=big,
    )
    response = R(
        version=12,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[T(version=12, topic="t", partitions=[p])],
    )
    parts = fetch_response_parts(response, 12, 1)
    assert parts is not None
    assert any(part is big for part in parts)


def _with(version: int, **fields: Any) -> Any:
    p = P(
        version=version,
        partition_index=0,
        error_code=0,
        high_watermark=1,
        last_stable_offset=1,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=b"",
    )
    for key, value in fields.items():
        setattr(p, key, value)
    return R(
        version=version,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[T(version=version, topic="t", topic_id=uuid.uuid4(), partitions=[p])],
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"diverging_epoch": P.EpochEndOffset(version=16, epoch=1, end_offset=5)},
        {"current_leader": P.LeaderIdAndEpoch(version=16, leader_id=1, leader_epoch=2)},
        {"aborted_transactions": []},
        {"aborted_transactions": [P.AbortedTransaction(version=16, producer_id=1, first_offset=0)]},
    ],
    ids=["diverging", "current-leader", "empty-aborted", "aborted"],
)
def test_answers_with_more_are_left_to_kafka_python(fields: dict[str, Any]) -> None:
    assert fetch_response_parts(_with(16, **fields), 16, 1) is None


def test_node_endpoints_are_left_to_kafka_python() -> None:
    response = _with(16)
    response.node_endpoints = [R.NodeEndpoint(version=16, node_id=1, host="h", port=1, rack=None)]
    assert fetch_response_parts(response, 16, 1) is None
