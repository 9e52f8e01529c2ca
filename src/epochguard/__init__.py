"""epochguard: a Kafka consumer SDK that detects log truncation (KIP-320) instead of hiding it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    from epochguard.consumer import (
        EpochConsumer,
        HangingTransactionError,
        LogTruncationError,
        LogTruncationException,
    )
    from epochguard.consumer.aio import AIOEpochConsumer

__version__ = "0.3.0"

#: The consumers and their errors, imported on first use: ``import epochguard.offsets`` (an
#: offset store in a Spark worker, say) and the command line do not load the consumer.
_LAZY = {
    "AIOEpochConsumer": "epochguard.consumer.aio",
    "EpochConsumer": "epochguard.consumer",
    "HangingTransactionError": "epochguard.consumer",
    "LogTruncationError": "epochguard.consumer",
    "LogTruncationException": "epochguard.consumer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
