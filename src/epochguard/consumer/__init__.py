"""epochguard.consumer: ``EpochConsumer``, a truncation-safe Kafka consumer."""

from epochguard.consumer.assignors import CooperativeStickyAssignor
from epochguard.consumer.consumer import EpochConsumer, ValidationResult
from epochguard.consumer.errors import (
    ConsumerClosedError,
    ConsumerConfigError,
    CorruptRecordError,
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
    "ConsumerClosedError",
    "ConsumerConfigError",
    "ConsumerRecord",
    "CooperativeStickyAssignor",
    "CorruptRecordError",
    "EpochConsumer",
    "LogTruncationError",
    "LogTruncationException",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "RecordDeserializationError",
    "SslAuthenticationError",
    "UnassignedPartitionError",
    "ValidationResult",
]
