"""The C record decoder against the pure-Python one: same records, same errors.

Batches are built with kafka-python's ``DefaultRecordBatchBuilder`` (an independent
encoder), then decoded twice in one process: once with ``records._native`` (the C
``decode_batch_records``) and once with it set to ``None`` (the Python fallback).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from epochguard.consumer import columns, records
from epochguard.consumer.errors import CorruptRecordError, RecordDeserializationError
from epochguard.consumer.records import DecodedFetch, decode_records

from ..examples import scaled

NATIVE = records._native


@pytest.fixture(autouse=True)
def _require_c_decoder() -> None:
    if NATIVE is None:
        why = records._native_reason
        if os.environ.get("CI"):
            pytest.fail(f"the C record decoder must be built in CI: {why}")
        pytest.skip(f"C record decoder not built: {why}")


Outcome = tuple[str, Any]


def _decode_both(data: bytes, fetch_offset: int = 0, **kwargs: Any) -> tuple[Outcome, Outcome]:
    def run(native: Any) -> Outcome:
        saved = records._native
        records._native = native
        try:
            out = decode_records(data, "topic", 3, fetch_offset, **kwargs)
        except CorruptRecordError as exc:
            return "error", str(exc)
        finally:
            records._native = saved
        return "ok", _plain(out)

    return run(NATIVE), run(None)


def _plain(out: DecodedFetch) -> Any:
    for r in out.records:
        assert type(r) is records.ConsumerRecord
    return ([tuple(r) for r in out.records], out.next_offset, out.last_epoch, out.size)


# ------------------------------------------------------------------ building batches

_CODECS = [0, 1, 2, 3, 4]  # none, gzip, snappy, lz4, zstd
_CRC = struct.Struct(">I")


def _set_attributes(raw: bytearray, extra: int) -> None:
    """Turn on attribute bits the producer-side builder never sets (control, log-append
    time); the CRC covers the attributes, so it is recomputed."""
    attrs = struct.unpack_from(">h", raw, 21)[0] | extra
    struct.pack_into(">h", raw, 21, attrs)
    _CRC.pack_into(raw, 17, crc32c.crc32c(bytes(raw[21:])))


def _build(
    base_offset: int,
    epoch: int,
    codec: int,
    transactional: bool,
    extra_attrs: int,
    recs: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=7 if transactional else -1,
        producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1,
        batch_size=10**8,
    )
    for delta, ts, key, value, headers in recs:
        b.append(delta, timestamp=ts, key=key, value=value, headers=headers)
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, base_offset)  # baseOffset and the epoch are outside the CRC
    struct.pack_into(">i", raw, 12, epoch)
    if extra_attrs:
        _set_attributes(raw, extra_attrs)
    return bytes(raw)


_blobs = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=100, max_size=300))
_headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3
)
_record_lists = st.lists(
    st.tuples(st.integers(-(2**40), 2**40), _blobs, _blobs, _headers), min_size=1, max_size=12
)


@st.composite
def _fetches(draw: st.DrawFn) -> bytes:
    out = b""
    next_base = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 4))):
        recs = draw(_record_lists)
        # Offset deltas increase but may skip (compacted logs); large gaps cross 2-byte varints.
        deltas, d = [], 0
        for _r in recs:
            deltas.append(d)
            d += draw(st.sampled_from([1, 1, 1, 2, 200, 70000]))
        base_ts = draw(st.integers(0, 2**42))
        batch = _build(
            next_base,
            draw(st.integers(-1, 2**31 - 1)),
            draw(st.sampled_from(_CODECS)),
            draw(st.booleans()),
            draw(st.sampled_from([0, 0, 0x08, 0x20])),
            [
                (delta, base_ts + ts, k, v, h)
                for delta, (ts, k, v, h) in zip(deltas, recs, strict=True)
            ],
        )
        out += batch
        next_base += deltas[-1] + 1 + draw(st.integers(0, 3))
    return out


# ------------------------------------------------------------------ differential tests


@settings(max_examples=scaled(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_fetches(), skip=st.integers(0, 20), cut=st.integers(0, 30))
def test_c_and_python_decoders_agree_on_valid_fetches(data: bytes, skip: int, cut: int) -> None:
    first = struct.unpack_from(">q", data, 0)[0]
    for fetch_offset in (0, first + skip):
        # Also with a partial trailing batch, as the broker sends at its byte limit.
        for chunk in (data, data[: len(data) - cut]):
            c, py = _decode_both(chunk, fetch_offset=fetch_offset)
            assert c == py
            assert c[0] == "ok"


@settings(max_examples=scaled(100), deadline=None)
@given(data=_fetches())
def test_decoders_agree_with_deserializers_and_read_committed(data: bytes) -> None:
    def make() -> tuple[list[Any], Callable[[str, Any, Any], Any]]:
        calls: list[Any] = []

        def des(topic: str, headers: Any, raw: Any) -> Any:
            calls.append((topic, list(headers), raw))
            return ("des", raw)

        return calls, des

    results = []
    for native in (NATIVE, None):
        calls, des = make()
        saved = records._native
        records._native = native
        try:
            out = decode_records(
                data,
                "topic",
                3,
                0,
                key_deserializer=des,
                value_deserializer=des,
                read_committed=True,
                aborted_producers=[(7, 0)],
            )
        finally:
            records._native = saved
        results.append((_plain(out), calls))
    assert results[0] == results[1]


def test_deserializer_errors_are_named_alike_by_both() -> None:
    data = _build(0, 1, 0, False, 0, [(0, 5, b"k", b"v", [])])

    def boom(_t: str, _h: Any, _d: Any) -> Any:
        raise ValueError("not json")

    for native in (NATIVE, None):
        records._native, saved = native, records._native
        try:
            with pytest.raises(RecordDeserializationError, match="offset 0") as info:
                decode_records(data, "t", 0, 0, value_deserializer=boom)
            assert isinstance(info.value.__cause__, ValueError)
            assert str(info.value.__cause__) == "not json"
        finally:
            records._native = saved


# ------------------------------------------------------------------ corrupt input


def _uncompressed(n: int = 5, headers: bool = True) -> bytes:
    return _build(
        100,
        2,
        0,
        False,
        0,
        [
            (
                i,
                1000 + i,
                b"key-%d" % i,
                b"value-%d" % i * 3,
                [("h", b"x" * i), ("n", None)] if headers else [],
            )
            for i in range(n)
        ],
    )


def _with_body(batch: bytes, body: bytes, count: int | None = None) -> bytes:
    """The batch's header with another records section (length fixed, CRC not)."""
    raw = bytearray(batch[:61] + body)
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    if count is not None:
        struct.pack_into(">i", raw, 57, count)
    return bytes(raw)


def _assert_same_error(data: bytes) -> str:
    c, py = _decode_both(data, check_crcs=False)
    assert c == py
    assert c[0] == "error", c
    return str(c[1])


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _record(*fields: bytes) -> bytes:
    body = b"".join(fields)
    return _varint(len(body)) + body


def test_truncated_records_give_the_same_error() -> None:
    batch = _uncompressed()
    body = batch[61:]
    for cut in range(len(body)):
        msg = _assert_same_error(_with_body(batch, body[:cut]))
        assert msg.endswith("topic-3: truncated record in batch at offset 100")


def test_bad_crc_is_reported_by_both() -> None:
    raw = bytearray(_uncompressed())
    raw[-3] ^= 0xFF
    c, py = _decode_both(bytes(raw))
    assert c == py
    assert c[0] == "error"
    assert c[1].endswith("topic-3: record batch at offset 100 failed its CRC check")


def test_overlong_varint_gives_the_same_error() -> None:
    batch = _uncompressed()
    for bad in (b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x02", b"\x80" * 11):
        for field in range(5):  # length, attributes(skip), ts delta, offset delta, key length
            fields = [b"\x00", b"\x00", b"\x00", b"\x02", b"k", b"\x02", b"v", b"\x00"]
            fields[[0, 2, 3, 5, 7][field]] = bad
            msg = _assert_same_error(_with_body(batch, b"".join(fields), count=1))
            assert msg.endswith(
                ("varint too long", "topic-3: truncated record in batch at offset 100")
            )


def test_a_record_size_that_disagrees_with_its_fields_gives_the_same_error() -> None:
    batch = _uncompressed()
    fields = [b"\x00", b"\x00", b"\x02", b"\x02", b"k", b"\x02", b"v", b"\x00"]
    body = b"".join(fields)
    good = _record(*fields)
    for declared in (len(body) - 1, len(body) + 1, 0):
        bad = _varint(declared) + body
        # The bad record first and last: the size is checked wherever the record stands.
        for pair, index in (([bad, good], 0), ([good, bad], 1)):
            msg = _assert_same_error(_with_body(batch, b"".join(pair), count=2))
            assert msg.endswith(
                f"topic-3: record {index} of the batch at offset 100 declares {declared} "
                f"bytes but holds {len(body)}"
            ), msg


def test_bytes_after_the_declared_records_give_the_same_error() -> None:
    batch = _uncompressed()
    one = _record(b"\x00", b"\x00", b"\x00", b"\x02", b"k", b"\x02", b"v", b"\x00")
    for extra, bytes_ in ((b"\x00", "1 byte"), (one, f"{len(one)} bytes")):
        msg = _assert_same_error(_with_body(batch, one + one + extra, count=2))
        assert msg.endswith(f"topic-3: the batch at offset 100 has {bytes_} after its 2 records"), (
            msg
        )
    msg = _assert_same_error(_with_body(batch, one + one, count=1))
    assert msg.endswith(f"has {len(one)} bytes after its 1 record"), msg


def test_largest_varints_decode_identically() -> None:
    batch = _uncompressed()
    top = b"\xff" * 9 + b"\x01"  # zigzag(2**64 - 1) == -(2**63)
    body = _record(b"\x00", top, top, b"\x01", b"\x01", b"\x00")
    c, py = _decode_both(_with_body(batch, body, count=1), check_crcs=False)
    assert c == py and c[0] == "ok"


def test_lengths_past_the_end_give_the_same_error() -> None:
    batch = _uncompressed()
    cases = [
        _record(b"\x00\x00\x00", _varint(10**6), b"k"),  # key
        _record(b"\x00\x00\x00", _varint(-1), _varint(2**40), b"v"),  # value
        _record(b"\x00\x00\x00", _varint(-1), _varint(-1), _varint(1), _varint(50), b"h"),
        _record(
            b"\x00\x00\x00", _varint(-1), _varint(-1), _varint(1), _varint(1), b"h", _varint(99)
        ),  # header value
        _record(b"\x00\x00\x00", _varint(-1), _varint(-1), _varint(2**30)),  # header count
    ]
    for body in cases:
        msg = _assert_same_error(_with_body(batch, body, count=1))
        assert msg.endswith("topic-3: truncated record in batch at offset 100")
    # More records announced than present.
    _assert_same_error(_with_body(batch, batch[61:], count=6))


def test_bad_header_keys_give_the_same_error() -> None:
    batch = _uncompressed()
    neg = _record(b"\x00\x00\x00", _varint(-1), _varint(-1), _varint(1), _varint(-3), b"abc")
    assert "negative header key length" in _assert_same_error(_with_body(batch, neg, count=1))
    bad = _record(
        b"\x00\x00\x00", _varint(-1), _varint(-1), _varint(1), _varint(2), b"\xff\xfe", _varint(-1)
    )
    assert "header key is not UTF-8" in _assert_same_error(_with_body(batch, bad, count=1))


def _mutations(batch: bytes, seed: int) -> Iterator[bytes]:
    import random

    rnd = random.Random(seed)
    body = bytearray(batch[61:])
    for _ in range(200):
        b = bytearray(body)
        for _k in range(rnd.randint(1, 4)):
            i = rnd.randrange(len(b))
            b[i] = rnd.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, rnd.randrange(256)])
        if rnd.random() < 0.3:
            del b[rnd.randrange(len(b)) :]
        yield _with_body(batch, bytes(b), count=rnd.choice([5, 5, 6, 1000, 0, -1]))


@pytest.mark.parametrize("seed", range(4))
def test_random_corruption_gives_identical_outcomes(seed: int) -> None:
    batch = _uncompressed(headers=seed % 2 == 0)
    for data in _mutations(batch, seed):
        c, py = _decode_both(data, check_crcs=False)
        assert c == py


def test_env_var_forces_the_python_decoder() -> None:
    code = "from epochguard.consumer import records; print(records.DECODER)"
    env = {**os.environ, "EPOCHGUARD_PURE_PYTHON": "1"}
    forced = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    env.pop("EPOCHGUARD_PURE_PYTHON")
    default = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    assert (forced, default) == ("python", "c")
    assert records.DECODER == "c"


def test_atomic_records_are_left_out_of_the_cyclic_gc() -> None:
    import gc

    data = _uncompressed()
    plain = decode_records(data, "t", 0, 0).records
    assert not any(gc.is_tracked(r) or gc.is_tracked(r.headers) for r in plain)
    assert [r.headers for r in plain][1] == [("h", b"x"), ("n", None)]
    # A deserializer returning containers keeps the record visible to the GC.
    rich = decode_records(data, "t", 0, 0, value_deserializer=lambda _t, _h, v: {"v": v}).records
    assert all(gc.is_tracked(r) for r in rich)


def test_no_references_leak_on_success_or_error_paths() -> None:
    import tracemalloc

    batch = _uncompressed()
    good = batch
    bad = [_with_body(batch, batch[61:][:cut]) for cut in range(0, len(batch) - 61, 7)]

    def boom(_t: str, _h: Any, d: Any) -> Any:
        raise ValueError("x")

    def once() -> None:
        decode_records(good, "t", 0, 0)
        decode_records(good, "t", 0, 102, key_deserializer=lambda _t, _h, k: k)
        for data in bad:
            with pytest.raises(CorruptRecordError):
                decode_records(data, "t", 0, 0, check_crcs=False)
        with pytest.raises(RecordDeserializationError):
            decode_records(good, "t", 0, 0, value_deserializer=boom)

    for _ in range(50):  # warm caches, interned strings, pytest internals
        once()
    tracemalloc.start()
    try:
        once()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(300):
            once()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # A leaked record per decode would be 300 * (5 records * ~200 B) = 300 kB.
    assert grown < 64 * 1024, grown


# ------------------------------------------------------------------ column output
# decode_columns (consumer/columns.py) with the C loop (_crecords.decode_batch_columns) and
# its pure-Python twin: the same bytes in every column buffer, the same errors, and the
# same records as the tuple decoder.

COLUMNS_NATIVE = columns._native


@pytest.fixture(params=["gil", "nogil"])
def gil_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a column test twice: as decode_batch_columns runs small batches (holding the
    GIL) and as it runs large ones (the loop with the GIL released)."""
    from epochguard.consumer import _crecords

    old = _crecords.set_release_gil_bytes(0 if request.param == "nogil" else 2**62)
    try:
        yield request.param
    finally:
        _crecords.set_release_gil_bytes(old)


def _columns_both(data: bytes, fetch_offset: int = 0, **kwargs: Any) -> tuple[Outcome, Outcome]:
    """The C and the Python column decoder on ``data`` (``headers=True`` among the kwargs:
    the fifteen buffers with headers)."""

    def run(native: Any) -> Outcome:
        saved = columns._native
        columns._native = native
        try:
            out = columns.decode_columns(data, "topic", 3, fetch_offset, **kwargs)
        except CorruptRecordError as exc:
            return "error", str(exc)
        finally:
            columns._native = saved
        cols = out.records
        assert isinstance(cols, columns.RecordColumns)
        raw = [bytes(c) for c in cols._cols]
        runs = (cols._run_starts, cols._run_epochs, cols._run_ts_types)
        return "ok", (raw, runs, len(cols), out.next_offset, out.last_epoch, out.size)

    assert COLUMNS_NATIVE is not None
    return run(COLUMNS_NATIVE), run(None)


def _as_rows(
    data: bytes, fetch_offset: int = 0, headers: bool = False, **kwargs: Any
) -> list[tuple[Any, ...]]:
    cols = columns.decode_columns(data, "topic", 3, fetch_offset, headers=headers, **kwargs)
    assert isinstance(cols.records, columns.RecordColumns)
    arrays = cols.records.to_arrow()
    assert list(arrays) == list(columns.COLUMN_NAMES) + (["headers"] if headers else [])
    lists = [arrays[name].to_pylist() for name in ("offset", "leaderEpoch", "timestampType")]
    stamps = arrays["timestamp"].cast("int64").to_pylist()
    rows = list(
        zip(
            lists[0], lists[1], stamps, lists[2], arrays["key"].to_pylist(),
            arrays["value"].to_pylist(), strict=True,
        )
    )  # fmt: skip
    if not headers:
        return rows
    arrays["headers"].validate(full=True)
    pairs = [
        None if h is None else [(kv["key"], kv["value"]) for kv in h]
        for h in arrays["headers"].to_pylist()
    ]
    return [(*row, h) for row, h in zip(rows, pairs, strict=True)]


def _tuple_rows(
    data: bytes, fetch_offset: int = 0, headers: bool = False, **kwargs: Any
) -> list[tuple[Any, ...]]:
    recs = decode_records(data, "topic", 3, fetch_offset, **kwargs).records
    rows = [(r.offset, r.leader_epoch, r.timestamp, r.timestamp_type, r.key, r.value) for r in recs]
    if not headers:
        return rows
    # Spark's source's convention, which the headers column follows: no headers is null.
    return [(*row, list(r.headers) or None) for row, r in zip(rows, recs, strict=True)]


@settings(
    max_examples=scaled(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=_fetches(), skip=st.integers(0, 20), cut=st.integers(0, 30), headers=st.booleans())
def test_column_decoders_agree_with_each_other_and_the_tuple_decoder(
    gil_path: str, data: bytes, skip: int, cut: int, headers: bool
) -> None:
    first = struct.unpack_from(">q", data, 0)[0]
    for fetch_offset in (0, first + skip):
        for chunk in (data, data[: len(data) - cut]):
            c, py = _columns_both(chunk, fetch_offset=fetch_offset, headers=headers)
            assert c == py
            assert c[0] == "ok"
            assert len(c[1][0]) == (15 if headers else 8)
            assert _as_rows(chunk, fetch_offset, headers) == _tuple_rows(
                chunk, fetch_offset, headers
            )
            fetched = decode_records(chunk, "topic", 3, fetch_offset)
            assert c[1][3:] == (fetched.next_offset, fetched.last_epoch, fetched.size)


@settings(max_examples=scaled(100), deadline=None)
@given(data=_fetches())
def test_column_decoders_skip_aborted_and_control_batches_as_the_tuple_decoder(
    data: bytes,
) -> None:
    kw: dict[str, Any] = {"read_committed": True, "aborted_producers": [(7, 0)]}
    c, py = _columns_both(data, headers=True, **kw)
    assert c == py
    assert _as_rows(data, headers=True, **kw) == _tuple_rows(data, headers=True, **kw)


def _assert_same_column_error(data: bytes) -> str:
    c, py = _columns_both(data, check_crcs=False)
    assert c == py
    assert c[0] == "error", c
    assert _columns_both(data, check_crcs=False, headers=True) == (c, py)
    # The tuple decoder fails the same way.
    assert _decode_both(data, check_crcs=False)[0] == c
    return str(c[1])


def test_column_decoders_report_corrupt_records_as_the_tuple_decoder(gil_path: str) -> None:
    batch = _uncompressed()
    body = batch[61:]
    for cut in range(len(body)):
        msg = _assert_same_column_error(_with_body(batch, body[:cut]))
        assert msg.endswith("topic-3: truncated record in batch at offset 100")
    for bad in (b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x02", b"\x80" * 11):
        for field in range(5):
            fields = [b"\x00", b"\x00", b"\x00", b"\x02", b"k", b"\x02", b"v", b"\x00"]
            fields[[0, 2, 3, 5, 7][field]] = bad
            _assert_same_column_error(_with_body(batch, b"".join(fields), count=1))
    neg = _record(b"\x00\x00\x00", _varint(-1), _varint(-1), _varint(1), _varint(-3), b"abc")
    assert "negative header key length" in _assert_same_column_error(
        _with_body(batch, neg, count=1)
    )
    utf = _record(
        b"\x00\x00\x00", _varint(-1), _varint(-1), _varint(1), _varint(2), b"\xff\xfe", _varint(-1)
    )
    assert "header key is not UTF-8" in _assert_same_column_error(_with_body(batch, utf, count=1))
    _assert_same_column_error(_with_body(batch, batch[61:], count=6))
    one = _record(b"\x00", b"\x00", b"\x00", b"\x02", b"k", b"\x02", b"v", b"\x00")
    assert _assert_same_column_error(_with_body(batch, one + b"\x00", count=1)).endswith(
        "topic-3: the batch at offset 100 has 1 byte after its 1 record"
    )
    # A count far beyond what the bytes can hold is refused, not allocated for.
    _assert_same_column_error(_with_body(batch, batch[61:], count=2**31 - 1))


def test_column_decoders_refuse_offsets_and_timestamps_past_int64(gil_path: str) -> None:
    # The tuple decoder returns Python ints there; an int64 column cannot hold them.
    batch = _uncompressed()
    top = _varint(2**62)
    for body, what in (
        (_record(b"\x00", b"\x00", top, b"\x01", b"\x01", b"\x00"), "offset"),
        (_record(b"\x00", top, b"\x00", b"\x01", b"\x01", b"\x00"), "timestamp"),
    ):
        raw = bytearray(_with_body(batch, body, count=1))
        struct.pack_into(">q", raw, 0, 2**62 + 5)  # base offset
        struct.pack_into(">q", raw, 27, 2**62 + 5)  # base timestamp
        c, py = _columns_both(bytes(raw), check_crcs=False)
        assert c == py
        assert c[0] == "error" and f"record {what} overflows" in c[1]


@pytest.mark.parametrize("seed", range(4))
def test_random_corruption_gives_identical_column_outcomes(gil_path: str, seed: int) -> None:
    batch = _uncompressed(headers=seed % 2 == 0)
    for data in _mutations(batch, seed):
        for headers in (False, True):
            c, py = _columns_both(data, check_crcs=False, headers=headers)
            assert c == py
            if c[0] == "ok":
                assert _as_rows(data, headers=headers, check_crcs=False) == _tuple_rows(
                    data, headers=headers, check_crcs=False
                )


@pytest.mark.parametrize(
    "key",
    [
        b"ascii",
        "\u00e9t\u00e9".encode(),  # 2-byte sequences
        "\u20ac \uffff".encode(),  # 3-byte sequences
        "\U0001f600 \U0010ffff".encode(),  # 4 bytes, up to the last code point
        b"\xc0\x80",  # overlong NUL
        b"\xc1\xbf",  # overlong 2-byte
        b"\xe0\x9f\xbf",  # overlong 3-byte
        b"\xf0\x8f\xbf\xbf",  # overlong 4-byte
        b"\xed\xa0\x80",  # a surrogate (U+D800)
        b"\xed\x9f\xbf",  # U+D7FF, just below the surrogates
        b"\xf4\x90\x80\x80",  # past U+10FFFF
        b"\xf5\x80\x80\x80",
        b"\xe2\x82",  # cut short
        b"\x80",  # a lone continuation byte
        b"\xe2\x28\xa1",  # a bad continuation byte
        b"\xff",
    ],
)
def test_header_keys_are_checked_as_python_decodes_utf8(gil_path: str, key: bytes) -> None:
    # Without the GIL the C loop checks UTF-8 itself instead of asking Python: both must
    # accept and refuse the same keys.
    rec = _record(
        b"\x00\x00\x00", _varint(-1), _varint(1), b"v", _varint(1), _varint(len(key)), key,
        _varint(-1),
    )  # fmt: skip
    data = _with_body(_uncompressed(), rec, count=1)
    c, py = _columns_both(data, check_crcs=False)
    assert c == py
    assert _columns_both(data, check_crcs=False, headers=True)[0][0] == c[0]
    try:
        key.decode()
    except UnicodeDecodeError:
        assert c[0] == "error" and "header key is not UTF-8" in c[1]
    else:
        assert c[0] == "ok"
        rows = _as_rows(data, headers=True, check_crcs=False)
        assert rows[0][-1] == [(key.decode(), None)]


def test_large_batches_decode_without_the_gil_by_default() -> None:
    from epochguard.consumer import _crecords

    old = _crecords.set_release_gil_bytes(64 * 1024)
    _crecords.set_release_gil_bytes(old)
    # 300 records of 1 KiB: past the default threshold, so the GIL-free loop runs.
    value = b"x" * 1024
    batch = _build(10, 3, 0, False, 0, [(i, 1000 + i, b"k%d" % i, value, []) for i in range(300)])
    assert len(batch) > old
    c, py = _columns_both(batch)
    assert c == py and c[0] == "ok"
    assert _as_rows(batch) == _tuple_rows(batch)
    with pytest.raises(ValueError, match="negative"):
        _crecords.set_release_gil_bytes(-1)


def test_arrow_arrays_share_the_column_buffers() -> None:
    rows = [(i, 50 + i, None, b"x%d" % i, []) for i in range(10)]
    data = b"".join(_build(10 * b, 4 + b // 2, 0, False, 0, rows) for b in range(4))
    cols = columns.decode_columns(data, "t", 0, 0).records
    assert isinstance(cols, columns.RecordColumns)
    arrays = cols.to_arrow()
    addresses = {pa.py_buffer(c).address for c in cols._cols}
    for name in ("offset", "timestamp"):
        assert arrays[name].buffers()[1].address in addresses
    for name in ("key", "value"):
        assert {b.address for b in arrays[name].buffers()[1:]} <= addresses
    assert arrays["key"].null_count == 40 and arrays["value"].null_count == 0
    # A view: no copy, its own rows, epochs and the fetcher's view of its ends.
    view = cols[15:32]
    assert len(view) == 17 and view[0] == (15, 4) and view[-1] == (31, 5)
    assert view.epoch_runs() == [(0, 4, 4), (5, 16, 5)]  # batches 1 (epoch 4) and 2, 3 (5)
    assert view.max_epoch() == 5
    assert view.data_bytes() == sum(len(b"x%d" % (i % 10)) for i in range(15, 32))
    assert view.rows_before(20) == 5 and view.rows_before(0) == 0 and view.rows_before(99) == 17
    sliced = view.to_arrow()
    assert sliced["offset"].to_pylist() == list(range(15, 32))
    assert sliced["leaderEpoch"].to_pylist() == [4] * 5 + [5] * 12
    assert sliced["value"].to_pylist() == [b"x%d" % (i % 10) for i in range(15, 32)]
    assert [r.offset for r in view] == list(range(15, 32))
    with pytest.raises(IndexError):
        view[17]
    with pytest.raises(ValueError, match="no step"):
        view[::2]


def test_env_var_forces_the_python_column_decoder() -> None:
    code = "from epochguard.consumer import columns; print(columns.DECODER)"
    env = {**os.environ, "EPOCHGUARD_PURE_PYTHON": "1"}
    forced = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    assert (forced, columns.DECODER) == ("python", "c")


def test_header_arrays_share_the_column_buffers_and_slice_with_their_rows() -> None:
    rows = [
        (i, 50 + i, b"k", b"v", [(f"h{j}", None if j == 1 else b"x" * j) for j in range(i % 3)])
        for i in range(10)
    ]
    data = b"".join(_build(10 * b, 4, 0, False, 0, rows) for b in range(3))
    cols = columns.decode_columns(data, "t", 0, 0, headers=True).records
    assert isinstance(cols, columns.RecordColumns) and cols.has_headers
    headers = cols.to_arrow()["headers"]
    assert headers.type == columns.header_type()
    addresses = {pa.py_buffer(c).address for c in cols._cols}
    pairs = headers.values
    used = [headers.buffers()[1], pairs.field(0).buffers()[1], pairs.field(0).buffers()[2]]
    used += pairs.field(1).buffers()
    assert {b.address for b in used if b is not None} <= addresses
    expected = [
        [{"key": f"h{j}", "value": None if j == 1 else b"x" * j} for j in range(i % 3)] or None
        for _ in range(3)
        for i in range(10)
    ]
    assert headers.to_pylist() == expected
    assert headers.null_count == sum(1 for e in expected if e is None)
    view = cols[7:23]
    assert view.to_arrow()["headers"].to_pylist() == expected[7:23]
    header_bytes = sum(
        len(h["key"]) + len(h["value"] or b"") for e in expected[7:23] for h in e or []
    )
    assert view.data_bytes() == 16 * 2 + header_bytes
    # Without headers asked for, the same fetch has no headers column and fewer bytes.
    plain = columns.decode_columns(data, "t", 0, 0).records
    assert isinstance(plain, columns.RecordColumns) and not plain.has_headers
    assert "headers" not in plain.to_arrow() and plain[7:23].data_bytes() == 32


def test_legacy_message_sets_have_null_headers_in_the_columns() -> None:
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    b = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=10**6)
    for i in range(3):
        b.append(i, timestamp=1000 + i, key=None, value=b"old-%d" % i)
    data = bytes(b.build())
    for native in (COLUMNS_NATIVE, None):
        saved, columns._native = columns._native, native
        try:
            assert _as_rows(data, headers=True) == _tuple_rows(data, headers=True)
            assert [r[-1] for r in _as_rows(data, headers=True)] == [None] * 3
        finally:
            columns._native = saved


def test_headers_decode_without_the_gil_and_refuse_impossible_counts() -> None:
    from epochguard.consumer import _crecords

    old = _crecords.set_release_gil_bytes(0)
    try:
        value = b"x" * 100
        pairs: list[tuple[str, bytes | None]] = [("a", b"1"), ("b", None)]
        recs = [(i, 1000 + i, None, value, pairs * (i % 4)) for i in range(300)]
        batch = _build(10, 3, 0, False, 0, recs)
        c, py = _columns_both(batch, headers=True)
        assert c == py and c[0] == "ok"
        assert _as_rows(batch, headers=True) == _tuple_rows(batch, headers=True)
        # A header count the bytes cannot hold is a truncated record, not an allocation.
        huge = _record(b"\x00\x00\x00", _varint(-1), _varint(1), b"v", _varint(2**31 - 1))
        data = _with_body(_uncompressed(), huge, count=1)
        c, py = _columns_both(data, check_crcs=False, headers=True)
        assert c == py and c[0] == "error" and "truncated record" in c[1]
    finally:
        _crecords.set_release_gil_bytes(old)


def test_one_bytearray_in_two_column_places_is_refused() -> None:
    # Each buffer is grown for its own layout: the same bytearray twice would be written
    # past its end (a heap overflow under AddressSanitizer before the check).
    from epochguard.consumer import _crecords

    batch = _uncompressed()
    for n in (8, 15):
        cols = columns._Builder(headers=n == 15).cols
        cols[n - 1] = cols[3]
        with pytest.raises(ValueError, match=f"cols 3 and {n - 1} are the same bytearray"):
            _crecords.decode_batch_columns(batch, 61, len(batch), 5, "t", 0, 0, 0, None, 0, cols)
