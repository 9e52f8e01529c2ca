"""One replica's log of one partition: v2 record batches kept as the bytes clients sent.

Offsets and leader epochs are stamped into the stored bytes on append (base offset is bytes
0..7, partitionLeaderEpoch bytes 12..15 of a v2 batch; the CRC covers neither), so a fetch
returns a contiguous slice of stored bytes without decoding or re-encoding anything.

Each replica also keeps its producer state as Kafka's ``ProducerStateManager`` does, learnt
from the batches it stores (so followers learn it through replication): every producer's
epoch and open transaction, the aborted-transaction index and the last stable offset.
"""

from __future__ import annotations

import bisect
import struct

import attrs

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

# Offsets of fields inside a v2 record batch header.
_BASE_OFFSET = struct.Struct(">q")
_LENGTH_AND_EPOCH = struct.Struct(">ii")
_MAGIC_AT = 16
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_AT = 35
_PRODUCER = struct.Struct(">qhi")
_PRODUCER_AT = 43
_RECORD_COUNT_AT = 57
BATCH_HEADER_SIZE = 61
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
#: Control record types (the key's second int16).
ABORT_MARKER = 0
COMMIT_MARKER = 1


class InvalidRecordBatchError(ValueError):
    """The bytes are not a sequence of well-formed v2 record batches."""


@attrs.frozen
class BatchInfo:
    """What the log needs to know about one batch without decoding its records."""

    length: int
    last_offset_delta: int
    max_timestamp: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int


@attrs.frozen
class AbortedTxn:
    """One entry of the aborted-transaction index: ``last_offset`` is the ABORT marker's."""

    producer_id: int
    first_offset: int
    last_offset: int


@attrs.define
class ProducerEntry:
    """What a replica knows about one producer id (Kafka's ``ProducerStateEntry``)."""

    producer_id: int
    epoch: int
    last_sequence: int = -1
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    #: First offset of the producer's open transaction on this partition, -1 when none.
    txn_first_offset: int = -1


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    shift = raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def control_marker(batch: bytes) -> tuple[int, int] | None:
    """``(marker type, coordinator epoch)`` of a control batch, None if it is not one."""
    (attributes,) = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)
    if not attributes & CONTROL_FLAG or len(batch) <= BATCH_HEADER_SIZE:
        return None
    pos = BATCH_HEADER_SIZE
    _, pos = _read_varint(batch, pos)  # record length
    pos += 1  # record attributes
    _, pos = _read_varint(batch, pos)  # timestamp delta
    _, pos = _read_varint(batch, pos)  # offset delta
    key_length, pos = _read_varint(batch, pos)
    if key_length < 4:
        return None
    _version, marker_type = struct.unpack_from(">hh", batch, pos)
    pos += key_length
    value_length, pos = _read_varint(batch, pos)
    coordinator_epoch = struct.unpack_from(">i", batch, pos + 2)[0] if value_length >= 6 else -1
    return marker_type, coordinator_epoch


@attrs.frozen
class EpochEntry:
    epoch: int
    start_offset: int


def split_batches(data: bytes | memoryview) -> list[tuple[bytes, BatchInfo]]:
    """Split a v2 record set into its batches; raises InvalidRecordBatchError if malformed."""
    view = memoryview(data)
    out: list[tuple[bytes, BatchInfo]] = []
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE:
            raise InvalidRecordBatchError(f"truncated batch header at byte {pos}")
        length, _epoch = _LENGTH_AND_EPOCH.unpack_from(view, pos + 8)
        size = length + 12
        if length < BATCH_HEADER_SIZE - 12 or pos + size > end:
            raise InvalidRecordBatchError(f"bad batch length {length} at byte {pos}")
        if view[pos + _MAGIC_AT] != 2:
            raise InvalidRecordBatchError(f"record batch magic {view[pos + _MAGIC_AT]} is not 2")
        (delta,) = _LAST_OFFSET_DELTA.unpack_from(view, pos + _LAST_OFFSET_DELTA_AT)
        (max_ts,) = _MAX_TIMESTAMP.unpack_from(view, pos + _MAX_TIMESTAMP_AT)
        pid, pepoch, seq = _PRODUCER.unpack_from(view, pos + _PRODUCER_AT)
        (count,) = struct.unpack_from(">i", view, pos + _RECORD_COUNT_AT)
        info = BatchInfo(size, delta, max_ts, count, pid, pepoch, seq)
        out.append((bytes(view[pos : pos + size]), info))
        pos += size
    return out


def batch_producers(data: bytes | memoryview) -> list[tuple[int, int, int]]:
    """``(attributes, producer id, producer epoch)`` of each batch, read from the headers
    only (nothing copied); raises InvalidRecordBatchError if a header is cut short."""
    out: list[tuple[int, int, int]] = []
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE:
            raise InvalidRecordBatchError(f"truncated batch header at byte {pos}")
        (length,) = struct.unpack_from(">i", data, pos + 8)
        (attributes,) = _ATTRIBUTES.unpack_from(data, pos + _ATTRIBUTES_AT)
        pid, pepoch, _ = _PRODUCER.unpack_from(data, pos + _PRODUCER_AT)
        out.append((attributes, pid, pepoch))
        if length < BATCH_HEADER_SIZE - 12:
            raise InvalidRecordBatchError(f"bad batch length {length} at byte {pos}")
        pos += length + 12
    return out


def stamp(batch: bytes, base_offset: int, leader_epoch: int) -> bytes:
    """Return ``batch`` with its base offset and partitionLeaderEpoch rewritten."""
    buf = bytearray(batch)
    _BASE_OFFSET.pack_into(buf, 0, base_offset)
    struct.pack_into(">i", buf, 12, leader_epoch)
    return bytes(buf)


def batch_epoch(batch: bytes) -> int:
    epoch: int = struct.unpack_from(">i", batch, 12)[0]
    return epoch


class PartitionLog:
    """An in-memory replica log with a KIP-101 leader-epoch cache.

    ``_bases[i]`` / ``_lasts[i]`` are the first / last offsets of ``_batches[i]``; lookups by
    offset bisect ``_lasts``. ``_positions[i]`` is the byte position of batch ``i`` in the
    logical concatenation, so the size of a range of batches is a subtraction.

    ``raft``: a Raft-term replica (``EmbeddedCluster(epochs="raft")``, see ``raft.py``). Every
    term its leader took stays in the epoch cache even when it holds no record (Raft's
    configuration batch at the start of each term, invisible at Kafka offsets), and the
    replica knows which prefix is on disk: :meth:`flush` makes it durable,
    :meth:`lose_unflushed` is a power cut.
    """

    def __init__(self, raft: bool = False) -> None:
        self.raft = raft
        self._batches: list[bytes] = []
        self._bases: list[int] = []
        self._lasts: list[int] = []
        self._max_ts: list[int] = []
        self._positions: list[int] = [0]
        self._epochs: list[EpochEntry] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        # Idempotent producers: producer id -> recent (epoch, base sequence, base offset).
        self._producers: dict[int, list[tuple[int, int, int]]] = {}
        self._producer_state: dict[int, ProducerEntry] = {}
        # Producer id -> first offset of its open transaction (kept beside the entries so
        # the last stable offset, asked on every Fetch, is a lookup).
        self._ongoing: dict[int, int] = {}
        self._aborted: list[AbortedTxn] = []
        # Finished transactions (first offset, marker offset) whose marker is not below the
        # high watermark yet: they hold the last stable offset back, as in Kafka.
        self._unreplicated_txns: list[tuple[int, int]] = []
        # Raft: the durable prefix (records below ``_flushed``; the terms that were on disk
        # at the last flush, for those that start exactly there). Terms by number: retention
        # moves a term's start, not its durability.
        self._flushed = 0
        self._flushed_epochs: frozenset[int] = frozenset()

    # -- appends ---------------------------------------------------------------------------

    def append_as_leader(self, records: bytes | memoryview, leader_epoch: int) -> tuple[int, int]:
        """Assign offsets and stamp ``leader_epoch``; returns (base offset, last offset)."""
        batches = split_batches(records)
        if not batches:
            raise InvalidRecordBatchError("empty record set")
        if len(batches) == 1:
            duplicate = self._duplicate_of(batches[0][1])
            if duplicate is not None:
                return duplicate, duplicate + batches[0][1].last_offset_delta
        first = self.log_end_offset
        for raw, info in batches:
            base = self.log_end_offset
            if info.producer_id >= 0 and info.base_sequence >= 0:
                recent = self._producers.setdefault(info.producer_id, [])
                recent.append((info.producer_epoch, info.base_sequence, base))
                del recent[:-5]
            self._push(
                stamp(raw, base, leader_epoch),
                base,
                base + info.last_offset_delta,
                info.max_timestamp,
                leader_epoch,
            )
        return first, self.log_end_offset - 1

    def _duplicate_of(self, info: BatchInfo) -> int | None:
        """Base offset of an identical idempotent batch among the producer's last five.

        A retried batch (same producer id, epoch and base sequence) is acknowledged with the
        original offsets instead of being written twice, as Kafka does.
        """
        if info.producer_id < 0 or info.base_sequence < 0:
            return None
        for epoch, seq, base in self._producers.get(info.producer_id, ()):
            if (
                epoch == info.producer_epoch
                and seq == info.base_sequence
                and (base < self.log_end_offset)
            ):
                return base
        return None

    def append_replicated(self, batch: bytes) -> None:
        """Append one batch copied from the leader, keeping its offsets and epoch."""
        base: int = _BASE_OFFSET.unpack_from(batch, 0)[0]
        if base != self.log_end_offset:
            raise ValueError(
                f"replicated batch at {base} but log end offset is {self.log_end_offset}"
            )
        (delta,) = _LAST_OFFSET_DELTA.unpack_from(batch, _LAST_OFFSET_DELTA_AT)
        (max_ts,) = _MAX_TIMESTAMP.unpack_from(batch, _MAX_TIMESTAMP_AT)
        self._push(batch, base, base + delta, max_ts, batch_epoch(batch))

    def _push(self, batch: bytes, base: int, last: int, max_ts: int, epoch: int) -> None:
        if not self._epochs or epoch > self._epochs[-1].epoch:
            self._add_epoch(epoch, base)
        self._batches.append(batch)
        self._bases.append(base)
        self._lasts.append(last)
        self._max_ts.append(max_ts)
        self._positions.append(self._positions[-1] + len(batch))
        self.log_end_offset = last + 1
        self._track_producer(batch, base, last, max_ts)

    def _track_producer(self, batch: bytes, base: int, last: int, max_ts: int) -> None:
        pid, pepoch, seq = _PRODUCER.unpack_from(batch, _PRODUCER_AT)
        if pid < 0:
            return
        entry = self._producer_state.get(pid)
        if entry is None:
            entry = self._producer_state[pid] = ProducerEntry(pid, pepoch)
        elif pepoch != entry.epoch:
            entry.epoch = pepoch
            entry.last_sequence = -1
        entry.last_timestamp = max_ts
        marker = control_marker(batch)
        if marker is not None:
            marker_type, coordinator_epoch = marker
            entry.coordinator_epoch = coordinator_epoch
            if entry.txn_first_offset >= 0:
                if marker_type == ABORT_MARKER:
                    self._aborted.append(AbortedTxn(pid, entry.txn_first_offset, base))
                self._unreplicated_txns.append((entry.txn_first_offset, base))
                entry.txn_first_offset = -1
                del self._ongoing[pid]
            return
        if seq >= 0:
            entry.last_sequence = seq + (last - base)
        (attributes,) = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)
        if attributes & TRANSACTIONAL_FLAG and entry.txn_first_offset < 0:
            entry.txn_first_offset = base
            self._ongoing[pid] = base

    def _rebuild_producer_state(self) -> None:
        """Replay the kept batches (after a truncation), as Kafka reloads producer state."""
        self._producer_state = {}
        self._ongoing = {}
        self._aborted = []
        self._unreplicated_txns = []
        for batch, base, last, max_ts in zip(
            self._batches, self._bases, self._lasts, self._max_ts, strict=True
        ):
            self._track_producer(batch, base, last, max_ts)

    # -- producer state --------------------------------------------------------------------

    def producer(self, producer_id: int) -> ProducerEntry | None:
        return self._producer_state.get(producer_id)

    @property
    def producers(self) -> list[ProducerEntry]:
        """Every producer this replica has batches of (DescribeProducers' active producers)."""
        return list(self._producer_state.values())

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest transaction not yet decided and replicated."""
        if self._unreplicated_txns:
            hw = self.high_watermark
            self._unreplicated_txns = [t for t in self._unreplicated_txns if t[1] >= hw]
        firsts = [t[0] for t in self._unreplicated_txns]
        if self._ongoing:
            firsts.append(min(self._ongoing.values()))
        return min(firsts) if firsts else None

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: the high watermark, or the first unstable offset below it."""
        first = self.first_unstable_offset
        hw = self.high_watermark
        return hw if first is None else max(min(first, hw), self.log_start_offset)

    def aborted_transactions(self, start: int, upper: int) -> list[AbortedTxn]:
        """Aborted transactions that overlap ``[start, upper)`` (Kafka's collectAbortedTxns)."""
        return [a for a in self._aborted if a.last_offset >= start and a.first_offset < upper]

    def assign_epoch(self, epoch: int) -> None:
        """A new leader records where its epoch starts (KIP-101), before any append."""
        if self._epochs and epoch <= self._epochs[-1].epoch:
            return
        self._add_epoch(epoch, self.log_end_offset)

    def _add_epoch(self, epoch: int, start_offset: int) -> None:
        # As Kafka's LeaderEpochFileCache.assign: an entry replaces every entry starting at
        # or after it (an epoch that never got a record is superseded). A Raft term is a log
        # entry of its own: one without records stays.
        while self._epochs and (
            self._epochs[-1].start_offset > start_offset
            or (self._epochs[-1].start_offset == start_offset and not self.raft)
        ):
            self._epochs.pop()
        self._epochs.append(EpochEntry(epoch, start_offset))

    # -- epoch cache -----------------------------------------------------------------------

    @property
    def epoch_cache(self) -> list[EpochEntry]:
        return list(self._epochs)

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1].epoch if self._epochs else UNDEFINED_EPOCH

    def end_offset_for_epoch(self, requested: int) -> tuple[int, int]:
        """(epoch, end offset) as a Kafka broker's LeaderEpochFileCache.endOffsetFor answers.

        The largest known epoch <= ``requested`` and the start offset of the next larger
        epoch (the log end offset when it is the latest). An epoch larger than every known
        one, or UNDEFINED, gives (-1, -1). An epoch older than every cached entry answers
        (requested, start offset of the first entry), as Kafka does: that data is gone from
        the log, and the first retained epoch bounds it.
        """
        if requested == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested == self._epochs[-1].epoch:
            return requested, self.log_end_offset
        if requested > self._epochs[-1].epoch:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        epochs = [e.epoch for e in self._epochs]
        higher = bisect.bisect_right(epochs, requested)
        if higher == 0:
            return requested, self._epochs[0].start_offset
        return self._epochs[higher - 1].epoch, self._epochs[higher].start_offset

    def term_end_offset(self, requested: int) -> tuple[int, int]:
        """``(epoch, end offset)`` as a Raft-term broker answers OffsetForLeaderEpoch (Redpanda's
        leader-epoch RFC): the requested term is echoed and the offset is where it ends, the
        start of the next term this replica holds, which is also the answer for a term that
        holds no record here (a term without records, or one this log never had). A term
        newer than every term here ends nowhere yet: ``(requested, -1)``; one older than the
        first kept entry (retention) ends at the log start."""
        if requested == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested > self._epochs[-1].epoch:
            return requested, UNDEFINED_EPOCH_OFFSET
        if requested < self._epochs[0].epoch:
            return requested, self.log_start_offset
        for e in self._epochs:
            if e.epoch > requested:
                return requested, max(e.start_offset, self.log_start_offset)
        return requested, self.log_end_offset

    def adopt_epochs(self, leader: PartitionLog) -> None:
        """Raft: take the leader's terms up to this replica's log end (after a catch-up this
        log is a prefix of the leader's, terms without records included)."""
        end = self.log_end_offset
        whole = end == leader.log_end_offset
        self._epochs = [
            e for e in leader._epochs if e.start_offset < end or (whole and e.start_offset == end)
        ]

    def epoch_for_offset(self, offset: int) -> int:
        """Epoch of the cache entry covering ``offset`` (Kafka's ``epochForOffset``)."""
        best = UNDEFINED_EPOCH
        for e in self._epochs:
            if e.start_offset <= offset:
                best = e.epoch
            else:
                break
        return best

    # -- durability (Raft mode) -------------------------------------------------------------

    @property
    def flushed_offset(self) -> int:
        """Records below this offset are on disk and survive :meth:`lose_unflushed`."""
        return self._flushed

    def flush(self) -> None:
        """Everything written so far is durable (an fsync)."""
        self._flushed = self.log_end_offset
        self._flushed_epochs = frozenset(e.epoch for e in self._epochs)

    def lose_unflushed(self) -> int:
        """A power cut: keep the durable prefix only; returns how many records were lost.

        A term's entry survives when records after its start did (its configuration batch
        came first), or when it was on disk itself at the last flush."""
        keep = max(min(self._flushed, self.log_end_offset), self.log_start_offset)
        lost = self.log_end_offset - keep
        epochs = [
            e
            for e in self._epochs
            if e.start_offset < keep or (e.start_offset == keep and e.epoch in self._flushed_epochs)
        ]
        if lost:
            self.truncate_to(keep)
            keep = self.log_end_offset  # a batch cut in two goes whole
        self._epochs = [e for e in epochs if e.start_offset <= keep]
        self._flushed = keep
        self._flushed_epochs = frozenset(e.epoch for e in self._epochs)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        return lost

    # -- truncation and retention ----------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every record at ``offset`` and above (whole batches; epoch cache follows)."""
        if offset >= self.log_end_offset:
            # As Kafka: still drop epoch entries without records (a former leader's entry
            # for an epoch in which it never appended).
            self._epochs = [e for e in self._epochs if e.start_offset < self.log_end_offset]
            return
        if offset <= self.log_start_offset:
            self.reset(offset)  # Kafka's truncateFullyAndStartAt
            return
        i = bisect.bisect_left(self._lasts, offset)
        if i < len(self._bases) and self._bases[i] < offset:
            # A batch straddles the cut: batches are atomic, keep it out entirely.
            offset = self._bases[i]
            if offset < self.log_start_offset:
                self.reset(self.log_start_offset)
                return
        del self._batches[i:]
        del self._bases[i:]
        del self._lasts[i:]
        del self._max_ts[i:]
        del self._positions[i + 1 :]
        self.log_end_offset = offset
        self.high_watermark = min(self.high_watermark, offset)
        self._flushed = min(self._flushed, offset)
        self._epochs = [e for e in self._epochs if e.start_offset < offset]
        self._rebuild_producer_state()

    def delete_before(self, offset: int) -> None:
        """Advance the log start offset (DeleteRecords); drops batches wholly below it."""
        if offset <= self.log_start_offset:
            return
        offset = min(offset, self.log_end_offset)
        i = bisect.bisect_right(self._lasts, offset - 1)
        del self._batches[:i]
        del self._bases[:i]
        del self._lasts[:i]
        del self._max_ts[:i]
        base = self._positions[i]
        self._positions = [p - base for p in self._positions[i:]]
        self.log_start_offset = offset
        kept = [e for e in self._epochs if e.start_offset >= offset]
        older = [e for e in self._epochs if e.start_offset < offset]
        if older and (not kept or kept[0].start_offset > offset):
            kept.insert(0, EpochEntry(older[-1].epoch, offset))
        self._epochs = kept
        self._aborted = [a for a in self._aborted if a.last_offset >= offset]

    def reset(self, start_offset: int) -> None:
        """Drop everything and restart empty at ``start_offset`` (follower far behind)."""
        self.__init__(self.raft)  # type: ignore[misc]
        self.log_start_offset = start_offset
        self.log_end_offset = start_offset
        self.high_watermark = start_offset
        self._flushed = start_offset

    # -- reads -----------------------------------------------------------------------------

    def batches_from(self, offset: int) -> list[bytes]:
        """Every stored batch whose last offset is >= ``offset``."""
        i = bisect.bisect_left(self._lasts, offset)
        return self._batches[i:]

    def read(self, offset: int, max_bytes: int, upper: int | None = None) -> bytes:
        """Stored bytes of the batches holding ``offset`` onwards, below ``upper``.

        At least one whole batch is returned even if larger than ``max_bytes`` (KIP-74).
        """
        batches = self.read_batches(offset, max_bytes, upper)
        return batches[0] if len(batches) == 1 else b"".join(batches)

    def read_batches(self, offset: int, max_bytes: int, upper: int | None = None) -> list[bytes]:
        """The stored batches :meth:`read` would join, uncopied (a Fetch answer hands them
        to the socket as they are)."""
        limit = self.log_end_offset if upper is None else upper
        if offset >= limit:
            return []
        i = bisect.bisect_left(self._lasts, offset)
        j = bisect.bisect_left(self._lasts, limit)  # batches ending below limit
        if j <= i:
            return []
        start_pos = self._positions[i]
        k = bisect.bisect_right(self._positions, start_pos + max_bytes, i + 1, j + 1) - 1
        k = max(k, i + 1)
        return self._batches[i:k]

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, batch epoch) of the first batch whose max timestamp is >= ``timestamp``.

        Batch granularity: the client skips earlier records of the batch itself.
        """
        for i, ts in enumerate(self._max_ts):
            if ts >= timestamp:
                return max(self._bases[i], self.log_start_offset), batch_epoch(self._batches[i])
        return None

    def epoch_of_offset(self, offset: int) -> int:
        """Leader epoch of the batch holding ``offset``, -1 if none."""
        i = bisect.bisect_left(self._lasts, offset)
        if i >= len(self._batches) or self._bases[i] > offset:
            return UNDEFINED_EPOCH
        return batch_epoch(self._batches[i])

    @property
    def size_in_bytes(self) -> int:
        return self._positions[-1]

    def __len__(self) -> int:
        return len(self._batches)
