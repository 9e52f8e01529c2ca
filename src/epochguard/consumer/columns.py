"""Fetched records as column buffers (Arrow layouts) instead of one tuple per record.

A consumer created with ``record_format="columns"`` decodes each partition's part of a
Fetch answer into one :class:`RecordColumns`: offsets and timestamps as int64 buffers, keys
and values each as one data buffer plus int32 offsets and a validity bitmap (Arrow's binary
layout), and the leader epoch and timestamp type of each run of rows from the same batch.
With ``column_headers=True`` the headers are kept as well, in the buffers of Arrow's
``list<struct<key: string, value: binary>>`` (a record without headers is a null list, as
in Spark's Kafka source).
No Python object is made per record or field; :meth:`RecordColumns.to_arrow` wraps the
buffers with ``pyarrow.Array.from_buffers`` without copying them. The batch layer (CRCs,
control and aborted batches, decompression, legacy formats) is ``records.walk_batches``,
shared with the tuple decoder.

The per-record loop is ``_crecords.decode_batch_columns`` (C) or :func:`_decode_batch_columns`
(pure Python, ``EPOCHGUARD_PURE_PYTHON``); tests/consumer/test_columns.py checks that both
write the same bytes and that they hold what the tuple decoder returns.
"""

from __future__ import annotations

import bisect
import functools
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from epochguard.consumer import records as _records
from epochguard.consumer.errors import CorruptRecordError
from epochguard.consumer.records import (
    ConsumerRecord,
    DecodedFetch,
    Deserializer,
    V2Batch,
    _counted,
    walk_batches,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "COLUMN_NAMES",
    "DECODER",
    "RecordColumns",
    "RecordRef",
    "decode_columns",
    "header_type",
]

#: The arrays :meth:`RecordColumns.to_arrow` returns, in this order (``headers`` too, last,
#: when the columns were decoded with headers).
COLUMN_NAMES = ("key", "value", "offset", "timestamp", "timestampType", "leaderEpoch")

_NATIVE_ORDER = "="  # Arrow buffers are the host's byte order (little-endian in practice)
_I64 = struct.Struct(_NATIVE_ORDER + "q")
_I32 = struct.Struct(_NATIVE_ORDER + "i")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_N_COLS = 8
_N_COLS_HEADERS = 15
# A record takes at least 7 bytes (length, attributes, two deltas, key and value lengths,
# header count): the C decoder sizes its columns by this bound.
_MIN_RECORD_BYTES = 7


def _load_native() -> Callable[..., tuple[int, int, int]] | None:
    # The tuple decoder's switch (EPOCHGUARD_PURE_PYTHON, the module built or not) decides.
    if _records._native is None:
        return None
    from epochguard.consumer import _crecords

    return _crecords.decode_batch_columns


_native = _load_native()
#: Which column decoder :func:`decode_columns` uses in this process: ``"c"`` or ``"python"``.
DECODER = "c" if _native is not None else "python"


@functools.cache
def header_type() -> pa.DataType:
    """The Arrow type of the ``headers`` column: Spark's Kafka source's
    ``array<struct<key: string, value: binary>>``."""
    import pyarrow as pa

    return pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class RecordRef(NamedTuple):
    """One row's offset and leader epoch: what the fetcher reads off a chunk's ends."""

    offset: int
    leader_epoch: int


class _Builder:
    """The eight (with headers: fifteen) growing column bytearrays of one fetch, and its
    runs of rows per batch."""

    __slots__ = ("cols", "key_nulls", "rows", "runs", "value_nulls")

    def __init__(self, headers: bool = False) -> None:
        zero = _I32.pack(0)
        # offsets, timestamps, key offsets, key data, key valid, value offsets/data/valid
        self.cols = [bytearray(), bytearray(), bytearray(zero), bytearray(), bytearray()]
        self.cols += [bytearray(zero), bytearray(), bytearray()]
        if headers:
            # list offsets, list valid; header key offsets, key data; value offsets, data, valid
            self.cols += [bytearray(zero), bytearray(), bytearray(zero), bytearray()]
            self.cols += [bytearray(zero), bytearray(), bytearray()]
        self.rows = 0
        self.key_nulls = 0
        self.value_nulls = 0
        #: (first row, leader epoch, timestamp type), one per change
        self.runs: list[tuple[int, int, int]] = []

    def add(self, rows: int, key_nulls: int, value_nulls: int, epoch: int, ts_type: int) -> None:
        if rows:
            runs = self.runs
            if not runs or runs[-1][1] != epoch or runs[-1][2] != ts_type:
                runs.append((self.rows, epoch, ts_type))
            self.rows += rows
            self.key_nulls += key_nulls
            self.value_nulls += value_nulls

    def append_record(self, rec: ConsumerRecord) -> None:
        """One decoded record (legacy message sets, which kafka-python decodes)."""
        row = self.rows
        _append_row(self.cols, row, rec.offset, rec.timestamp, rec.key, rec.value, rec.headers)
        self.add(1, rec.key is None, rec.value is None, rec.leader_epoch, rec.timestamp_type)


def _append_row(
    cols: list[bytearray],
    row: int,
    offset: int,
    ts: int,
    key: Any,
    value: Any,
    headers: Sequence[tuple[bytes | str, bytes | None]] | None = None,
) -> None:
    """One row; ``headers`` as ``(key, value)`` pairs (the key as str or UTF-8 bytes),
    written only when ``cols`` has the header buffers."""
    offsets, stamps, koffs, kdata, kvalid, voffs, vdata, vvalid = cols[:_N_COLS]
    offsets += _I64.pack(offset)
    stamps += _I64.pack(ts)
    _append_binary(koffs, kdata, kvalid, row, key)
    _append_binary(voffs, vdata, vvalid, row, value)
    if len(cols) == _N_COLS_HEADERS:
        _append_headers(cols, row, headers or ())


def _append_binary(
    offs: bytearray, data: bytearray, valid: bytearray, row: int, value: bytes | None
) -> None:
    """Row ``row`` of one Arrow binary column (offsets, data, validity bitmap)."""
    if row % 8 == 0:
        valid.append(0)
    if value is not None:
        data += value
        valid[row >> 3] |= 1 << (row & 7)
    if len(data) > _INT32_MAX:
        raise OverflowError("column data of one fetch passes 2 GiB (Arrow binary offsets)")
    offs += _I32.pack(len(data))


def _append_headers(
    cols: list[bytearray], row: int, headers: Sequence[tuple[bytes | str, bytes | None]]
) -> None:
    hoffs, hvalid, hkoffs, hkdata, hvoffs, hvdata, hvvalid = cols[_N_COLS:]
    if row % 8 == 0:
        hvalid.append(0)
    if headers:
        hvalid[row >> 3] |= 1 << (row & 7)
    hrow = len(hkoffs) // 4 - 1
    for hkey, hvalue in headers:
        hkdata += hkey.encode() if isinstance(hkey, str) else hkey
        if len(hkdata) > _INT32_MAX:
            raise OverflowError("column data of one fetch passes 2 GiB (Arrow binary offsets)")
        hkoffs += _I32.pack(len(hkdata))
        _append_binary(hvoffs, hvdata, hvvalid, hrow, hvalue)
        hrow += 1
    hoffs += _I32.pack(hrow)


def _decode_batch_columns(
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    topic: str,
    partition: int,
    base_offset: int,
    base_ts: int,
    log_append_ts: int | None,
    min_offset: int,
    cols: list[bytearray],
) -> tuple[int, int, int]:
    """Pure-Python twin of ``_crecords.decode_batch_columns``: same bytes, same errors."""
    rows0 = len(cols[0]) // 8
    row = rows0
    keep_headers = len(cols) == _N_COLS_HEADERS
    key_nulls = value_nulls = 0
    read_varint = _records._read_varint
    cap = max(0, min(count, (max(0, end - pos)) // _MIN_RECORD_BYTES + 1))
    try:
        for i in range(count):
            size, pos = read_varint(buf, pos, end)
            record_start = pos
            if pos >= end:
                raise IndexError("record attributes past the end of the batch")
            pos += 1
            ts_delta, pos = read_varint(buf, pos, end)
            off_delta, pos = read_varint(buf, pos, end)
            klen, pos = read_varint(buf, pos, end)
            key = None
            if klen >= 0:
                if klen > end - pos:
                    raise IndexError("key past the end of the batch")
                key = buf[pos : pos + klen]
                pos += klen
            vlen, pos = read_varint(buf, pos, end)
            value = None
            if vlen >= 0:
                if vlen > end - pos:
                    raise IndexError("value past the end of the batch")
                value = buf[pos : pos + vlen]
                pos += vlen
            if pos >= end:
                raise IndexError("headers past the end of the batch")
            headers: list[tuple[bytes, bytes | None]] = []
            if buf[pos] == 0:
                pos += 1
            else:
                nh, pos = read_varint(buf, pos, end)
                for _h in range(nh):
                    hklen, pos = read_varint(buf, pos, end)
                    if hklen < 0:
                        raise CorruptRecordError(
                            f"{topic}-{partition}: negative header key length in batch at "
                            f"offset {base_offset}"
                        )
                    if hklen > end - pos:
                        raise IndexError("header key past the end of the batch")
                    hkey = bytes(buf[pos : pos + hklen])
                    try:
                        hkey.decode("utf-8")  # checked whether kept or not
                    except UnicodeDecodeError:
                        raise CorruptRecordError(
                            f"{topic}-{partition}: header key is not UTF-8 in batch at offset "
                            f"{base_offset}"
                        ) from None
                    pos += hklen
                    hvlen, pos = read_varint(buf, pos, end)
                    if hvlen >= 0 and hvlen > end - pos:
                        raise IndexError("header value past the end of the batch")
                    if keep_headers:
                        headers.append(
                            (hkey, bytes(buf[pos : pos + hvlen]) if hvlen >= 0 else None)
                        )
                    pos += max(hvlen, 0)
            if pos - record_start != size:
                raise CorruptRecordError(
                    f"{topic}-{partition}: record {i} of the batch at offset {base_offset} "
                    f"declares {size} bytes but holds {pos - record_start}"
                )
            offset = base_offset + off_delta
            if offset > _INT64_MAX:
                raise CorruptRecordError(
                    f"{topic}-{partition}: record offset overflows in batch at offset {base_offset}"
                )
            if offset < _INT64_MIN or offset < min_offset:
                continue
            ts = base_ts + ts_delta if log_append_ts is None else log_append_ts
            if not _INT64_MIN <= ts <= _INT64_MAX:
                raise CorruptRecordError(
                    f"{topic}-{partition}: record timestamp overflows in batch at offset "
                    f"{base_offset}"
                )
            if row - rows0 >= cap:
                raise IndexError("more records than the batch's bytes can hold")
            _append_row(cols, row, offset, ts, key, value, headers)
            key_nulls += key is None
            value_nulls += value is None
            row += 1
    except IndexError:
        raise CorruptRecordError(
            f"{topic}-{partition}: truncated record in batch at offset {base_offset}"
        ) from None
    if pos != end:
        raise CorruptRecordError(
            f"{topic}-{partition}: the batch at offset {base_offset} has "
            f"{_counted(end - pos, 'byte')} after its {_counted(count, 'record')}"
        )
    return row - rows0, key_nulls, value_nulls


def decode_columns(
    data: bytes | bytearray | memoryview | None,
    topic: str,
    partition: int,
    fetch_offset: int,
    *,
    check_crcs: bool = True,
    key_deserializer: Deserializer | None = None,
    value_deserializer: Deserializer | None = None,
    aborted_producers: Sequence[tuple[int, int]] | None = None,
    read_committed: bool = False,
    headers: bool = False,
    transactions: list[Any] | None = None,
) -> DecodedFetch:
    """:func:`~epochguard.consumer.records.decode_records`, with the records as one
    :class:`RecordColumns` (``DecodedFetch.records``). Keys and values stay bytes: the
    consumer refuses deserializers with ``record_format="columns"``. ``headers``: keep the
    records' headers too (``to_arrow()["headers"]``)."""
    if key_deserializer is not None or value_deserializer is not None:
        raise TypeError("decode_columns takes no deserializers (keys and values stay bytes)")
    builder = _Builder(headers)
    if not data:
        empty = RecordColumns(topic, partition, builder)
        return DecodedFetch(empty, None, None, 0)  # type: ignore[arg-type]
    native = _native

    def v2(body: Any, bstart: int, bend: int, count: int, info: V2Batch) -> None:
        args = (
            body,
            bstart,
            bend,
            count,
            topic,
            partition,
            info.base_offset,
            info.base_ts,
            info.log_append_ts,
            fetch_offset,
            builder.cols,
        )
        rows, knulls, vnulls = native(*args) if native is not None else _decode_batch_columns(*args)
        builder.add(rows, knulls, vnulls, info.epoch, info.ts_type)

    def legacy(chunk: bytes) -> tuple[int | None, int | None]:
        out: list[ConsumerRecord] = []
        nxt = _records._decode_legacy(
            chunk, topic, partition, fetch_offset, check_crcs, out, None, None
        )
        for rec in out:
            builder.append_record(rec)
        return nxt

    next_offset, last_epoch, size = walk_batches(
        data,
        topic,
        partition,
        fetch_offset,
        check_crcs=check_crcs,
        aborted_producers=aborted_producers,
        read_committed=read_committed,
        in_place=native is not None,
        v2=v2,
        legacy=legacy,
        transactions=transactions,
    )
    columns = RecordColumns(topic, partition, builder)
    # DecodedFetch.records is typed for tuples; the fetcher only slices and measures it.
    return DecodedFetch(
        columns,  # type: ignore[arg-type]
        next_offset,
        last_epoch,
        size,
        transactions or (),
    )


class RecordColumns(Sequence[RecordRef]):
    """The records one fetch returned for one partition, as column buffers, or a slice of
    them (rows ``start`` to ``stop``; slicing copies nothing).

    As a sequence its items are :class:`RecordRef` (offset, leader epoch), made on demand:
    use :meth:`to_arrow` for the data."""

    __slots__ = (
        "_cols",
        "_key_nulls",
        "_rows",
        "_run_epochs",
        "_run_starts",
        "_run_ts_types",
        "_value_nulls",
        "partition",
        "start",
        "stop",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        builder: _Builder,
        start: int = 0,
        stop: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self._cols = builder.cols
        self._rows = builder.rows
        self._key_nulls = builder.key_nulls
        self._value_nulls = builder.value_nulls
        self._run_starts = [r[0] for r in builder.runs]
        self._run_epochs = [r[1] for r in builder.runs]
        self._run_ts_types = [r[2] for r in builder.runs]
        self.start = start
        self.stop = builder.rows if stop is None else stop

    def _view(self, start: int, stop: int) -> RecordColumns:
        view = RecordColumns.__new__(RecordColumns)
        for name in RecordColumns.__slots__:
            setattr(view, name, getattr(self, name))
        view.start, view.stop = start, stop
        return view

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"RecordColumns({self.topic}-{self.partition}, {len(self)} rows" + (
            f", offsets {self.offset_at(0)}..{self.offset_at(len(self) - 1)})" if self else ")"
        )

    def offset_at(self, i: int) -> int:
        """The offset of row ``i`` of this view."""
        return int(_I64.unpack_from(self._cols[0], 8 * (self.start + i))[0])

    def epoch_at(self, i: int) -> int:
        return self._run_epochs[bisect.bisect_right(self._run_starts, self.start + i) - 1]

    @overload
    def __getitem__(self, i: int) -> RecordRef: ...

    @overload
    def __getitem__(self, i: slice) -> RecordColumns: ...

    def __getitem__(self, i: int | slice) -> RecordRef | RecordColumns:
        n = self.stop - self.start
        if isinstance(i, slice):
            lo, hi, step = i.indices(n)
            if step != 1:
                raise ValueError("RecordColumns slices take no step")
            return self._view(self.start + lo, self.start + max(lo, hi))
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("RecordColumns index out of range")
        return RecordRef(self.offset_at(i), self.epoch_at(i))

    def __iter__(self) -> Iterator[RecordRef]:
        for i in range(len(self)):
            yield self[i]

    def epoch_runs(self) -> list[tuple[int, int, int]]:
        """``(first row, last row, leader epoch)`` of each run of rows from batches with the
        same epoch, in this view: one entry unless the log changed leaders within it."""
        out: list[tuple[int, int, int]] = []
        starts, epochs = self._run_starts, self._run_epochs
        first = bisect.bisect_right(starts, self.start) - 1
        for k in range(max(first, 0), len(starts)):
            lo = max(starts[k], self.start)
            hi = min(starts[k + 1] if k + 1 < len(starts) else self._rows, self.stop)
            if lo >= hi:
                break
            if out and out[-1][2] == epochs[k]:
                out[-1] = (out[-1][0], hi - 1 - self.start, epochs[k])
            else:
                out.append((lo - self.start, hi - 1 - self.start, epochs[k]))
        return out

    @property
    def has_headers(self) -> bool:
        """Whether these columns were decoded with the records' headers."""
        return len(self._cols) == _N_COLS_HEADERS

    def data_bytes(self) -> int:
        """Bytes of keys and values (and header keys and values) in this view."""
        cols = self._cols

        def span(offs: bytearray, lo: int, hi: int) -> int:
            return int(_I32.unpack_from(offs, 4 * hi)[0] - _I32.unpack_from(offs, 4 * lo)[0])

        total = span(cols[2], self.start, self.stop) + span(cols[5], self.start, self.stop)
        if len(cols) == _N_COLS_HEADERS:
            # Rows start..stop hold headers first..last (the list offsets).
            first, last = (_I32.unpack_from(cols[8], 4 * r)[0] for r in (self.start, self.stop))
            total += span(cols[10], first, last) + span(cols[12], first, last)
        return total

    def max_epoch(self) -> int | None:
        runs = self.epoch_runs()
        return max(r[2] for r in runs) if runs else None

    def rows_before(self, offset: int) -> int:
        """How many rows of this view have an offset below ``offset``."""
        offsets = memoryview(self._cols[0]).cast("q")[self.start : self.stop]
        return bisect.bisect_left(offsets, offset)

    def to_arrow(self) -> dict[str, pa.Array]:
        """``{name: pyarrow.Array}`` for :data:`COLUMN_NAMES` over this view's rows: the
        offsets, timestamps, keys and values share this object's buffers (no copy);
        ``leaderEpoch`` and ``timestampType`` are filled from the runs. ``timestamp`` is
        ``timestamp[ms, tz=UTC]``. With headers, ``headers`` (last) is
        ``list<struct<key: string, value: binary>>`` over the header buffers, no copy."""
        import pyarrow as pa

        if sys.byteorder != "little":  # pragma: no cover - no big-endian pyarrow builds
            raise RuntimeError("Arrow column buffers need a little-endian host")
        n_all = self._rows
        cols = [pa.py_buffer(c) for c in self._cols]
        offsets, stamps, koffs, kdata, kvalid, voffs, vdata, vvalid = cols[:_N_COLS]
        start, n = self.start, self.stop - self.start

        def binary(offs: pa.Buffer, data: pa.Buffer, valid: pa.Buffer, nulls: int) -> pa.Array:
            return pa.Array.from_buffers(
                pa.binary(), n_all, [valid if nulls else None, offs, data], null_count=nulls
            ).slice(start, n)

        out = {
            "key": binary(koffs, kdata, kvalid, self._key_nulls),
            "value": binary(voffs, vdata, vvalid, self._value_nulls),
            "offset": pa.Array.from_buffers(pa.int64(), n_all, [None, offsets]).slice(start, n),
            "timestamp": pa.Array.from_buffers(
                pa.timestamp("ms", tz="UTC"), n_all, [None, stamps]
            ).slice(start, n),
        }
        out["timestampType"] = self._per_run(self._run_ts_types, start, n)
        out["leaderEpoch"] = self._per_run(self._run_epochs, start, n)
        if len(cols) == _N_COLS_HEADERS:
            out["headers"] = self._headers_array(cols[_N_COLS:], n_all).slice(start, n)
        return out

    def _headers_array(self, bufs: list[pa.Buffer], n_all: int) -> pa.Array:
        import pyarrow as pa

        hoffs, hvalid, hkoffs, hkdata, hvoffs, hvdata, hvvalid = bufs
        n_headers = len(self._cols[10]) // 4 - 1
        # null_count=-1: Arrow counts the nulls from the bitmaps when asked.
        keys = pa.Array.from_buffers(pa.string(), n_headers, [None, hkoffs, hkdata])
        values = pa.Array.from_buffers(
            pa.binary(), n_headers, [hvvalid, hvoffs, hvdata], null_count=-1
        )
        htype = header_type()
        pairs = pa.StructArray.from_arrays([keys, values], fields=list(htype.value_type))
        return pa.Array.from_buffers(htype, n_all, [hvalid, hoffs], null_count=-1, children=[pairs])

    def _per_run(self, values: list[int], start: int, n: int) -> pa.Array:
        import pyarrow as pa

        parts = []
        for lo, hi, value in self._runs_of(values, start, n):
            parts.append(_I32.pack(value) * (hi - lo))
        return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(b"".join(parts))])

    def _runs_of(self, values: list[int], start: int, n: int) -> Iterator[tuple[int, int, int]]:
        starts = self._run_starts
        stop = start + n
        for k in range(len(starts)):
            lo = max(starts[k], start)
            hi = min(starts[k + 1] if k + 1 < len(starts) else self._rows, stop)
            if lo < hi:
                yield lo, hi, values[k]
