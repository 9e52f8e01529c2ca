"""KIP-227 incremental fetch sessions, as one broker keeps them.

A client opens a session with a full fetch (epoch 0); later requests (epochs 1, 2, ...) name
only partitions whose fetch state changed and topics to forget. As Kafka's
``FetchSession.scala``: a full fetch with a session id closes that session first; an
incremental fetch that leaves the session empty closes it and is answered sessionless
(session id 0); a session keeps the topic addressing it was opened with (ids from v13,
names before) and refuses the other with FETCH_SESSION_TOPIC_ID_ERROR; partitions that
returned records move to the end of the session, so the next answers start with the others
(the response size limit is shared fairly). Responses of an incremental
fetch carry only partitions with something to say: records, an error, a diverging epoch, or
a high watermark / log start offset different from the last one sent. An idle partition is
therefore absent from the response, as with a real broker, which is what keeps some clients'
position epochs intact while they wait (kafka-python resets its position epoch when it
processes an empty partition).
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict

import attrs

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
FETCH_SESSION_TOPIC_ID_ERROR = 106
MAX_SESSIONS_PER_BROKER = 1000

TopicKey = str | uuid.UUID  # topic name before Fetch v13, topic id from v13


@attrs.define
class FetchTarget:
    """One partition a fetch asks for, and (in a session) what the client was last told."""

    topic: TopicKey
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    partition_max_bytes: int
    sent_high_watermark: int | None = None
    sent_log_start_offset: int | None = None
    #: In a session: the topic's name when the partition joined it. Kafka's session cache
    #: resolves a topic id once; a partition whose topic was re-created since is then found
    #: under that name with another id (INCONSISTENT_TOPIC_ID).
    resolved_name: str | None = None

    def update_from(self, other: FetchTarget) -> None:
        self.current_leader_epoch = other.current_leader_epoch
        self.fetch_offset = other.fetch_offset
        self.last_fetched_epoch = other.last_fetched_epoch
        self.partition_max_bytes = other.partition_max_bytes


@attrs.define
class FetchSession:
    session_id: int
    next_epoch: int
    partitions: OrderedDict[tuple[TopicKey, int], FetchTarget]
    uses_topic_ids: bool = False

    def served(self, target: FetchTarget) -> None:
        """``target`` returned records: it goes last in the next answers."""
        key = (target.topic, target.partition)
        if key in self.partitions:
            self.partitions.move_to_end(key)


class SessionError(Exception):
    def __init__(self, error_code: int) -> None:
        super().__init__(error_code)
        self.error_code = error_code


def _next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class FetchSessionCache:
    """The sessions of one broker; dropped when the broker stops."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._sessions)

    def clear(self) -> None:
        self._sessions.clear()

    def sessions(self) -> dict[int, FetchSession]:
        return dict(self._sessions)

    def open(
        self,
        session_id: int,
        epoch: int,
        requested: list[FetchTarget],
        forgotten: list[tuple[TopicKey, int]],
        create: bool = True,
        uses_topic_ids: bool = False,
    ) -> tuple[FetchSession | None, list[FetchTarget], bool]:
        """Resolve a request's session metadata (``create``: may open new sessions;
        ``uses_topic_ids``: the request is Fetch v13+).

        Returns (session or None, the partitions to answer, whether the answer is
        incremental). Raises SessionError for an unknown session, a wrong epoch or a
        change of topic addressing.
        """
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id:
                self._sessions.pop(session_id, None)
            if epoch == FINAL_EPOCH or not create:
                return None, requested, False
            session = FetchSession(
                next(self._ids),
                1,
                OrderedDict(((t.topic, t.partition), t) for t in requested),
                uses_topic_ids,
            )
            self._sessions[session.session_id] = session
            while len(self._sessions) > MAX_SESSIONS_PER_BROKER:
                self._sessions.popitem(last=False)
            return session, list(session.partitions.values()), False
        existing = self._sessions.get(session_id)
        if existing is None:
            raise SessionError(FETCH_SESSION_ID_NOT_FOUND)
        if existing.next_epoch != epoch:
            raise SessionError(INVALID_FETCH_SESSION_EPOCH)
        if existing.uses_topic_ids != uses_topic_ids:
            raise SessionError(FETCH_SESSION_TOPIC_ID_ERROR)
        self._sessions.move_to_end(session_id)
        for target in requested:
            known = existing.partitions.get((target.topic, target.partition))
            if known is None:
                existing.partitions[(target.topic, target.partition)] = target
            else:
                known.update_from(target)
        for key in forgotten:
            existing.partitions.pop(key, None)
        if not existing.partitions:
            # Nothing left to fetch: Kafka closes the session and answers sessionless.
            del self._sessions[session_id]
            return None, requested, False
        existing.next_epoch = _next_epoch(epoch)
        return existing, list(existing.partitions.values()), True
