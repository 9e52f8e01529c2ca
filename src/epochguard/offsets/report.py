"""``TruncationReport``: what was lost when a partition's log was truncated."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from epochguard.offsets.position import EpochOffset


class DetectedBy(enum.StrEnum):
    """Which signal revealed the truncation."""

    METADATA = "metadata"  # a newer leader epoch in metadata triggered validation
    FENCED = "fenced"  # a fetch answered FENCED/UNKNOWN_LEADER_EPOCH
    DIVERGING_EPOCH = "diverging_epoch"  # a Fetch v12+ response carried DivergingEpoch
    OFFSET_OUT_OF_RANGE = "offset_out_of_range"  # a fetch answered OFFSET_OUT_OF_RANGE
    RESTORE = "restore"  # validating a restored/committed/seeked position
    TOPIC_RECREATED = "topic_recreated"  # metadata showed a new topic id
    #: KIP-392: another replica serves the partition now (a follower named by the leader,
    #: or the leader again after the follower failed or expired)
    REPLICA_CHANGED = "replica_changed"


class PositionSource(enum.StrEnum):
    """Where a tracker's position came from (``TruncationReport.position_source``). Drivers
    may pass their own text to ``restore(source=...)`` / ``seek(source=...)``."""

    COMMITTED = "committed"  # restore(): a committed/stored position
    SEEK = "seek"  # the application's seek()
    REWIND = "rewind"  # the tracker rewound to a divergence point
    TRUNCATION_HANDLER = "truncation_handler"  # a truncation handler's EpochOffset
    RESET_EARLIEST = "reset_earliest"  # ListOffsets earliest
    RESET_LATEST = "reset_latest"  # ListOffsets latest
    # Where this consumer stood in a partition it gave up and was given back (restore()'s
    # ``read_to``), or in a re-created topic's old log.
    LEFT_POSITION = "left_position"


def records_count(count: int | None) -> str:
    """``"1 record"``, ``"3 records"`` (``"? records"`` when not known)."""
    if count is None:
        return "? records"
    return f"{count} record" if count == 1 else f"{count} records"


@attrs.frozen
class TruncationReport:
    """One detected truncation of one partition.

    The application had consumed up to (not including) ``consumed_to.offset``. The log now
    differs from what it consumed starting at ``divergence.offset``, so the records in
    ``[lost_from, lost_to)`` that it consumed no longer exist (they were replaced, or the log
    is now shorter). ``divergence`` is ``None`` when the leader could not say where the logs
    diverge (its epoch cache no longer reaches back that far). It is never below the leader's
    log start: what was read below it is gone for every reader, retention's or not.
    """

    tp: Any
    consumed_to: EpochOffset
    divergence: EpochOffset | None
    detected_by: DetectedBy = attrs.field(converter=DetectedBy)
    new_leader_epoch: int | None = None
    position_source: PositionSource | str | None = None

    @property
    def topic(self) -> str:
        return str(self.tp.topic)

    @property
    def partition(self) -> int:
        return int(self.tp.partition)

    @property
    def lost_from(self) -> int | None:
        return None if self.divergence is None else self.divergence.offset

    @property
    def lost_to(self) -> int:
        return self.consumed_to.offset

    @property
    def lost_count(self) -> int | None:
        """How many offsets the application consumed that are gone; ``None`` if unknown."""
        if self.divergence is None:
            return None
        return max(0, self.consumed_to.offset - self.divergence.offset)

    def to_dict(self) -> dict[str, Any]:
        """A flat, JSON-serialisable form with stable keys (for logs and alerting)."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "consumed_to": self.consumed_to.to_json(),
            "divergence": None if self.divergence is None else self.divergence.to_json(),
            "lost_from": self.lost_from,
            "lost_to": self.lost_to,
            "lost_count": self.lost_count,
            "new_leader_epoch": self.new_leader_epoch,
            "detected_by": self.detected_by.value,
            # Plain text, as the docs promise: a PositionSource member would show as an enum
            # in reprs and to handlers that check types.
            "position_source": None if self.position_source is None else str(self.position_source),
        }

    def describe(self) -> str:
        """One human sentence, used as the message of ``LogTruncationError``."""
        where = f"{self.topic}-{self.partition}"
        if self.divergence is None:
            lost = f"divergence point unknown, consumed up to offset {self.lost_to}"
        else:
            lost = (
                f"offsets [{self.lost_from}, {self.lost_to}) ({records_count(self.lost_count)}) "
                f"consumed under the old epoch are gone; logs diverge at {self.divergence}"
            )
        return (
            f"log truncation on {where} detected by {self.detected_by.value}: {lost}; "
            f"new leader epoch {self.new_leader_epoch}"
        )
