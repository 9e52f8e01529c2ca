"""Filter pushdown for batch reads: the part of the log a query's filters leave to read.

Sans-IO (no pyspark, no Kafka). Spark hands a batch read the ``where`` conditions it can
split off as a list of simple comparisons, to be ANDed; the data source's side turns each
one it recognises into a :class:`Comparison` and folds them into :class:`ReadBounds`:

- ``partition = n`` / ``partition IN (...)``: only those partitions are planned. Exact.
- ``offset`` ``=``, ``>=``, ``>``, ``<``, ``<=`` (``BETWEEN`` arrives as two of them): the
  planned range of every partition is cut to those offsets. Exact. ``offset IN (...)`` cuts
  to its smallest and largest value; Spark still filters.
- ``timestamp`` ``>=``, ``>``, ``=``: the range starts at the first offset whose record is at
  or after that time (ListOffsets by time). A record's timestamp is set by its producer, so
  records after that offset may be earlier: Spark still filters. ``timestamp < / <=`` cannot
  move the end: a record with an earlier time may come at any later offset, so nothing is
  skipped for them and Spark filters.

"Exact" comparisons hold for every row the narrowed ranges return, so Spark need not apply
them again; every other comparison goes back to Spark, which applies it to the rows read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

from epochguard.offsets.position import EpochOffset

__all__ = ["COLUMNS", "Column", "Comparison", "Op", "ReadBounds", "push"]

Op = Literal["=", "in", ">", ">=", "<", "<="]
Column = Literal["partition", "offset", "timestamp"]
#: The columns a read can be narrowed by, by name.
COLUMNS: dict[str, Column] = {
    "partition": "partition",
    "offset": "offset",
    "timestamp": "timestamp",
}


@attrs.frozen
class Comparison:
    """``column op value`` on one of the columns the source can narrow by.

    ``value``: an int for ``partition`` and ``offset``, microseconds since the epoch (UTC)
    for ``timestamp``; a tuple of them for ``in``.
    """

    column: Column
    op: Op
    value: int | tuple[int, ...]


def _ceil_ms(micros: int) -> int:
    return -(-micros // 1000)


@attrs.frozen
class ReadBounds:
    """What the pushed comparisons leave to read, the intersection of all of them.

    ``partitions``: the partition numbers allowed (None: every one). ``offset_from`` /
    ``offset_until``: offsets in ``[offset_from, offset_until)`` (None: no end).
    ``timestamp_from_ms``: no record before the first one at or after this time (ms since
    the epoch) qualifies.
    """

    partitions: frozenset[int] | None = None
    offset_from: int = 0
    offset_until: int | None = None
    timestamp_from_ms: int | None = None

    @property
    def empty(self) -> bool:
        """Nothing can qualify: no partition, or an offset range with no offset in it."""
        return self.partitions == frozenset() or (
            self.offset_until is not None and self.offset_until <= self.offset_from
        )

    def allows_partition(self, partition: int) -> bool:
        return self.partitions is None or partition in self.partitions

    def with_comparison(self, c: Comparison) -> tuple[ReadBounds, bool] | None:
        """These bounds narrowed by ``c`` and whether ``c`` then holds for every row read
        (exact), or None when ``c`` narrows nothing (Spark applies it)."""
        if isinstance(c.value, tuple):
            values = c.value
            if c.op != "in" or not values:
                return None
        elif c.op == "in":
            return None
        else:
            values = (c.value,)
        if c.column == "partition":
            if c.op not in ("=", "in"):
                return None
            allowed = frozenset(values)
            if self.partitions is not None:
                allowed &= self.partitions
            return attrs.evolve(self, partitions=allowed), True
        if c.column == "offset":
            return self._offsets(c.op, values)
        return self._timestamps(c.op, values)

    def _offsets(self, op: Op, values: tuple[int, ...]) -> tuple[ReadBounds, bool] | None:
        low, high = min(values), max(values)
        lo: int | None = None
        until: int | None = None
        if op in ("=", "in"):
            lo, until = low, high + 1
        elif op == ">=":
            lo = low
        elif op == ">":
            lo = low + 1
        elif op == "<":
            until = low
        else:  # "<="
            until = low + 1
        bounds = self
        if lo is not None and lo > bounds.offset_from:
            bounds = attrs.evolve(bounds, offset_from=lo)
        if until is not None and (bounds.offset_until is None or until < bounds.offset_until):
            bounds = attrs.evolve(bounds, offset_until=max(until, 0))
        # IN with gaps reads the offsets between its values too: Spark drops those.
        return bounds, op != "in" or len(set(values)) == 1

    def _timestamps(self, op: Op, values: tuple[int, ...]) -> tuple[ReadBounds, bool] | None:
        if op in ("<", "<="):
            return None
        low = min(values)
        # Record times are whole milliseconds: the first that can qualify.
        from_ms = low // 1000 + 1 if op == ">" else _ceil_ms(low)
        if from_ms <= 0:
            # ListOffsets reads negative times as its sentinels (latest, earliest, ...), and
            # a bound at or before the epoch skips nothing worth a lookup.
            return self, False
        if self.timestamp_from_ms is not None and self.timestamp_from_ms >= from_ms:
            return self, False
        return attrs.evolve(self, timestamp_from_ms=from_ms), False

    def narrow(
        self,
        start: EpochOffset,
        end: EpochOffset,
        first_at_time: EpochOffset | None = None,
    ) -> tuple[EpochOffset, EpochOffset] | None:
        """The planned range ``[start, end)`` of one partition cut to these bounds, or None
        when nothing of it is left.

        ``first_at_time``: the first offset at or after :attr:`timestamp_from_ms` (ListOffsets
        by time), with the epoch of the record there; when no record is that late, the log
        end it was looked up against. A start moved by an offset bound and a moved end
        take ``end``'s epoch, which bounds the epoch of every record before it (as the
        pieces :func:`~epochguard.spark_connector.planning.split_ranges` cuts)."""
        lo = max(start.offset, self.offset_from)
        if first_at_time is not None:
            lo = max(lo, first_at_time.offset)
        hi = end.offset if self.offset_until is None else min(end.offset, self.offset_until)
        if hi <= lo:
            return None
        if lo == start.offset:
            new_start = start
        elif first_at_time is not None and lo == first_at_time.offset:
            new_start = first_at_time
        else:
            new_start = EpochOffset(lo, end.leader_epoch, topic_id=end.topic_id)
        new_end = (
            end if hi == end.offset else EpochOffset(hi, end.leader_epoch, topic_id=end.topic_id)
        )
        return new_start, new_end


def push(comparisons: Sequence[Comparison | None]) -> tuple[ReadBounds, list[int]]:
    """Fold ``comparisons`` (None: one the source does not recognise) into bounds.

    Returns the bounds and the indices of the comparisons Spark must still apply: those
    not recognised, those that narrow nothing, and those that narrow without being exact.
    """
    bounds = ReadBounds()
    left: list[int] = []
    for i, c in enumerate(comparisons):
        pushed = None if c is None else bounds.with_comparison(c)
        if pushed is None:
            left.append(i)
            continue
        bounds, exact = pushed
        if not exact:
            left.append(i)
    return bounds, left
