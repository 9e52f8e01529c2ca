"""The hot path: v2 record batches (bytes of a Fetch response) to ``ConsumerRecord`` tuples.

kafka-python decodes every record through several objects (``MemoryRecords`` ->
``DefaultRecordBatch`` -> ``DefaultRecord``) and a varint helper call per field. This module
walks a whole fetch's bytes with one function per batch, inlines single-byte varints (keys,
values and deltas shorter than 64 bytes are the common case) and builds the result tuple
directly, which is where most of the consumer's throughput advantage comes from.
Legacy message formats (magic 0/1) are handed to kafka-python's decoder, which is correct
and rare enough not to matter for speed.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import crc32c

from epochguard._decoder_warning import C_DECODER_REMEDY as C_DECODER_REMEDY
from epochguard._decoder_warning import PURE_PYTHON_ENV as PURE_PYTHON_ENV
from epochguard._decoder_warning import pure_python_chosen, warn_once
from epochguard._log import get_logger
from epochguard.consumer.errors import CorruptRecordError, RecordDeserializationError
from epochguard.offsets.reopened import BatchKind, TxnBatch

__all__ = [
    "DECODER",
    "BatchInfo",
    "ConsumerRecord",
    "DecodedFetch",
    "as_deserializer",
    "decode_records",
    "fetch_end",
]

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
_HEADER_SIZE = _HEADER.size  # 61
_LOG_OVERHEAD = 12  # baseOffset + batchLength
_MAGIC_OFFSET = 16
_END_FIELDS = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
_LAST_DELTA = struct.Struct(">i").unpack_from
_LAST_DELTA_OFFSET = 23
_CRC_START = 21
# crc, magic, attributes, key and value lengths: the smallest v0 message after the offset
# and size fields (Java's LegacyRecord.RECORD_OVERHEAD_V0).
_LEGACY_MIN_SIZE = 14

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
#: A control record's key: version, type (0 ABORT, 1 COMMIT).
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_MASK = 0x20


class ConsumerRecord(NamedTuple):
    """One consumed record. Field names and order are kafka-python's ``ConsumerRecord``.

    ``leader_epoch`` is the epoch of the leader that appended the record's batch (-1 for
    old message formats), which is what a position must carry.
    """

    topic: str
    partition: int
    leader_epoch: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: list[tuple[str, bytes | None]]
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


class BatchInfo(NamedTuple):
    """What the engine needs to know about each batch, even a batch with no returned records."""

    base_offset: int
    next_offset: int
    leader_epoch: int


class DecodedFetch(NamedTuple):
    records: list[ConsumerRecord]
    #: offset after the last complete batch seen (None if no complete batch)
    next_offset: int | None
    #: leader epoch of the last complete batch (None if no complete batch or no epoch)
    last_epoch: int | None
    #: encoded size of the complete batches
    size: int
    #: read_committed: the transactional batches at or after the fetch offset (what the
    #: partition's :class:`~epochguard.offsets.reopened.TransactionLedger` reads)
    transactions: Sequence[TxnBatch] = ()


log = get_logger("epochguard.consumer")


def _load_native() -> tuple[Callable[..., None] | None, str]:
    if pure_python_chosen():
        return None, f"{PURE_PYTHON_ENV} is set"
    try:
        from epochguard.consumer import _crecords
    except ImportError as exc:  # not built (no compiler at install time): pure Python
        return None, f"C extension not importable: {exc}"
    return _crecords.decode_batch_records, "C extension loaded"


#: The per-record decoder: ``epochguard.consumer._crecords.decode_batch_records`` (C) or
#: ``None`` for the pure-Python fallback :func:`_decode_batch_records`.
_native, _native_reason = _load_native()
#: Which decoder :func:`decode_records` uses in this process: ``"c"`` or ``"python"``.
DECODER = "c" if _native is not None else "python"
#: :func:`fetch_end`'s walk in C, with the C decoder (an extension built from older sources
#: lacks it).
_native_fetch_end: Callable[[Any], Any] | None = None
_native_batch_cuts: Callable[[Any, int, int], list[tuple[int, int]] | None] | None = None
if _native is not None:
    from epochguard.consumer import _crecords

    _native_fetch_end = getattr(_crecords, "fetch_end", None)
    _native_batch_cuts = getattr(_crecords, "batch_cuts", None)
_logged = False

if _native is None:
    warn_once(_native_reason)


def log_decoder_once() -> None:
    """Log (debug) which record decoder is active, the first time a consumer starts."""
    global _logged
    if not _logged:
        _logged = True
        log.debug("record_decoder_selected", decoder=DECODER, reason=_native_reason)


def _counted(n: int, noun: str) -> str:
    """``"1 record"``, ``"2 records"``: the C decoder's wording, which errors must match."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


#: ``(topic, headers, data) -> value``; see :func:`as_deserializer`.
#: Zigzag-decoded values of every 1-byte (index < 128) and 2-byte varint, indexed by the
#: raw 14-bit payload: one list lookup instead of shifts and masks on the hot path.
_ZZ = [(n >> 1) ^ -(n & 1) for n in range(1 << 14)]

Deserializer = Callable[[str, list[tuple[str, bytes | None]], Any], Any]


def as_deserializer(obj: Any) -> Deserializer | None:
    """Accept kafka-python's forms: a ``Deserializer`` object or a plain ``fn(bytes)``."""
    if obj is None:
        return None
    deserialize = getattr(obj, "deserialize", None)
    if callable(deserialize):
        return deserialize  # type: ignore[no-any-return]
    if callable(obj):
        fn = obj
        return lambda _topic, _headers, data: fn(data)
    raise TypeError(f"not a deserializer: {obj!r}")


#: The most bytes one compressed batch may inflate to. Kafka's own limits bound only the
#: compressed size, so without this a few KB of zeros (a "compression bomb", or garbage
#: that happens to decompress) could take all memory; a batch past it is a
#: ``CorruptRecordError``. Raise it for producers with a larger ``batch.size``.
MAX_DECOMPRESSED_BATCH_BYTES = 64 * 1024 * 1024

_CODEC_NAMES = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
# xerial snappy framing (what Java's SnappyOutputStream writes): magic, version, compat.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


_CHUNK = 1 << 20

#: Each thread inflates batches into one buffer of its own, kept between batches. Inflated
#: into a fresh allocation, every batch (512 KB at the default batch size) was mapped,
#: paged in and unmapped again by malloc: an lz4 batch took up to twice as long as
#: inflating it into memory already paged in. Kept up to this size; a larger batch
#: inflates into an allocation of its own.
_SCRATCH_KEEP = 16 << 20
_SCRATCH = threading.local()


def _scratch() -> bytearray:
    """This thread's inflate buffer (at first :data:`_CHUNK` bytes). Its contents are the
    last batch inflated on this thread: a caller reads them before the next one."""
    buf: bytearray | None = getattr(_SCRATCH, "buf", None)
    if buf is None:
        buf = _SCRATCH.buf = bytearray(_CHUNK)
    return buf


def _scratch_fitting(size: int) -> bytearray | None:
    """:func:`_scratch`, grown to at least ``size`` bytes; ``None`` past
    :data:`_SCRATCH_KEEP`."""
    buf = _scratch()
    if len(buf) >= size:
        return buf
    if size > _SCRATCH_KEEP:
        return None
    # A new buffer, not a resize: a view of the old one may still be held.
    buf = _SCRATCH.buf = bytearray(size)
    return buf


class _Bomb(Exception):
    """Inflating would pass the limit."""


def _inflate_gzip(data: bytes | memoryview, limit: int) -> bytes:
    import zlib

    # A MiB at a time, so that a bomb is refused holding about ``limit`` bytes, not twice.
    parts: list[bytes] = []
    size = 0
    rest = data
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not d.eof:
            chunk = d.decompress(rest, _CHUNK)
            rest = d.unconsumed_tail
            if not chunk and not rest and not d.eof:
                raise ValueError("gzip stream is cut short")
            size += len(chunk)
            if size > limit:
                raise _Bomb
            parts.append(chunk)
        rest = d.unused_data
        if not rest:
            return b"".join(parts)


def _snappy_length(block: bytes | memoryview) -> int:
    """The uncompressed length a raw snappy block announces (its leading varint)."""
    size = shift = i = 0
    while True:
        if i >= len(block) or shift > 28:
            raise ValueError("bad snappy length preamble")
        b = block[i]
        size |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return size
        shift += 7


def _inflate_snappy(data: bytes | memoryview, limit: int) -> bytes | memoryview:
    # python-snappy 0.7 is a wrapper around cramjam, whose *_into call lets every block of
    # a xerial stream inflate straight into one buffer (no per-block bytes, no join).
    import cramjam

    # Each raw block starts with its uncompressed length: checked against the limit before
    # anything is inflated.
    if data[:8] != _XERIAL_MAGIC:
        if _snappy_length(data) > limit:
            raise _Bomb
        return bytes(cramjam.snappy.decompress_raw(data))
    view = memoryview(data)
    blocks: list[tuple[memoryview, int]] = []
    size = 0
    cursor = 16
    while cursor < len(view):
        if cursor + 4 > len(view):
            raise ValueError("xerial snappy block size is cut short")
        (block_size,) = struct.unpack_from(">i", view, cursor)
        cursor += 4
        if block_size < 0 or cursor + block_size > len(view):
            raise ValueError(f"xerial snappy block of {block_size} bytes does not fit")
        block = view[cursor : cursor + block_size]
        n = _snappy_length(block)
        size += n
        if size > limit:
            raise _Bomb
        blocks.append((block, n))
        cursor += block_size
    out = _scratch_fitting(size)
    target = memoryview(out if out is not None else bytearray(size))[:size]
    pos = 0
    for block, n in blocks:
        # The decoder checks the block against its announced length, so each fills exactly
        # its slot; it raises on a block that does not.
        cramjam.snappy.decompress_raw_into(block, target[pos : pos + n])
        pos += n
    return target


def _inflate_lz4(data: bytes | memoryview, limit: int) -> bytes:
    import lz4.frame  # type: ignore[import-untyped]

    parts: list[bytes] = []
    size = 0
    rest = data
    while rest:
        d = lz4.frame.LZ4FrameDecompressor()
        chunk = d.decompress(rest, max_length=_CHUNK)
        while True:
            size += len(chunk)
            if size > limit:
                raise _Bomb
            parts.append(chunk)
            if d.eof or d.needs_input:
                break
            chunk = d.decompress(b"", max_length=_CHUNK)
        if not d.eof:
            raise ValueError("lz4 frame is cut short")
        rest = d.unused_data
    return b"".join(parts)


_ZSTD = threading.local()


def _zstd_decompressor() -> Any:
    """This thread's ZstdDecompressor (not thread-safe; making one per batch cost about
    8% of inflating a 512 KB batch)."""
    d = getattr(_ZSTD, "d", None)
    if d is None:
        import zstandard

        d = _ZSTD.d = zstandard.ZstdDecompressor()
    return d


def _inflate_zstd(data: bytes | memoryview, limit: int) -> bytes:
    import io

    import zstandard

    declared = zstandard.frame_content_size(data)
    if 0 <= declared <= limit:
        # The frame says how large it is: one call into a buffer of that size, which zstd
        # cannot write past (a quarter faster than streaming a 512 KB batch). A second
        # frame does not fit that buffer: it takes the streaming path below.
        try:
            return bytes(_zstd_decompressor().decompress(data))
        except zstandard.ZstdError:
            pass
    parts: list[bytes] = []
    size = 0
    with zstandard.ZstdDecompressor().stream_reader(
        io.BytesIO(data), read_across_frames=True
    ) as reader:
        while True:
            chunk = reader.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise _Bomb
            parts.append(chunk)
    return b"".join(parts)


_Inflate = Callable[[bytes | memoryview, int], bytes | memoryview]


def _into_scratch(codec: str, exact: _Inflate) -> _Inflate:
    """An inflater that writes into the thread's buffer with cramjam's ``decompress_into``
    (which reads every concatenated frame, as Kafka's own decoders do) and falls back to
    ``exact``, which streams and so tells a bomb, a cut frame and bad data apart, when the
    data does not fit the buffer or does not decompress."""

    def inflate(data: bytes | memoryview, limit: int) -> bytes | memoryview:
        try:
            import cramjam
        except ImportError:  # an optional package: the codec's own library inflates
            return exact(data, limit)
        into = getattr(cramjam, codec).decompress_into
        buf = _scratch()
        try:
            n = into(data, buf)
        except Exception:  # cramjam's errors do not say which case: the exact path does
            out = exact(data, limit)
            _scratch_fitting(len(out))  # the next batch of this size fits
            return out
        if n > limit:
            raise _Bomb
        return memoryview(buf)[:n]

    return inflate


_INFLATE: dict[int, _Inflate] = {
    1: _into_scratch("gzip", _inflate_gzip),
    2: _inflate_snappy,
    3: _into_scratch("lz4", _inflate_lz4),
    # python-zstandard inflates a frame that declares its size (as Kafka's producers write
    # them) into one allocation of that size, which malloc reuses: no gain from the buffer.
    4: _inflate_zstd,
}


def _decompress(codec: int, data: bytes | memoryview, where: str) -> bytes | memoryview:
    """``data`` inflated, at most ``MAX_DECOMPRESSED_BATCH_BYTES`` (read at each call, so
    it can be changed at run time); ``where`` names the batch in errors. Usually a view of
    the thread's inflate buffer (:func:`_scratch`): read it before the thread inflates
    another batch."""
    limit = MAX_DECOMPRESSED_BATCH_BYTES
    inflate = _INFLATE.get(codec)
    if inflate is None:
        raise CorruptRecordError(f"{where}: unknown compression codec {codec}")
    name = _CODEC_NAMES[codec]
    try:
        out = inflate(data, limit)
    except ImportError as exc:
        raise CorruptRecordError(
            f"{where}: {name} compression needs the {exc.name!r} package, which is not installed"
        ) from exc
    except _Bomb:
        out = None
    except Exception as exc:  # each codec library has its own error types
        raise CorruptRecordError(f"{where}: {name} data does not decompress: {exc!r}") from exc
    if out is None:
        raise CorruptRecordError(
            f"{where}: {name} data inflates past {limit} bytes "
            "(records.MAX_DECOMPRESSED_BATCH_BYTES)"
        )
    return out


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= end:
            # ``buf`` may go on with the next batch: its bytes are not this record's.
            raise IndexError("varint past the end of the batch")
        b = buf[pos]
        pos += 1
        # The tenth byte may only carry bit 63: a longer value is no 64-bit varint.
        if shift == 63 and b > 1:
            raise CorruptRecordError("varint too long")
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint too long")


def _decode_batch_records(
    buf: bytes,
    pos: int,
    end: int,
    count: int,
    topic: str,
    partition: int,
    epoch: int,
    base_offset: int,
    base_ts: int,
    ts_type: int,
    log_append_ts: int | None,
    min_offset: int,
    out: list[ConsumerRecord],
    key_des: Deserializer | None,
    value_des: Deserializer | None,
) -> None:
    new = tuple.__new__
    cls = ConsumerRecord
    append = out.append
    read_varint = _read_varint
    zz = _ZZ
    for i in range(count):
        b = buf[pos]
        if b < 0x80:
            size = zz[b]
            pos += 1
        elif buf[pos + 1] < 0x80:
            size = zz[(b & 0x7F) | (buf[pos + 1] << 7)]
            pos += 2
        else:
            size, pos = read_varint(buf, pos, end)
        record_start = pos
        pos += 1  # record attributes, unused
        b = buf[pos]
        if b < 0x80:
            ts_delta = zz[b]
            pos += 1
        elif buf[pos + 1] < 0x80:
            ts_delta = zz[(b & 0x7F) | (buf[pos + 1] << 7)]
            pos += 2
        else:
            ts_delta, pos = read_varint(buf, pos, end)
        b = buf[pos]
        if b < 0x80:
            off_delta = zz[b]
            pos += 1
        elif buf[pos + 1] < 0x80:
            off_delta = zz[(b & 0x7F) | (buf[pos + 1] << 7)]
            pos += 2
        else:
            off_delta, pos = read_varint(buf, pos, end)
        b = buf[pos]
        if b < 0x80:
            klen = zz[b]
            pos += 1
        else:
            klen, pos = read_varint(buf, pos, end)
        if klen >= 0:
            key: Any = buf[pos : pos + klen]
            pos += klen
        else:
            key = None
        b = buf[pos]
        if b < 0x80:
            vlen = zz[b]
            pos += 1
        elif buf[pos + 1] < 0x80:
            vlen = zz[(b & 0x7F) | (buf[pos + 1] << 7)]
            pos += 2
        else:
            vlen, pos = read_varint(buf, pos, end)
        if vlen >= 0:
            value: Any = buf[pos : pos + vlen]
            pos += vlen
        else:
            value = None
        b = buf[pos]
        if b == 0:
            pos += 1
            headers: list[tuple[str, bytes | None]] = []
            hsize = -1
        else:
            nh, pos = read_varint(buf, pos, end)
            headers = []
            hsize = 0
            for _h in range(nh):
                hklen, pos = read_varint(buf, pos, end)
                if hklen < 0:
                    raise CorruptRecordError(
                        f"{topic}-{partition}: negative header key length in batch at offset "
                        f"{base_offset}"
                    )
                if pos + hklen > end:
                    raise IndexError("header key past the end of the batch")
                try:
                    hkey = buf[pos : pos + hklen].decode("utf-8")
                except UnicodeDecodeError:
                    raise CorruptRecordError(
                        f"{topic}-{partition}: header key is not UTF-8 in batch at offset "
                        f"{base_offset}"
                    ) from None
                pos += hklen
                hvlen, pos = read_varint(buf, pos, end)
                if hvlen >= 0:
                    if pos + hvlen > end:
                        raise IndexError("header value past the end of the batch")
                    hval: bytes | None = buf[pos : pos + hvlen]
                    pos += hvlen
                    hsize += hklen + hvlen
                else:
                    hval = None
                    hsize += hklen
                headers.append((hkey, hval))
        if pos > end:
            # Before any deserializer sees it: a record that ran into the next batch.
            raise IndexError("record past the end of the batch")
        if pos - record_start != size:
            # Java's DefaultRecord.readFrom refuses it too: the fields and the declared size
            # disagree, so at least one of them is wrong.
            raise CorruptRecordError(
                f"{topic}-{partition}: record {i} of the batch at offset {base_offset} "
                f"declares {size} bytes but holds {pos - record_start}"
            )
        offset = base_offset + off_delta
        if offset < min_offset:
            continue
        if key_des is not None:
            key = key_des(topic, headers, key)
        if value_des is not None:
            value = value_des(topic, headers, value)
        append(
            new(
                cls,
                (
                    topic,
                    partition,
                    epoch,
                    offset,
                    base_ts + ts_delta if log_append_ts is None else log_append_ts,
                    ts_type,
                    key,
                    value,
                    headers,
                    None,
                    klen,  # -1 for a null key, as kafka-python reports it
                    vlen,
                    hsize,
                ),
            )
        )
    if pos > end:
        # A key or value ran past the end: the same error as any other truncated record.
        raise IndexError("record past the end of the batch")
    if pos != end:
        raise CorruptRecordError(
            f"{topic}-{partition}: the batch at offset {base_offset} has "
            f"{_counted(end - pos, 'byte')} after its {_counted(count, 'record')}"
        )


def decode_records(
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
    transactions: list[TxnBatch] | None = None,
) -> DecodedFetch:
    """Decode every complete batch of one partition's fetched bytes.

    Records below ``fetch_offset`` (the broker returns whole batches) are skipped; control
    batches and, with ``read_committed``, aborted transactional batches are skipped too but
    still advance ``next_offset``. A trailing partial batch (the broker cuts at the byte
    limit) is ignored. Bytes that cannot be decoded raise ``CorruptRecordError``; a
    deserializer that raises, ``RecordDeserializationError`` naming the record's offset and
    holding the records before it. ``transactions``: a list that gets the transactional
    batches (:class:`~epochguard.offsets.reopened.TxnBatch`), also in
    ``DecodedFetch.transactions``.
    """
    out: list[ConsumerRecord] = []
    args = (data, topic, partition, fetch_offset, check_crcs)
    try:
        return _decode_into(
            out,
            *args,
            key_deserializer,
            value_deserializer,
            aborted_producers,
            read_committed,
            transactions,
        )
    except Exception as exc:
        if key_deserializer is None and value_deserializer is None:
            raise
        # Whose exception: the deserializer's, or the decoder's on corrupt bytes (an
        # IndexError from a deserializer even became "truncated record")? Decoding the same
        # bytes without deserializers tells, at no cost to the hot path: corrupt bytes raise
        # CorruptRecordError again, and else the record the deserializer failed on is the
        # next one after the records it returned.
        raw = _decode_into([], *args, None, None, aborted_producers, read_committed, None).records
        if len(raw) <= len(out):
            raise
        failed = raw[len(out)]
        if isinstance(exc, CorruptRecordError) and exc.__cause__ is not None:
            exc = exc.__cause__  # the deserializer's own exception, not the decoder's guess
        raise RecordDeserializationError(
            f"{topic}-{partition}: the deserializer failed on the record at offset "
            f"{failed.offset} ({type(exc).__name__}: {exc}); seek past it to go on",
            tp=None,
            offset=failed.offset,
            records=out,
        ) from exc


def _decode_into(
    out: list[ConsumerRecord],
    data: bytes | bytearray | memoryview | None,
    topic: str,
    partition: int,
    fetch_offset: int,
    check_crcs: bool,
    key_deserializer: Deserializer | None,
    value_deserializer: Deserializer | None,
    aborted_producers: Sequence[tuple[int, int]] | None,
    read_committed: bool,
    transactions: list[TxnBatch] | None,
) -> DecodedFetch:
    if not data:
        return DecodedFetch(out, None, None, 0)
    native = _native

    def v2(body: Any, bstart: int, bend: int, count: int, info: V2Batch) -> None:
        args = (
            body,
            bstart,
            bend,
            count,
            topic,
            partition,
            info.epoch,
            info.base_offset,
            info.base_ts,
            info.ts_type,
            info.log_append_ts,
            fetch_offset,
            out,
            key_deserializer,
            value_deserializer,
        )
        if native is not None:
            native(*args, ConsumerRecord)
        else:
            _decode_batch_records(*args)

    def legacy(chunk: bytes) -> tuple[int | None, int | None]:
        return _decode_legacy(
            chunk,
            topic,
            partition,
            fetch_offset,
            check_crcs,
            out,
            key_deserializer,
            value_deserializer,
        )

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
    return DecodedFetch(out, next_offset, last_epoch, size, transactions or ())


class V2Batch(NamedTuple):
    """What a v2 batch's header says about the records in it."""

    base_offset: int
    epoch: int
    base_ts: int
    ts_type: int
    #: the batch's max timestamp when its timestamps are the broker's (LogAppendTime)
    log_append_ts: int | None


def fetch_end(data: Any) -> tuple[int, int | None] | None:
    """``(next_offset, last_epoch)`` that decoding ``data`` will return, read from the batch
    headers alone (no CRC, no records): what the fetch after this one asks for, known before
    the records are decoded. ``None`` when it cannot be told that way (legacy message sets,
    no complete batch, a header that does not parse: the decoder has the last word). The C
    extension walks the headers when it is loaded (one Python step per batch is felt with
    small batches: 2.8 ms per MiB of one-record batches of 100 B, 0.03 in C)."""
    if _native_fetch_end is not None:
        end = _native_fetch_end(data)
        if end is not NotImplemented:
            return end  # type: ignore[no-any-return]
    return _fetch_end_python(data)


def batch_cuts(data: Any, max_records: int, max_bytes: int) -> list[tuple[int, int]] | None:
    """Where to cut one partition's fetched bytes into pieces of whole v2 batches of at most
    ``max_records`` records and ``max_bytes`` bytes each (a batch larger than that is a
    piece of its own): ``(end, records)`` of each piece, the last end where the complete
    batches end, ``records`` what its batch headers count (control batches included).
    Decoding the pieces one after the other, each from the offset the one before ended at,
    returns what decoding the whole returns. ``None`` where the C extension is not loaded,
    for legacy message sets, and without a complete batch: decode the whole then."""
    if _native_batch_cuts is None:
        return None
    return _native_batch_cuts(data, max_records, max_bytes)


def _fetch_end_python(data: Any) -> tuple[int, int | None] | None:
    total = len(data)
    pos = 0
    next_offset: int | None = None
    last_epoch: int | None = None
    unpack = _END_FIELDS.unpack_from
    try:
        while pos + _HEADER_SIZE <= total:
            base_offset, length, epoch, magic = unpack(data, pos)
            if magic != 2 or length + _LOG_OVERHEAD < _HEADER_SIZE:
                return None
            end = pos + _LOG_OVERHEAD + length
            if end > total:
                break  # partial batch at the end, as the decoder skips it
            next_offset = base_offset + _LAST_DELTA(data, pos + _LAST_DELTA_OFFSET)[0] + 1
            if epoch >= 0:
                last_epoch = epoch
            pos = end
    except struct.error:
        return None
    return None if next_offset is None else (next_offset, last_epoch)


def _marker_kind(buf: Any, start: int, end: int, codec: int) -> BatchKind | None:
    """COMMIT or ABORT: the type in the key of a control batch's record (version int16,
    type int16); ``None`` for another control record (a KRaft one) or one that does not
    parse (the batch is skipped either way)."""
    try:
        if codec:
            body: Any = _decompress(codec, memoryview(buf)[start:end], "control batch")
            start, end = 0, len(body)
        else:
            body = buf
        pos = _read_varint(body, start, end)[1]  # record length
        pos += 1  # attributes
        pos = _read_varint(body, pos, end)[1]  # timestamp delta
        pos = _read_varint(body, pos, end)[1]  # offset delta
        key_len, pos = _read_varint(body, pos, end)
        if key_len < 4 or pos + 4 > end:
            return None
        kind = _CONTROL_KEY.unpack_from(body, pos)[1]
    except (IndexError, struct.error, CorruptRecordError):
        return None
    if kind == 1:
        return BatchKind.COMMIT
    if kind == 0:
        return BatchKind.ABORT
    return None


def walk_batches(
    data: bytes | bytearray | memoryview,
    topic: str,
    partition: int,
    fetch_offset: int,
    *,
    check_crcs: bool,
    aborted_producers: Sequence[tuple[int, int]] | None,
    read_committed: bool,
    in_place: bool,
    v2: Callable[[Any, int, int, int, V2Batch], None],
    legacy: Callable[[bytes], tuple[int | None, int | None]],
    transactions: list[TxnBatch] | None = None,
) -> tuple[int | None, int | None, int]:
    """The batch layer of one partition's fetched bytes: headers, CRCs, control and aborted
    batches, decompression; each v2 batch's records go to ``v2(body, start, end, count,
    info)`` and each legacy message set to ``legacy(chunk)``. Returns ``(next_offset,
    last_epoch, size)`` as :class:`DecodedFetch` has them. ``in_place``: the record decoder
    reads any contiguous buffer (the C ones), else ``data`` is copied to ``bytes`` once.
    ``transactions`` (read_committed): gets each transactional batch past ``fetch_offset``
    (data delivered or skipped as aborted, COMMIT and ABORT markers)."""
    # The C decoder reads any contiguous buffer in place (the lean Fetch path hands it a
    # memoryview into the response frame); the pure-Python one slices keys and values,
    # which must come out as bytes, so it takes one copy of the section.
    buf: Any = data if in_place or isinstance(data, bytes) else bytes(data)
    total = len(buf)
    pos = 0
    next_offset: int | None = None
    last_epoch: int | None = None
    unpack = _HEADER.unpack_from
    view = memoryview(buf)
    # Aborted-transaction bookkeeping (KIP-98): (producer_id, first_offset) sorted by offset.
    aborted = sorted(aborted_producers or (), key=lambda a: a[1]) if read_committed else []
    aborted_idx = 0
    aborting: set[int] = set()
    while pos + _LOG_OVERHEAD <= total:
        base_offset, length = struct.unpack_from(">qi", buf, pos)
        # As Java's ByteBufferLogInputStream: a size below the smallest record is garbage
        # (not a cut), checked before the cut so that a negative size is not mistaken for one.
        if length < _LEGACY_MIN_SIZE:
            raise CorruptRecordError(
                f"{topic}-{partition}: record batch at offset {base_offset} has size {length}, "
                f"less than the minimum {_LEGACY_MIN_SIZE}"
            )
        batch_end = pos + _LOG_OVERHEAD + length
        if batch_end > total:
            break  # partial batch at the end of the response
        magic = buf[pos + _MAGIC_OFFSET]
        if magic != 2:
            if magic > 2:  # a signed byte on the wire: 128..255 are negative
                raise CorruptRecordError(
                    f"{topic}-{partition}: record batch at offset {base_offset} has unknown "
                    f"magic {magic if magic < 128 else magic - 256}"
                )
            nxt, ep = legacy(bytes(buf[pos:batch_end]))
            if nxt is not None:
                next_offset = nxt
                last_epoch = ep
            pos = batch_end
            continue
        if length + _LOG_OVERHEAD < _HEADER_SIZE:
            raise CorruptRecordError(
                f"{topic}-{partition}: record batch at offset {base_offset} has size {length}, "
                f"less than a v2 batch header ({_HEADER_SIZE - _LOG_OVERHEAD})"
            )
        (
            _base,
            _len,
            epoch,
            _magic,
            crc,
            attrs_,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            _pe,
            _seq,
            count,
        ) = unpack(buf, pos)
        # A memoryview: slicing the bytes would copy every batch once more just for the CRC.
        if check_crcs and crc32c.crc32c(view[pos + _CRC_START : batch_end]) != crc:
            raise CorruptRecordError(
                f"{topic}-{partition}: record batch at offset {base_offset} failed its CRC check"
            )
        if count < 0:
            raise CorruptRecordError(
                f"{topic}-{partition}: record batch at offset {base_offset} has a negative "
                f"record count {count}"
            )
        batch_next = base_offset + last_delta + 1
        body_start = pos + _HEADER_SIZE
        pos = batch_end
        next_offset = batch_next
        last_epoch = epoch if epoch >= 0 else last_epoch
        if batch_next <= fetch_offset:
            continue
        if attrs_ & _CONTROL_MASK:
            if read_committed and count == 1:
                aborting.discard(producer_id)
            if transactions is not None and count == 1:
                kind = _marker_kind(buf, body_start, batch_end, attrs_ & _COMPRESSION_MASK)
                if kind is not None:
                    transactions.append(
                        TxnBatch(
                            producer_id, _pe, max(base_offset, fetch_offset), batch_next - 1, kind
                        )
                    )
            continue
        if read_committed and attrs_ & _TRANSACTIONAL_MASK:
            while aborted_idx < len(aborted) and aborted[aborted_idx][1] <= batch_next - 1:
                aborting.add(aborted[aborted_idx][0])
                aborted_idx += 1
            skipped = producer_id in aborting
            if transactions is not None:
                transactions.append(
                    TxnBatch(
                        producer_id,
                        _pe,
                        max(base_offset, fetch_offset),
                        batch_next - 1,
                        BatchKind.SKIPPED if skipped else BatchKind.DELIVERED,
                    )
                )
            if skipped:
                continue
        ts_type = 1 if attrs_ & _TIMESTAMP_TYPE_MASK else 0
        codec = attrs_ & _COMPRESSION_MASK
        if codec:
            # The codecs read the compressed bytes in place (no copy of each batch).
            body = _decompress(
                codec,
                view[body_start:batch_end],
                f"{topic}-{partition}: record batch at offset {base_offset}",
            )
            if not in_place and type(body) is not bytes:
                body = bytes(body)  # the pure-Python decoder slices keys and values
            bstart, bend = 0, len(body)
        else:
            body = buf
            bstart, bend = body_start, batch_end
        info = V2Batch(base_offset, epoch, base_ts, ts_type, max_ts if ts_type == 1 else None)
        try:
            v2(body, bstart, bend, count, info)
        except IndexError as exc:
            raise CorruptRecordError(
                f"{topic}-{partition}: truncated record in batch at offset {base_offset}"
            ) from exc
    return next_offset, last_epoch, pos if next_offset is not None else 0


def _bound_legacy_wrapper(chunk: bytes, where: str) -> None:
    """kafka-python inflates a compressed v0/v1 wrapper message without a limit: inflate
    its value here first, bounded, so that a bomb is refused before that."""
    try:
        base_offset, _size, _crc, magic, attrs = struct.unpack_from(">qiIbb", chunk, 0)
        codec = attrs & _COMPRESSION_MASK
        if not codec or (magic == 0 and codec == 3):
            return  # uncompressed; or v0 lz4, whose broken frame header only kafka-python reads
        pos = 18 + (8 if magic == 1 else 0)
        (klen,) = struct.unpack_from(">i", chunk, pos)
        pos += 4 + max(klen, 0)
        (vlen,) = struct.unpack_from(">i", chunk, pos)
        value = chunk[pos + 4 : pos + 4 + max(vlen, 0)]
    except struct.error as exc:
        raise CorruptRecordError(f"{where} is cut short: {exc}") from exc
    _decompress(codec, value, f"{where} {base_offset}")


def _decode_legacy(
    chunk: bytes,
    topic: str,
    partition: int,
    fetch_offset: int,
    check_crcs: bool,
    out: list[ConsumerRecord],
    key_des: Deserializer | None,
    value_des: Deserializer | None,
) -> tuple[int | None, int | None]:
    from kafka.record import MemoryRecords

    nxt: int | None = None
    parsed: list[Any] = []
    _bound_legacy_wrapper(chunk, f"{topic}-{partition}: legacy message at offset")
    try:
        records = MemoryRecords(chunk)
        while True:
            batch = records.next_batch()
            if batch is None:
                break
            parsed += batch
    except Exception as exc:  # kafka-python's parser fails with bare struct/index errors
        raise CorruptRecordError(
            f"{topic}-{partition}: legacy message set does not parse: {exc!r}"
        ) from exc
    for rec in parsed:
        if check_crcs and not rec.validate_crc():
            raise CorruptRecordError(f"{topic}-{partition}: record {rec.offset} failed CRC")
        nxt = rec.offset + 1
        if rec.offset < fetch_offset:
            continue
        key, value = rec.key, rec.value
        out.append(
            ConsumerRecord(
                topic,
                partition,
                -1,
                rec.offset,
                rec.timestamp,
                rec.timestamp_type,
                key if key_des is None else key_des(topic, [], key),
                value if value_des is None else value_des(topic, [], value),
                [],
                rec.checksum,
                -1 if key is None else len(key),
                -1 if value is None else len(value),
                -1,
            )
        )
    return nxt, None
