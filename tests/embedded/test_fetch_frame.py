"""The EmbeddedCluster's own Fetch response writer gives kafka-python's bytes exactly, for
every version it serves, and leaves what it does not write to kafka-python."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse

from epochguard.testing.embedded.fetch_frame import (
    StoredBatches,
    fetch_response_parts,
    join_stored_batches,
    write_parts,
)

from ..examples import scaled

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
                # read_committed answers without aborted transactions carry an empty list.
                aborted_transactions=draw(st.sampled_from([None, []])),
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
@settings(max_examples=scaled(60), deadline=None)
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
        {"aborted_transactions": [P.AbortedTransaction(version=16, producer_id=1, first_offset=0)]},
    ],
    ids=["diverging", "current-leader", "aborted"],
)
def test_answers_with_more_are_left_to_kafka_python(fields: dict[str, Any]) -> None:
    assert fetch_response_parts(_with(16, **fields), 16, 1) is None


def test_node_endpoints_are_left_to_kafka_python() -> None:
    response = _with(16)
    response.node_endpoints = [R.NodeEndpoint(version=16, node_id=1, host="h", port=1, rack=None)]
    assert fetch_response_parts(response, 16, 1) is None


stored = st.lists(st.binary(min_size=1, max_size=6000), min_size=1, max_size=4).map(StoredBatches)


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16])
@settings(max_examples=scaled(40), deadline=None)
@given(data=st.data(), correlation_id=i32)
def test_stored_batches_give_the_bytes_of_their_join(
    version: int, data: Any, correlation_id: int
) -> None:
    response = data.draw(answers(version))
    for topic in response.responses:
        for p in topic.partitions:
            if data.draw(st.booleans()):
                p.records = data.draw(stored)
    parts = fetch_response_parts(response, version, correlation_id)
    assert parts is not None
    framed = b"".join(parts)
    join_stored_batches(response)  # what the server does before kafka-python's encoder
    assert not any(
        isinstance(p.records, StoredBatches) for t in response.responses for p in t.partitions
    )
    assert framed == _reference(response, correlation_id)


def test_stored_batches_are_handed_on_uncopied() -> None:
    batches = [b"a" * 50_000, b"b" * 60_000]
    response = _with(12, records=StoredBatches(batches))
    parts = fetch_response_parts(response, 12, 1)
    assert parts is not None
    assert [p for p in parts if len(p) >= 50_000] == batches
    assert all(any(p is b for p in parts) for b in batches)


class _Transport:
    """What ``write_parts`` asks of an asyncio transport, over a given socket; ``tls``
    makes it a TLS transport (an ``sslcontext`` extra)."""

    def __init__(self, sock: socket.socket, tls: bool) -> None:
        self.written: list[Any] = []
        self.extra = {"socket": sock, "sslcontext": object() if tls else None}

    def get_extra_info(self, name: str) -> Any:
        return self.extra[name]

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def writelines(self, parts: list[Any]) -> None:
        self.written.extend(parts)


async def _write_parts_and_read(
    chunks_before: list[bytes], parts: list[bytes], sndbuf: int
) -> tuple[bytes, int]:
    """Write ``chunks_before`` through the transport, then ``parts`` with ``write_parts``,
    on a loopback connection whose reader starts late; the bytes read and the most the
    transport held once ``write_parts`` had started."""
    received = bytearray()
    expected = sum(map(len, chunks_before)) + sum(map(len, parts))
    got_all = asyncio.Event()
    start_reading = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await start_reading.wait()
        while len(received) < expected:
            received.extend(await reader.read(65536))
        got_all.set()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    for chunk in chunks_before:
        writer.write(chunk)
    held = [0]
    before = writer.transport.get_write_buffer_size()

    async def watch() -> None:
        while not got_all.is_set():
            held[0] = max(held[0], writer.transport.get_write_buffer_size() - before)
            await asyncio.sleep(0)

    watcher = asyncio.ensure_future(watch())
    task = asyncio.ensure_future(write_parts(writer, parts))
    await asyncio.sleep(0.05)
    start_reading.set()
    await asyncio.wait_for(task, 30)
    await asyncio.wait_for(got_all.wait(), 30)
    await watcher
    writer.close()
    server.close()
    await server.wait_closed()
    return bytes(received), held[0]


def test_write_parts_writes_every_byte_in_order_holding_one_part_at_most() -> None:
    # A small send buffer and a reader that starts late: what the socket does not take
    # waits in write_parts, and the transport is given one part at a time (never the
    # answer joined), while the peer reads every part in order.
    parts = [bytes([i]) * 300_000 for i in range(1, 9)]
    got, held = asyncio.run(_write_parts_and_read([], parts, sndbuf=4096))
    assert got == b"".join(parts)
    assert held <= 300_000


def test_write_parts_goes_behind_what_the_transport_still_holds() -> None:
    before = [b"\x07" * 2_000_000]
    parts = [b"p" * 10, b"q" * 70_000, b"r" * 5]
    got, _held = asyncio.run(_write_parts_and_read(before, parts, sndbuf=4096))
    assert got == before[0] + b"".join(parts)


def test_write_parts_leaves_tls_to_the_transport() -> None:
    sock, peer = socket.socketpair()
    with sock, peer:
        transport = _Transport(sock, tls=True)

        class Writer:
            pass

        writer = Writer()
        writer.transport = transport  # type: ignore[attr-defined]
        asyncio.run(write_parts(writer, [b"a", b"b"]))  # type: ignore[arg-type]
    assert transport.written == [b"a", b"b"]


def test_write_parts_skips_empty_buffers() -> None:
    # Answers below Fetch v12 end in an empty buffer after a large records section (no
    # tagged fields follow it); writev of only empty buffers returns 0 and must not spin.
    parts = [b"", b"head", b"r" * 70_000, b""]
    got, _held = asyncio.run(_write_parts_and_read([], parts, sndbuf=4096))
    assert got == b"head" + b"r" * 70_000
