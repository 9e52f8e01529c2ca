"""Where the consumer stood in partitions it gave up, kept for a while and then forgotten.

A topic deleted from under a group revokes its partitions, and Kafka deletes the group's
commits with the topic. When the topic is re-created and a partition comes back with
nothing committed, the consumer starts from where it stood in the old log (with the old
topic id), so the re-creation is reported instead of a silent start over. That needs the
position of every partition given up, and a long-lived member hands many partitions in
and out: each position is kept for ``ttl_s`` and at most ``max_entries`` are kept (the
oldest go first). A re-creation noticed after that starts from the reset policy, as in
Java. Sans-IO: time is passed in.
"""

from __future__ import annotations

import attrs
from kafka.structs import TopicPartition

from epochguard.offsets.position import EpochOffset

__all__ = ["LeftPositions"]


@attrs.frozen
class _Left:
    position: EpochOffset
    left_at: float
    #: The position whose truncation this consumer last reported in the partition (its
    #: ``consumed_to``), if any.
    reported: EpochOffset | None = None


class LeftPositions:
    """Positions of partitions given up, oldest first, bounded in age and number."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        if ttl_s <= 0 or max_entries <= 0:
            raise ValueError("ttl_s and max_entries must be positive")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        # Insertion order is age order: remember() moves a partition to the end.
        self._left: dict[TopicPartition, _Left] = {}

    def __len__(self) -> int:
        return len(self._left)

    def remember(
        self,
        tp: TopicPartition,
        position: EpochOffset,
        now: float,
        reported: EpochOffset | None = None,
    ) -> None:
        self._left.pop(tp, None)
        self._left[tp] = _Left(position, now, reported)
        self.expire(now)

    def get(self, tp: TopicPartition, now: float) -> EpochOffset | None:
        left = self._get(tp, now)
        return None if left is None else left.position

    def reported(self, tp: TopicPartition, now: float) -> EpochOffset | None:
        """The ``consumed_to`` of the last truncation reported in ``tp`` before it was given
        up (``None``: none, or the position is forgotten)."""
        left = self._get(tp, now)
        return None if left is None else left.reported

    def _get(self, tp: TopicPartition, now: float) -> _Left | None:
        left = self._left.get(tp)
        if left is None or now - left.left_at >= self.ttl_s:
            return None
        return left

    def forget(self, tp: TopicPartition) -> None:
        self._left.pop(tp, None)

    def clear(self) -> None:
        self._left.clear()

    def expire(self, now: float) -> list[TopicPartition]:
        """Drop what is too old or beyond the bound; returns the partitions dropped."""
        dropped: list[TopicPartition] = []
        while self._left:
            tp, left = next(iter(self._left.items()))
            if now - left.left_at < self.ttl_s and len(self._left) <= self.max_entries:
                break
            del self._left[tp]
            dropped.append(tp)
        return dropped
