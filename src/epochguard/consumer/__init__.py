"""epochguard.consumer: ``EpochConsumer`` (threads) and ``AIOEpochConsumer`` (asyncio),
truncation-safe Kafka consumers on one engine."""

from typing import TYPE_CHECKING, Any

from epochguard.consumer.assignors import CooperativeStickyAssignor
from epochguard.consumer.consumer import EpochConsumer, ValidationResult
from epochguard.consumer.errors import (
    ConsumerClosedError,
    ConsumerConfigError,
    CorruptRecordError,
    HangingTransactionError,
    LogTruncationError,
    LogTruncationException,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RecordDeserializationError,
    ReopenedTransactionError,
    SslAuthenticationError,
    UnassignedPartitionError,
)
from epochguard.consumer.records import ConsumerRecord

if TYPE_CHECKING:
    from epochguard.consumer.aio import AIOEpochConsumer


def __getattr__(name: str) -> Any:
    # Imported on first use: asyncio and aiokafka's errors are no cost of threaded users
    # (a Spark query's Python processes each import this package).
    if name == "AIOEpochConsumer":
        from epochguard.consumer.aio import AIOEpochConsumer

        return AIOEpochConsumer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AIOEpochConsumer",
    "ConsumerClosedError",
    "ConsumerConfigError",
    "ConsumerRecord",
    "CooperativeStickyAssignor",
    "CorruptRecordError",
    "EpochConsumer",
    "HangingTransactionError",
    "LogTruncationError",
    "LogTruncationException",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "RecordDeserializationError",
    "ReopenedTransactionError",
    "SslAuthenticationError",
    "UnassignedPartitionError",
    "ValidationResult",
]
