"""Typed errors of the consumer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kafka.errors as kerrors

from epochguard.offsets.errors import EpochGuardError
from epochguard.offsets.errors import LogTruncationError as _CoreLogTruncationError
from epochguard.offsets.errors import NoOffsetForPartitionError as _CoreNoOffsetError
from epochguard.offsets.errors import OffsetOutOfRangeError as _CoreOutOfRangeError
from epochguard.offsets.hanging import HangingTransaction
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.reopened import ReopenedTransaction
from epochguard.offsets.report import TruncationReport

__all__ = [
    "ConsumerClosedError",
    "ConsumerConfigError",
    "CorruptRecordError",
    "HangingTransactionError",
    "LogTruncationError",
    "LogTruncationException",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "RecordDeserializationError",
    "ReopenedTransactionError",
    "SslAuthenticationError",
    "UnassignedPartitionError",
    "as_consumer_error",
]


class ConsumerConfigError(kerrors.KafkaConfigurationError, ValueError):  # type: ignore[misc]
    """An unknown configuration key or an invalid value; the message names the key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        # A wrapped error of the sans-IO core ("on_truncation must be ...") names the key
        # already; it is said once.
        super().__init__(f"{key}: {message.removeprefix(f'{key} ')}")


class CorruptRecordError(kerrors.CorruptRecordError):  # type: ignore[misc]
    """A fetched batch failed its CRC check or could not be parsed.

    Raised by ``poll`` with ``tp`` and ``offset`` set (the partition and the position it
    stopped at): that partition stops fetching until the application seeks it, the others
    keep delivering. The decoders raise it without them.
    """

    def __init__(self, message: str, *, tp: Any = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.tp = tp
        self.offset = offset


class RecordDeserializationError(kerrors.KafkaError):  # type: ignore[misc]
    """The key or value deserializer raised on the record at ``offset`` of ``tp`` (Java's
    ``RecordDeserializationException``, KIP-334); the deserializer's exception is the
    ``__cause__``.

    The records before it are delivered first; then ``poll`` raises this once and ``tp``
    stays at ``offset`` until the application seeks it (``seek(tp, offset + 1)`` skips the
    record); the other partitions keep delivering. ``records`` (decoders only) holds the
    records decoded before the failing one.
    """

    def __init__(
        self, message: str, *, tp: Any, offset: int, records: list[Any] | None = None
    ) -> None:
        super().__init__(message)
        self.tp = tp
        self.offset = offset
        self.records: list[Any] = records if records is not None else []


class SslAuthenticationError(kerrors.KafkaConnectionError):  # type: ignore[misc]
    """The TLS handshake failed because the broker's certificate could not be verified
    (an unknown CA, an expired certificate, a host name that does not match).

    Java's ``SslAuthenticationException``: retrying cannot help, so the consumer raises it at
    once instead of retrying until ``bootstrap_timeout_ms``. A ``KafkaConnectionError``, which
    kafka-python raises for the same handshake."""


class ConsumerClosedError(kerrors.IllegalStateError):  # type: ignore[misc]
    """A method was called on a closed ``EpochConsumer``."""


class UnassignedPartitionError(kerrors.IllegalStateError, ValueError):  # type: ignore[misc]
    """A partition-level call (``seek``, ``seek_to_beginning``, ...) named a partition that is
    not assigned. kafka-python raises ``ValueError`` here and Java ``IllegalStateException``:
    this is both, so either ``except`` works."""


class LogTruncationError(kerrors.OffsetOutOfRangeError, _CoreLogTruncationError):  # type: ignore[misc]
    """Records the application consumed were truncated from the log (policy ``"raise"``).

    Subclass of kafka-python's ``OffsetOutOfRangeError``, as Java's
    ``LogTruncationException`` extends ``OffsetOutOfRangeException`` (and of the core's
    per-partition ``epochguard.offsets.LogTruncationError``). ``truncations`` maps each
    affected partition to its ``TruncationReport``; those partitions stop fetching until the
    application seeks them. ``report``/``tp``/``offset`` describe the first one.
    """

    def __init__(self, truncations: Mapping[Any, TruncationReport]) -> None:
        if not truncations:
            raise ValueError("LogTruncationError needs at least one truncation report")
        self.truncations: dict[Any, TruncationReport] = dict(truncations)
        first = next(iter(self.truncations.values()))
        self.report = first
        self.tp = first.tp
        self.offset = first.consumed_to.offset
        self.reason = f"log truncated (detected by {first.detected_by.value})"
        Exception.__init__(self, "; ".join(r.describe() for r in self.truncations.values()))

    def truncation_offsets(self) -> dict[Any, EpochOffset | None]:
        """Java's ``divergentOffsets()``: the first divergent position per partition
        (``None`` when the leader could not say)."""
        return {tp: r.divergence for tp, r in self.truncations.items()}

    def __str__(self) -> str:
        return "; ".join(r.describe() for r in self.truncations.values())


#: Java-style alias.
LogTruncationException = LogTruncationError


class HangingTransactionError(kerrors.KafkaError, EpochGuardError):  # type: ignore[misc]
    """A transaction has been open on a partition longer than the broker's
    ``transaction.max.timeout.ms`` allows (``on_hanging_transaction="raise"``): a
    read_committed consumer cannot read past its first offset until it is aborted.

    Typically its COMMIT or ABORT marker was lost to an unclean leader election. ``poll``
    raises it once per stall; the partition keeps being fetched and delivers again as soon
    as an operator aborts the transaction (``kafka-transactions.sh abort``). ``transactions``
    maps each partition to its :class:`~epochguard.offsets.hanging.HangingTransaction`
    (producer id and epoch, first offset); ``transaction``/``tp`` describe the first one.
    """

    retriable = False

    def __init__(self, transactions: Mapping[Any, HangingTransaction]) -> None:
        if not transactions:
            raise ValueError("HangingTransactionError needs at least one hanging transaction")
        self.transactions: dict[Any, HangingTransaction] = dict(transactions)
        first = next(iter(self.transactions.values()))
        self.transaction = first
        self.tp = first.tp
        Exception.__init__(self, str(self))

    def __str__(self) -> str:
        return "; ".join(t.describe() for t in self.transactions.values())


class ReopenedTransactionError(kerrors.KafkaError, EpochGuardError):  # type: ignore[misc]
    """A transaction this read_committed consumer read as decided is no longer decided so
    (``on_hanging_transaction="raise"``): an unclean leader election took its COMMIT or
    ABORT marker, and the records it delivered (or skipped) are open again, or were
    decided again otherwise.

    ``reopened`` holds each :class:`~epochguard.offsets.reopened.ReopenedTransaction`
    (partition, producer id and epoch, the offsets of the records concerned, what the
    consumer did with them and what they are now); ``transaction``/``tp`` describe the
    first one. ``poll`` raises it once per report; the partition keeps being fetched.
    """

    retriable = False

    def __init__(self, reopened: Sequence[ReopenedTransaction]) -> None:
        if not reopened:
            raise ValueError("ReopenedTransactionError needs at least one transaction")
        self.reopened: tuple[ReopenedTransaction, ...] = tuple(reopened)
        self.transaction = self.reopened[0]
        self.tp = self.transaction.tp
        Exception.__init__(self, str(self))

    def __str__(self) -> str:
        return "; ".join(t.describe() for t in self.reopened)


class OffsetOutOfRangeError(kerrors.OffsetOutOfRangeError, _CoreOutOfRangeError):  # type: ignore[misc]
    """The position is not in the log and ``auto_offset_reset`` is ``"none"``.

    What kafka-python raises in this case (``kafka.errors.OffsetOutOfRangeError``), and also
    the core's ``epochguard.OffsetOutOfRangeError``; ``tp``/``offset``/``reason`` say which.
    """

    def __init__(self, tp: Any, offset: int | None, reason: str) -> None:
        _CoreOutOfRangeError.__init__(self, tp, offset, reason)


class NoOffsetForPartitionError(kerrors.NoOffsetForPartitionError, _CoreNoOffsetError):  # type: ignore[misc]
    """No committed or stored position and ``auto_offset_reset`` is ``"none"``: kafka's
    ``NoOffsetForPartitionError`` and the core's ``epochguard.NoOffsetForPartitionError``."""

    def __init__(self, tp: Any) -> None:
        _CoreNoOffsetError.__init__(self, tp)


def as_consumer_error(error: EpochGuardError) -> Exception:
    """The exception the application sees for a stopped partition's core error: the same
    facts, also an instance of the kafka-python class its code already catches."""
    if isinstance(error, _CoreLogTruncationError) and not isinstance(error, LogTruncationError):
        return LogTruncationError({error.tp: error.report})
    if isinstance(error, _CoreNoOffsetError) and not isinstance(error, NoOffsetForPartitionError):
        return NoOffsetForPartitionError(error.tp)
    if isinstance(error, _CoreOutOfRangeError) and not isinstance(
        error, (OffsetOutOfRangeError, LogTruncationError, NoOffsetForPartitionError)
    ):
        return OffsetOutOfRangeError(error.tp, error.offset, error.reason)
    return error
