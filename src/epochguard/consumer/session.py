"""KIP-227 incremental fetch sessions, the client side: one :class:`FetchSession` per broker.

A session lets a Fetch name only the partitions whose fetch state changed since the previous
request to that broker (and the partitions to forget); the broker answers every partition of
the session that has something to say and leaves the idle ones out. A consumer of 1,000
mostly idle partitions therefore sends a few dozen bytes per Fetch instead of every
partition.

The session of a broker always holds exactly the partitions of the last request planned for
it. A partition is left out of a request (and so forgotten by the session) whenever its
tracker does not ask to fetch from that broker: unassigned, paused, buffered records not yet
delivered, under validation (OffsetsForLeaderEpoch in flight), or led by another broker. It
comes back as an added partition, with its tracker's current leader epoch, when its tracker
asks again. The broker keeps fencing every partition of the session with the
``current_leader_epoch`` it last received, so an idle partition whose leader moved on is
answered FENCED_LEADER_EPOCH (errors are never left out) and its tracker validates it.

Every change of session state goes through :data:`TRANSITIONS` (``(state, event) -> state``);
docs/design.md ("Fetch sessions") lists the table and tests/consumer/test_session_table.py
drives each row. Epoch decisions stay with the trackers: a session only decides what a
request carries.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from typing import Final

import attrs
from kafka.structs import TopicPartition

from epochguard._errors import ErrorCode
from epochguard._log import get_logger
from epochguard.consumer import wire

__all__ = [
    "SESSION_ERRORS",
    "TRANSITIONS",
    "FetchSession",
    "SessionEvent",
    "SessionPlan",
    "SessionState",
]

log = get_logger("epochguard.consumer")

#: Kafka's ``FetchMetadata``: no session id, the epoch that opens a session, the epoch of a
#: sessionless (full, never cached) fetch.
INVALID_SESSION_ID: Final = 0
INITIAL_EPOCH: Final = 0
FINAL_EPOCH: Final = -1

#: Top-level Fetch errors about the session itself (not about any partition): the request is
#: sent again at once as a full fetch, with no error backoff for the partitions.
SESSION_ERRORS: Final = frozenset(
    {
        int(ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
        int(ErrorCode.INVALID_FETCH_SESSION_EPOCH),
        int(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR),
    }
)


class SessionState(enum.Enum):
    #: Sessions turned off (``enable_incremental_fetch_sessions=False``): every Fetch is full
    #: and sessionless (id 0, epoch -1), so the broker caches nothing.
    OFF = "off"
    #: No session: the next Fetch is full with id 0 and epoch 0, which asks for a new one.
    NEW = "new"
    #: A session the broker holds: the next Fetch is incremental (id, epoch >= 1).
    OPEN = "open"
    #: The broker may hold a session we can no longer trust: the next Fetch is full with
    #: (id, epoch 0), which closes it and opens a fresh one.
    REOPEN = "reopen"


class SessionEvent(enum.Enum):
    #: A full fetch was answered with a session id: the session is open at epoch 1.
    OPENED = "opened"
    #: An incremental fetch was answered under the same session id: next epoch.
    CONTINUED = "continued"
    #: An answer with session id 0: the broker created no session (its cache was full) or
    #: closed it (the session became empty).
    NO_SESSION = "no_session"
    #: FETCH_SESSION_ID_NOT_FOUND: the broker forgot the session (evicted, restarted).
    ID_NOT_FOUND = "id_not_found"
    #: INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR or any other top-level error.
    SESSION_ERROR = "session_error"
    #: No answer (timeout, disconnect, a frame that does not parse): the broker may or may
    #: not have moved the session to the next epoch.
    REQUEST_FAILED = "request_failed"
    #: Metadata moved the leader or the leader epoch of a partition of this session.
    LEADER_CHANGED = "leader_changed"
    #: The next request addresses topics differently (ids from Fetch v13, names before),
    #: which a broker refuses within one session (FETCH_SESSION_TOPIC_ID_ERROR).
    TOPIC_IDS_CHANGED = "topic_ids_changed"
    #: An incremental answer named a partition that is not in the session.
    UNEXPECTED_PARTITION = "unexpected_partition"
    #: A partition the session holds was handed to a new tracker (a rebalance gave it back
    #: before a request forgot it): the broker leaves it out of its answers until something
    #: changes (KIP-227), so the new tracker would never hear its high watermark and last
    #: stable offset. A full fetch answers it once more.
    PARTITION_RETURNED = "partition_returned"


S, E = SessionState, SessionEvent
_RESET_EVENTS = (
    E.SESSION_ERROR,
    E.REQUEST_FAILED,
    E.LEADER_CHANGED,
    E.TOPIC_IDS_CHANGED,
    E.UNEXPECTED_PARTITION,
    E.PARTITION_RETURNED,
)

#: Every allowed transition; a (state, event) pair missing here leaves the state as it is
#: (OFF ignores everything; the others are events that cannot happen in that state).
TRANSITIONS: Final[Mapping[SessionState, Mapping[SessionEvent, SessionState]]] = {
    S.OFF: {},
    S.NEW: {
        E.OPENED: S.OPEN,
        E.NO_SESSION: S.NEW,
        E.ID_NOT_FOUND: S.NEW,
        # A full request of ours failed: the broker may have opened a session we never
        # heard of. It has no id we could close, so its cache evicts it in time.
        E.SESSION_ERROR: S.NEW,
        E.REQUEST_FAILED: S.NEW,
        # The full request in flight may open a session with partitions fenced under the
        # old epochs: close whatever it opens with the next request.
        E.LEADER_CHANGED: S.REOPEN,
    },
    S.OPEN: {
        E.CONTINUED: S.OPEN,
        E.NO_SESSION: S.NEW,
        E.ID_NOT_FOUND: S.NEW,
        **dict.fromkeys(_RESET_EVENTS, S.REOPEN),
    },
    S.REOPEN: {
        E.OPENED: S.OPEN,
        E.NO_SESSION: S.NEW,
        E.ID_NOT_FOUND: S.NEW,
        E.SESSION_ERROR: S.REOPEN,
        E.REQUEST_FAILED: S.REOPEN,
        E.LEADER_CHANGED: S.REOPEN,
    },
}


#: What the broker's session holds for one partition (what a request last told it): the
#: offset, the current leader epoch, the last fetched epoch and the topic id. A plain tuple,
#: not a value class: every request plans one per partition and compares it with the last,
#: which over 1,000 partitions took most of the time to send a fetch.
_Sent = tuple[int, "int | None", "int | None", "str | None"]
_SENT_TOPIC_ID: Final = 3


@attrs.frozen
class SessionPlan:
    """One Fetch request of a session: what goes on the wire and how to read its answer."""

    session_id: int
    epoch: int
    #: The partitions to send: every one for a full fetch, added and changed ones otherwise.
    entries: tuple[wire.FetchTarget, ...]
    forgotten: tuple[tuple[TopicPartition, str | None], ...]
    #: True: the broker answers only the partitions of the session with news, so one left
    #: out of the answer keeps its state.
    incremental: bool
    #: Topic names by id for every partition of the session (an incremental answer names
    #: topics this request did not carry).
    names: Mapping[uuid.UUID, str]
    #: Address topics by id (Fetch v13) or by name (v12 and before).
    by_id: bool
    token: int


class FetchSession:
    """The fetch session with one broker. Not thread-safe: the fetcher's thread owns it."""

    __slots__ = ("_partitions", "_token", "by_id", "epoch", "node", "session_id", "state")

    def __init__(self, node: int, enabled: bool = True) -> None:
        self.node = node
        self.state = S.NEW if enabled else S.OFF
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.by_id = False
        #: What the broker's session holds, as of the last planned request.
        self._partitions: dict[TopicPartition, _Sent] = {}
        # Bumped by every transition, so that the answer to a request planned before it (a
        # reset while the request was in flight) does not move the session forward.
        self._token = 0

    def __repr__(self) -> str:
        return (
            f"FetchSession(node={self.node}, {self.state.value}, id={self.session_id}, "
            f"epoch={self.epoch}, partitions={len(self._partitions)})"
        )

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        return frozenset(self._partitions)

    def holds(self, tp: TopicPartition) -> bool:
        return tp in self._partitions

    def event(self, event: SessionEvent, session_id: int = INVALID_SESSION_ID) -> SessionState:
        """Apply ``event`` through :data:`TRANSITIONS`; ``session_id`` is the answer's."""
        before = self.state
        after = TRANSITIONS[before].get(event)
        if after is None:
            return before
        if after is S.OPEN:
            if event is E.OPENED:
                self.session_id = session_id
                self.epoch = 1
            else:
                self.epoch = _next_epoch(self.epoch)
        elif after is S.NEW:
            self.session_id = INVALID_SESSION_ID
            self.epoch = INITIAL_EPOCH
        elif after is S.REOPEN:
            self.epoch = INITIAL_EPOCH
        if after is not S.OPEN:
            # Whatever the broker holds is replaced by the next (full) request.
            self._partitions.clear()
        if event is not E.CONTINUED:
            self._token += 1
            if after is not before:
                log.debug(
                    "fetch_session",
                    node=self.node,
                    on=event.value,
                    state=after.value,
                    session_id=self.session_id,
                )
        self.state = after
        return after

    def plan(self, entries: Sequence[wire.FetchTarget], by_id: bool) -> SessionPlan:
        """The next request for ``entries`` (every partition to fetch from this broker now),
        recorded as what the broker's session will hold once it is answered."""
        if self.state is S.OPEN and by_id != self.by_id:
            self.event(E.TOPIC_IDS_CHANGED)
        names: dict[uuid.UUID, str] = {}
        if by_id:
            # Each topic's id once, not each partition's.
            by_text = {e.topic_id: e.tp.topic for e in entries if e.topic_id is not None}
            for text, topic in by_text.items():
                tid = wire.topic_id_to_wire(text)
                if tid is not None:
                    names[tid] = topic
        if self.state is S.OFF:
            return SessionPlan(
                INVALID_SESSION_ID, FINAL_EPOCH, tuple(entries), (), False, names, by_id, -1
            )
        new = {e.tp: e for e in entries}
        sent: dict[TopicPartition, _Sent] = {
            tp: (e.offset, e.current_leader_epoch, e.last_fetched_epoch, e.topic_id)
            for tp, e in new.items()
        }
        if self.state is not S.OPEN:
            self._partitions = sent
            self.by_id = by_id
            return SessionPlan(
                self.session_id, INITIAL_EPOCH, tuple(entries), (), False, names, by_id, self._token
            )
        old = self._partitions
        changed = [e for tp, e in new.items() if old.get(tp) != sent[tp]]
        # A partition now fetched under another topic id is another key of the broker's
        # session (Kafka keys it by topic id and partition): the old key is forgotten, as
        # Java's FetchSessionHandler does with its replaced partitions. Kept, the broker
        # would go on answering it (UNKNOWN_TOPIC_ID from then on), and an answer under an
        # id another partition of the topic still uses would be read as this partition's.
        forgotten = tuple(
            (tp, s[_SENT_TOPIC_ID])
            for tp, s in old.items()
            if tp not in new or (by_id and new[tp].topic_id != s[_SENT_TOPIC_ID])
        )
        self._partitions = sent
        return SessionPlan(
            self.session_id, self.epoch, tuple(changed), forgotten, True, names, by_id, self._token
        )

    def on_answer(
        self,
        plan: SessionPlan,
        error_code: int,
        session_id: int,
        answered: Sequence[TopicPartition],
    ) -> SessionState:
        """The broker answered ``plan``'s request (``error_code``: the top-level error)."""
        if plan.token != self._token:
            # Reset while the request was in flight; keep the id so the full fetch that
            # follows closes what the broker now holds.
            if session_id != INVALID_SESSION_ID and self.state is S.REOPEN:
                self.session_id = session_id
            return self.state
        if self.state is S.OFF:
            return self.state
        if error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
            return self.event(E.ID_NOT_FOUND)
        if error_code:
            return self.event(E.SESSION_ERROR)
        if session_id == INVALID_SESSION_ID:
            return self.event(E.NO_SESSION)
        if not plan.incremental:
            return self.event(E.OPENED, session_id)
        if session_id != self.session_id:
            return self.event(E.SESSION_ERROR)
        held = self._partitions
        if any(tp not in held for tp in answered):
            return self.event(E.UNEXPECTED_PARTITION)
        return self.event(E.CONTINUED, session_id)

    def on_failure(self, plan: SessionPlan) -> SessionState:
        if plan.token != self._token:
            return self.state
        return self.event(E.REQUEST_FAILED)


def _next_epoch(epoch: int) -> int:
    # Kafka's FetchMetadata.nextEpoch: wraps to 1, never back to the opening epoch 0.
    return 1 if epoch >= 2**31 - 1 else epoch + 1
