"""epochguard.consumer: ``EpochConsumer`` (threads) and ``AIOEpochConsumer`` (asyncio),
truncation-safe Kafka consumers on one engine."""

from epochguard.consumer.aio import AIOEpochConsumer
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
    SslAuthenticationError,
    UnassignedPartitionError,
)
from epochguard.consumer.records import ConsumerRecord

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
    "SslAuthenticationError",
    "UnassignedPartitionError",
    "ValidationResult",
]
