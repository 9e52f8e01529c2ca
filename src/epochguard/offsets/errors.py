"""Typed errors of the epoch core.

Every error names the offending value or partition so that a log line alone is enough to act on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epochguard.offsets.report import TruncationReport


class EpochGuardError(Exception):
    """Base class of every error raised by epochguard."""


class InvalidPositionError(EpochGuardError, ValueError):
    """An offset or leader epoch that cannot be a Kafka position (negative offset, epoch < -1)."""


class InvalidPolicyError(EpochGuardError, ValueError):
    """A policy value that is not one of the documented choices."""


class OffsetStoreError(EpochGuardError):
    """An offset store is unreadable, corrupt, or belongs to something else.

    Raised instead of returning an empty mapping: an empty mapping would silently restart
    every partition from ``auto_offset_reset``.
    """


class InvalidTransitionError(EpochGuardError, RuntimeError):
    """The tracker was asked to move along an edge that its transition table does not have.

    This is a bug in epochguard, never a condition of the cluster.
    """


class OffsetOutOfRangeError(EpochGuardError):
    """The position is not in the log and no reset policy may move it (``auto_offset_reset``
    is ``"none"``). The partition stays stopped until the application seeks."""

    def __init__(self, tp: Any, offset: int | None, reason: str) -> None:
        self.tp = tp
        self.offset = offset
        self.reason = reason
        super().__init__(f"{_fmt_tp(tp)}: no valid offset ({reason}); position={offset}")


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """No committed or stored position exists and ``auto_offset_reset`` is ``"none"``."""

    def __init__(self, tp: Any) -> None:
        super().__init__(tp, None, "no committed offset and auto_offset_reset='none'")


class LogTruncationError(OffsetOutOfRangeError):
    """The log was truncated below the consumer's position: records were lost.

    ``report`` says which ones. Subclasses :class:`OffsetOutOfRangeError` as Java's
    ``LogTruncationException`` does, so generic out-of-range handlers also see it.
    """

    def __init__(self, report: TruncationReport) -> None:
        self.report = report
        EpochGuardError.__init__(self, report.describe())
        self.tp = report.tp
        self.offset = report.consumed_to.offset
        self.reason = f"log truncated (detected by {report.detected_by.value})"


def _fmt_tp(tp: Any) -> str:
    try:
        return f"{tp.topic}-{tp.partition}"
    except AttributeError:
        return repr(tp)
