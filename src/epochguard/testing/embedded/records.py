"""A small, fast v2 record batch builder for direct appends and benchmarks."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Sequence

import crc32c

_AFTER_CRC = struct.Struct(">hiqqqhii")


def _varint(value: int, out: bytearray) -> None:
    v = (value << 1) ^ (value >> 63)  # zigzag
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


Record = (
    bytes
    | None
    | tuple[bytes | None, bytes | None]
    | tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
)


def build_batch(
    records: Iterable[Record],
    *,
    timestamp_ms: int | None = None,
    base_offset: int = 0,
    leader_epoch: int = -1,
) -> bytes:
    """One uncompressed v2 batch. A record is a value, ``(key, value)`` or
    ``(key, value, headers)``; values and keys are bytes or None."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    body = bytearray()
    count = 0
    for i, rec in enumerate(records):
        headers: Sequence[tuple[str, bytes | None]] = ()
        if isinstance(rec, tuple):
            key, value = rec[0], rec[1]
            if len(rec) == 3:
                headers = rec[2]
        else:
            key, value = None, rec
        r = bytearray(b"\x00")  # attributes
        _varint(0, r)  # timestamp delta
        _varint(i, r)
        if key is None:
            _varint(-1, r)
        else:
            _varint(len(key), r)
            r += key
        if value is None:
            _varint(-1, r)
        else:
            _varint(len(value), r)
            r += value
        _varint(len(headers), r)
        for hk, hv in headers:
            hkb = hk.encode()
            _varint(len(hkb), r)
            r += hkb
            if hv is None:
                _varint(-1, r)
            else:
                _varint(len(hv), r)
                r += hv
        _varint(len(r), body)
        body += r
        count += 1
    if count == 0:
        raise ValueError("a record batch needs at least one record")
    return _frame(0, count, ts, -1, -1, -1, bytes(body), base_offset, leader_epoch)


def _frame(
    attributes: int,
    count: int,
    ts: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    body: bytes,
    base_offset: int,
    leader_epoch: int,
) -> bytes:
    after_crc = (
        _AFTER_CRC.pack(
            attributes, count - 1, ts, ts, producer_id, producer_epoch, base_sequence, count
        )
        + body
    )
    crc = crc32c.crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, leader_epoch, 2, crc) + after_crc


#: v2 batch attributes: the batch belongs to a transaction / is a control batch.
TRANSACTIONAL = 0x10
CONTROL = 0x20


def build_control_batch(
    producer_id: int,
    producer_epoch: int,
    *,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int | None = None,
) -> bytes:
    """A transaction marker: one control record, key (version 0, type 1 COMMIT / 0 ABORT)
    and value (version 0, coordinator epoch), as Kafka's ``EndTransactionMarker``."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, coordinator_epoch)
    r = bytearray(b"\x00")
    _varint(0, r)  # timestamp delta
    _varint(0, r)  # offset delta
    _varint(len(key), r)
    r += key
    _varint(len(value), r)
    r += value
    _varint(0, r)  # no headers
    body = bytearray()
    _varint(len(r), body)
    body += r
    return _frame(
        TRANSACTIONAL | CONTROL, 1, ts, producer_id, producer_epoch, -1, bytes(body), 0, -1
    )
