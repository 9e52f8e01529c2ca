"""The lean Fetch response path: ``wire.FetchFrame`` answers equal kafka-python's decoded
``FetchResponse`` ones, malformed frames raise a typed error, the connection parser
reassembles frames however the bytes arrive, and records decode in place."""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import threading
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.parser import KafkaProtocol

from epochguard.consumer import client, records, wire
from epochguard.testing.embedded.records import build_batch

FR = FetchResponse
P = FR.FetchableTopicResponse.PartitionData
VERSIONS = list(range(wire.FETCH_MIN_VERSION, wire.FETCH_MAX_VERSION + 1))
IDS = [uuid.UUID(int=0x1234_5678_9ABC), uuid.UUID(int=0xFEDC_BA98_7654)]


def _partition(index: int, rng: random.Random) -> Any:
    div = rng.choice([(-1, -1), (3, 120), (-1, 7), (0, 0)])
    aborted = rng.choice(
        [None, [], [P.AbortedTransaction(producer_id=rng.randrange(1 << 40), first_offset=5)]]
    )
    return P(
        partition_index=index,
        error_code=rng.choice([0, 0, 6, 74, 75]),
        high_watermark=rng.randrange(1 << 50),
        last_stable_offset=-1,
        log_start_offset=0,
        diverging_epoch=P.EpochEndOffset(epoch=div[0], end_offset=div[1]),
        current_leader=P.LeaderIdAndEpoch(leader_id=rng.choice([-1, 2]), leader_epoch=9),
        snapshot_id=P.SnapshotId(end_offset=-1, epoch=-1),
        aborted_transactions=aborted,
        preferred_read_replica=-1,
        records=rng.choice([None, b"", build_batch([b"v%d" % i for i in range(index + 1)])]),
    )


def _response(version: int, seed: int) -> Any:
    rng = random.Random(seed)
    topics = []
    for t in range(rng.randrange(0, 3)):
        kw: dict[str, Any] = {"topic": f"tópic-{t}"} if version < 13 else {"topic_id": IDS[t]}
        parts = [_partition(i, rng) for i in range(rng.randrange(0, 4))]
        topics.append(FR.FetchableTopicResponse(partitions=parts, **kw))
    response = FR(
        version=version,
        throttle_time_ms=rng.choice([0, 250]),
        error_code=rng.choice([0, 0, 70]) if version >= 7 else 0,
        session_id=0,
        responses=topics,
    )
    if version >= 16 and rng.random() < 0.7:  # KIP-951: where the hinted leaders listen
        response.node_endpoints = [
            FR.NodeEndpoint(node_id=2, host="héllo", port=9092, rack=rng.choice([None, "r1"])),
            FR.NodeEndpoint(node_id=3, host="b3", port=19092, rack=None),
        ]
    return response


def _frame(response: Any, version: int) -> wire.FetchFrame:
    return wire.FetchFrame(version, memoryview(response.encode(version=version)))


def _normalised(answer: wire.FetchAnswer) -> Any:
    return (
        answer.error,
        answer.version,
        [
            (
                p.tp,
                p.error,
                p.high_watermark,
                p.last_stable_offset,
                p.diverging,
                p.aborted,
                p.current_leader,
                _bytes(p.records),
            )
            for p in answer.partitions
        ],
        answer.node_endpoints,
    )


def _bytes(data: Any) -> bytes | None:
    return None if data is None else bytes(data)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("seed", range(8))
def test_frame_answer_equals_kafka_python_answer(version: int, seed: int) -> None:
    response = _response(version, seed)
    names = {IDS[0]: "tópic-0"}  # the second id was not asked for: named ""
    decoded = FR.decode(response.encode(version=version), version=version)
    frame = _frame(response, version)
    assert frame.throttle_time_ms == response.throttle_time_ms
    assert _normalised(wire.read_fetch(frame, names)) == _normalised(
        wire.read_fetch(decoded, names)
    )


def test_leader_hints_are_read_from_v16() -> None:
    """KIP-951: CurrentLeader (a partition's tag 1) and NodeEndpoints (the answer's tag 0),
    read alike from the frame and from kafka-python's decoding."""
    part = P(
        partition_index=0,
        error_code=74,
        high_watermark=-1,
        last_stable_offset=-1,
        log_start_offset=-1,
        current_leader=P.LeaderIdAndEpoch(leader_id=2, leader_epoch=9),
        records=None,
    )
    response = FR(
        version=16,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[FR.FetchableTopicResponse(topic_id=IDS[0], partitions=[part])],
    )
    response.node_endpoints = [FR.NodeEndpoint(node_id=2, host="b2", port=9093, rack="r")]
    decoded = FR.decode(response.encode(version=16), version=16)
    for answer in (wire.read_fetch(_frame(response, 16), {}), wire.read_fetch(decoded, {})):
        assert answer.partitions[0].current_leader == wire.LeaderHint(2, 9)
        assert answer.node_endpoints == (wire.NodeEndpoint(2, "b2", 9093, "r"),)


def test_frame_records_are_views_into_the_frame() -> None:
    batch = build_batch([b"a", b"b"])
    part = _partition(0, random.Random(1))
    part.records = batch
    response = FR(
        version=13,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[FR.FetchableTopicResponse(topic_id=IDS[0], partitions=[part])],
    )
    frame = _frame(response, 13)
    [p] = wire.read_fetch(frame, {IDS[0]: "t"}).partitions
    assert isinstance(p.records, memoryview) and p.records.obj is frame.data.obj
    decoded = records.decode_records(p.records, "t", 0, 0)
    assert [(r.offset, r.value) for r in decoded.records] == [(0, b"a"), (1, b"b")]
    assert all(type(r.value) is bytes for r in decoded.records)


@pytest.mark.parametrize("version", [4, 11, 12, 13])
def test_every_truncation_of_a_frame_raises_a_typed_error(version: int) -> None:
    response = _response(version, 3)
    response.responses = [
        FR.FetchableTopicResponse(
            partitions=[_partition(2, random.Random(4))],
            **({"topic": "t"} if version < 13 else {"topic_id": IDS[0]}),
        )
    ]
    data = response.encode(version=version)
    wire.read_fetch(wire.FetchFrame(version, memoryview(data)), {})  # whole: parses
    for cut in range(len(data)):
        with pytest.raises(wire.MalformedFetchResponse):
            wire.read_fetch(wire.FetchFrame(version, memoryview(data[:cut])), {})


def test_records_length_past_the_frame_is_named() -> None:
    part = _partition(0, random.Random(2))
    part.records = b"R" * 10
    response = FR(
        version=12,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[FR.FetchableTopicResponse(topic="t", partitions=[part])],
    )
    data = bytearray(response.encode(version=12))
    at = data.index(b"\x0b" + b"R" * 10)  # compact length 10 + 1
    data[at] = 0x7F  # 126 bytes: past the frame's end
    with pytest.raises(wire.MalformedFetchResponse, match="records section of 126 bytes"):
        wire.read_fetch(wire.FetchFrame(12, memoryview(bytes(data))), {})


@pytest.mark.parametrize("version", [0, 3, 18])
def test_unread_versions_are_refused(version: int) -> None:
    with pytest.raises(wire.MalformedFetchResponse, match=f"v{version}"):
        wire.FetchFrame(version, memoryview(b"\0" * 8))


# ------------------------------------------------------------------- connection parser


class _Header:
    def __init__(self, api_key: int, version: int, correlation_id: int, response: Any) -> None:
        self.request_api_key = api_key
        self.request_api_version = version
        self.correlation_id = correlation_id
        self._response = response

    def get_response_class(self) -> Any:
        return type(self._response)[self.request_api_version]


def _lean_parser() -> Any:
    parser = KafkaProtocol(client_id="t")
    parser.__class__ = client._LeanParser
    parser._lean_init()
    return parser


def _wire_frames(n: int, rng: random.Random) -> tuple[bytes, list[Any], list[Any]]:
    """``n`` responses framed as a broker sends them (size, correlation id, header tags,
    body): Fetch at random versions, mixed with Metadata answers, some larger than the
    parser's direct-read threshold."""
    from kafka.protocol.metadata import MetadataResponse

    stream = bytearray()
    headers = []
    expected = []
    for cid in range(1, n + 1):
        if rng.random() < 0.7:
            version = rng.choice(VERSIONS)
            response = _response(version, rng.randrange(1000))
            if rng.random() < 0.3:
                big = build_batch([b"x" * 1000] * rng.randrange(60, 200))
                response.responses = [
                    FR.FetchableTopicResponse(
                        partitions=[_partition(0, rng)],
                        **({"topic": "t"} if version < 13 else {"topic_id": IDS[0]}),
                    )
                ]
                response.responses[0].partitions[0].records = big
            body = response.encode(version=version)
            head = cid.to_bytes(4, "big") + (b"\0" if version >= 12 else b"")
            headers.append(_Header(1, version, cid, response))
            expected.append(
                (
                    "fetch",
                    version,
                    _normalised(wire.read_fetch(_decode(response, version), {IDS[0]: "t"})),
                )
            )
        else:
            response = MetadataResponse(version=1, brokers=[], controller_id=1, topics=[])
            body = response.encode(version=1)
            head = cid.to_bytes(4, "big")
            header = _Header(3, 1, cid, response)
            headers.append(header)
            expected.append(("metadata", 1, None))
        frame = head + body
        stream += len(frame).to_bytes(4, "big") + frame
    return bytes(stream), headers, expected


def _parser_awaiting(n: int, rng: random.Random) -> tuple[bytes, Any, list[Any]]:
    """:func:`_wire_frames` and a parser whose requests those frames answer."""
    stream, headers, expected = _wire_frames(n, rng)
    parser = _lean_parser()
    parser.in_flight_requests = deque(headers)
    return stream, parser, expected


def _decode(response: Any, version: int) -> Any:
    return type(response).decode(response.encode(version=version), version=version)


def _check(got: list[tuple[int, Any]], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for (_cid, answer), (kind, version, want) in zip(got, expected, strict=True):
        if kind == "fetch":
            assert isinstance(answer, wire.FetchFrame) and version == answer.API_VERSION
            assert _normalised(wire.read_fetch(answer, {IDS[0]: "t"})) == want
        else:
            assert type(answer).__name__ == "MetadataResponse"


@pytest.mark.parametrize("seed", range(4))
def test_parser_reassembles_frames_fed_in_any_chunks(seed: int) -> None:
    rng = random.Random(seed)
    stream, parser, expected = _parser_awaiting(12, rng)
    got: list[tuple[int, Any]] = []
    pos = 0
    while pos < len(stream):
        step = rng.choice([1, 3, 4, 5, 100, 4096, 70_000, 300_000])
        got += parser.receive_bytes(stream[pos : pos + step])
        pos += step
    _check(got, expected)
    assert [cid for cid, _ in got] == list(range(1, 13))


@pytest.mark.parametrize("seed", range(3))
def test_parser_reads_a_socket_into_its_frames(seed: int) -> None:
    rng = random.Random(100 + seed)
    stream, parser, expected = _parser_awaiting(10, rng)
    a, b = socket.socketpair()
    try:
        # Both ends non-blocking: a full socket buffer only means "read first".
        a.setblocking(False)
        b.setblocking(False)
        got: list[tuple[int, Any]] = []
        sent = 0
        while sent < len(stream) or len(got) < len(expected):
            if sent < len(stream):
                with contextlib.suppress(BlockingIOError):
                    sent += a.send(stream[sent : sent + rng.choice([7, 5000, 200_000])])
            try:
                while parser.recv_from(b):
                    pass
            except BlockingIOError:
                pass
            got += parser.receive_bytes(b"")
        _check(got, expected)
    finally:
        a.close()
        b.close()


def _read_as_sent(stream: bytes, read_once: Callable[[socket.socket], int]) -> None:
    """Send ``stream`` from a thread over a socket pair (the broker's side blocking) and
    call ``read_once`` with the other, non-blocking end whenever it is readable, until it
    has read every byte."""
    ours, broker = socket.socketpair()
    try:
        ours.setblocking(False)
        sender = threading.Thread(target=broker.sendall, args=(stream,))
        sender.start()
        read = 0
        while read < len(stream):
            select.select([ours], [], [], 5.0)
            read += read_once(ours)
        sender.join()
    finally:
        ours.close()
        broker.close()


@pytest.mark.parametrize("budget", [None, 100_000])
def test_a_read_budget_bounds_each_read_of_the_socket(budget: int | None) -> None:
    """Under asyncio one read of a connection must not take a whole large answer off the
    socket (up to fetch_max_bytes): with a read budget each read takes at most that, the
    rest waits in the socket for the next, and every frame still arrives whole."""
    rng = random.Random(7)
    stream, parser, expected = _parser_awaiting(40, rng)
    transport = object.__new__(client._LargeReadTransport)
    transport.read_budget_bytes = budget
    reads: list[int] = []
    got: list[tuple[int, Any]] = []

    def read_once(ours: socket.socket) -> int:
        nonlocal got
        transport._sock = ours
        n, err = transport._recv_frames(parser)
        assert err is None
        reads.append(n)
        got += parser.receive_bytes(b"")
        return n

    _read_as_sent(stream, read_once)
    _check(got, expected)
    assert sum(reads) == len(stream)
    if budget is not None:
        assert max(reads) <= budget
        assert len(reads) >= len(stream) // budget


def test_a_large_frame_is_read_into_its_own_buffer_from_its_head_on() -> None:
    """Frames of ``DIRECT_READ_MIN`` bytes or more go through the scratch buffer (a copy)
    only as far as the read that found their head took them: ``HEAD_READ`` bytes at most,
    not a whole ``RECV_CHUNK`` of a 1 MiB Fetch answer."""
    rng = random.Random(11)
    stream, parser, expected = _parser_awaiting(30, rng)
    sizes = []
    pos = 0
    while pos < len(stream):
        size = int.from_bytes(stream[pos : pos + 4], "big")
        sizes.append(size)
        pos += 4 + size
    large = [size for size in sizes if size >= client.DIRECT_READ_MIN]
    assert large, "the stream must hold large frames"
    small_bytes = sum(4 + size for size in sizes if size < client.DIRECT_READ_MIN)
    copied: list[int] = []
    feed = parser._feed

    def counting_feed(chunk: memoryview) -> None:
        copied.append(len(chunk))
        feed(chunk)

    parser._feed = counting_feed
    got: list[tuple[int, Any]] = []

    def read_once(ours: socket.socket) -> int:
        nonlocal got
        n = 0
        with contextlib.suppress(BlockingIOError):
            n = parser.recv_from(ours)
        got += parser.receive_bytes(b"")
        return n

    _read_as_sent(stream, read_once)
    _check(got, expected)
    assert sum(copied) <= small_bytes + len(sizes) * client.HEAD_READ


def test_parser_refuses_a_mismatched_correlation_id() -> None:
    import kafka.errors as kerrors

    response = _response(12, 1)
    body = (7).to_bytes(4, "big") + b"\0" + response.encode(version=12)
    parser = _lean_parser()
    parser.in_flight_requests = deque([_Header(1, 12, 8, response)])
    with pytest.raises(kerrors.CorrelationIdError):
        parser.receive_bytes(len(body).to_bytes(4, "big") + body)


@pytest.mark.parametrize("decoder", ["c", "python"])
def test_decoders_read_views_like_bytes(decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    native = records._native
    if decoder == "c" and native is None:
        if os.environ.get("CI"):
            pytest.fail(f"the C record decoder must be built in CI: {records._native_reason}")
        pytest.skip(f"C record decoder not built: {records._native_reason}")
    monkeypatch.setattr(records, "_native", native if decoder == "c" else None)
    data = b"".join(
        build_batch([(b"k%d" % i, b"v" * i) for i in range(50)], base_offset=50 * n)
        for n in range(3)
    )
    view = memoryview(bytearray(b"??" + data))[2:]
    a = records.decode_records(data, "t", 0, 10)
    b = records.decode_records(view, "t", 0, 10)
    assert a == b and len(a.records) == 140
    assert all(type(r.key) is bytes and type(r.value) is bytes for r in b.records)
    # Cut inside the last record: the same typed error from a view as from bytes.
    with pytest.raises(records.CorruptRecordError) as from_bytes:
        records.decode_records(_with_last_length(data, 3), "t", 0, 0, check_crcs=False)
    with pytest.raises(records.CorruptRecordError) as from_view:
        records.decode_records(
            memoryview(bytearray(_with_last_length(data, 3))), "t", 0, 0, check_crcs=False
        )
    assert str(from_bytes.value) == str(from_view.value)


def _with_last_length(data: bytes, cut: int) -> bytes:
    """``data`` (three equal batches) with the last batch's records cut by ``cut`` bytes
    and its length field saying so: a complete batch whose last record runs out."""
    size = len(data) // 3
    last = bytearray(data[2 * size : len(data) - cut])
    last[8:12] = (len(last) - 12).to_bytes(4, "big")
    return data[: 2 * size] + bytes(last)


# ---------------------------------------------------------------- reused frame buffers


def _fetch_stream(cid: int, fill: bytes) -> tuple[bytes, _Header]:
    """A v12 Fetch answer framed as a broker sends it: one partition of 100 records of
    1 KB of ``fill``."""
    response = FR(
        version=12,
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            FR.FetchableTopicResponse(
                topic="t",
                partitions=[
                    P(
                        partition_index=0,
                        error_code=0,
                        high_watermark=100,
                        last_stable_offset=100,
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=build_batch([fill * 1024] * 100),
                    )
                ],
            )
        ],
    )
    frame = cid.to_bytes(4, "big") + b"\0" + response.encode(version=12)
    return len(frame).to_bytes(4, "big") + frame, _Header(1, 12, cid, response)


def _answer(parser: Any, cid: int, fill: bytes) -> tuple[wire.FetchedPartition, int]:
    """Feed one answer; its partition (records still a view into the frame) and the id
    of the buffer it was read into."""
    stream, header = _fetch_stream(cid, fill)
    assert len(stream) > client._POOL_MIN  # a pooled frame
    parser.in_flight_requests.append(header)
    [(_cid, frame)] = parser.receive_bytes(stream)
    buffer_id = id(frame.data.obj)
    [partition] = wire.read_fetch(frame, {}).partitions
    return partition, buffer_id


def _values(partition: wire.FetchedPartition) -> set[bytes]:
    return {r.value for r in records.decode_records(partition.records, "t", 0, 0).records}


@pytest.mark.skipif(client._getrefcount is None, reason="frame buffers are reused on CPython")
def test_frame_buffers_are_reused_only_once_nothing_refers_to_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client, "_POOL_MIN", 64 * 1024)  # pooled from 32 MiB on
    parser = _lean_parser()
    a, a_buffer = _answer(parser, 1, b"a")
    decoded_a = records.decode_records(a.records, "t", 0, 0).records
    del a  # decoded: nothing refers to the frame any more
    b, b_buffer = _answer(parser, 2, b"b")
    assert b_buffer == a_buffer  # read into the first answer's buffer
    # Records decoded from it own their keys and values.
    assert {r.value for r in decoded_a} == {b"a" * 1024} and len(decoded_a) == 100
    # An answer not decoded yet (a stored prefetch) keeps its buffer: the next answer goes
    # elsewhere and leaves it intact.
    c, c_buffer = _answer(parser, 3, b"c")
    assert c_buffer != b_buffer
    assert _values(b) == {b"b" * 1024} and _values(c) == {b"c" * 1024}
    del b
    d, d_buffer = _answer(parser, 4, b"d")
    assert d_buffer == b_buffer
    assert _values(c) == {b"c" * 1024} and _values(d) == {b"d" * 1024}
    assert {r.value for r in decoded_a} == {b"a" * 1024}


@pytest.mark.skipif(client._getrefcount is None, reason="frame buffers are reused on CPython")
def test_a_larger_frame_does_not_fit_a_smaller_free_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client, "_POOL_MIN", 64 * 1024)
    parser = _lean_parser()
    small, small_buffer = _answer(parser, 1, b"s")
    del small
    _stream, header = _fetch_stream(2, b"L")
    response = header._response  # with records four times as large
    response.responses[0].partitions[0].records = build_batch([b"L" * 4096] * 100)
    body = (2).to_bytes(4, "big") + b"\0" + response.encode(version=12)
    big = len(body).to_bytes(4, "big") + body
    parser.in_flight_requests.append(header)
    [(_cid, frame)] = parser.receive_bytes(big)
    assert id(frame.data.obj) != small_buffer
    [p] = wire.read_fetch(frame, {}).partitions
    assert _values(p) == {b"L" * 4096}


@pytest.mark.parametrize("huge_pages", [True, False])
def test_new_frame_buffers_are_unfilled_bytearrays_of_the_size_asked(huge_pages: bool) -> None:
    buf = client._new_frame_buffer(100_000, huge_pages)
    assert type(buf) is bytearray and len(buf) == 100_000
    assert len(client._new_frame_buffer(0, huge_pages)) == 0
    if client._new_frame_buffer is not client._zeroed_bytearray:  # the C extension's
        with pytest.raises(ValueError, match="negative"):
            client._new_frame_buffer(-1, huge_pages)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address``."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    return []


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read()
    except OSError:
        return ""


@pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps")
    or client._new_frame_buffer is client._zeroed_bytearray
    or "[madvise]" not in _thp_mode(),
    reason="transparent huge pages on request (Linux, THP in madvise mode, the C extension)",
)
def test_a_large_frame_buffer_asks_for_huge_pages_when_told_to() -> None:
    import ctypes

    size = 16 * 1024 * 1024
    buf = client._new_frame_buffer(size, True)
    middle = ctypes.addressof((ctypes.c_char * size).from_buffer(buf)) + size // 2
    assert "hg" in _vm_flags(middle)
    small_pages = client._new_frame_buffer(size, False)
    middle = ctypes.addressof((ctypes.c_char * size).from_buffer(small_pages)) + size // 2
    assert "hg" not in _vm_flags(middle)


def test_frames_below_the_pooled_size_are_not_kept() -> None:
    parser = _lean_parser()
    small, _ = _answer_unpooled(parser)
    assert parser._pool == [] and _values(small) == {b"s" * 1024}


def _answer_unpooled(parser: Any) -> tuple[wire.FetchedPartition, int]:
    stream, header = _fetch_stream(1, b"s")
    assert len(stream) < client._POOL_MIN
    parser.in_flight_requests.append(header)
    [(_cid, frame)] = parser.receive_bytes(stream)
    [partition] = wire.read_fetch(frame, {}).partitions
    return partition, id(frame.data.obj)
