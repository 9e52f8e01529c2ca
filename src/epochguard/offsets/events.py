"""What a :class:`~epochguard.offsets.state.PartitionTracker` asks for (actions) and tells
(events). All are small frozen values; drivers turn actions into requests and events into
logs, metrics, callbacks or exceptions.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, TypeAlias

import attrs

from epochguard._log import get_logger
from epochguard.offsets.policy import ResetStrategy
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy, TruncationReport

# ----------------------------------------------------------------------------------- actions


@attrs.frozen(slots=True)
class FetchAction:
    """Fetch from ``offset``. ``last_fetched_epoch`` goes into Fetch v12+ ``LastFetchedEpoch``
    (``None``: send -1). Pass the action back with the answer (``on_records`` etc.)."""

    tp: Any
    leader_id: int
    offset: int
    current_leader_epoch: int | None
    last_fetched_epoch: int | None
    token: int
    #: The topic id from metadata, as text (Fetch v13+ sends it; the broker then answers
    #: UNKNOWN_TOPIC_ID for a recreated topic instead of serving the new log).
    topic_id: str | None = None
    #: KIP-392: the follower the leader named as preferred read replica (``None``: fetch
    #: from the leader). Its answers are judged differently: an error from it sends the
    #: partition back to the leader instead of being acted on.
    read_replica: int | None = None
    #: Metadata names another topic id than the position's: this fetch under that id only
    #: asks whether a leader serves it (which of the two incarnations is live). Its records
    #: are never delivered (``on_records`` refuses them): a driver may pass an answer with
    #: records to ``on_empty_fetch`` without decoding it.
    topic_probe: bool = False

    @property
    def node_id(self) -> int:
        """The broker this fetch goes to: the read replica, else the leader."""
        return self.leader_id if self.read_replica is None else self.read_replica


@attrs.frozen(slots=True)
class ValidateAction:
    """Send OffsetForLeaderEpoch(``current_leader_epoch``, ``leader_epoch``) to the leader.

    ``leader_epoch`` is the position's epoch in the first round; in later rounds (needed only
    after several unclean elections) it is an older epoch the consumer read, which pins the
    divergence point exactly. ``position`` is the position being validated.
    """

    tp: Any
    leader_id: int
    current_leader_epoch: int | None
    leader_epoch: int
    position: EpochOffset
    token: int


class ListOffsetsPurpose(enum.StrEnum):
    RESET = "reset"  # apply auto_offset_reset (or an explicit seek to beginning/end)
    LOG_START_PROBE = "log_start_probe"  # tell retention apart from truncation


# The words the tracker uses in actions and events. ``StrEnum``: each member equals its
# value, so code and tests comparing with the old strings keep working, and ``to_dict`` /
# logs show the plain text.


class WaitReason(enum.StrEnum):
    """``WaitAction.reason``."""

    METADATA_REFRESH = "metadata_refresh"  # refresh metadata, then ask again
    RETRY_BACKOFF = "retry_backoff"  # a request failed: wait, then send it again


class RefreshReason(enum.StrEnum):
    """``MetadataRefreshNeeded.reason`` when no error caused it (after an error the reason
    is the error's name, e.g. ``not_leader_or_follower``)."""

    LEADER_UNKNOWN = "leader_unknown"
    LEADER_EPOCH_BEHIND = "leader_epoch_behind"  # below the epoch the position needs


class RequestKind(enum.StrEnum):
    """``RequestFailed.request``: which request failed."""

    FETCH = "fetch"
    OFFSET_FOR_LEADER_EPOCH = "offset_for_leader_epoch"
    LIST_OFFSETS = "list_offsets"


class ResetReason(enum.StrEnum):
    """Why the tracker looked up earliest/latest (``OffsetReset.reason``) or stopped without
    a valid offset (``NoValidOffset.reason``). Drivers may pass their own text to
    ``request_reset(reason=...)``; it is carried through unchanged."""

    REQUESTED = "requested"  # request_reset() without a reason
    NO_COMMITTED_OFFSET = "no_committed_offset"  # restore(None)
    OFFSET_OUT_OF_RANGE = "offset_out_of_range"  # fetch OOR, position not truncated
    LOG_START_MOVED_PAST_POSITION = "log_start_moved_past_position"  # retention passed us
    TRUNCATION_DIVERGENCE_UNKNOWN = "truncation_divergence_unknown"  # rewind policy, no point
    LOG_TRUNCATED_BELOW_RESET_POSITION = "log_truncated_below_reset_position"  # nothing read


class TruncationOutcome(enum.StrEnum):
    """``TruncationDetected.decision``: what was done about a truncation."""

    REWIND = "rewind"  # moved to the divergence point (``new_position``)
    RESET = "reset"  # divergence unknown: auto_offset_reset follows
    SEEK = "seek"  # the handler's target (``new_position``)
    RAISE = "raise"  # stopped; ``tracker.error`` holds the exception


@attrs.frozen(slots=True)
class ResetAction:
    """Send ListOffsets for ``strategy`` (earliest: -2, latest: -1) to the leader."""

    tp: Any
    leader_id: int
    strategy: ResetStrategy
    current_leader_epoch: int | None
    token: int
    purpose: ListOffsetsPurpose = ListOffsetsPurpose.RESET


@attrs.frozen(slots=True)
class WaitAction:
    """Nothing to send before ``until`` (the caller's clock). ``reason`` is stable snake_case:
    ``metadata_refresh`` (refresh metadata, then ask again) or ``retry_backoff``."""

    tp: Any
    until: float
    reason: WaitReason


Action: TypeAlias = FetchAction | ValidateAction | ResetAction | WaitAction

# ------------------------------------------------------------------------------------ events


@attrs.frozen(slots=True)
class TruncationDetected:
    """A truncation was detected and decided. ``decision``: ``rewind`` (``new_position`` is
    the divergence point), ``reset`` (``auto_offset_reset`` follows), ``seek`` (handler's
    target), or ``raise`` (partition stopped; ``tracker.error`` holds the exception)."""

    report: TruncationReport
    decision: TruncationOutcome
    new_position: EpochOffset | None

    name = "truncation_detected"

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.report.to_dict(),
            "decision": self.decision,
            "new_position": None if self.new_position is None else self.new_position.to_json(),
        }


@attrs.frozen(slots=True)
class ValidationStarted:
    tp: Any
    position: EpochOffset
    cause: DetectedBy

    name = "offset_validation_started"

    def to_dict(self) -> dict[str, Any]:
        return {**_tp(self.tp), "position": self.position.to_json(), "cause": self.cause.value}


@attrs.frozen(slots=True)
class PositionValidated:
    tp: Any
    position: EpochOffset
    leader_epoch: int | None
    cause: DetectedBy

    name = "offset_validated"

    def to_dict(self) -> dict[str, Any]:
        return {
            **_tp(self.tp),
            "position": self.position.to_json(),
            "leader_epoch": self.leader_epoch,
            "cause": self.cause.value,
        }


@attrs.frozen(slots=True)
class OffsetReset:
    """The position was moved by the reset policy (``reason`` says why it had to)."""

    tp: Any
    position: EpochOffset
    strategy: ResetStrategy
    reason: ResetReason | str

    name = "offset_reset"

    def to_dict(self) -> dict[str, Any]:
        return {
            **_tp(self.tp),
            "position": self.position.to_json(),
            "strategy": self.strategy.value,
            "reason": self.reason,
        }


@attrs.frozen(slots=True)
class NoValidOffset:
    """No valid offset and ``auto_offset_reset='none'``: the partition stopped."""

    tp: Any
    position: EpochOffset | None
    reason: ResetReason | str

    name = "no_valid_offset"

    def to_dict(self) -> dict[str, Any]:
        pos = None if self.position is None else self.position.to_json()
        return {**_tp(self.tp), "position": pos, "reason": self.reason}


@attrs.frozen(slots=True)
class MetadataRefreshNeeded:
    """Refresh metadata for this partition; ``min_leader_epoch`` is what the tracker waits for
    (``None``: any fresh answer)."""

    tp: Any
    reason: RefreshReason | str
    min_leader_epoch: int | None

    name = "metadata_refresh_needed"

    def to_dict(self) -> dict[str, Any]:
        return {**_tp(self.tp), "reason": self.reason, "min_leader_epoch": self.min_leader_epoch}


@attrs.frozen(slots=True)
class RequestFailed:
    """A request for this partition failed with ``error_code``; it will be retried."""

    tp: Any
    request: RequestKind
    error_code: int
    retry_at: float

    name = "request_failed"

    def to_dict(self) -> dict[str, Any]:
        return {
            **_tp(self.tp),
            "request": self.request,
            "error_code": self.error_code,
            "retry_at": self.retry_at,
        }


Event: TypeAlias = (
    TruncationDetected
    | ValidationStarted
    | PositionValidated
    | OffsetReset
    | NoValidOffset
    | MetadataRefreshNeeded
    | RequestFailed
)


def _tp(tp: Any) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition}


#: Log level per event name for :func:`log_events` (anything else: info).
EVENT_LEVELS: dict[str, str] = {
    "truncation_detected": "warning",
    "no_valid_offset": "error",
    "request_failed": "debug",
    "metadata_refresh_needed": "debug",
    "offset_validation_started": "debug",
}


def log_events(events: Iterable[Event], logger: Any = None) -> None:
    """Log events through the ``epochguard.offsets`` logger (stdlib ``logging``): the event's
    ``name`` and its ``to_dict()`` keys. ``logger`` is any structlog-style logger instead.

    The core never logs by itself (its hot path stays free of logging); drivers call this
    with what they drained, or route events elsewhere.
    """
    log = get_logger("epochguard.offsets") if logger is None else logger
    for ev in events:
        getattr(log, EVENT_LEVELS.get(ev.name, "info"))(ev.name, **ev.to_dict())
