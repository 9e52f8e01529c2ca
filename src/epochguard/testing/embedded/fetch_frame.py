"""Fetch responses written as a list of buffers, the stored record batches among them
uncopied.

kafka-python's encoder copies every records section twice (into its encode buffer and out
of it) and spends a Python call per field; at 1 KB values that was a third of what the
broker did per Fetch. Here the fixed fields of an answer are packed into small byte
strings and each partition's records are handed on as they are, for
``StreamWriter.writelines``.

A partition's records are read from its log as the stored batches themselves
(:class:`StoredBatches`), never joined, and :func:`write_parts` writes the buffers with
``os.writev`` as the socket takes them: on Python 3.11 asyncio's ``writelines`` joins them
into one copy and its transport copies again whatever the socket does not take at once; at
1 KB values those copies were a third of the broker's CPU, and a 50 MiB answer stopped
the broker for about 100 ms.

Only the common answer is written this way: no aborted transactions (a null or empty
list), none of the tagged fields (a diverging epoch, a current leader, a snapshot id, node
endpoints). Those answers are small and rare (errors, divergence, aborted transactions);
:func:`fetch_response_parts` returns ``None`` for them and the server uses kafka-python's
encoder. ``tests/embedded/test_fetch_frame.py`` holds the bytes equal to kafka-python's for
every version.
"""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = [
    "StoredBatches",
    "fetch_response_parts",
    "join_stored_batches",
    "write_parts",
]

#: Records sections at least this long travel as their own buffer; smaller ones are copied
#: into the surrounding bytes (one buffer less to hand on).
_SEPARATE_BYTES = 4096

_I16 = struct.Struct(">h").pack
_I32 = struct.Struct(">i").pack
_HEAD_V4 = struct.Struct(">ihqq")  # partition, error, high watermark, last stable offset
_I64 = struct.Struct(">q").pack


#: Buffers per ``writev`` call (Linux's IOV_MAX).
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


@attrs.frozen
class StoredBatches:
    """One partition's records in a Fetch answer: stored batches, in order, not joined.

    ``len()`` is the byte size, as for the ``bytes`` kafka-python's encoder takes;
    :func:`join_stored_batches` turns them into that when an answer is left to it."""

    batches: Sequence[bytes]
    size: int = attrs.field()

    @size.default
    def _size(self) -> int:
        return sum(len(b) for b in self.batches)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.batches)


def join_stored_batches(response: Any) -> None:
    """Replace every :class:`StoredBatches` of ``response`` by its bytes (for kafka-python's
    encoder, which takes nothing else)."""
    for topic in response.responses:
        for p in topic.partitions:
            if isinstance(p.records, StoredBatches):
                p.records = bytes(p.records)


async def write_parts(writer: asyncio.StreamWriter, parts: list[bytes | memoryview]) -> None:
    """Write ``parts`` in order on ``writer``: straight to the socket with ``writev``
    while the transport holds nothing (a plain TCP connection; TLS goes through the
    transport). What the socket does not take at once waits here (one part handed to the
    transport, then until the socket took it) instead of being joined into one buffer for
    the transport.

    Joining a 50 MiB answer and the transport's own copy of it (each a fresh allocation
    that glibc maps from the system and faults in page by page) kept the broker from
    writing for about 100 ms per answer, while the client waited."""
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        transport.writelines(parts)
        return
    # drain() then waits until the transport holds nothing (the default lets it hold
    # 64 KiB), so a part is never written straight to the socket past one it still holds.
    transport.set_write_buffer_limits(high=0)
    fd = sock.fileno()
    pending = [part for part in parts if len(part)]  # an empty buffer would stall writev
    i = 0
    while i < len(pending):
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() == 0:
            try:
                sent = os.writev(fd, pending[i : i + _IOV_MAX])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                break  # the transport meets the same error on its write and reports it
            if sent > 0:
                while sent:
                    n = len(pending[i])
                    if sent < n:
                        pending[i] = memoryview(pending[i])[sent:]
                        break
                    sent -= n
                    i += 1
                continue
        # The socket is full: one part goes to the transport, which writes it when the
        # socket has room; the rest waits for that.
        transport.write(pending[i])
        i += 1
        await writer.drain()
    if i < len(pending):
        transport.writelines(pending[i:])


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _plain(partition: Any) -> bool:
    return (
        getattr(partition, "diverging_epoch", None) is None
        and getattr(partition, "current_leader", None) is None
        and getattr(partition, "snapshot_id", None) is None
        and not partition.aborted_transactions
    )


def fetch_response_parts(
    response: Any, version: int, correlation_id: int
) -> list[bytes | memoryview] | None:
    """The framed response (size, header, body) as buffers to write in order, or ``None``
    when the answer carries something this writer leaves to kafka-python."""
    if getattr(response, "node_endpoints", None):
        return None
    for topic in response.responses:
        for p in topic.partitions:
            if not _plain(p):
                return None
    flexible = version >= 12
    parts: list[bytes | memoryview] = []
    buf = bytearray(_I32(correlation_id))
    if flexible:
        buf += b"\x00"  # response header v1: no tagged fields
    buf += _I32(response.throttle_time_ms)
    if version >= 7:
        buf += _I16(response.error_code) + _I32(response.session_id)
    topics = response.responses
    buf += _uvarint(len(topics) + 1) if flexible else _I32(len(topics))
    for topic in topics:
        if version >= 13:
            buf += uuid.UUID(str(topic.topic_id)).bytes
        else:
            name = topic.topic.encode()
            buf += _uvarint(len(name) + 1) + name if flexible else _I16(len(name)) + name
        partitions = topic.partitions
        buf += _uvarint(len(partitions) + 1) if flexible else _I32(len(partitions))
        for p in partitions:
            buf += _HEAD_V4.pack(
                p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset
            )
            if version >= 5:
                buf += _I64(p.log_start_offset)
            if p.aborted_transactions is None:
                buf += b"\x00" if flexible else b"\xff\xff\xff\xff"  # null
            else:
                buf += b"\x01" if flexible else b"\x00\x00\x00\x00"  # empty list
            if version >= 11:
                buf += _I32(p.preferred_read_replica)
            records = p.records
            if records is None:
                buf += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                size = len(records)
                buf += _uvarint(size + 1) if flexible else _I32(size)
                batches = records.batches if isinstance(records, StoredBatches) else (records,)
                if size >= _SEPARATE_BYTES:
                    parts.append(bytes(buf))
                    parts.extend(batches)
                    buf = bytearray()
                else:
                    for batch in batches:
                        buf += batch
            if flexible:
                buf += b"\x00"  # the partition's tagged fields
        if flexible:
            buf += b"\x00"  # the topic's tagged fields
    if flexible:
        buf += b"\x00"  # the response's tagged fields
    parts.append(bytes(buf))
    size = sum(len(b) for b in parts)
    parts.insert(0, _I32(size))
    return parts
