"""What the consumer engine asks of group membership, and the coordinator link both kinds of
membership share.

Two memberships implement :class:`Membership`: the classic protocol's
:class:`~epochguard.consumer.group.ClassicMember` (eager and cooperative-sticky assignors,
static members) and KIP-848's :class:`~epochguard.consumer.group_consumer.ConsumerGroupMember`.
The engine calls the same steps on either: ``reconcile`` on every poll (it joins, syncs or
takes the broker's assignment, and moves partitions in and out through the engine as the
:class:`MembershipHost`), ``commit`` and ``fetch_committed_metadata`` for offsets, ``leave``
when closing. Each composes a :class:`CoordinatorLink` for FindCoordinator and for sending
to the coordinator with retries. Every call that waits is a step; heartbeats run as a
background step the driver spawns (a thread or a task).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import attrs
import kafka.errors as kerrors
from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.consumer import wire
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.effects import Await, Signal, Sleep, Step, TaskHandle, request
from epochguard.offsets.policy import RetryBackoff
from epochguard.offsets.position import EpochOffset

__all__ = [
    "CommitNaming",
    "CommitView",
    "CoordinatorLink",
    "Heartbeats",
    "Membership",
    "MembershipHost",
    "OwnCommits",
]

log = get_logger("epochguard.consumer")

#: The coordinator moved or is not ready: look it up again.
COORDINATOR_ERRORS = (
    kerrors.CoordinatorLoadInProgressError,
    kerrors.CoordinatorNotAvailableError,
    kerrors.NotCoordinatorError,
)
#: OffsetCommit answers worth asking again until the commit's deadline, as Java's commitSync
#: does: the coordinator may not know the topic yet (its metadata lags a restart, or a
#: re-creation: UNKNOWN_TOPIC_ID to a commit by id) or the request timed out.
COMMIT_RETRY = (
    kerrors.UnknownTopicOrPartitionError,
    kerrors.UnknownTopicIdError,
    kerrors.RequestTimedOutError,
)
#: Between FindCoordinator attempts.
_LOOKUP_BACKOFF = RetryBackoff(0.1, 1.0)
#: Between attempts of a coordinator request after a transport error.
_CALL_BACKOFF = RetryBackoff(0.05, 0.5)
#: Transport failures of a coordinator request: find the coordinator again and resend.
_TRANSPORT_ERRORS = (
    kerrors.KafkaConnectionError,
    kerrors.NodeNotReadyError,
    kerrors.KafkaTimeoutError,
    kerrors.RequestTimedOutError,
    kerrors.UnknownBrokerIdError,
    # The transport closed the connection on a frame it could not match (a correlation id
    # out of order): the request is lost with the connection, as on a disconnect. The chaos
    # schedules found it escaping poll() from a join.
    kerrors.KafkaProtocolError,
)


class CoordinatorLink:
    """The coordinator of one group: found with FindCoordinator, forgotten when it moves,
    and every request to it sent again (after a new lookup) on transport errors."""

    def __init__(self, client: BrokerClient, group_id: str, request_timeout_s: float) -> None:
        self._client = client
        self.group_id = group_id
        self.timeout_s = request_timeout_s
        #: The coordinator's broker id, while known.
        self.coordinator_id: int | None = None
        #: The connection requests to the coordinator go on (see
        #: :meth:`BrokerClient.coordinator_node`), while known.
        self.node: Any = None
        #: The FindCoordinator request in flight, if any (see :meth:`ensure`).
        self._lookup: Any = None

    def ensure(self, deadline: float) -> Step[Any]:
        """The connection to send the coordinator requests on, the coordinator looked up when
        not known."""
        attempt = 0
        last_error: BaseException | None = None
        while self.node is None:
            if self._client.closed:
                raise kerrors.KafkaConnectionError("consumer closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise kerrors.KafkaTimeoutError(
                    f"group {self.group_id!r}: no coordinator found in time"
                    + (f"; last error: {last_error}" if last_error is not None else "")
                )
            lookup = self._lookup
            if lookup is None:
                # Sent with the full request timeout, whatever is left of the caller's: a
                # request that times out closes its connection (kafka-python, as Java), so a
                # poll(timeout_ms=1) would drop it (and log in again, on SASL) every time. A
                # lookup still on its way when the caller's time is up serves the next call.
                lookup = self._lookup = self._client.send(
                    None, wire.find_coordinator_request(self.group_id), self.timeout_s * 1000
                )
            try:
                resp = yield Await(lookup, remaining)
            except kerrors.KafkaError as exc:
                if not lookup.is_done:
                    raise kerrors.KafkaTimeoutError(
                        f"group {self.group_id!r}: no coordinator found in time"
                    ) from None
                log.debug("find_coordinator_failed", group=self.group_id, error=repr(exc))
                last_error = exc
                resp = None
            if self._lookup is lookup:
                self._lookup = None
            if resp is not None and resp.error_code == 0:
                self.coordinator_id = resp.node_id
                self.node = self._client.coordinator_node(self.group_id, resp)
                log.info("coordinator_found", group=self.group_id, node=resp.node_id)
                break
            err = None if resp is None else wire.error_from_wire(resp.error_code)
            if err is not None and not err.retriable:
                # GROUP_AUTHORIZATION_FAILED above all: looking again cannot change the
                # answer, so fail now instead of retrying until the deadline.
                raise err(f"group {self.group_id!r}: FindCoordinator refused")
            delay = _LOOKUP_BACKOFF.delay(attempt)
            attempt += 1
            yield Sleep(min(delay, max(0.0, deadline - time.monotonic())))
        return self.node

    def forget(self) -> None:
        """The coordinator moved or is gone: the next request looks it up again."""
        self.coordinator_id = None
        self.node = None

    def call(
        self,
        req: Any,
        deadline: float,
        timeout_s: float | None = None,
        unanswered: Callable[[], None] | None = None,
    ) -> Step[Any]:
        """Send to the coordinator; on transport errors find the coordinator again and retry
        until ``deadline``. ``unanswered`` is called for each attempt cut by a transport
        error: the coordinator may still have received it, and may act on it later."""
        t = self.timeout_s if timeout_s is None else timeout_s
        attempt = 0
        while True:
            node = yield from self.ensure(deadline)
            remaining = max(0.05, deadline - time.monotonic())
            try:
                return (yield from request(self._client, node, req, min(t, remaining)))
            except _TRANSPORT_ERRORS as exc:
                self.forget()
                if unanswered is not None:
                    unanswered()
                if time.monotonic() >= deadline or self._client.closed:
                    raise
                log.debug("coordinator_request_failed", group=self.group_id, error=repr(exc))
                delay = _CALL_BACKOFF.delay(attempt)
                attempt += 1
                yield Sleep(min(delay, max(0.0, deadline - time.monotonic())))


#: How long a commit sent without an answer is held as one that may still land (seconds).
OWN_COMMITS_TTL_S = 600.0


class OwnCommits:
    """What became of this member's commits: per partition, commits sent whose answer never
    came, and the commit acknowledged after them.

    An OffsetCommit cut by a timeout or a lost connection may still reach the coordinator,
    and later than a commit sent after it: the group then holds the older position, over
    one that was acknowledged. A member given the partition back that finds there one of
    its own unanswered commits, older than the one acknowledged after it, resumes from the
    acknowledged one (:meth:`overtaken`). Partitions without an unanswered commit cost one
    test per commit. Sans-IO: time is passed in."""

    def __init__(self, ttl_s: float = OWN_COMMITS_TTL_S) -> None:
        self.ttl_s = ttl_s
        #: Unanswered since the last acknowledgement: (offset, leader epoch) -> when sent.
        self._unanswered: dict[TopicPartition, dict[tuple[int, int | None], float]] = {}
        #: Unanswered before an acknowledgement, so possibly landing after it.
        self._may_land_late: dict[TopicPartition, dict[tuple[int, int | None], float]] = {}
        self._acknowledged: dict[TopicPartition, tuple[EpochOffset, str]] = {}

    def unanswered(
        self, offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], now: float
    ) -> None:
        for tp, (pos, _metadata) in offsets.items():
            self._unanswered.setdefault(tp, {})[(pos.offset, pos.leader_epoch)] = now

    def acknowledged(
        self, offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], now: float
    ) -> None:
        if not self._unanswered and not self._may_land_late:
            return
        self.expire(now)
        for tp, committed in offsets.items():
            sent = self._unanswered.pop(tp, None)
            if sent is not None:
                self._may_land_late.setdefault(tp, {}).update(sent)
            if tp in self._may_land_late:
                self._acknowledged[tp] = committed

    def overtaken(
        self, tp: TopicPartition, found: EpochOffset | None, now: float
    ) -> tuple[EpochOffset, str] | None:
        """The commit acknowledged for ``tp`` when ``found`` (what the group holds) is an
        older unanswered commit of this member's that landed after it; else ``None``."""
        if found is None or not self._may_land_late:
            return None
        self.expire(now)
        acknowledged = self._acknowledged.get(tp)
        late = self._may_land_late.get(tp, {})
        key = (found.offset, found.leader_epoch)
        if acknowledged is None or key not in late or key in self._unanswered.get(tp, {}):
            # Sent again since the acknowledgement: it may as well be the newest commit.
            return None
        if (acknowledged[0].offset, acknowledged[0].leader_epoch) == key:
            return None
        return acknowledged

    def expire(self, now: float) -> None:
        for held in (self._unanswered, self._may_land_late):
            for tp in list(held):
                sent = {k: at for k, at in held[tp].items() if now - at < self.ttl_s}
                if sent:
                    held[tp] = sent
                else:
                    del held[tp]
        for tp in [tp for tp in self._acknowledged if tp not in self._may_land_late]:
            del self._acknowledged[tp]


def commit_worth_retrying(link: CoordinatorLink, errors: set[type[kerrors.KafkaError]]) -> bool:
    """Whether an OffsetCommit answer's ``errors`` are worth asking again, for either group
    protocol; forgets the coordinator when it moved or timed out."""
    if any(issubclass(e, COORDINATOR_ERRORS) for e in errors):
        link.forget()
        return True
    if errors and all(issubclass(e, COMMIT_RETRY) for e in errors):
        if kerrors.RequestTimedOutError in errors:
            link.forget()
        return True
    return False


class Heartbeats:
    """A member's background heartbeat step, spawned by the driver (a thread or a task)."""

    def __init__(self, spawn: Callable[[Step[None], str], TaskHandle], name: str) -> None:
        self._spawn = spawn
        self._name = name
        self._task: TaskHandle | None = None
        self._stop = Signal()

    @property
    def task(self) -> TaskHandle | None:
        """The step's handle since the last start (until stopped)."""
        return self._task

    @property
    def running(self) -> bool:
        return self._task is not None and self._task.is_alive()

    def start(self, loop: Callable[[Signal], Step[None]]) -> None:
        self._stop = Signal()
        self._task = self._spawn(loop(self._stop), self._name)

    def stop(self, wake: Signal | None = None) -> None:
        """Stop the step and wait for it (bounded); ``wake`` is set after the stop, for a step
        that waits on it rather than on the stop signal."""
        self._stop.set()
        if wake is not None:
            wake.set()
        task, self._task = self._task, None
        if task is not None:
            task.join(2.0)


def commit_topic_ids(
    offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], by_id: bool
) -> dict[TopicPartition, str | None] | None:
    """The topic ids an OffsetCommit names: none (by name, the position's id in the commit's
    metadata) unless ``by_id``, then each position's own (the incarnation it was read in)."""
    if not by_id:
        return None
    return {tp: pos.topic_id for tp, (pos, _m) in offsets.items()}


def refused_id_deleted(
    topic_id: str, topic: str, answer: wire.MetadataAnswer, older: Collection[str] = ()
) -> bool:
    """Whether ``topic_id``, refused by a coordinator (UNKNOWN_TOPIC_ID to a commit by id),
    is a deleted incarnation of ``topic``, judged by a partition leader's Metadata answer.

    A leader serves the live incarnation, so its metadata names the live id: another id
    there means ``topic_id`` was deleted (ids are never reused), and a commit by name goes
    to the live topic with the deleted id in its metadata, where the next owner sees the
    re-creation. The same id means the coordinator lags the topic: by id it takes the commit
    once it knows the id and keeps it (by name it would file it under the id its view gives
    the name, a deleted one, and drop it). No topic by that name, an error or no id decide
    nothing: by id, asked again next round. A leader that itself lags the deletion names
    the old id until it applies it, so asking again converges; one that names an id in
    ``older`` (known deleted: the consumer saw a leader serve a later one) is behind too."""
    for t in answer.topics:
        if t.name == topic and t.error is None and t.topic_id is not None:
            named = _canonical(t.topic_id)
            if named in {_canonical(o) for o in older}:
                return False
            return named != _canonical(topic_id)
    return False


def _canonical(topic_id: str | None) -> str | None:
    """A topic id as an answer names it (lower-case UUID text); ``None``: no id, or text
    that is no UUID (a commit names those by name)."""
    return wire.topic_id_from_wire(wire.topic_id_to_wire(topic_id))


@attrs.frozen
class CommitView:
    """What the consumer knows that judges a refused topic id: the brokers its metadata
    names leaders of the topic (of the commit's partitions first, each once), and the
    topic ids its trackers know to be deleted incarnations."""

    leaders: tuple[int, ...] = ()
    older_ids: frozenset[str] = frozenset()


#: The engine's :class:`CommitView` of ``(topic, partitions)``.
CommitViewOf = Callable[[str, Sequence[int]], CommitView]

#: One partition of an OffsetCommit: ``(tp, offset, leader epoch, metadata)``.
CommitEntry = tuple[TopicPartition, int, int | None, str]


def no_view(_topic: str, _partitions: Sequence[int]) -> CommitView:
    return CommitView()


class CommitNaming:
    """How one commit names its partitions' topics: by each position's topic id (when every
    position has one and ``by_id``), until a partition leader shows an id deleted
    (:func:`refused_id_deleted`); that id's partitions then go by name, in a request of
    their own."""

    def __init__(self, offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], by_id: bool):
        ids = commit_topic_ids(offsets, by_id)
        canonical = {tp: _canonical(i) for tp, i in (ids or {}).items()}
        # One position without an id names them all by name, as Java's CommitRequestManager.
        self._ids: dict[TopicPartition, str] | None = (
            None
            if ids is None or any(i is None for i in canonical.values())
            else {tp: i for tp, i in canonical.items() if i is not None}
        )
        #: Partitions whose position's topic id a leader showed deleted.
        self.by_name: set[TopicPartition] = set()

    def requests(
        self, entries: Sequence[CommitEntry]
    ) -> list[tuple[list[CommitEntry], dict[TopicPartition, str] | None]]:
        """The requests of one round, as ``(entries, topic ids or None: by name)``."""
        ids = self._ids
        if ids is None:
            return [(list(entries), None)]
        by_id = [e for e in entries if e[0] not in self.by_name]
        by_name = [e for e in entries if e[0] in self.by_name]
        out: list[tuple[list[CommitEntry], dict[TopicPartition, str] | None]] = []
        if by_id:
            out.append((by_id, ids))
        if by_name:
            out.append((by_name, None))
        return out

    def refused(self, topic_ids: set[str]) -> dict[str, list[TopicPartition]]:
        """The partitions still committed by id under each refused id."""
        out: dict[str, list[TopicPartition]] = {}
        for tp, tid in (self._ids or {}).items():
            if tid in topic_ids and tp not in self.by_name:
                out.setdefault(tid, []).append(tp)
        return out

    def on_leader_answer(
        self,
        topic_id: str,
        partitions: Sequence[TopicPartition],
        answer: wire.MetadataAnswer,
        older: Collection[str] = (),
    ) -> bool:
        """Takes a leader's Metadata answer for the refused ``topic_id``; whether its
        partitions go by name from now on."""
        if not partitions or not refused_id_deleted(topic_id, partitions[0].topic, answer, older):
            return False
        self.by_name.update(partitions)
        return True

    def judge(
        self,
        client: BrokerClient,
        view_of: CommitViewOf,
        refused: set[str],
        deadline: float,
        timeout_s: float,
        group_id: str,
    ) -> Step[bool]:
        """Asks a leader of each refused id's topic (in the consumer's metadata) for the
        topic, never past ``deadline``; whether a partition goes by name from now on. No
        leader, or none answering, leaves the commit by id (asked again next round)."""
        changed = False
        for tid, tps in sorted(self.refused(refused).items()):
            topic = tps[0].topic
            view = view_of(topic, [tp.partition for tp in tps])
            for node in view.leaders:
                # request() waits half a second past the request's own timeout.
                remaining = deadline - time.monotonic() - 0.5
                if remaining <= 0:
                    return changed
                req = wire.metadata_request([topic], allow_auto_create=False)
                try:
                    resp = yield from request(client, node, req, min(timeout_s, remaining))
                except kerrors.KafkaError as exc:
                    log.debug(
                        "commit_leader_metadata_failed", group=group_id, node=node, error=repr(exc)
                    )
                    continue
                answer = wire.read_metadata(resp)
                if answer.error is not None:
                    continue
                if self.on_leader_answer(tid, tps, answer, view.older_ids):
                    changed = True
                    log.info(
                        "commit_by_name_for_deleted_topic_id",
                        group=group_id,
                        topic=topic,
                        topic_id=tid,
                        node=node,
                        partitions=sorted(tp.partition for tp in tps),
                    )
                break
        return changed


class MembershipHost(Protocol):
    """What a membership reads and drives on the consumer engine (its poll strand)."""

    config: dict[str, Any]
    assigned: list[TopicPartition]
    subscription_topics: set[str] | None
    fetcher: Any

    @property
    def pattern(self) -> Any: ...
    @property
    def pattern_matched(self) -> bool: ...
    def commit(
        self, offsets: Mapping[TopicPartition, Any] | None = None, timeout_ms: int | None = None
    ) -> Step[None]: ...
    def current_positions(self) -> dict[TopicPartition, EpochOffset]: ...
    def set_assignment(self, parts: list[TopicPartition]) -> None: ...
    def restore_positions(self, deadline: float) -> Step[None]: ...
    def call_listener(self, method: str, partitions: set[TopicPartition]) -> Step[None]: ...
    def metadata_for(self, topics: set[str], deadline: float) -> Step[dict[str, set[int]]]: ...


class Membership(Protocol):
    """One member of one group, as the consumer engine uses it."""

    group_id: str
    member_id: str
    heartbeats_sent: int
    rebalances: int
    rejoin_needed: bool
    commits_by_topic_id: bool
    commit_view: CommitViewOf
    own_commits: OwnCommits

    @property
    def generation(self) -> int: ...
    @property
    def coordinator_id(self) -> int | None: ...
    @property
    def rebalancing(self) -> bool: ...
    def polled(self) -> None: ...
    def reconcile(self, host: MembershipHost, deadline: float) -> Step[None]: ...
    def abandon_join(self) -> None: ...
    def commit(
        self, offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], deadline: float
    ) -> Step[None]: ...
    def fetch_committed(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> Step[dict[TopicPartition, EpochOffset | None]]: ...
    def fetch_committed_metadata(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> Step[dict[TopicPartition, tuple[EpochOffset, str] | None]]: ...
    def leave(self, reason: str = ...) -> Step[None]: ...
