"""Micro-batch planning: how far each batch reads and how it is cut into Spark tasks.

Sans-IO (no pyspark, no Kafka, the clock injected). The arithmetic is Spark's Kafka source's,
so a query moved over from it plans the same batches:

- :func:`rate_limit` is ``KafkaMicroBatchStream.rateLimit``: ``maxOffsetsPerTrigger`` shared
  across partitions in proportion to their backlog, a partition with a backlog never starved
  (a share below one offset is rounded up to one, so with many small backlogs the batch can
  exceed the limit by at most one offset per partition: Spark's behaviour, kept);
- :class:`MinOffsetsGate` is ``delayBatch``: ``minOffsetsPerTrigger`` with
  ``maxTriggerDelay``;
- :func:`split_ranges` is ``KafkaOffsetRangeCalculator.getRanges``: ``maxRecordsPerPartition``
  then ``minPartitions``.

Every planned range carries positions, not bare offsets: its start as checkpointed (the
epoch to validate) and its planned end with the leader epoch seen at planning time, which
bounds the epoch of every record in the range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from epochguard.offsets.position import EpochOffset

if TYPE_CHECKING:
    from kafka.structs import TopicPartition

__all__ = [
    "MinOffsetsGate",
    "OffsetRange",
    "plan_end_offsets",
    "rate_limit",
    "split_ranges",
]

_LONG_MAX = 2**63 - 1


def rate_limit(
    limit: int,
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    earliest_of_new: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """End offsets that read about ``limit`` records in total, shared by backlog.

    ``start``: where each partition's batch begins; a partition in ``latest`` but not in
    ``start`` is new and begins at ``earliest_of_new`` (absent there: it keeps ``latest``,
    as Spark lets its data-loss checks deal with it). Never past ``latest``.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    new = earliest_of_new or {}
    sizes: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        size = sizes.get(tp)
        if size is None:
            out[tp] = end
            continue
        begin = start[tp] if tp in start else new[tp]
        prorate = limit * (size / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        off = _LONG_MAX if share > _LONG_MAX - begin else begin + share
        out[tp] = min(end, off)
    return out


@attrs.define
class MinOffsetsGate:
    """``minOffsetsPerTrigger`` + ``maxTriggerDelay``: hold a batch back until enough records
    are waiting or the delay since the last batch has passed.

    ``clock`` returns milliseconds. As in Spark, the last trigger time starts at 0, so the
    first batch is never delayed.
    """

    min_rows: int
    max_delay_ms: int
    clock: Callable[[], float]
    last_trigger_ms: float = 0.0

    def should_delay(
        self, start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]
    ) -> bool:
        now = self.clock()
        if now - self.last_trigger_ms >= self.max_delay_ms:
            self.last_trigger_ms = now
            return False
        waiting = sum(end - start.get(tp, 0) for tp, end in latest.items())
        if waiting < self.min_rows:
            return True
        self.last_trigger_ms = now
        return False


def plan_end_offsets(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    read_all: bool,
    max_rows: int | None = None,
    gate: MinOffsetsGate | None = None,
    earliest_of_new: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """The next batch's end offsets (Spark's ``latestOffset(start, readLimit)``).

    ``read_all`` (``ReadAllAvailable``: availableNow, once) wins; otherwise ``gate`` may hold
    the batch back (the result is then ``start`` itself: an empty batch Spark skips), and
    ``max_rows`` caps it through :func:`rate_limit`.
    """
    if read_all:
        return dict(latest)
    if gate is not None and gate.should_delay(start, latest):
        return dict(start)
    if max_rows is not None:
        return rate_limit(max_rows, start, latest, earliest_of_new)
    return dict(latest)


@attrs.frozen
class OffsetRange:
    """One Spark task's work: read ``tp`` from ``start`` up to (not including) ``end``."""

    tp: TopicPartition
    start: EpochOffset
    end: EpochOffset

    def __attrs_post_init__(self) -> None:
        if self.end.offset < self.start.offset:
            raise ValueError(
                f"{self.tp.topic}-{self.tp.partition}: range end {self.end} is before "
                f"its start {self.start}"
            )

    @property
    def size(self) -> int:
        return self.end.offset - self.start.offset


def _divide(rng: OffsetRange, parts: int) -> list[OffsetRange]:
    """``parts`` consecutive pieces, the remainder going to the last ones (Spark's loop).

    An inner boundary's epoch is not known; the range end's epoch bounds it from above
    (no record before the end was appended in a later epoch), so it is what the piece
    starting there is validated with.
    """
    out: list[OffsetRange] = []
    remaining = rng.size
    begin = rng.start
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        end_offset = min(begin.offset + this, rng.end.offset)
        end = (
            rng.end
            if end_offset == rng.end.offset
            else EpochOffset(end_offset, rng.end.leader_epoch, topic_id=rng.end.topic_id)
        )
        out.append(OffsetRange(rng.tp, begin, end))
        begin = end
    return [r for r in out if r.size > 0]


def _part_count(size: int, total: int, min_parts: int) -> int:
    # Scala's math.round rounds half up; Python's round() would round half to even.
    return max(math.floor(size / total * min_parts + 0.5), 1)


def split_ranges(
    ranges: Sequence[OffsetRange],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """Cut the batch's per-partition ranges into Spark tasks; empty ranges are dropped.

    ``maxRecordsPerPartition`` first cuts every range into pieces of at most that many
    offsets; then, while there are fewer pieces than ``minPartitions``, the large ones are
    cut in proportion to their size (pieces that would get a single part stay whole and do
    not count towards the proportion), as Spark's ``KafkaOffsetRangeCalculator`` does.
    The pieces of a range are consecutive and cover it exactly.
    """
    if min_partitions is not None and min_partitions < 1:
        raise ValueError(f"min_partitions must be >= 1, got {min_partitions}")
    if max_records_per_partition is not None and max_records_per_partition < 1:
        raise ValueError(f"max_records_per_partition must be >= 1, got {max_records_per_partition}")
    pieces = [r for r in ranges if r.size > 0]
    if max_records_per_partition is not None:
        pieces = [
            p for r in pieces for p in _divide(r, math.ceil(r.size / max_records_per_partition))
        ]
    if min_partitions is None or len(pieces) >= min_partitions:
        return pieces
    total = sum(r.size for r in pieces)
    whole = [_part_count(r.size, total, min_partitions) == 1 for r in pieces]
    whole_size = sum(r.size for r, w in zip(pieces, whole, strict=True) if w)
    split_total = total - whole_size
    split_min = max(min_partitions - sum(whole), 1)
    out: list[OffsetRange] = []
    for r, w in zip(pieces, whole, strict=True):
        parts = 1 if w else _part_count(r.size, split_total, split_min)
        out.extend(_divide(r, parts))
    return out
