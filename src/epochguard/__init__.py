"""epochguard: a Kafka consumer SDK that detects log truncation (KIP-320) instead of hiding it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epochguard import _decoder_warning
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
    TruncationDecision,
    TruncationReport,
)

if TYPE_CHECKING:
    from kafka.structs import TopicPartition

    from epochguard.consumer import (
        AIOEpochConsumer,
        EpochConsumer,
        HangingTransactionError,
        LogTruncationError,
        LogTruncationException,
        ReopenedTransactionError,
    )

__version__ = "0.3.0"

#: Names of epochguard.consumer, imported on first use: the consumer (with kafka-python's
#: connection layer) is most of the import, and programs that import the package for
#: something else (``epochguard cluster-ctl``, the sans-IO core) do not need it.
_CONSUMER_NAMES = frozenset(
    {
        "AIOEpochConsumer",
        "EpochConsumer",
        "HangingTransactionError",
        "LogTruncationError",
        "LogTruncationException",
        "ReopenedTransactionError",
    }
)

# A missing C record decoder is said when the package is imported, not at the first consumer.
_missing = _decoder_warning.missing_reason()
if _missing is not None:
    _decoder_warning.warn_once(_missing)


def __getattr__(name: str) -> Any:
    if name == "TopicPartition":
        # kafka-python's class, imported when first asked for (epochguard._topic_partition).
        from epochguard._topic_partition import topic_partition_class

        return topic_partition_class()
    if name in _CONSUMER_NAMES:
        import epochguard.consumer

        return getattr(epochguard.consumer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CONSUMER_NAMES | {"TopicPartition"})


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
    "ReopenedTransactionError",
    "ResetStrategy",
    "RetryBackoff",
    "SqliteOffsetStore",
    "TopicPartition",
    "TruncationDecision",
    "TruncationReport",
    "__version__",
]
