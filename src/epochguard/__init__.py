"""epochguard: a Kafka consumer SDK that detects log truncation (KIP-320) instead of hiding it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epochguard.consumer import (
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

if TYPE_CHECKING:
    from epochguard.consumer.aio import AIOEpochConsumer

__version__ = "0.3.0"


def __getattr__(name: str) -> Any:
    # Imported on first use (asyncio and aiokafka's errors), as in epochguard.consumer.
    if name == "AIOEpochConsumer":
        from epochguard.consumer.aio import AIOEpochConsumer

        return AIOEpochConsumer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
