"""``records.fetch_end`` reads from batch headers alone what decoding will return as
``(next_offset, last_epoch)``: the fetcher sends the next fetch on it before decoding."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from epochguard.consumer import records
from epochguard.consumer.records import _fetch_end_python, decode_records, fetch_end

from ..examples import scaled

_CONTROL = 0x20


def _batch(base: int, epoch: int, deltas: list[int], codec: int, control: bool) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=control,
        producer_id=7 if control else -1,
        producer_epoch=0 if control else -1,
        base_sequence=0 if control else -1,
        batch_size=10**8,
    )
    for d in deltas:
        b.append(d, timestamp=1, key=None, value=b"v" * 30, headers=[])
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, base)
    struct.pack_into(">i", raw, 12, epoch)  # outside the CRC
    if control:
        attrs = struct.unpack_from(">h", raw, 21)[0] | _CONTROL
        struct.pack_into(">h", raw, 21, attrs)
        struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    return bytes(raw)


@st.composite
def _fetches(draw: st.DrawFn) -> bytes:
    out = b""
    base = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 5))
        deltas = sorted(draw(st.sets(st.integers(0, 40), min_size=n, max_size=n)))
        out += _batch(
            base,
            draw(st.integers(-1, 5)),
            deltas,
            draw(st.sampled_from([0, 0, 1, 3])),
            draw(st.booleans()),
        )
        base += deltas[-1] + 1 + draw(st.integers(0, 3))
    return out


#: Both walks: the C extension's (``fetch_end`` when it is built) and the Python one.
WALKS = [fetch_end, _fetch_end_python]


def test_the_c_walk_is_used_with_the_c_decoder() -> None:
    if records.DECODER == "c":
        assert records._native_fetch_end is not None
        assert fetch_end(b"") is None


@settings(max_examples=scaled(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_fetches(), cut=st.integers(0, 200), skip=st.integers(0, 50))
def test_fetch_end_is_what_decoding_returns(data: bytes, cut: int, skip: int) -> None:
    chunk = data[: max(0, len(data) - cut)]
    first = struct.unpack_from(">q", data, 0)[0]
    decoded = decode_records(chunk, "t", 0, first + skip)
    for walk in WALKS:
        end = walk(memoryview(chunk))
        if decoded.next_offset is None:
            assert end is None  # no complete batch
        else:
            assert end == (decoded.next_offset, decoded.last_epoch)
    assert fetch_end(bytearray(chunk)) == _fetch_end_python(chunk)


@pytest.mark.parametrize("walk", WALKS)
def test_an_offset_past_64_bits_is_told_exactly(walk: Any) -> None:
    batch = bytearray(_batch(0, 2, [0, 1], 0, False))
    struct.pack_into(">q", batch, 0, 2**63 - 1)  # base offset: the next one is past 64 bits
    assert walk(bytes(batch)) == (2**63 + 1, 2)


@pytest.mark.parametrize("walk", WALKS)
def test_legacy_message_sets_are_left_to_the_decoder(walk: Any) -> None:
    b = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=10**6)
    b.append(0, timestamp=1, key=None, value=b"v")
    assert walk(bytes(b.build())) is None
    assert walk(_batch(10, 3, [0], 0, False) + bytes(b.build()) * 2) is None


@pytest.mark.parametrize("walk", WALKS)
def test_a_batch_cut_short_is_not_counted(walk: Any) -> None:
    one = _batch(10, 3, [0, 1], 0, False)
    two = _batch(12, 4, [0], 0, False)
    assert walk(one + two) == (13, 4)
    assert walk(one + two[:-1]) == (12, 3)
    assert walk(one[:-1]) is None
    assert walk(b"") is None
    assert walk(_batch(12, -1, [0], 0, False)) == (13, None)
    assert walk(one + _batch(12, -1, [0], 0, False)) == (13, 3)


@pytest.mark.skipif(records._native_batch_cuts is None, reason="the C extension cuts")
@settings(max_examples=scaled(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=_fetches(),
    cut=st.integers(0, 200),
    skip=st.integers(0, 50),
    max_records=st.integers(1, 12),
    max_bytes=st.integers(1, 400),
)
def test_decoding_the_pieces_in_turn_is_decoding_the_whole(
    data: bytes, cut: int, skip: int, max_records: int, max_bytes: int
) -> None:
    chunk = data[: max(0, len(data) - cut)]
    offset = struct.unpack_from(">q", data, 0)[0] + skip
    whole = decode_records(chunk, "t", 0, offset)
    cuts = records.batch_cuts(memoryview(chunk), max_records, max_bytes)
    if whole.next_offset is None:
        assert cuts is None  # no complete batch
        return
    assert cuts is not None
    ends = [end for end, _ in cuts]
    assert ends == sorted(set(ends)) and ends[-1] == whole.size
    got: list[Any] = []
    start, at, next_offset, last_epoch = 0, offset, None, None
    for end, count in cuts:
        piece = decode_records(memoryview(chunk)[start:end], "t", 0, at)
        assert piece.size == end - start  # whole batches only
        counts = _record_counts(chunk[start:end])
        assert count == sum(counts)
        # At most max_records records and max_bytes bytes, unless one batch alone is more.
        assert len(counts) == 1 or (sum(counts) <= max_records and end - start <= max_bytes)
        got += piece.records
        next_offset = piece.next_offset
        at = max(at, next_offset)  # the next piece's records from here
        last_epoch = piece.last_epoch if piece.last_epoch is not None else last_epoch
        start = end
    assert got == whole.records
    assert (next_offset, last_epoch) == (whole.next_offset, whole.last_epoch)


def _record_counts(data: bytes) -> list[int]:
    """The records count of each batch of ``data``."""
    counts, pos = [], 0
    while pos < len(data):
        counts.append(struct.unpack_from(">i", data, pos + 57)[0])
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    return counts


@pytest.mark.skipif(records._native_batch_cuts is None, reason="the C extension cuts")
def test_legacy_message_sets_are_not_cut() -> None:
    b = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=10**6)
    b.append(0, timestamp=1, key=None, value=b"v")
    assert records.batch_cuts(bytes(b.build()), 1, 1) is None
    assert records.batch_cuts(b"", 1, 1) is None
