"""epochguard: a Kafka consumer SDK that detects log truncation (KIP-320) instead of hiding it."""

from __future__ import annotations

from epochguard.consumer import (
    AIOEpochConsumer,
    EpochConsumer,
    HangingTransactionError,
    LogTruncationError,
    LogTruncationException,
)
from epochguard.offsets import (
    DetectedBy,
    EpochGuardError,
    EpochOffset,
    InvalidPolicyError,
    InvalidPositionError,
    JsonFileOffsetStore,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    OffsetPolicy,
    OffsetStore,
    OffsetStoreError,
    PartitionState,
    PartitionTracker,
    ResetStrategy,
    RetryBackoff,
    SqliteOffsetStore,
    TopicPartition,
    TruncationDecision,
    TruncationReport,
)

__version__ = "0.3.0"

__all__ = [
    "AIOEpochConsumer",
    "DetectedBy",
    "EpochConsumer",
    "EpochGuardError",
    "EpochOffset",
    "HangingTransactionError",
    "InvalidPolicyError",
    "InvalidPositionError",
    "JsonFileOffsetStore",
    "LogTruncationError",
    "LogTruncationException",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "OffsetPolicy",
    "OffsetStore",
    "OffsetStoreError",
    "PartitionState",
    "PartitionTracker",
    "ResetStrategy",
    "RetryBackoff",
    "SqliteOffsetStore",
    "TopicPartition",
    "TruncationDecision",
    "TruncationReport",
    "__version__",
]
