"""Fuzzing the record-batch decoders: the C extension and the pure-Python fallback give the
same records or the same ``CorruptRecordError`` for any bytes, and nothing else escapes.

Inputs: random bytes; valid fetches (built by kafka-python's independent encoder) with
header fields overwritten (size, magic, attributes incl. codec bits, record count, last
offset delta), body bytes overwritten, or cut; and compression bombs in every codec.
"""

from __future__ import annotations

import gzip
import os
import struct
import tracemalloc
import zlib
from typing import Any

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochguard.consumer import columns, records
from epochguard.consumer.errors import CorruptRecordError
from epochguard.consumer.records import DecodedFetch, decode_records

from ..consumer.test_crecords import _as_rows, _build, _fetches, _tuple_rows
from .conftest import fuzz

NATIVE = records._native


@pytest.fixture(autouse=True)
def _require_c_decoder() -> None:
    if NATIVE is None:
        why = records._native_reason
        if os.environ.get("CI"):
            pytest.fail(f"the C record decoder must be built in CI: {why}")
        pytest.skip(f"C record decoder not built: {why}")


Outcome = tuple[str, Any]


def _plain(out: DecodedFetch) -> Any:
    return ([tuple(r) for r in out.records], out.next_offset, out.last_epoch, out.size)


def _run(native: Any, data: bytes, fetch_offset: int, check_crcs: bool) -> Outcome:
    saved = records._native
    records._native = native
    try:
        out = decode_records(data, "fz", 7, fetch_offset, check_crcs=check_crcs)
    except CorruptRecordError as exc:
        # Typed and naming the problem: the partition and what is wrong.
        assert str(exc), "CorruptRecordError without a message"
        return "error", str(exc)
    finally:
        records._native = saved
    return "ok", _plain(out)


def _same(data: bytes, fetch_offset: int = 0, check_crcs: bool = True) -> Outcome:
    c = _run(NATIVE, data, fetch_offset, check_crcs)
    py = _run(None, data, fetch_offset, check_crcs)
    assert c == py
    return c


def _fix_crc(raw: bytearray, pos: int = 0) -> None:
    """Recompute the CRC of the batch at ``pos`` so that corruption reaches the parsers."""
    (length,) = struct.unpack_from(">i", raw, pos + 8)
    end = min(len(raw), pos + 12 + max(length, 0))
    if end > pos + 21:
        struct.pack_into(">I", raw, pos + 17, crc32c.crc32c(bytes(raw[pos + 21 : end])))


# ------------------------------------------------------------------ properties


@fuzz(300)
@given(data=st.binary(max_size=400), check=st.booleans())
def test_random_bytes(data: bytes, check: bool) -> None:
    _same(data, check_crcs=check)


# Header fields of a v2 batch: (offset, struct format).
_FIELDS = {
    "base_offset": (0, ">q"),
    "length": (8, ">i"),
    "epoch": (12, ">i"),
    "magic": (16, ">b"),
    "attributes": (21, ">h"),
    "last_offset_delta": (23, ">i"),
    "record_count": (57, ">i"),
}
_FIELD_VALUES = {
    ">q": st.integers(-(2**63), 2**63 - 1),
    ">i": st.one_of(
        st.sampled_from([-(2**31), -1, 0, 1, 13, 14, 48, 49, 60, 61, 2**31 - 1]),
        st.integers(-(2**31), 2**31 - 1),
    ),
    ">b": st.integers(-128, 127),
    ">h": st.one_of(st.integers(0, 0x3F), st.integers(-(2**15), 2**15 - 1)),
}


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(_fetches()))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["field", "field", "byte", "cut"]))
        if kind == "field":
            off, fmt = _FIELDS[draw(st.sampled_from(sorted(_FIELDS)))]
            if off + struct.calcsize(fmt) <= len(raw):
                struct.pack_into(fmt, raw, off, draw(_FIELD_VALUES[fmt]))
        elif kind == "byte" and raw:
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]) | st.integers(0, 255))
        elif raw:
            del raw[draw(st.integers(0, len(raw) - 1)) :]
    # Half the time the CRC is made right again, so that the damage reaches the parsers.
    if draw(st.booleans()) and len(raw) >= 21:
        _fix_crc(raw)
    return bytes(raw)


@fuzz(150)
@given(case=_mutated(), fetch_offset=st.sampled_from([0, 5, 2**40]))
def test_mutated_valid_fetches(case: bytes, fetch_offset: int) -> None:
    data = case
    _same(data, fetch_offset, check_crcs=True)
    _same(data, fetch_offset, check_crcs=False)


def _columns(native: Any, data: bytes, fetch_offset: int, check: bool, headers: bool) -> Outcome:
    saved = columns._native
    columns._native = native
    try:
        out = columns.decode_columns(data, "fz", 7, fetch_offset, check_crcs=check, headers=headers)
    except CorruptRecordError as exc:
        assert str(exc), "CorruptRecordError without a message"
        return "error", str(exc)
    finally:
        columns._native = saved
    cols = out.records
    assert isinstance(cols, columns.RecordColumns)
    runs = (cols._run_starts, cols._run_epochs, cols._run_ts_types)
    return "ok", ([bytes(c) for c in cols._cols], runs, out.next_offset, out.last_epoch, out.size)


def _same_columns(data: bytes, fetch_offset: int, check: bool, headers: bool) -> None:
    """The C and Python column decoders write the same bytes in every buffer (headers
    included) or raise the same error; whatever they decode, the tuple decoder decodes
    the same (the reverse does not hold: offsets or timestamps past int64 are an error
    in columns only)."""
    c = _run_columns_pair(data, fetch_offset, check, headers)
    if c[0] == "ok":
        kw: dict[str, Any] = {"check_crcs": check}
        assert _as_rows(data, fetch_offset, headers, **kw) == _tuple_rows(
            data, fetch_offset, headers, **kw
        )


def _run_columns_pair(data: bytes, fetch_offset: int, check: bool, headers: bool) -> Outcome:
    c = _columns(columns._native, data, fetch_offset, check, headers)
    assert c == _columns(None, data, fetch_offset, check, headers)
    return c


@fuzz(300)
@given(data=st.binary(max_size=400), check=st.booleans(), headers=st.booleans())
def test_random_bytes_in_columns(data: bytes, check: bool, headers: bool) -> None:
    _run_columns_pair(data, 0, check, headers)


@fuzz(150)
@given(case=_mutated(), fetch_offset=st.sampled_from([0, 5, 2**40]), headers=st.booleans())
def test_mutated_valid_fetches_in_columns(case: bytes, fetch_offset: int, headers: bool) -> None:
    _same_columns(case, fetch_offset, True, headers)
    _same_columns(case, fetch_offset, False, headers)


@fuzz(100)
@given(
    codec=st.sampled_from([1, 2, 3, 4]),
    body=st.binary(max_size=200),
    count=st.integers(-2, 50),
)
def test_garbage_compressed_bodies(codec: int, body: bytes, count: int) -> None:
    """A batch whose compressed body is garbage (its CRC made right): a typed error naming
    the codec, or records, the same from both decoders."""
    batch = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    batch[61:] = body
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 57, count)
    _fix_crc(batch)
    kind, detail = _same(bytes(batch))
    if kind == "error":
        assert "fz-7: record batch at offset 10" in detail or "fz-7: truncated" in detail


@pytest.mark.parametrize("magic", [-1, 3, 7, 127, -128])
def test_unknown_magic_is_named(magic: int) -> None:
    raw = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    struct.pack_into(">b", raw, 16, magic)
    kind, detail = _same(bytes(raw))
    assert kind == "error" and detail.endswith(f"unknown magic {magic}")


@pytest.mark.parametrize("length", [-(2**31), -1, 0, 13])
def test_sizes_below_the_smallest_record_are_corrupt_not_a_cut(length: int) -> None:
    raw = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    struct.pack_into(">i", raw, 8, length)
    kind, detail = _same(bytes(raw))
    assert kind == "error" and f"has size {length}, less than the minimum 14" in detail


@pytest.mark.parametrize("length", [14, 48])
def test_sizes_below_a_v2_header_are_corrupt(length: int) -> None:
    raw = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    struct.pack_into(">i", raw, 8, length)
    kind, detail = _same(bytes(raw[: 12 + length]), check_crcs=False)
    assert kind == "error" and f"has size {length}, less than a v2 batch header" in detail


def test_absurd_size_is_a_cut_batch() -> None:
    """A size past the end of the bytes is what the broker's byte limit produces: nothing
    decoded yet, not an error (the next fetch asks again)."""
    raw = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    struct.pack_into(">i", raw, 8, 2**31 - 1)
    assert _same(bytes(raw)) == ("ok", ([], None, None, 0))


def test_negative_record_count_is_named() -> None:
    raw = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    struct.pack_into(">i", raw, 57, -5)
    _fix_crc(raw)
    kind, detail = _same(bytes(raw))
    assert kind == "error" and detail.endswith("negative record count -5")


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_bits_are_named(codec: int) -> None:
    raw = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    struct.pack_into(">h", raw, 21, codec)
    _fix_crc(raw)
    kind, detail = _same(bytes(raw))
    assert kind == "error" and detail.endswith(f"unknown compression codec {codec}")


# ------------------------------------------------------------------ compression bombs

_MiB = 1 << 20


def _zeros_stream(compressor: Any, total: int, finish: Any) -> bytes:
    """Compress ``total`` zero bytes a MiB at a time (the bomb is built in small memory)."""
    chunk = bytes(_MiB)
    out = [compressor(chunk) for _ in range(total // _MiB)]
    return b"".join(out) + finish()


def _bomb(codec: int, total: int) -> bytes:
    if codec == 1:
        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return _zeros_stream(z.compress, total, z.flush)
    if codec == 2:
        # A raw snappy block announcing ``total`` bytes: the preamble alone must be refused.
        n, pre = total, bytearray()
        while n >= 0x80:
            pre.append((n & 0x7F) | 0x80)
            n >>= 7
        pre.append(n)
        return bytes(pre) + b"\x00" * 16
    if codec == 3:
        import lz4.frame

        c = lz4.frame.LZ4FrameCompressor()
        head = c.begin()
        return head + _zeros_stream(c.compress, total, c.flush)
    import zstandard

    zc = zstandard.ZstdCompressor().compressobj()
    return _zeros_stream(zc.compress, total, zc.flush)


def _bomb_batch(codec: int, total: int) -> bytes:
    batch = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    batch[61:] = _bomb(codec, total)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, codec)
    _fix_crc(batch)
    return bytes(batch)


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_compression_bomb_is_bounded(codec: int) -> None:
    """A few KB that inflate to twice the limit: refused once the limit is reached, and the
    memory taken stays near the limit (not the announced size)."""
    limit = records.MAX_DECOMPRESSED_BATCH_BYTES
    data = _bomb_batch(codec, 2 * limit)
    assert len(data) < 2 * _MiB
    for native in (NATIVE, None):
        tracemalloc.start()
        try:
            kind, detail = _run(native, data, 0, True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert kind == "error"
        names = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
        assert f"fz-7: record batch at offset 10: {names[codec]} data inflates past" in detail
        assert peak < limit + 8 * _MiB


def test_limit_applies_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    value = b"x" * 5000
    batch = _build(10, 3, 1, False, 0, [(0, 1, None, value, [])])
    assert _same(batch)[0] == "ok"
    monkeypatch.setattr(records, "MAX_DECOMPRESSED_BATCH_BYTES", 1000)
    kind, detail = _same(batch)
    assert kind == "error" and "gzip data inflates past 1000 bytes" in detail


def test_multi_member_gzip_still_decodes() -> None:
    """Java writes one gzip member, but a concatenation is valid gzip too."""
    batch = bytearray(_build(10, 3, 1, False, 0, [(0, 1, None, b"v" * 100, [])]))
    body = gzip.decompress(bytes(batch[61:]))
    half = len(body) // 2
    batch[61:] = gzip.compress(body[:half]) + gzip.compress(body[half:])
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    _fix_crc(batch)
    kind, detail = _same(bytes(batch))
    assert kind == "ok" and [r[7] for r in detail[0]] == [b"v" * 100]


def _legacy_wrapper(value: bytes, codec: int) -> bytes:
    """A v1 compressed wrapper message (offset 10) whose compressed value is ``value``."""
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    b = LegacyRecordBatchBuilder(magic=1, compression_type=codec, batch_size=10**6)
    b.append(0, timestamp=1, key=None, value=b"v")
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, 10)
    (klen,) = struct.unpack_from(">i", raw, 26)
    pos = 30 + max(klen, 0)
    raw[pos:] = struct.pack(">i", len(value)) + value
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">I", raw, 12, zlib.crc32(bytes(raw[16:])))
    return bytes(raw)


def test_legacy_compressed_wrapper_bomb_is_bounded() -> None:
    limit = records.MAX_DECOMPRESSED_BATCH_BYTES
    data = _legacy_wrapper(_bomb(1, 2 * limit), 1)
    tracemalloc.start()
    try:
        kind, detail = _same(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert kind == "error"
    assert "fz-7: legacy message at offset 10: gzip data inflates past" in detail
    assert peak < limit + 8 * _MiB


def test_legacy_compressed_wrapper_still_decodes() -> None:
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    b = LegacyRecordBatchBuilder(magic=1, compression_type=1, batch_size=10**6)
    for i in range(3):
        b.append(i, timestamp=1, key=None, value=b"v%d" % i)
    kind, detail = _same(bytes(b.build()))
    assert kind == "ok" and [r[7] for r in detail[0]] == [b"v0", b"v1", b"v2"]


def _zstd_batch(frame: bytes) -> bytes:
    batch = bytearray(_build(10, 3, 0, False, 0, [(0, 1, b"k", b"v", [])]))
    batch[61:] = frame
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, 4)
    _fix_crc(batch)
    return bytes(batch)


def test_zstd_frame_announcing_more_than_the_limit_is_bounded() -> None:
    """A frame whose header declares its size (past the limit) skips the one-call path
    and is refused by the bounded one."""
    import zstandard

    limit = records.MAX_DECOMPRESSED_BATCH_BYTES
    zc = zstandard.ZstdCompressor(write_content_size=True)
    frame = zc.compress(b"\x00" * (2 * limit))
    assert zstandard.frame_content_size(frame) == 2 * limit
    for native in (NATIVE, None):
        tracemalloc.start()
        try:
            kind, detail = _run(native, _zstd_batch(frame), 0, True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert kind == "error" and "zstd data inflates past" in detail, detail
        assert peak < limit + 8 * _MiB


def test_zstd_frame_that_lies_about_its_size_is_corrupt() -> None:
    import zstandard

    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(b"x" * 1000))
    assert frame[4] == 0x60  # single segment, a 2-byte size field holding size - 256
    frame[5:7] = (500 - 256).to_bytes(2, "little")
    for native in (NATIVE, None):
        kind, detail = _run(native, _zstd_batch(bytes(frame)), 0, True)
        assert kind == "error" and "zstd data does not decompress" in detail, detail
