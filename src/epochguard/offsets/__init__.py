"""epochguard.offsets: the sans-IO epoch core.

Positions that carry leader epochs (:class:`EpochOffset`), the per-partition state machine
(:class:`PartitionTracker`), truncation reports, policies and offset stores. No sockets,
threads or clocks: drivers feed answers in and carry actions out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epochguard._topic_partition import topic_partition_class
from epochguard.offsets.errors import (
    EpochGuardError,
    InvalidPolicyError,
    InvalidPositionError,
    InvalidTransitionError,
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    OffsetStoreError,
)
from epochguard.offsets.events import (
    Action,
    Event,
    FetchAction,
    ListOffsetsPurpose,
    MetadataRefreshNeeded,
    NoValidOffset,
    OffsetReset,
    PositionValidated,
    RefreshReason,
    RequestFailed,
    RequestKind,
    ResetAction,
    ResetReason,
    TruncationDetected,
    TruncationOutcome,
    ValidateAction,
    ValidationStarted,
    WaitAction,
    WaitReason,
    log_events,
)
from epochguard.offsets.policy import (
    OffsetPolicy,
    ResetStrategy,
    RetryBackoff,
    TruncationDecision,
    TruncationHandler,
)
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy, PositionSource, TruncationReport
from epochguard.offsets.state import (
    SUB_STATES,
    TRANSITIONS,
    ErrorCode,
    PartitionState,
    PartitionTracker,
    SubState,
    Trigger,
)
from epochguard.offsets.stores import JsonFileOffsetStore, OffsetStore, SqliteOffsetStore

if TYPE_CHECKING:
    from kafka.structs import TopicPartition


def __getattr__(name: str) -> Any:
    # kafka-python's class, imported when first asked for (epochguard._topic_partition).
    if name == "TopicPartition":
        return topic_partition_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SUB_STATES",
    "TRANSITIONS",
    "Action",
    "DetectedBy",
    "EpochGuardError",
    "EpochOffset",
    "ErrorCode",
    "Event",
    "FetchAction",
    "InvalidPolicyError",
    "InvalidPositionError",
    "InvalidTransitionError",
    "JsonFileOffsetStore",
    "ListOffsetsPurpose",
    "LogTruncationError",
    "MetadataRefreshNeeded",
    "NoOffsetForPartitionError",
    "NoValidOffset",
    "OffsetOutOfRangeError",
    "OffsetPolicy",
    "OffsetReset",
    "OffsetStore",
    "OffsetStoreError",
    "PartitionState",
    "PartitionTracker",
    "PositionSource",
    "PositionValidated",
    "RefreshReason",
    "RequestFailed",
    "RequestKind",
    "ResetAction",
    "ResetReason",
    "ResetStrategy",
    "RetryBackoff",
    "SqliteOffsetStore",
    "SubState",
    "TopicPartition",
    "Trigger",
    "TruncationDecision",
    "TruncationDetected",
    "TruncationHandler",
    "TruncationOutcome",
    "TruncationReport",
    "ValidateAction",
    "ValidationStarted",
    "WaitAction",
    "WaitReason",
    "log_events",
]
