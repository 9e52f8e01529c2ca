"""The per-partition epoch state machine: every decision about a position lives here.

Sans-IO: no sockets, threads or clocks. A driver (``EpochConsumer``, the Spark source, the
demo) feeds answers in through ``on_*`` methods, asks :meth:`PartitionTracker.next_action` what
to send, and drains events with :meth:`PartitionTracker.drain_events`. Time is passed in as a
float ``now`` in the driver's clock.

State changes only happen along the edges of :data:`TRANSITIONS` (checked at run time). A
state alone does not say everything: within ``AWAIT_VALIDATION`` the tracker may be in a
second round or probing the log start, within ``AWAIT_RESET`` it remembers why it resets, and
any live state may be waiting for metadata to reach an epoch. Those sub-states are listed in
:data:`SUB_STATES` (field, values, the states it lives in, who writes and who reads it); every
other field of the tracker is listed in :data:`TRACKER_FIELDS`. A test checks that the two
cover every slot, and the fuzz tests check that a sub-state is idle outside its states
(``_goto`` puts it back on leaving). The two tables plus :data:`TRANSITIONS` are the complete
picture of what can happen to a partition.
"""

from __future__ import annotations

import enum
import functools
import itertools
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from epochguard._errors import ErrorCode as ErrorCode  # re-exported: drivers import it here
from epochguard._errors import error_name
from epochguard.offsets.errors import (
    EpochGuardError,
    InvalidPolicyError,
    InvalidTransitionError,
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
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
)
from epochguard.offsets.policy import OffsetPolicy, ResetStrategy, TruncationDecision
from epochguard.offsets.position import EpochOffset, normalise_topic_id
from epochguard.offsets.report import DetectedBy, PositionSource, TruncationReport

# --------------------------------------------------------------------------- states and table


class PartitionState(enum.Enum):
    """Where a partition is. Mirrors Java's ``FetchStates`` plus two stopped states."""

    INITIALIZING = "initializing"  # no position yet: restore(), seek() or request_reset()
    FETCHING = "fetching"  # valid position: fetch
    AWAIT_VALIDATION = "await_validation"  # position has an epoch to check with the leader
    AWAIT_RESET = "await_reset"  # ListOffsets for earliest/latest
    TRUNCATED = "truncated"  # truncation and policy said raise: stopped until a seek
    NO_VALID_OFFSET = "no_valid_offset"  # out of range / no offset, reset "none": stopped


class Trigger(enum.Enum):
    """What moves a partition between states (inputs classified by the tracker)."""

    SEEK_UNVALIDATED = "seek_unvalidated"  # seek/restore to a position with an epoch
    SEEK_VALIDATED = "seek_validated"  # seek/restore without epoch: nothing to validate
    RESET_REQUESTED = "reset_requested"  # no valid offset and a reset strategy applies
    STOP_NO_OFFSET = "stop_no_offset"  # no valid offset and auto_offset_reset="none"
    VALIDATION_NEEDED = "validation_needed"  # new leader/epoch, FENCED, OOR, DivergingEpoch
    VALIDATED = "validated"  # leader confirms the position
    TRUNCATION_REWOUND = "truncation_rewound"  # truncation, moved to the divergence point
    TRUNCATION_RAISED = "truncation_raised"  # truncation, stopped
    RESET_DONE = "reset_done"  # ListOffsets answered


S = PartitionState
T = Trigger

_REPOSITION: Final[Mapping[Trigger, PartitionState]] = {
    T.SEEK_UNVALIDATED: S.AWAIT_VALIDATION,
    T.SEEK_VALIDATED: S.FETCHING,
    T.RESET_REQUESTED: S.AWAIT_RESET,
    T.STOP_NO_OFFSET: S.NO_VALID_OFFSET,
}

#: ``TRANSITIONS[state][trigger] -> next state``. Any other (state, trigger) is a bug.
#: Inputs that change no state (records, empty fetches, retriable errors, stale answers)
#: are not listed.
TRANSITIONS: Final[Mapping[PartitionState, Mapping[Trigger, PartitionState]]] = {
    S.INITIALIZING: {**_REPOSITION},
    S.FETCHING: {
        **_REPOSITION,
        T.VALIDATION_NEEDED: S.AWAIT_VALIDATION,
        T.TRUNCATION_REWOUND: S.FETCHING,  # topic recreated
        T.TRUNCATION_RAISED: S.TRUNCATED,  # topic recreated
    },
    S.AWAIT_VALIDATION: {
        **_REPOSITION,
        T.VALIDATION_NEEDED: S.AWAIT_VALIDATION,  # new leader while validating: start over
        T.VALIDATED: S.FETCHING,
        T.TRUNCATION_REWOUND: S.FETCHING,
        T.TRUNCATION_RAISED: S.TRUNCATED,
    },
    S.AWAIT_RESET: {
        **_REPOSITION,
        T.RESET_DONE: S.FETCHING,
        # Skipping forward past retention found the log start *behind* us: the log was
        # replaced under our position, so validate it after all.
        T.VALIDATION_NEEDED: S.AWAIT_VALIDATION,
    },
    S.TRUNCATED: {**_REPOSITION},
    S.NO_VALID_OFFSET: {**_REPOSITION},
}

STOPPED_STATES: Final = frozenset({S.TRUNCATED, S.NO_VALID_OFFSET})


# ------------------------------------------------------------------------------ sub-states


@attrs.frozen
class SubState:
    """A tracker field that refines a state. Outside ``states`` it holds ``idle``."""

    states: frozenset[PartitionState]
    idle: Any
    values: str
    meaning: str
    written_by: tuple[str, ...]
    read_by: tuple[str, ...]


_LIVE: Final = frozenset({S.FETCHING, S.AWAIT_VALIDATION, S.AWAIT_RESET})

#: The hidden part of the state machine: ``SUB_STATES[field]``.
SUB_STATES: Final[Mapping[str, SubState]] = {
    "_query_epoch": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        None,
        "int | None",
        "epoch asked in this OffsetForLeaderEpoch round: the position's epoch in round one, "
        "an older epoch this consumer read in later rounds (after several unclean elections)",
        ("_restart_validation", "_apply_epoch_answer"),
        ("next_action",),
    ),
    "_bound": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        None,
        "int | None",
        "upper bound on the divergence point from earlier rounds (None: round one)",
        ("_restart_validation", "_apply_epoch_answer"),
        ("_apply_epoch_answer",),
    ),
    "_probe": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        False,
        "bool",
        "log-start probe: the leader knew no epoch <= ours, or the divergence point from our "
        "own reads lies below its answer, so ListOffsets(earliest) tells retention (log start "
        "past us) from truncation",
        ("_apply_epoch_answer", "_restart_validation", "on_list_offsets"),
        ("next_action", "on_validation", "on_list_offsets"),
    ),
    "_probe_divergence": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        None,
        "EpochOffset | None",
        "with the log-start probe: the divergence point our own reads gave (below the "
        "leader's answer), reported from the log start if retention removed part of it",
        ("_apply_epoch_answer", "_restart_validation", "on_list_offsets"),
        ("on_list_offsets",),
    ),
    "_reset_on_valid": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        False,
        "bool",
        "validation started by OFFSET_OUT_OF_RANGE: if the position is not truncated, "
        "retention passed it and the reset policy applies",
        ("on_fetch_error", "_begin_validation"),
        ("_apply_epoch_answer",),
    ),
    "_start_after": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        None,
        "tuple[EpochOffset, PositionSource | str, bool] | None",
        "restore() with ``read_to``: the position validated is where this consumer had read "
        "to before it gave the partition up; once the leader confirms it, the consumer "
        "starts from this one (the committed or stored position, its source, epoch_exact), "
        "validated in turn; if it is truncated instead, from this one all the same when it was "
        "read in a later epoch, past the divergence (policy rewind), or this one is validated "
        "before the partition stops (a stopping policy: see _pending_stop)",
        ("restore", "seek"),
        ("_validated", "_decide"),
    ),
    "_pending_stop": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        None,
        "TruncationReport | None",
        "a stop decided on the report of where this consumer had read to, waiting for the "
        "validation of the position it was given back at (read in a later epoch, past the "
        "divergence: another member was told and read the new log): told and carried out "
        "once that position is confirmed (or fell to retention); if that position is "
        "truncated too, told before its own report, with which the partition stops; dropped "
        "by a seek, as the validation it waits for",
        ("_decide", "seek"),
        ("_decide", "_validated", "on_list_offsets"),
    ),
    "_cause": SubState(
        frozenset({S.AWAIT_VALIDATION}),
        DetectedBy.RESTORE,
        "DetectedBy",
        "the signal that started this validation (reported with its outcome); set just "
        "before the report of a re-created topic too",
        ("_begin_validation", "_topic_recreated"),
        ("_validated", "_truncation"),
    ),
    "_reset_reason": SubState(
        frozenset({S.AWAIT_RESET}),
        None,
        "ResetReason | str | None",
        "why the reset: skip-forward reasons (offset_out_of_range, "
        "log_start_moved_past_position) must move forward, else the log was replaced",
        ("_begin_reset",),
        ("on_list_offsets", "_topic_recreated"),
    ),
    "_await_epoch": SubState(
        _LIVE,
        None,
        "int | None",
        "KIP-232: metadata must reach this leader epoch before the next request (a position's "
        "epoch, or one past a FENCED answer); given up after MAX_EPOCH_WAITS refreshes",
        (
            "_begin_validation",
            "_retry_after_error",
            "on_metadata",
            "next_action",
            "seek",
            "_begin_reset",
            "_topic_recreated",
        ),
        ("next_action", "_metadata_blocked"),
    ),
}

#: Every other field of the tracker, and what it holds.
TRACKER_FIELDS: Final[Mapping[str, str]] = {
    "tp": "the partition",
    "_policy": "OffsetPolicy: reset strategy, truncation policy, retry backoff",
    "_state": "PartitionState",
    "_offset": "position: next offset to deliver (-1: none yet)",
    "_epoch": "position: epoch of the record before the offset (None: unknown)",
    "_source": "position: where it came from (PositionSource or the driver's text)",
    "_from_reset": "position: set by a reset and nothing read since (a truncation then "
    "moves it without a report)",
    "_reset_over": "position: while _from_reset, the position (and its source) that a reset "
    "after falling off the log start replaced: where the application stood in this topic "
    "incarnation, so that a re-creation before anything more is read still reports what it "
    "had consumed (None: the reset replaced no position, or the application asked for it)",
    "_hist": "(epoch, first offset read in it) pairs since the last seek",
    "_hist_epoch": "epoch of the last _hist entry",
    "_hist_inexact": "the first _hist entry's offset is only an upper bound",
    "_splices": "offsets (ascending) where this consumer's reads moved to another log: the log "
    "start it continued from after what it had read below diverged there and retention had "
    "removed it; _hist entries below a splice belong to the earlier log, which a later leader "
    "may hold again, so each stretch is validated against its own epochs",
    "_leader_id": "metadata: leader node (None: unknown)",
    "_leader_epoch": "metadata: leader epoch (None: unknown)",
    "_topic_id": "the topic id (as text) of the incarnation the position is in, which fetches "
    "name (None: unknown)",
    "_old_topic_ids": "topic ids known to be older than one a leader served since they were "
    "named (the last few): deleted incarnations; metadata naming one is behind, a position "
    "in one is reported at once",
    "_rival": "(topic id, leader, leader epoch) of the metadata that named another id than "
    "_topic_id last, not judged yet (None: none): the next request is a fetch under it "
    "(FetchAction.topic_probe); a leader serving it proves the position's incarnation "
    "deleted, metadata naming _topic_id again ends it",
    "_unjudged": "topic ids named (by metadata or a position given up by a seek) since a "
    "leader last served one, neither _topic_id nor known to be older: a leader serving "
    "_topic_id (or the rival) now proves each of them older",
    "_replicas": "metadata: the partition's live replicas (None: not known)",
    "_replica": "KIP-392: the follower fetches go to (None: the leader); any change of the "
    "replica serving the partition validates the position with the leader",
    "_replica_until": "KIP-392: when the read replica expires (fetches go back to the leader, "
    "which names one again), in the driver's clock",
    "_reset_strategy": "strategy of the last reset; kept after it, since a truncation found "
    "before anything was read repeats that reset",
    "_retry_at": "retry schedule: nothing is sent before this time",
    "_attempts": "retry schedule: failures in a row (RetryBackoff attempt)",
    "_wait_reason": "retry schedule: WaitReason of the current wait",
    "_gen": "generation: the token of valid actions, unique in the process; bumped to make "
    "answers stale",
    "_in_flight": "a request action was handed out and not answered",
    "_paused": "fetches suppressed (validation and resets go on)",
    "_report": "the last TruncationReport",
    "_error": "the exception to raise while stopped",
    "_events": "events not drained yet",
}

# -------------------------------------------------------------------------------- error codes


class ErrorClass(enum.Enum):
    OUT_OF_RANGE = "out_of_range"  # fetch only: validate (epoch) or reset (no epoch)
    FENCED = "fenced"  # our leader epoch is older than the broker's
    STALE_METADATA = "stale_metadata"  # wrong broker / broker behind: refresh and retry
    RETRIABLE = "retriable"  # anything else: retry with backoff


ERROR_CLASSES: Final[Mapping[int, ErrorClass]] = {
    ErrorCode.OFFSET_OUT_OF_RANGE: ErrorClass.OUT_OF_RANGE,
    ErrorCode.FENCED_LEADER_EPOCH: ErrorClass.FENCED,
    ErrorCode.UNKNOWN_LEADER_EPOCH: ErrorClass.STALE_METADATA,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorClass.STALE_METADATA,
    ErrorCode.LEADER_NOT_AVAILABLE: ErrorClass.STALE_METADATA,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorClass.STALE_METADATA,
    ErrorCode.UNKNOWN_TOPIC_ID: ErrorClass.STALE_METADATA,
    # A fetch session still naming a re-created topic's old id (Java: refresh metadata).
    ErrorCode.INCONSISTENT_TOPIC_ID: ErrorClass.STALE_METADATA,
    ErrorCode.REPLICA_NOT_AVAILABLE: ErrorClass.STALE_METADATA,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorClass.STALE_METADATA,
    ErrorCode.OFFSET_NOT_AVAILABLE: ErrorClass.STALE_METADATA,
}


def classify_error(code: int) -> ErrorClass:
    return ERROR_CLASSES.get(code, ErrorClass.RETRIABLE)


#: Bound on the remembered (epoch, first offset) history. Dropping old entries can only turn
#: an exact divergence point far in the past into an unknown one, never into a wrong one.
MAX_EPOCH_HISTORY: Final = 64
#: Former topic ids a tracker remembers (metadata naming one of them is stale).
MAX_OLD_TOPIC_IDS: Final = 8

#: How many metadata refreshes to wait for the leader epoch to reach a position's epoch
#: (KIP-232) before validating regardless.
MAX_EPOCH_WAITS: Final = 5

#: Tokens come from one counter for the whole process, not one per tracker. A driver finds
#: the tracker an answer is for by its partition; a tracker made again for the same
#: partition (revoked and assigned back, a consumer group's everyday hand-over) numbered
#: its generations from the start again and took its predecessor's answers as its own: an
#: OffsetForLeaderEpoch answer about another position made it report a truncation that never
#: happened (the chaos runs' seed 72).
_GENERATIONS: Final = itertools.count(1)

_FETCHING = S.FETCHING

_REQUEST_KINDS: Final[Mapping[type, RequestKind]] = {
    FetchAction: RequestKind.FETCH,
    ValidateAction: RequestKind.OFFSET_FOR_LEADER_EPOCH,
    ResetAction: RequestKind.LIST_OFFSETS,
}

#: Kafka's "no topic id" (``Uuid.ZERO_UUID``) in the forms drivers may pass it: not an id,
#: so it must never look like a recreated topic.
_NO_TOPIC_IDS: Final = frozenset(
    {uuid.UUID(int=0), str(uuid.UUID(int=0)), "AAAAAAAAAAAAAAAAAAAAAA", "", 0, b"\0" * 16}
)

#: Reset reasons that mean "our position fell off the start of the log": the reset must move
#: forward. A reset answer behind the position means the log was replaced instead.
_SKIP_FORWARD_REASONS: Final = frozenset(
    {ResetReason.OFFSET_OUT_OF_RANGE, ResetReason.LOG_START_MOVED_PAST_POSITION}
)


# ------------------------------------------------------------------------------------ tracker


def _same_point(position: EpochOffset | None, other: EpochOffset | None) -> bool:
    """``position`` and ``other`` name the same offset in the same known epoch
    (``EpochOffset`` equality compares those two alone)."""
    return position is not None and position.leader_epoch is not None and position == other


def _older_at_same_offset(position: EpochOffset, read_to: EpochOffset) -> bool:
    """``position`` names ``read_to``'s offset in an older epoch."""
    return (
        position.offset == read_to.offset
        and position.leader_epoch is not None
        and read_to.leader_epoch is not None
        and position.leader_epoch < read_to.leader_epoch
    )


def _written_since(position: EpochOffset, report: TruncationReport) -> bool:
    """Whether ``position`` was read in an epoch after the one ``report`` found truncated,
    at or past its divergence point: in a log written since the truncation."""
    consumed_epoch = report.consumed_to.leader_epoch
    divergence = report.divergence
    return (
        divergence is not None
        and position.leader_epoch is not None
        and consumed_epoch is not None
        and position.leader_epoch > consumed_epoch
        and position.offset >= divergence.offset
    )


class PartitionTracker:
    """The epoch state of one partition's consumer position.

    Inputs (each returns ``True`` if it was applied, ``False`` if it was stale and ignored):
    :meth:`on_metadata`, :meth:`on_records`, :meth:`on_empty_fetch`, :meth:`on_fetch_error`,
    :meth:`on_diverging_epoch`, :meth:`on_validation`, :meth:`on_list_offsets`,
    :meth:`on_request_failed`; commands :meth:`restore`, :meth:`seek`,
    :meth:`request_reset`, :meth:`pause`, :meth:`resume`, :meth:`cancel`.

    Outputs: :meth:`next_action` (each request is handed out once; pass the action back with
    its answer) and :meth:`drain_events`. When :attr:`error` is set the partition is stopped
    and the driver should raise it.
    """

    __slots__ = (
        "_attempts",
        "_await_epoch",
        "_bound",
        "_cause",
        "_epoch",
        "_error",
        "_events",
        "_from_reset",
        "_gen",
        "_hist",
        "_hist_epoch",
        "_hist_inexact",
        "_in_flight",
        "_leader_epoch",
        "_leader_id",
        "_offset",
        "_old_topic_ids",
        "_paused",
        "_pending_stop",
        "_policy",
        "_probe",
        "_probe_divergence",
        "_query_epoch",
        "_replica",
        "_replica_until",
        "_replicas",
        "_report",
        "_reset_on_valid",
        "_reset_over",
        "_reset_reason",
        "_reset_strategy",
        "_retry_at",
        "_rival",
        "_source",
        "_splices",
        "_start_after",
        "_state",
        "_topic_id",
        "_unjudged",
        "_wait_reason",
        "tp",
    )

    def __init__(self, tp: Any, policy: OffsetPolicy | None = None) -> None:
        self.tp = tp
        self._policy = OffsetPolicy() if policy is None else policy
        self._state = S.INITIALIZING
        self._gen = next(_GENERATIONS)
        self._in_flight = False
        self._paused = False
        # Position, kept as two plain attributes for the records hot path.
        self._offset = -1
        self._epoch: int | None = None
        self._source: PositionSource | str | None = None
        # The position was set by a reset (ListOffsets) and nothing was read since.
        self._from_reset = False
        self._reset_over: tuple[EpochOffset, PositionSource | str | None] | None = None
        # (epoch, first offset consumed in it), ascending; what this consumer actually read.
        self._hist: list[tuple[int, int]] = []
        self._hist_epoch: int | None = None
        # True when the first entry's start offset is only an upper bound (it came from a
        # restored position, or older entries were dropped).
        self._hist_inexact = False
        # Where the reads in _hist moved to another log (see TRACKER_FIELDS).
        self._splices: list[int] = []
        # Metadata.
        self._leader_id: int | None = None
        self._leader_epoch: int | None = None
        # As text (``normalise_topic_id``): metadata gives ``uuid.UUID``, stored positions str.
        self._topic_id: str | None = None
        self._old_topic_ids: tuple[str, ...] = ()
        self._rival: tuple[str, int | None, int | None] | None = None
        self._unjudged: tuple[str, ...] = ()
        self._replicas: frozenset[int] | None = None
        # KIP-392 follower fetching.
        self._replica: int | None = None
        self._replica_until = 0.0
        # Retry / waiting.
        self._retry_at = 0.0
        self._attempts = 0
        self._wait_reason = WaitReason.RETRY_BACKOFF
        self._await_epoch: int | None = None
        # Validation in progress.
        self._cause = DetectedBy.RESTORE
        self._query_epoch: int | None = None
        self._bound: int | None = None
        self._probe = False
        # A divergence point found below the leader's answer, waiting for the log start probe.
        self._probe_divergence: EpochOffset | None = None
        self._reset_on_valid = False
        self._start_after: tuple[EpochOffset, PositionSource | str, bool] | None = None
        self._pending_stop: TruncationReport | None = None
        # Reset in progress.
        self._reset_strategy = ResetStrategy.LATEST
        self._reset_reason: ResetReason | str | None = None
        # Outcome.
        self._report: TruncationReport | None = None
        self._error: EpochGuardError | None = None
        self._events: list[Event] = []

    # ------------------------------------------------------------------------ properties

    @property
    def state(self) -> PartitionState:
        return self._state

    @property
    def policy(self) -> OffsetPolicy:
        return self._policy

    @property
    def position(self) -> EpochOffset | None:
        """The next offset to deliver and the epoch of the record before it; ``None`` before
        the first position is known."""
        if self._offset < 0:
            return None
        return EpochOffset(
            self._offset,
            self._epoch,
            topic_id=self._topic_id,
            epoch_exact=self._epoch is not None and self._read_since_splice(),
        )

    @property
    def has_valid_position(self) -> bool:
        return self._state is _FETCHING

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def error(self) -> EpochGuardError | None:
        """The exception to raise while the partition is stopped (TRUNCATED, NO_VALID_OFFSET)."""
        return self._error

    @property
    def last_report(self) -> TruncationReport | None:
        """The most recent truncation report (kept after the partition moved on)."""
        return self._report

    @property
    def leader_id(self) -> int | None:
        return self._leader_id

    @property
    def leader_epoch(self) -> int | None:
        return self._leader_epoch

    @property
    def read_replica(self) -> int | None:
        """The follower this partition fetches from (KIP-392), ``None``: the leader."""
        return self._replica

    @property
    def fetch_node(self) -> int | None:
        """The broker fetches go to now: the read replica, else the leader."""
        return self._leader_id if self._replica is None else self._replica

    @property
    def topic_id(self) -> str | None:
        """The topic's id as text (the driver turns it back into its wire form)."""
        return self._topic_id

    @property
    def old_topic_ids(self) -> tuple[str, ...]:
        """Topic ids known to be older than one a leader served since they were named (the
        last few): deleted incarnations of the topic."""
        return self._old_topic_ids

    @property
    def position_is_exact(self) -> bool:
        """True when the position's epoch is the epoch of the record before it as read by
        this tracker (or promised by ``epoch_exact``), False when it is an upper bound (after
        a reset, or a rewind below what this tracker read). Drivers that can store this flag
        with the position pass it back to :meth:`restore`."""
        return self._epoch is None or self._read_since_splice()

    @property
    def epoch_history(self) -> tuple[tuple[int, int], ...]:
        """``(epoch, first offset read in it)`` pairs this consumer read since its last seek."""
        return tuple(self._hist)

    def __repr__(self) -> str:
        pos = "none" if self._offset < 0 else str(EpochOffset(self._offset, self._epoch))
        return (
            f"<PartitionTracker {self.tp.topic}-{self.tp.partition} {self._state.name} "
            f"position={pos} leader={self._leader_id}@e{self._leader_epoch}"
            f"{'' if self._replica is None else f' replica={self._replica}'}"
            f"{' paused' if self._paused else ''}>"
        )

    def drain_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    # -------------------------------------------------------------------------- outputs

    def next_action(self, now: float) -> Action | None:
        """What to send now, or ``None`` (idle: stopped, paused, no position, or a request
        is already in flight). Each request action is returned once."""
        state = self._state
        if state is S.INITIALIZING or state in STOPPED_STATES or self._in_flight:
            return None
        if self._rival is not None:
            # Which incarnation is live comes first: validation and resets ask by name, and
            # a broker answers them from whichever one it holds. Not held up by a pause: the
            # probe's records are never delivered.
            return self._topic_probe(now)
        if state is _FETCHING and self._paused:
            return None
        if self._replica is not None and now >= self._replica_until:
            # The leader's choice is only good for a while (Java: metadata.max.age.ms): ask it
            # again, it may name the same follower or another one.
            self._change_replica(None)
            state = self._state
        if self._metadata_blocked():
            if self._leader_id is not None and self._attempts >= MAX_EPOCH_WAITS:
                # Metadata never reached the epoch we wait for (a position from a deleted
                # topic, a bogus epoch): ask the leader anyway. If our view is stale it
                # answers FENCED and we wait again; otherwise its answer settles it.
                self._await_epoch = None
                return self.next_action(now)
            if now >= self._retry_at:
                self._events.append(
                    MetadataRefreshNeeded(self.tp, self._blocked_reason(), self._await_epoch)
                )
                self._schedule_retry(now, WaitReason.METADATA_REFRESH)
            return WaitAction(self.tp, self._retry_at, WaitReason.METADATA_REFRESH)
        if now < self._retry_at:
            return WaitAction(self.tp, self._retry_at, self._wait_reason)
        leader = self._leader_id
        assert leader is not None
        self._in_flight = True
        if state is _FETCHING:
            return FetchAction(
                self.tp,
                leader,
                self._offset,
                self._leader_epoch,
                self._epoch,
                self._gen,
                self._topic_id,
                self._replica,
            )
        if state is S.AWAIT_VALIDATION:
            if self._probe:
                return ResetAction(
                    self.tp,
                    leader,
                    ResetStrategy.EARLIEST,
                    self._leader_epoch,
                    self._gen,
                    ListOffsetsPurpose.LOG_START_PROBE,
                )
            assert self._query_epoch is not None
            return ValidateAction(
                self.tp,
                leader,
                self._leader_epoch,
                self._query_epoch,
                EpochOffset(self._offset, self._epoch),
                self._gen,
            )
        assert state is S.AWAIT_RESET
        return ResetAction(self.tp, leader, self._reset_strategy, self._leader_epoch, self._gen)

    def fetch_leader(self, now: float) -> int | None:
        """The leader :meth:`next_action` would return a ``FetchAction`` for at ``now``, or
        ``None`` when it would return anything else. Changes nothing: a driver that could
        not send that fetch anyway (a request to that leader in flight) skips the tracker
        instead of taking the action and cancelling it, which at 1,000 partitions was most
        of each ``poll()``'s CPU time."""
        if (
            self._state is not _FETCHING
            or self._paused
            or self._in_flight
            or now < self._retry_at
            or self._rival is not None
            or self._metadata_blocked()
        ):
            return None
        return self._leader_id

    # ----------------------------------------------------------------- commands from the app

    def restore(
        self,
        position: EpochOffset | None,
        source: PositionSource | str = PositionSource.COMMITTED,
        epoch_exact: bool = False,
        read_to: EpochOffset | None = None,
        reported: EpochOffset | None = None,
    ) -> None:
        """Start from a committed/stored position (``None``: there is none).

        ``epoch_exact``: see :meth:`seek`.

        ``read_to``: where this consumer had read to in the partition before it gave it up
        (a rebalance took it away and gave it back). A commit that failed on the way leaves
        ``position`` below it, and the records in between were delivered: ``read_to`` is
        validated first, so a truncation of them is reported (with ``read_to`` as
        ``consumed_to``, source ``left_position``); once it is confirmed, the consumer starts
        from ``position`` as without it. Found truncated under policy ``rewind``, it starts
        from ``position`` too when that was read in a later epoch at or past the divergence
        (the owner meanwhile read the new log and committed there), else from the
        divergence. Under a policy that stops, such a ``position`` is validated before the
        partition stops: intact, it stops with the report of ``read_to``; truncated too, both
        reports are told and it stops with the one of ``position``. Ignored without an
        epoch, when their topic ids differ, or when ``position`` is at or past it in the same
        epoch: one epoch's records are one leader's log, so ``position`` covers what this
        consumer read, and validating it reports a truncation of those records together
        with what the group read after them. A ``position`` at the same offset in an older
        epoch is older than this consumer's own reading (a commit that landed late, after a
        newer one: a request the client had given up on): ``read_to`` covers it, and the
        consumer starts from ``read_to`` once it is confirmed; validating the older epoch
        again would report a truncation this consumer already reported, and read again what
        it read since. So does a ``position`` this consumer found truncated itself before it
        gave the partition up (``reported``: the ``consumed_to`` of its last report there,
        the same offset and epoch): a commit made after that report had not landed, and the
        group's commit is still the position it reported. A ``read_to`` that is itself that
        position (the partition stopped at the report, or was taken away before it moved
        on) holds nothing this consumer read since: it is ignored.
        """
        if _same_point(read_to, reported):
            read_to = None
        if position is None:
            self._source = source
            self._no_valid_offset(ResetReason.NO_COMMITTED_OFFSET, no_offset=True)
        elif (
            read_to is not None
            and read_to.offset > 0
            and read_to.leader_epoch is not None
            and not (
                read_to.leader_epoch == position.leader_epoch and read_to.offset <= position.offset
            )
            and read_to.topic_id == position.topic_id
        ):
            self.seek(read_to, source=PositionSource.LEFT_POSITION)
            if (
                self._state is S.AWAIT_VALIDATION
                and not _older_at_same_offset(position, read_to)
                and not _same_point(position, reported)
            ):
                self._start_after = (position, source, epoch_exact)
        else:
            self.seek(position, source=source, epoch_exact=epoch_exact)

    def seek(
        self,
        position: EpochOffset | int,
        source: PositionSource | str = PositionSource.SEEK,
        epoch_exact: bool = False,
    ) -> None:
        """Move to ``position``. With an epoch it is validated before the first fetch (after
        metadata has caught up with that epoch); without one it is fetched from directly.

        A position's epoch is at most the epoch of the record before it; positions committed
        right after a reset carry the leader's epoch instead, which may have no records at
        all. So by default a leader that lacks the epoch but whose older epoch reaches the
        offset validates the position (Java's rule). ``epoch_exact=True`` promises that the
        record before the offset was read in exactly this epoch (see
        :attr:`position_is_exact`); then a leader lacking the epoch means truncation.
        """
        if not isinstance(position, EpochOffset):
            position = EpochOffset(position)
        epoch_exact = epoch_exact or position.epoch_exact
        self._start_after = None
        self._pending_stop = None
        report = self._report
        # The application resumes where this tracker's own report said the logs part (the
        # documented answer to LogTruncationError, and a truncation handler's usual one).
        # What it read below that point stays known, as a rewind keeps it: cleared, the
        # reported epoch would be an upper bound only, and a later election replacing
        # records below it went unseen (found by `make explore`; for handlers, on Raft-term
        # brokers, whose answers echo the epoch asked about).
        resumes_at_report = (
            (self._state is S.TRUNCATED or source is PositionSource.TRUNCATION_HANDLER)
            and report is not None
            and report.divergence is not None
            and position.offset == report.divergence.offset
            and position.leader_epoch == report.divergence.leader_epoch
            and position.topic_id in (None, self._topic_id)
        )
        self._error = None
        self._source = source
        self._from_reset = False
        self._reset_over = None
        self._offset = position.offset
        # The epoch is that of the record before the offset; at 0 there is none.
        self._epoch = position.leader_epoch if position.offset > 0 else None
        if resumes_at_report:
            self._truncate_history(position.offset)
        else:
            self._clear_history()
        wanted = position.topic_id
        deleted = False
        if wanted is not None and wanted != self._topic_id:
            if wanted in self._old_topic_ids:
                # A leader served another id since this one was named: the position's
                # incarnation is deleted (reported below, once the position is taken).
                deleted = True
            else:
                self._take_position_topic(wanted)
        if self._epoch is not None and epoch_exact and not resumes_at_report:
            # What the position itself says: offset-1 was read in this epoch. Where the
            # reader entered that epoch is unknown (``_hist_inexact``).
            self._hist.append((self._epoch, position.offset - 1))
            self._hist_epoch = self._epoch
            self._hist_inexact = True
        self._retry_at = 0.0
        self._attempts = 0
        self._await_epoch = None
        if self._epoch is None:
            self._goto(T.SEEK_VALIDATED)
            self._bump()
        else:
            self._begin_validation(T.SEEK_UNVALIDATED, DetectedBy.RESTORE)
        if deleted:
            self._topic_recreated(self._leader_id, self._leader_epoch, self._topic_id)

    def request_reset(
        self,
        strategy: ResetStrategy | str | None = None,
        reason: ResetReason | str = ResetReason.REQUESTED,
    ) -> None:
        """Look up earliest/latest (``None``: the policy's ``auto_offset_reset``)."""
        if strategy is None:
            self._no_valid_offset(reason)
            return
        strategy = ResetStrategy(strategy) if isinstance(strategy, str) else strategy
        if strategy is ResetStrategy.NONE:
            raise InvalidPolicyError("request_reset needs 'earliest' or 'latest', got 'none'")
        self._error = None
        self._begin_reset(strategy, reason)

    def pause(self) -> None:
        """Stop fetching (validation and resets still proceed). An in-flight fetch's records
        will be refused by :meth:`on_records`."""
        if not self._paused:
            self._paused = True
            if self._state is _FETCHING:
                self._bump()

    def resume(self) -> None:
        self._paused = False

    def awaits(self, action: Action) -> bool:
        """Whether ``action`` is the request this tracker is waiting on, so that its answer
        is current. The ``on_*`` inputs ignore a stale answer themselves; a driver asks
        first when it keeps state of its own per answer (buffers, which broker serves the
        partition): a former leader's late answer must not disturb what the current
        request brought."""
        if not self._in_flight_now(action):
            return False
        return not isinstance(action, FetchAction) or self._state is _FETCHING or action.topic_probe

    def _in_flight_now(self, action: Action) -> bool:
        """``action`` is the request handed out last, still unanswered, at this generation."""
        return not isinstance(action, WaitAction) and action.token == self._gen and self._in_flight

    def cancel(self, action: Action) -> None:
        """The driver did not send ``action`` after all: hand it out again, no backoff."""
        if not isinstance(action, WaitAction) and action.token == self._gen:
            self._in_flight = False

    # ------------------------------------------------------------------- inputs: metadata

    def on_metadata(
        self,
        leader_id: int | None,
        leader_epoch: int | None = None,
        topic_id: Any = None,
        replicas: Iterable[int] | None = None,
        *,
        fetch_detects_divergence: bool = False,
    ) -> bool:
        """Metadata for this partition. ``leader_epoch`` ``None``/-1: not known (old metadata
        versions). ``topic_id`` ``None``: not known. ``replicas``: the live replicas (``None``:
        not known); a read replica no longer among them sends fetches back to the leader.
        ``fetch_detects_divergence``: the leader named answers Fetch v12+ (the driver sends
        it ``LastFetchedEpoch`` and passes its ``DivergingEpoch`` to
        :meth:`on_diverging_epoch`), so a new leader epoch needs no OffsetForLeaderEpoch round
        trip: the next fetch carries the comparison. Never ``True`` for an older Fetch
        version: the leader would not compare and a truncation would go unnoticed.
        Returns ``False`` for stale metadata (an older leader epoch than already seen, same
        topic)."""
        if leader_epoch is not None and leader_epoch < 0:
            leader_epoch = None
        topic_id = _id_text(topic_id)
        if topic_id is not None and self._topic_id is not None and topic_id != self._topic_id:
            if topic_id in self._old_topic_ids:
                # Topic ids are never reused, and a leader served another since this one was
                # named: a broker that has not heard of the re-creation yet. Ignore its old
                # log's leader and epoch.
                return False
            # A re-creation, or a broker behind one (the order ids are seen in is not the
            # order of the incarnations): a leader serving one of the two decides.
            self._rival_named(leader_id, leader_epoch, topic_id)
            return True
        if topic_id is not None and self._rival is not None:
            # Our id again: the broker that named the other one was behind it, or is ahead
            # (judged when a leader serves ours, or the other one is named again). The wait
            # was the probe's: this answer is the refresh it waited for.
            self._rival = None
            self._retry_at = 0.0
            self._attempts = 0
            self._bump()
        known = self._leader_epoch
        if leader_epoch is not None and known is not None and leader_epoch < known:
            return False
        if topic_id is not None:
            self._topic_id = topic_id
        if replicas is not None:
            self._replicas = frozenset(replicas)
        new_epoch = leader_epoch if leader_epoch is not None else known
        if leader_id == self._leader_id and new_epoch == known:
            replica, live = self._replica, self._replicas
            if replica is not None and live is not None and replica not in live:
                # The follower left the replica set or went offline.
                self._change_replica(None)
            return True
        self._leader_id = leader_id
        self._leader_epoch = new_epoch
        # A new leader (or epoch) chooses the read replica afresh; the validation that a new
        # epoch starts below covers the change of replica too.
        self._replica = None
        if leader_id is not None:
            # A new leader answers differently: whatever was waiting may go now. Failures
            # in a row were the old leader's, or the wait for one: a broker taking over may
            # refuse the first request (UNKNOWN_LEADER_EPOCH before it has applied its
            # election), and that retry comes after retry_backoff_ms, not after the longest
            # backoff the wait for a leader had reached. (Without a leader the backoff
            # goes on: asking at once would only fetch the answer just applied again.)
            self._retry_at = 0.0
            self._attempts = 0
        if (
            self._await_epoch is not None
            and new_epoch is not None
            and new_epoch >= self._await_epoch
        ):
            self._await_epoch = None
        state = self._state
        if state is _FETCHING:
            if self._epoch is not None and not fetch_detects_divergence:
                self._begin_validation(T.VALIDATION_NEEDED, DetectedBy.METADATA)
            else:
                # No epoch: nothing to validate. Or the next fetch, carrying LastFetchedEpoch
                # to the new leader, is the validation (DivergingEpoch or OOR if it differs).
                self._bump()
        elif state is S.AWAIT_VALIDATION:
            # Answers from the old leader are worthless now; start the rounds over.
            self._goto(T.VALIDATION_NEEDED)
            self._restart_validation()
        elif state is S.AWAIT_RESET:
            self._bump()
        return True

    # --------------------------------------------------------------------- inputs: fetch

    def on_records(
        self,
        fetch: FetchAction,
        first_offset: int,
        last_offset: int,
        leader_epoch: int | None,
        next_offset: int | None = None,
    ) -> bool:
        """Records ``[first_offset, last_offset]`` of one batch (``leader_epoch`` = its
        ``partitionLeaderEpoch``) are being delivered. Call once per batch, or per part of a
        batch. ``False``: the fetch is stale (position moved, new leader, paused, seek):
        discard the records. Hot path: keep it to attribute checks and assignments."""
        if (
            fetch.token != self._gen
            or self._state is not _FETCHING
            or first_offset < self._offset
            or fetch.topic_probe
        ):
            if fetch.topic_probe:
                self._probe_answered(fetch)
            return False
        self._in_flight = False
        if leader_epoch is not None and leader_epoch < 0:
            leader_epoch = None
        if leader_epoch != self._hist_epoch:
            self._note_epoch(leader_epoch, first_offset)
        if self._unjudged:
            self._topic_served()
        self._offset = last_offset + 1 if next_offset is None else next_offset
        self._epoch = leader_epoch
        self._attempts = 0
        return True

    def on_empty_fetch(self, fetch: FetchAction) -> bool:
        """A fetch answered without records. The position, epoch included, stays. (For a
        ``topic_probe``: any answer but an error.)"""
        if fetch.topic_probe:
            return self._probe_answered(fetch)
        if fetch.token != self._gen or self._state is not _FETCHING:
            return False
        self._in_flight = False
        self._attempts = 0
        if self._unjudged:
            self._topic_served()
        return True

    def on_fetch_error(
        self,
        fetch: FetchAction,
        error_code: int,
        now: float,
        *,
        fetch_detects_divergence: bool = False,
    ) -> bool:
        """A Fetch refused with ``error_code``. ``fetch_detects_divergence``: the leader asked
        answers Fetch v12+ (see :meth:`on_metadata`); a FENCED refusal then waits for
        metadata past the refused epoch and lets the leader it names decide how to validate,
        instead of asking OffsetForLeaderEpoch at once."""
        if fetch.topic_probe:
            if classify_error(error_code) is ErrorClass.OUT_OF_RANGE:
                # Refused for the offset, not the id: the leader serves the topic.
                return self._probe_answered(fetch)
            if not self._in_flight_now(fetch):
                return False
            self._in_flight = False
            self._retry_after_error(RequestKind.FETCH, error_code, now, None)
            return True
        if fetch.token != self._gen or self._state is not _FETCHING:
            return False
        self._in_flight = False
        kind = classify_error(error_code)
        if fetch.read_replica is not None:
            # A follower's error says nothing reliable about the log: OFFSET_OUT_OF_RANGE
            # from a follower that is behind us or lost records, FENCED from one that has not
            # learnt the epoch yet. Never reset on it: back to the leader, which validates.
            self._change_replica(None)
            if kind in (ErrorClass.FENCED, ErrorClass.STALE_METADATA):
                self._events.append(
                    MetadataRefreshNeeded(self.tp, error_name(error_code), self._await_epoch)
                )
            return True
        if kind is ErrorClass.OUT_OF_RANGE:
            if self._epoch is not None:
                # A broker answers OOR for a LastFetchedEpoch it does not know: that can be
                # truncation, so ask before resetting.
                self._begin_validation(T.VALIDATION_NEEDED, DetectedBy.OFFSET_OUT_OF_RANGE)
                self._reset_on_valid = True
            else:
                self._no_valid_offset(ResetReason.OFFSET_OUT_OF_RANGE)
            return True
        if kind is ErrorClass.FENCED and self._epoch is not None and not fetch_detects_divergence:
            min_epoch = (
                None if fetch.current_leader_epoch is None else (fetch.current_leader_epoch + 1)
            )
            self._begin_validation(T.VALIDATION_NEEDED, DetectedBy.FENCED, min_epoch)
            self._retry_after_error(RequestKind.FETCH, error_code, now, fetch.current_leader_epoch)
            return True
        # Otherwise (no epoch, or fetch_detects_divergence) wait for metadata past the
        # refused epoch: on_metadata then validates, unless the leader it names is one whose
        # fetch answers judge the position (DivergingEpoch). No answer of before counts.
        if kind is ErrorClass.FENCED:
            self._bump()
        self._retry_after_error(RequestKind.FETCH, error_code, now, fetch.current_leader_epoch)
        return True

    def on_preferred_replica(
        self, fetch: FetchAction, replica_id: int | None, now: float, expires_at: float
    ) -> bool:
        """A Fetch answer named ``replica_id`` as preferred read replica (KIP-392; ``None`` or
        -1: the leader itself). Fetches go there until ``expires_at`` (the driver's clock),
        an error from it, or metadata without it; the position is validated with the leader
        first. Use it in place of :meth:`on_empty_fetch` (such answers carry no records)."""
        if fetch.topic_probe:
            return self._probe_answered(fetch)
        if fetch.token != self._gen or self._state is not _FETCHING:
            return False
        self._in_flight = False
        self._attempts = 0
        if replica_id is not None and replica_id < 0:
            replica_id = None
        if replica_id == self._leader_id:
            replica_id = None
        live = self._replicas
        if replica_id is not None and live is not None and replica_id not in live:
            return True  # not a live replica in our metadata: stay where we are
        if replica_id is not None:
            self._replica_until = expires_at
        self._change_replica(replica_id)
        return True

    def on_diverging_epoch(
        self, fetch: FetchAction, epoch: int | None, end_offset: int | None, now: float
    ) -> bool:
        """A Fetch v12+ answer carried ``DivergingEpoch(epoch, end_offset)``: the leader's
        answer to OffsetForLeaderEpoch(last_fetched_epoch), without a round trip. ``None``
        (or Kafka's -1): the leader knows no such epoch."""
        if fetch.topic_probe:
            return self._probe_answered(fetch)
        if fetch.token != self._gen or self._state is not _FETCHING:
            return False
        self._in_flight = False
        if self._epoch is None:
            # We sent no LastFetchedEpoch, so the broker had nothing to compare: retry.
            self._retry_after_error(RequestKind.FETCH, ErrorCode.UNKNOWN_SERVER_ERROR, now, None)
            return True
        self._begin_validation(T.VALIDATION_NEEDED, DetectedBy.DIVERGING_EPOCH)
        self._await_epoch = None  # the leader has just answered at our epoch
        if self._query_epoch == self._epoch:
            self._apply_epoch_answer(epoch, end_offset, fetch.current_leader_epoch)
        # Otherwise nothing was read since a splice: the answer is about the epoch the log
        # start gave us, not about what we read; an OffsetForLeaderEpoch for that follows.
        return True

    # ---------------------------------------------------------- inputs: validation, reset

    def on_validation(
        self,
        action: ValidateAction,
        error_code: int,
        end_epoch: int | None,
        end_offset: int | None,
        now: float,
    ) -> bool:
        """The OffsetForLeaderEpoch answer for ``action``; ``end_epoch``/``end_offset``
        ``None`` (or Kafka's -1): the leader knows no epoch at or below the one asked for."""
        if action.token != self._gen or self._state is not S.AWAIT_VALIDATION or self._probe:
            return False
        self._in_flight = False
        if error_code != ErrorCode.NONE:
            self._retry_after_error(
                RequestKind.OFFSET_FOR_LEADER_EPOCH, error_code, now, action.current_leader_epoch
            )
            return True
        self._attempts = 0
        self._apply_epoch_answer(end_epoch, end_offset, action.current_leader_epoch)
        return True

    def on_list_offsets(
        self,
        action: ResetAction,
        offset: int,
        leader_epoch: int | None = None,
        error_code: int = 0,
        now: float = 0.0,
    ) -> bool:
        """The ListOffsets answer for ``action`` (a reset or a log start probe)."""
        if action.token != self._gen:
            return False
        probe = action.purpose is ListOffsetsPurpose.LOG_START_PROBE
        expected = S.AWAIT_VALIDATION if probe else S.AWAIT_RESET
        if self._state is not expected or (probe and not self._probe):
            return False
        self._in_flight = False
        if error_code != ErrorCode.NONE:
            self._retry_after_error(
                RequestKind.LIST_OFFSETS, error_code, now, action.current_leader_epoch
            )
            return True
        self._attempts = 0
        if leader_epoch is not None and leader_epoch < 0:
            leader_epoch = None
        if not probe:
            if (
                self._reset_reason in _SKIP_FORWARD_REASONS
                and self._epoch is not None
                and offset < self._offset
            ):
                self._begin_validation(T.VALIDATION_NEEDED, DetectedBy.OFFSET_OUT_OF_RANGE)
                return True
            reason = self._reset_reason or ResetReason.REQUESTED
            if not self._from_reset:
                # A position that fell off the log start is one the application reached in
                # this incarnation of the topic (read, committed or sought to); a reset from a
                # reset position keeps the first one's.
                self._reset_over = (
                    (EpochOffset(self._offset, self._epoch), self._source)
                    if reason in _SKIP_FORWARD_REASONS and self._offset > 0
                    else None
                )
            self._goto(T.RESET_DONE)
            self._offset = offset
            # ListOffsets gives the epoch of the record *at* the offset (earliest) or the
            # leader's current epoch (latest): an upper bound for the record before it. It
            # still lets a caught-up consumer notice an election that truncates below it.
            self._epoch = leader_epoch if offset > 0 else None
            self._clear_history()
            self._source = (
                PositionSource.RESET_EARLIEST
                if action.strategy is ResetStrategy.EARLIEST
                else PositionSource.RESET_LATEST
            )
            self._from_reset = True
            self._bump()
            self._events.append(
                OffsetReset(
                    self.tp,
                    EpochOffset(offset, self._epoch),
                    action.strategy,
                    reason,
                )
            )
            return True
        # The leader knew no epoch <= ours, or we found a divergence point below its answer.
        # Retention (log start past us) or truncation, and from where?
        self._probe = False
        pending, self._probe_divergence = self._probe_divergence, None
        log_start = offset
        stop = self._pending_stop
        if self._offset < log_start and stop is not None:
            # The group's commit fell to retention, not to a truncation: nothing to add to the
            # stop that waited for it.
            self._report = stop
            self._stop_truncated(stop)
        elif self._offset < log_start:
            self._no_valid_offset(ResetReason.LOG_START_MOVED_PAST_POSITION)
        elif self._offset == log_start:
            # Nothing readable was lost: whatever preceded us is gone from this leader's log.
            # What we read below stays in the history: a later leader may hold it again.
            self._epoch = leader_epoch if offset > 0 else None
            self._splice_at(log_start)
            self._validated(action.current_leader_epoch)
        elif pending is None:
            self._truncation(None, action.current_leader_epoch)
        elif pending.offset >= log_start:
            self._truncation(pending, action.current_leader_epoch)
        else:
            # What we read in [pending, log start) diverged, but retention has removed it:
            # the loss starts at the log start. The leader's epoch there bounds the one before.
            # A rewind continues there, in another log than the one we read below it.
            self._splice_at(log_start)
            start = EpochOffset(log_start, leader_epoch if log_start > 0 else None)
            self._truncation(start, action.current_leader_epoch)
        return True

    def on_request_failed(self, action: Action, now: float) -> bool:
        """Transport failure (timeout, connection lost) for ``action``: retry with backoff."""
        if not self._in_flight_now(action):
            return False
        self._in_flight = False
        if isinstance(action, FetchAction) and action.read_replica is not None:
            # The follower is unreachable: the leader serves the partition again.
            self._change_replica(None)
            return True
        self._retry_after_error(
            _REQUEST_KINDS[type(action)],
            ErrorCode.NETWORK_EXCEPTION,
            now,
            None,
            refresh=True,
        )
        return True

    # ------------------------------------------------------------------------- internals

    def _change_replica(self, replica: int | None) -> None:
        """Fetch from ``replica`` (``None``: the leader) from now on. Another replica may be
        behind the position or hold a diverged log, so a position with an epoch is validated
        with the leader first (OffsetForLeaderEpoch always goes to the leader)."""
        if replica == self._replica:
            return
        self._replica = replica
        if replica is None:
            self._replica_until = 0.0
        if self._state is _FETCHING:
            if self._epoch is not None:
                self._begin_validation(T.VALIDATION_NEEDED, DetectedBy.REPLICA_CHANGED)
            else:
                self._bump()  # answers still coming from the other replica are stale

    def _goto(self, trigger: Trigger) -> None:
        try:
            new = TRANSITIONS[self._state][trigger]
        except KeyError:
            raise InvalidTransitionError(
                f"{self.tp}: no transition from {self._state.name} on {trigger.name}"
            ) from None
        self._state = new
        # Sub-states belong to their state (see SUB_STATES): leaving it puts them back to
        # idle, so no rule can read a value left over from an earlier round.
        if new is not S.AWAIT_VALIDATION:
            self._cause = DetectedBy.RESTORE
            self._query_epoch = None
            self._bound = None
            self._probe = False
            self._probe_divergence = None
            self._reset_on_valid = False
            self._start_after = None
            self._pending_stop = None
        if new is not S.AWAIT_RESET:
            self._reset_reason = None
        if new in STOPPED_STATES:
            self._await_epoch = None

    def _bump(self) -> None:
        """Invalidate every request in flight: their answers will be ignored."""
        self._gen = next(_GENERATIONS)
        self._in_flight = False

    def _metadata_blocked(self) -> bool:
        if self._leader_id is None:
            return True
        need = self._await_epoch
        return need is not None and self._leader_epoch is not None and self._leader_epoch < need

    def _blocked_reason(self) -> RefreshReason:
        if self._leader_id is None:
            return RefreshReason.LEADER_UNKNOWN
        return RefreshReason.LEADER_EPOCH_BEHIND

    def _schedule_retry(self, now: float, reason: WaitReason) -> None:
        self._retry_at = now + self._policy.retry_backoff.delay(self._attempts)
        self._attempts += 1
        self._wait_reason = reason

    def _retry_after_error(
        self,
        request: RequestKind,
        error_code: int,
        now: float,
        current_leader_epoch: int | None,
        refresh: bool = False,
    ) -> None:
        kind = classify_error(error_code)
        min_epoch: int | None = None
        if kind is ErrorClass.FENCED and current_leader_epoch is not None:
            # Our epoch is older than the broker's: the same request can only fail again.
            min_epoch = current_leader_epoch + 1
            if self._await_epoch is None or self._await_epoch < min_epoch:
                self._await_epoch = min_epoch
        stale = kind in (ErrorClass.FENCED, ErrorClass.STALE_METADATA) or refresh
        self._schedule_retry(
            now, WaitReason.METADATA_REFRESH if stale else WaitReason.RETRY_BACKOFF
        )
        self._events.append(RequestFailed(self.tp, request, int(error_code), self._retry_at))
        if stale:
            reason = error_name(error_code)
            self._events.append(MetadataRefreshNeeded(self.tp, reason, self._await_epoch))

    def _clear_history(self) -> None:
        self._hist.clear()
        self._hist_epoch = None
        self._hist_inexact = False
        self._splices.clear()

    def _note_epoch(self, epoch: int | None, first_offset: int) -> None:
        if epoch is None:
            # Records without an epoch (old format) break the chain of what we know.
            self._clear_history()
            return
        self._hist.append((epoch, first_offset))
        self._from_reset = False
        if len(self._hist) > MAX_EPOCH_HISTORY:
            del self._hist[0]
            self._hist_inexact = True
            first = self._hist[0][1]
            self._splices = [s for s in self._splices if s > first]
        self._hist_epoch = epoch

    def _retire_topic_id(self, topic_id: str) -> None:
        if topic_id not in self._old_topic_ids:
            self._old_topic_ids = (*self._old_topic_ids[-(MAX_OLD_TOPIC_IDS - 1) :], topic_id)
        if topic_id in self._unjudged:
            self._unjudged = tuple(t for t in self._unjudged if t != topic_id)

    # Topic ids. Ids are never reused, and a leader serves only the live incarnation (a fetch
    # under any other id is answered UNKNOWN_TOPIC_ID, or UNKNOWN_TOPIC_OR_PARTITION by a
    # broker behind). Every id named (by metadata, a commit, a store) was live when it was
    # named. So an id a leader serves is newer than every other id named before the fetch
    # went out; nothing else orders them (a broker behind names the deleted id after the new
    # one, and a tracker made after the re-creation never had the old one).

    def _note_unjudged(self, topic_id: str) -> None:
        if topic_id not in self._unjudged:
            self._unjudged = (*self._unjudged[-(MAX_OLD_TOPIC_IDS - 1) :], topic_id)

    def _rival_named(self, leader_id: int | None, leader_epoch: int | None, topic_id: str) -> None:
        """Metadata names ``topic_id``, not the position's and not known to be older: the
        next request asks a leader whether it serves it."""
        rival = self._rival
        if rival is not None and rival[0] == topic_id:
            if leader_epoch is None:
                leader_epoch = rival[2]
            elif rival[2] is not None and leader_epoch < rival[2]:
                return  # an older view of that incarnation
            if rival[1:] == (leader_id, leader_epoch):
                return
        self._note_unjudged(topic_id)
        self._rival = (topic_id, leader_id, leader_epoch)
        if leader_id is not None:
            self._retry_at = 0.0
            self._attempts = 0
        # Any answer in flight went out before this id was named: it cannot order them.
        self._bump()

    def _take_position_topic(self, topic_id: str) -> None:
        """A seek to a position in incarnation ``topic_id`` (not known to be deleted) while
        the tracker follows another: fetches name the position's id, metadata's is probed
        (the position may be the newer: a commit made by a member that read the new
        incarnation, while this one's metadata comes from a broker behind)."""
        current = self._topic_id
        rival = self._rival
        if rival is not None and rival[0] == topic_id:
            # The position is in the incarnation metadata named last: fetch there.
            self._leader_id, self._leader_epoch = rival[1], rival[2]
            self._rival = None
        elif current is not None:
            if rival is None:
                self._rival = (current, self._leader_id, self._leader_epoch)
            # The position's leader is not known: metadata naming its id will say.
            self._leader_id = None
            self._leader_epoch = None
        if current is not None:
            self._note_unjudged(current)
        self._unjudged = tuple(t for t in self._unjudged if t != topic_id)
        self._topic_id = topic_id
        self._replica = None

    def _topic_probe(self, now: float) -> Action:
        rival = self._rival
        assert rival is not None
        topic_id, leader, _epoch = rival
        if leader is None:
            if now >= self._retry_at:
                self._events.append(
                    MetadataRefreshNeeded(self.tp, RefreshReason.LEADER_UNKNOWN, None)
                )
                self._schedule_retry(now, WaitReason.METADATA_REFRESH)
            return WaitAction(self.tp, self._retry_at, WaitReason.METADATA_REFRESH)
        if now < self._retry_at:
            return WaitAction(self.tp, self._retry_at, self._wait_reason)
        self._in_flight = True
        # No epochs: the question is only whether this leader serves the id (an answer about
        # the offset, records or out of range, says it does).
        return FetchAction(
            self.tp,
            leader,
            max(self._offset, 0),
            None,
            None,
            self._gen,
            topic_id,
            None,
            topic_probe=True,
        )

    def _probe_answered(self, fetch: FetchAction) -> bool:
        """A leader served the probed id: it is the live incarnation, every other id named
        before is older, the position's included (a re-creation)."""
        rival = self._rival
        if not self._in_flight_now(fetch) or rival is None or fetch.topic_id != rival[0]:
            return False
        self._in_flight = False
        self._attempts = 0
        topic_id, leader, epoch = rival
        self._rival = None
        for older in self._unjudged:
            if older != topic_id:
                self._retire_topic_id(older)
        self._unjudged = ()
        self._topic_recreated(leader, epoch, topic_id)
        return True

    def _topic_served(self) -> None:
        """A leader served the position's id: the ids named before this fetch went out are
        older."""
        for older in self._unjudged:
            self._retire_topic_id(older)
        self._unjudged = ()

    def _splice_at(self, offset: int) -> None:
        """From ``offset`` on we read another log than the one ``_hist`` holds below it."""
        # A splice above the new one belonged to reads the log start now lies below.
        while self._splices and self._splices[-1] >= offset:
            self._splices.pop()
        if any(start < offset for _, start in self._hist):
            self._splices.append(offset)
        # The next record read starts an entry, whatever its epoch.
        self._hist_epoch = None

    def _truncate_history(self, offset: int) -> None:
        """Forget what was read at ``offset`` and past it (a rewind to ``offset``)."""
        while self._hist and self._hist[-1][1] >= offset:
            self._hist.pop()
        while self._splices and self._splices[-1] > offset:
            self._splices.pop()
        if not self._hist:
            self._clear_history()
        elif self._read_since_splice():
            self._hist_epoch = self._hist[-1][0]
        else:
            self._hist_epoch = None

    def _read_since_splice(self) -> bool:
        """Whether the record before the position is in ``_hist``, read from the log the
        position is in."""
        hist = self._hist
        return bool(hist) and (not self._splices or hist[-1][1] >= self._splices[-1])

    def _segment_floor(self, bound: int) -> int | None:
        """The splice where the log holding the record before ``bound`` starts in ``_hist``
        (``None``: the oldest log we read)."""
        floor: int | None = None
        for s in self._splices:
            if s >= bound:
                break
            floor = s
        return floor

    def _first_offset_after(self, epoch: int, floor: int | None) -> int | None:
        """First offset this consumer read under an epoch newer than ``epoch``, from ``floor``
        (a splice) on."""
        for e, start in self._hist:
            if e > epoch and (floor is None or start >= floor):
                return start
        return None

    def _epoch_at(self, offset: int, floor: int | None) -> int | None:
        """Epoch of the record this consumer read at ``offset`` in the log that starts at
        ``floor`` (None: not in history)."""
        found: int | None = None
        for e, start in self._hist:
            if start > offset:
                break
            if floor is None or start >= floor:
                found = e
        return found

    def _at_splice(self) -> bool:
        """Nothing read since a splice at the position (a splice always has reads below)."""
        return bool(self._splices) and self._splices[-1] == self._offset

    def _validation_epoch(self) -> int | None:
        """The epoch to ask the leader about first: the position's, unless nothing was read
        since a splice at the position; then the epoch we last read, in the earlier log."""
        return self._hist[-1][0] if self._at_splice() else self._epoch

    def _begin_validation(
        self, trigger: Trigger, cause: DetectedBy, min_epoch: int | None = None
    ) -> None:
        assert self._epoch is not None
        self._goto(trigger)
        self._cause = cause
        self._reset_on_valid = False
        # KIP-232: metadata older than the position's epoch cannot judge it.
        need = self._epoch if min_epoch is None else max(self._epoch, min_epoch)
        if self._leader_epoch is None or self._leader_epoch < need:
            self._await_epoch = need if self._await_epoch is None else max(need, self._await_epoch)
        self._restart_validation()
        self._events.append(
            ValidationStarted(self.tp, EpochOffset(self._offset, self._epoch), cause)
        )

    def _restart_validation(self) -> None:
        self._query_epoch = self._validation_epoch()
        self._bound = None
        self._probe = False
        self._probe_divergence = None
        self._bump()

    def _apply_epoch_answer(
        self, end_epoch: int | None, end_offset: int | None, current_leader_epoch: int | None
    ) -> None:
        """Judge an OffsetForLeaderEpoch answer (or DivergingEpoch) against what we read.

        A single answer is exact as long as the epoch the leader names is the epoch we read
        the record before the divergence point in; after several unclean elections it may
        name an epoch we never read, and then we ask again for the epoch we did read there.
        Every round only lowers an upper bound on the divergence point, so a truncation is
        reported only when one really happened.
        """
        pos = self._offset
        if end_epoch is None or end_offset is None or end_epoch < 0 or end_offset < 0:
            if self._bound is None:
                # The leader knows no epoch <= ours: retention or a wiped log? Ask log start.
                self._probe = True
                self._bump()
            else:
                self._truncation(None, current_leader_epoch)
            return
        bound = pos if self._bound is None else self._bound
        # Judge the answer against the log (between splices) the record before ``bound`` was
        # read from.
        floor = self._segment_floor(bound)
        d = min(end_offset, bound)
        first_newer = self._first_offset_after(end_epoch, floor)
        if first_newer is not None and first_newer < d:
            d = first_newer
        if floor is None and self._hist_inexact and self._hist and self._hist[0][0] > end_epoch:
            # We read records in an epoch this leader does not have, from an offset we do not
            # know (a restored position): truncated, divergence point unknown.
            self._truncation(None, current_leader_epoch)
            return
        if self._bound is None and d >= pos:
            if self._at_splice():
                # The leader holds what we read before the splice, up to the position: the
                # log we moved to at the splice is not this leader's, the earlier one is.
                self._splices.pop()
                self._epoch = end_epoch
                self._hist_epoch = self._hist[-1][0]
            elif self._epoch is not None and end_epoch < self._epoch:
                # Only reachable without own reads: our epoch was an upper bound. Adopt the
                # leader's, so that Fetch LastFetchedEpoch stops reporting a divergence.
                self._epoch = end_epoch
            if self._reset_on_valid:
                # Not truncated, yet out of range: retention moved the log start past us.
                self._no_valid_offset(ResetReason.OFFSET_OUT_OF_RANGE)
            else:
                self._validated(current_leader_epoch)
            return
        if floor is not None and d <= floor:
            # Nothing we read since the splice is in this leader's log; whether what we read
            # before it is, only the epochs of that earlier log can tell.
            earlier = self._epoch_at(floor - 1, self._segment_floor(floor))
            if earlier is not None:
                self._bound = floor
                self._query_epoch = earlier
                self._bump()
                return
        read_epoch = self._epoch_at(d - 1, floor)
        if read_epoch is not None and read_epoch < end_epoch:
            self._bound = d
            self._query_epoch = read_epoch
            self._bump()
            return
        # Exact when we read the record before ``d`` in ``end_epoch`` ourselves; otherwise
        # the leader's epoch is an upper bound for it, as in Java.
        epoch = end_epoch if d > 0 else None
        if d < end_offset:
            # ``d`` comes from our own reads (or an earlier round), not from the leader's epoch
            # cache, whose entries never start below its log start (truncateFromStart). What we
            # read below the log start was removed by retention, not by this truncation, and
            # no leader can tell the two apart any more: ask for the log start first.
            self._probe = True
            self._probe_divergence = EpochOffset(d, epoch)
            self._bump()
            return
        self._truncation(EpochOffset(d, epoch), current_leader_epoch)

    def _validated(self, current_leader_epoch: int | None) -> None:
        cause = self._cause
        start_after = self._start_after
        pending = self._pending_stop
        validated = PositionValidated(
            self.tp, EpochOffset(self._offset, self._epoch), current_leader_epoch, cause
        )
        if pending is not None:
            # The group's commit is intact: what it read since is there. The stop decided on
            # what this consumer read before goes ahead, with that report alone.
            self._events.append(validated)
            self._report = pending
            self._stop_truncated(pending)
            return
        self._goto(T.VALIDATED)
        self._bump()
        self._events.append(validated)
        if start_after is not None:
            # What this consumer read before giving the partition up is intact: start where
            # the commit (or store) says, validated as any restored position.
            self._start_from(start_after)

    def _start_from(self, start: tuple[EpochOffset, PositionSource | str, bool]) -> None:
        """Seek to a position ``restore()`` kept in ``_start_after`` (position, source,
        epoch_exact): validated as any restored position."""
        position, source, epoch_exact = start
        self.seek(position, source=source, epoch_exact=epoch_exact)

    def _truncation(self, divergence: EpochOffset | None, leader_epoch: int | None) -> None:
        if self._from_reset and not self._hist:
            # Nothing was read since a reset put us here: the application lost nothing, but
            # the new records below the position must still be read. Move, do not report.
            self._reset_again(divergence)
            return
        report = TruncationReport(
            self.tp,
            EpochOffset(self._offset, self._epoch),
            divergence,
            self._cause,
            leader_epoch,
            self._source,
        )
        self._decide(report)

    def _decide(self, report: TruncationReport) -> None:
        pending = self._pending_stop
        self._report = report
        if pending is not None:
            # The group's commit, validated before a stop on what this consumer read before,
            # is truncated too: the policy already stopped the partition. Both reports are
            # told, this one last: the partition stops with it, and its divergence is where
            # the log this leader holds parts from what the group read.
            self._events.append(TruncationDetected(pending, TruncationOutcome.RAISE, None))
            self._stop_truncated(report)
            return
        try:
            decision = self._policy.decide(report)
        except BaseException:
            # A failing handler must not leave the partition fetching past the loss.
            self._stop_truncated(report)
            raise
        if isinstance(decision, EpochOffset):
            self._events.append(TruncationDetected(report, TruncationOutcome.SEEK, decision))
            self.seek(decision, source=PositionSource.TRUNCATION_HANDLER)
            return
        later = self._start_after
        written_since = later is not None and _written_since(later[0], report)
        if decision is TruncationDecision.REWIND:
            target = report.divergence
            if target is not None and later is not None and written_since:
                # What this consumer read before it gave the partition up is gone, but the
                # commit it was given back was read past the divergence in a later epoch (the
                # owner meanwhile was told, and read the new log): start there, validated as
                # any restored position. The divergence would read again what was committed.
                self._events.append(TruncationDetected(report, TruncationOutcome.REWIND, later[0]))
                self._start_from(later)
                return
            if target is not None:
                self._goto(T.TRUNCATION_REWOUND)
                self._offset = target.offset
                self._epoch = target.leader_epoch
                self._truncate_history(target.offset)
                self._source = PositionSource.REWIND
                self._bump()
                self._events.append(TruncationDetected(report, TruncationOutcome.REWIND, target))
                return
            strategy = self._policy.auto_offset_reset
            if strategy is not ResetStrategy.NONE:
                self._events.append(TruncationDetected(report, TruncationOutcome.RESET, None))
                self._begin_reset(strategy, ResetReason.TRUNCATION_DIVERGENCE_UNKNOWN)
                return
        if later is not None and written_since and later[0].offset > 0:
            # A stop on what this consumer read before it gave the partition up, while the
            # group's commit was read past the divergence in a later epoch: the records the
            # group read since are not this report's, and once the application answers it
            # (a seek, a commit of the divergence) nobody would validate that commit. So it
            # is validated first; the stop follows with what that finds.
            self._start_from(later)
            if self._state is S.AWAIT_VALIDATION:
                self._pending_stop = report
                return
        self._stop_truncated(report)

    def _reset_again(self, divergence: EpochOffset | None) -> None:
        reason = ResetReason.LOG_TRUNCATED_BELOW_RESET_POSITION
        if divergence is None:
            self._begin_reset(self._reset_strategy, reason)
            return
        self._goto(T.TRUNCATION_REWOUND)
        self._offset = divergence.offset
        self._epoch = divergence.leader_epoch
        self._bump()
        self._events.append(OffsetReset(self.tp, divergence, self._reset_strategy, reason))

    def _stop_truncated(self, report: TruncationReport) -> None:
        if self._state is not S.TRUNCATED:
            self._goto(T.TRUNCATION_RAISED)
        self._error = LogTruncationError(report)
        self._bump()
        self._events.append(TruncationDetected(report, TruncationOutcome.RAISE, None))

    def _no_valid_offset(self, reason: ResetReason | str, no_offset: bool = False) -> None:
        strategy = self._policy.auto_offset_reset
        if strategy is ResetStrategy.NONE:
            position = self.position
            self._goto(T.STOP_NO_OFFSET)
            self._bump()
            self._error = (
                NoOffsetForPartitionError(self.tp)
                if no_offset
                else OffsetOutOfRangeError(self.tp, self._offset, reason)
            )
            self._events.append(NoValidOffset(self.tp, position, reason))
            return
        self._error = None
        self._begin_reset(strategy, reason)

    def _begin_reset(self, strategy: ResetStrategy, reason: ResetReason | str) -> None:
        self._goto(T.RESET_REQUESTED)
        self._reset_strategy = strategy
        self._reset_reason = reason
        self._await_epoch = None
        self._bump()

    def _topic_recreated(
        self, leader_id: int | None, leader_epoch: int | None, topic_id: str | None
    ) -> None:
        # A new topic id is a new log: its epochs restart, so the old ones must not block it.
        if self._topic_id is not None and self._topic_id != topic_id:
            self._retire_topic_id(self._topic_id)
        self._topic_id = topic_id
        self._replica = None
        self._leader_id = leader_id
        self._leader_epoch = leader_epoch
        self._await_epoch = None
        self._retry_at = 0.0
        state = self._state
        if (
            state is S.AWAIT_RESET
            and self._offset > 0
            and (
                self._reset_reason in _SKIP_FORWARD_REASONS
                or (self._from_reset and self._reset_over is not None)
            )
        ):
            # A reset under way past the deleted log's start: moot now. The position it was
            # to replace is judged below like one fetched from, so that what the application
            # consumed of the deleted log is reported (an answer from the new log would be
            # compared with that position as if it were the same log).
            self._goto(T.SEEK_VALIDATED)
            state = self._state
        if state not in (_FETCHING, S.AWAIT_VALIDATION):
            self._bump()
            return
        over = self._reset_over
        if self._from_reset and not self._hist and over is not None:
            # Nothing read since the reset, but the reset replaced a position the application
            # had reached in the deleted log: what it consumed there went with the topic, and
            # the new log's offsets start again below it (another group member, or this one,
            # had delivered them).
            consumed_to, source = over
            self._reset_over = None  # told once
            self._decide(
                TruncationReport(
                    self.tp,
                    consumed_to,
                    EpochOffset(0, None),
                    DetectedBy.TOPIC_RECREATED,
                    leader_epoch,
                    source,
                )
            )
            return
        if self._offset == 0:
            self._clear_history()
            self._goto(T.SEEK_VALIDATED)
            self._epoch = None
            self._bump()
            return
        self._cause = DetectedBy.TOPIC_RECREATED
        # Nothing of the old log exists in the new one: everything read diverges at 0. (The
        # history goes with the rewind; it still tells whether anything was read at all.)
        self._truncation(EpochOffset(0, None), leader_epoch)


def _id_text(topic_id: Any) -> str | None:
    """A topic id as the tracker keeps it: text, ``None`` for any form of "no id"."""
    if topic_id is None or topic_id in _NO_TOPIC_IDS:
        return None
    if isinstance(topic_id, str):
        return _text_id_as_kept(topic_id)
    return normalise_topic_id(topic_id if isinstance(topic_id, uuid.UUID) else str(topic_id))


@functools.lru_cache(maxsize=1024)
def _text_id_as_kept(topic_id: str) -> str | None:
    # Every partition of a topic names the same id: one UUID parse per topic, not per
    # partition (a metadata answer for 1,000 partitions parsed 1,000).
    return normalise_topic_id(topic_id)
