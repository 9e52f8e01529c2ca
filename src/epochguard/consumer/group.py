"""Classic consumer-group protocol: coordinator lookup, join/sync with kafka-python's
assignors, background heartbeats, and offset commit/fetch carrying leader epochs.

Every call that waits is a :data:`~epochguard.consumer.effects.Step` run by the consumer's
driver (threads or asyncio); nothing here sleeps or blocks.

Heartbeats: like kafka-python and the Java client, a background step (a daemon thread under
the threaded driver, a task under asyncio) heartbeats while the application is between
polls. It also enforces ``max_poll_interval_ms``: if ``poll`` is not called for that long,
the heartbeat step leaves the group so the partitions move to a live member, and the next
``poll`` rejoins. Joining and syncing happen inside ``poll`` on the application's strand,
which is where listeners and commits-on-revoke run.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kafka.errors as kerrors
from kafka.coordinator.assignors.abstract import RebalanceProtocol
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.consumer import wire
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.effects import (
    Signal,
    Sleep,
    Step,
    TaskHandle,
    WaitSignal,
    request,
    spawn_thread,
)
from epochguard.consumer.membership import (
    COORDINATOR_ERRORS,
    CommitNaming,
    CommitViewOf,
    CoordinatorLink,
    Heartbeats,
    MembershipHost,
    OwnCommits,
    commit_worth_retrying,
    no_view,
)
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.reopened import UndecidedTransaction

__all__ = ["ClassicMember", "CommitFailedError"]

log = get_logger("epochguard.consumer")

#: This member's generation is over: join again.
_REJOIN_ERRORS = (
    kerrors.IllegalGenerationError,
    kerrors.UnknownMemberIdError,
    kerrors.RebalanceInProgressError,
)
#: Commit answers that end this member's generation besides those: a static member fenced
#: by another process with its instance id, and a group the coordinator no longer has
#: (OffsetCommit v9+ names it; older versions answer ILLEGAL_GENERATION).
_COMMIT_REJOIN_ERRORS = (kerrors.FencedInstanceIdError, kerrors.GroupIdNotFoundError)
#: OffsetFetch partitions that are not readable yet: ask again.
_OFFSET_FETCH_RETRY = (
    kerrors.CoordinatorLoadInProgressError,
    kerrors.NotCoordinatorError,
    kerrors.UnstableOffsetCommitError,
)
#: Before retrying a request the coordinator answered with a retriable error.
_RETRY_S = 0.05

#: Commit metadata that starts with this carries what OffsetCommit has no field for, written
#: only when the application gave no metadata of its own: whether the committed epoch is the
#: epoch of the record before the offset as this consumer read it (``epoch_exact``), the
#: topic's id, and under read_committed the transactions read below the offset whose marker
#: was not read (``txns``). Without them a restart from the group validates by Java's looser
#: rule and misses a truncation that began below the leader's answer (a leader that never
#: had the committed epoch), or a topic re-created under the same name, and the next reader
#: cannot tell a marker that decides those transactions otherwise than they were read.
PROVENANCE_PREFIX = "epochguard:"


def provenance_metadata(position: EpochOffset, metadata: str) -> str:
    """The metadata string to commit with ``position``: the application's, or (when it
    gave none) the position's provenance."""
    if metadata:
        return metadata
    fields: dict[str, object] = {}
    if position.epoch_exact and position.leader_epoch is not None:
        fields["epoch_exact"] = True
    if position.topic_id is not None:
        fields["topic_id"] = position.topic_id
    if position.undecided_transactions:
        fields["txns"] = [t.to_json() for t in position.undecided_transactions]
    if not fields:
        return ""
    return PROVENANCE_PREFIX + json.dumps(fields, sort_keys=True, separators=(",", ":"))


def committed_position(
    offset: int, leader_epoch: int | None, metadata: str | None
) -> tuple[EpochOffset, str]:
    """A committed offset as a position, with the provenance :func:`provenance_metadata`
    stored (then the application's metadata is ``""``); other metadata is the
    application's and passes through."""
    if metadata and metadata.startswith(PROVENANCE_PREFIX):
        try:
            fields = json.loads(metadata[len(PROVENANCE_PREFIX) :])
            if isinstance(fields, dict):
                return (
                    EpochOffset(
                        offset,
                        leader_epoch,
                        topic_id=fields.get("topic_id"),
                        epoch_exact=fields.get("epoch_exact") is True and leader_epoch is not None,
                        undecided_transactions=tuple(
                            UndecidedTransaction.from_json(t) for t in fields.get("txns", ())
                        ),
                    ),
                    "",
                )
        except (ValueError, TypeError):
            pass  # someone else's metadata that happens to start alike
    return EpochOffset(offset, leader_epoch), metadata or ""


def _protocols(assignor: Any) -> list[Any]:
    supported = getattr(assignor, "supported_protocols", None)
    return list(supported()) if supported is not None else [RebalanceProtocol.EAGER]


class CommitFailedError(kerrors.CommitFailedError):  # type: ignore[misc]
    """An offset commit was rejected (the group rebalanced, or the member was fenced)."""


class _ClusterView:
    """What kafka-python's assignors read from ``cluster``."""

    def __init__(self, partitions: Mapping[str, set[int]]) -> None:
        self._partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        parts = self._partitions.get(topic)
        return set(parts) if parts is not None else None

    def topics(self, exclude_internal_topics: bool = True) -> set[str]:
        return set(self._partitions)


class ClassicMember:
    """One member of one classic group (plus offset APIs for ``assign()`` users)."""

    def __init__(
        self,
        client: BrokerClient,
        config: dict[str, Any],
        spawn: Callable[[Step[None], str], TaskHandle] = spawn_thread,
    ) -> None:
        self._client = client
        self._config = config
        self.group_id: str = config["group_id"]
        self._instance_id: str | None = config.get("group_instance_id")
        self.link = CoordinatorLink(client, self.group_id, self._timeout_s())
        self.own_commits = OwnCommits()
        #: OffsetCommit v10 by topic id when the coordinator offers it (see
        #: :class:`~epochguard.consumer.membership.CommitNaming`).
        self.commits_by_topic_id = True
        #: What the consumer knows of a topic, to judge a refused id (set by the engine).
        self.commit_view: CommitViewOf = no_view
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        #: This member assigned the partitions in its last join.
        self.leader = False
        self._assignors = {a.name: a for a in config["partition_assignment_strategy"]}
        #: KIP-429: every assignor offered is cooperative, so whichever the group picks, the
        #: member keeps what it keeps across a rebalance (Java's rule for the protocol).
        self.cooperative = all(
            RebalanceProtocol.COOPERATIVE in _protocols(a) for a in self._assignors.values()
        )
        #: The coordinator no longer knows this member (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
        #: session expired): what it owned may be someone else's already. A cooperative
        #: member drops everything without committing before it joins again (Java's
        #: onPartitionsLost).
        self.partitions_lost = False
        # The join under way: ("join" | "sync", the request's future), and the topics its
        # JoinGroup named.
        self._join_step: tuple[str, Any] | None = None
        self._join_topics: frozenset[str] = frozenset()
        # The eager join under way has revoked everything already (once per rebalance, not
        # again for each poll() a deferred join spans).
        self._join_prepared = False
        self._lock = threading.Lock()
        self.rejoin_needed = True
        self._heartbeats = Heartbeats(spawn, f"epochguard-heartbeat-{self.group_id}")
        self._last_poll = time.monotonic()
        self._closed = False
        self.heartbeats_sent = 0
        self.rebalances = 0

    # ------------------------------------------------------------------ coordinator

    def _timeout_s(self) -> float:
        return float(self._config["request_timeout_ms"]) / 1000

    @property
    def coordinator_id(self) -> int | None:
        return self.link.coordinator_id

    def coordinator_dead(self) -> None:
        self.link.forget()

    def _call(
        self,
        req: Any,
        deadline: float,
        unanswered: Callable[[], None] | None = None,
    ) -> Step[Any]:
        return self.link.call(req, deadline, unanswered=unanswered)

    # ------------------------------------------------------------------ offsets

    def fetch_committed(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> Step[dict[TopicPartition, EpochOffset | None]]:
        """OffsetFetch (v5+ returns the committed leader epoch)."""
        got = yield from self.fetch_committed_metadata(partitions, deadline)
        return {tp: None if g is None else g[0] for tp, g in got.items()}

    def fetch_committed_metadata(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> Step[dict[TopicPartition, tuple[EpochOffset, str] | None]]:
        """Like :meth:`fetch_committed`, with the metadata string stored by the commit."""
        req = wire.offset_fetch_request(self.group_id, partitions)
        while True:
            try:
                resp = yield from self._call(req, deadline)
            except kerrors.KafkaError as exc:
                # Not retriable (GROUP_AUTHORIZATION_FAILED): asking again changes nothing.
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
                yield Sleep(_RETRY_S)
                continue
            top, parts = wire.read_offset_fetch(resp)
            if top is not None and issubclass(top, COORDINATOR_ERRORS):
                self.coordinator_dead()
                if time.monotonic() >= deadline:
                    raise top()
                yield Sleep(_RETRY_S)
                continue
            if top is not None:
                raise top()
            out: dict[TopicPartition, tuple[EpochOffset, str] | None] = {}
            retry = False
            for p in parts:
                if p.error is not None and issubclass(p.error, _OFFSET_FETCH_RETRY):
                    retry = True
                    continue
                if p.error is not None:
                    raise p.error()
                out[p.tp] = (
                    None
                    if p.offset is None
                    else committed_position(p.offset, p.leader_epoch, p.metadata)
                )
            if not retry:
                return out
            if time.monotonic() >= deadline:
                raise kerrors.KafkaTimeoutError("OffsetFetch: offsets unstable")
            yield Sleep(_RETRY_S)

    def commit(
        self, offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], deadline: float
    ) -> Step[None]:
        """OffsetCommit v6+ with ``committed_leader_epoch``; v10 (by topic id) when every
        position names its topic's incarnation."""
        if not offsets:
            return
        if self._join_step is not None:
            # Java's RebalanceInProgressException: the generation is about to change and a
            # commit now would be refused (or, worse, read as this member being dropped).
            raise kerrors.RebalanceInProgressError(
                f"group {self.group_id!r}: a rebalance is under way; commit after poll() "
                "completes it"
            )
        with self._lock:
            generation, member = self.generation, self.member_id
        subscribed = self.protocol is not None
        entries = [
            (tp, pos.offset, pos.leader_epoch, provenance_metadata(pos, metadata))
            for tp, (pos, metadata) in offsets.items()
        ]
        naming = CommitNaming(offsets, self.commits_by_topic_id)

        def sent_unanswered() -> None:
            self.own_commits.unanswered(offsets, time.monotonic())

        while True:
            errors: set[type[kerrors.KafkaError]] = set()
            refused: set[str] = set()
            for part, topic_ids in naming.requests(entries):
                req = wire.offset_commit_request(
                    self.group_id,
                    part,
                    generation if subscribed else None,
                    member if subscribed else "",
                    self._instance_id if subscribed else None,
                    topic_ids,
                )
                resp = yield from self._call(req, deadline, unanswered=sent_unanswered)
                errors |= wire.commit_errors(resp)
                refused |= wire.commit_refused_topic_ids(resp)
            if kerrors.RequestTimedOutError in errors:
                sent_unanswered()  # the coordinator's write may yet complete
            if not errors:
                self.own_commits.acknowledged(offsets, time.monotonic())
                log.debug(
                    "offsets_committed",
                    group=self.group_id,
                    offsets={str(tp): str(p) for tp, (p, _m) in offsets.items()},
                )
                return
            if commit_worth_retrying(self.link, errors) and time.monotonic() < deadline:
                if refused and (
                    yield from naming.judge(
                        self._client,
                        self.commit_view,
                        refused,
                        deadline,
                        self._timeout_s(),
                        self.group_id,
                    )
                ):
                    continue
                yield Sleep(_RETRY_S)
                continue
            if any(issubclass(e, (*_REJOIN_ERRORS, *_COMMIT_REJOIN_ERRORS)) for e in errors):
                self.rejoin_needed = True
                lost = (
                    kerrors.UnknownMemberIdError,
                    kerrors.IllegalGenerationError,
                    kerrors.GroupIdNotFoundError,
                )
                if any(issubclass(e, lost) for e in errors) and self.generation == generation:
                    # Only if no newer generation was joined meanwhile (the answer to an
                    # older one says nothing about the member now).
                    self.partitions_lost = True
                codes = sorted(int(e.errno) for e in errors)
                raise CommitFailedError(
                    f"group {self.group_id!r}: commit rejected ({codes}); the group "
                    "rebalanced, partitions may have moved to another member"
                )
            raise min(errors, key=lambda e: int(e.errno))()

    # ------------------------------------------------------------------ reconciliation

    def reconcile(self, host: MembershipHost, deadline: float) -> Step[None]:
        """Join when the group asks it (the poll strand), a step at a time: the coordinator
        holds a JoinGroup until every member has rejoined, and poll() keeps its timeout
        meanwhile (kafka-python and Java do too). An eager join gives every partition up
        first, once per rebalance; a cooperative one moves only what changed."""
        subscribed = host.subscription_topics
        if not self.rejoin_needed or subscribed is None:
            return
        if not subscribed and not host.pattern_matched:
            # A pattern not yet matched against the cluster's topics: joining now would
            # only be followed by another join once it is.
            return
        # A pattern that matches nothing joins too, with no topics (as Java's and
        # kafka-python's members do): it gives up what it held, and the group's rebalances
        # do not wait max_poll_interval_ms for a member that never sends its JoinGroup.
        topics = set(subscribed)
        if self.cooperative:
            if self.partitions_lost:
                yield from self._lose_partitions(host)
        elif not self._join_prepared:
            yield from self._revoke_all(host, commit=host.config["enable_auto_commit"])
            self._join_prepared = True
        try:
            joined = yield from self.poll_join(
                topics,
                host.metadata_for,
                max(deadline, time.monotonic() + 0.05),
                host.fetcher.wakeup,
            )
        except kerrors.KafkaTimeoutError as exc:
            log.debug("group_join_deferred", group=self.group_id, error=repr(exc))
            return
        if joined is None:
            return
        settle_by = max(deadline, time.monotonic() + self._timeout_s())
        if self.cooperative:
            yield from self._cooperative_assignment(host, joined, settle_by)
            return
        self._join_prepared = False
        host.set_assignment(joined)
        yield from host.restore_positions(settle_by)
        yield from host.call_listener("on_partitions_assigned", set(joined))

    def _revoke_all(self, host: MembershipHost, commit: bool) -> Step[None]:
        """Before an eager join: every partition is given up. As kafka-python, the listener
        hears about it even when nothing is assigned yet."""
        if commit and host.assigned:
            try:
                yield from host.commit()
            except kerrors.KafkaError as exc:
                log.warning("commit_on_revoke_failed", error=repr(exc))
        yield from host.call_listener("on_partitions_revoked", set(host.assigned))
        if host.assigned:
            host.set_assignment([])

    def _cooperative_assignment(
        self, host: MembershipHost, parts: list[TopicPartition], deadline: float
    ) -> Step[None]:
        """KIP-429: only what changed moves. Partitions kept keep their trackers (position,
        buffered records, validation under way); revoked ones commit their positions with
        epochs before anyone else can get them (the next owner only gets them in the next
        generation, which waits for this member's rejoin); new ones restore their committed
        positions, epochs included, and are validated before the first fetch."""
        before = set(host.assigned)
        revoked = before - set(parts)
        added = set(parts) - before
        if revoked:
            if host.config["enable_auto_commit"]:
                positions = {
                    tp: (pos, "") for tp, pos in host.current_positions().items() if tp in revoked
                }
                try:
                    yield from self.commit(positions, deadline)
                except kerrors.KafkaError as exc:
                    log.warning("commit_on_revoke_failed", error=repr(exc))
            yield from host.call_listener("on_partitions_revoked", revoked)
            log.info(
                "partitions_revoked",
                group=self.group_id,
                partitions=sorted(str(tp) for tp in revoked),
                kept=len(before - revoked),
            )
        host.set_assignment(parts)
        self.set_owned(parts)
        if revoked:
            # Their next owner gets them in a follow-up rebalance (KIP-429).
            self.rejoin_needed = True
        yield from host.restore_positions(deadline)
        yield from host.call_listener("on_partitions_assigned", added)

    def _lose_partitions(self, host: MembershipHost) -> Step[None]:
        """The group moved on without this member: drop every partition without a commit
        (another member may own them already) before joining again."""
        self.partitions_lost = False
        lost = set(host.assigned)
        if lost:
            log.warning(
                "partitions_lost", group=self.group_id, partitions=sorted(str(tp) for tp in lost)
            )
            yield from host.call_listener("on_partitions_lost", lost)
            host.set_assignment([])
        self.set_owned([])

    # ------------------------------------------------------------------ joining

    def poll_join(
        self,
        topics: set[str],
        metadata_for: Callable[[set[str], float], Step[Mapping[str, set[int]]]],
        deadline: float,
        wakeup: Callable[[], None],
    ) -> Step[list[TopicPartition] | None]:
        """One step of a join, without waiting for the coordinator: sends JoinGroup, then
        SyncGroup, as their answers arrive. Returns the new assignment once SyncGroup
        answered, else ``None`` (call again from the next poll). A JoinGroup can wait at
        the coordinator until every member has rejoined; meanwhile a cooperative member
        keeps fetching and delivering the partitions it owns. ``wakeup`` is called when an
        answer arrives, so a waiting poll() goes on at once, and when a step was refused, so
        the next goes out in the same poll (every new member's first JoinGroup is refused
        with MEMBER_ID_REQUIRED)."""
        step = self._join_step
        if step is None:
            self.stop_heartbeats()
            node = yield from self.link.ensure(deadline)
            protocols = [
                (name, assignor.metadata(topics).encode())
                for name, assignor in self._assignors.items()
            ]
            rebalance_timeout = int(self._config["max_poll_interval_ms"])
            req = wire.join_group_request(
                self.group_id,
                self._config["session_timeout_ms"],
                rebalance_timeout,
                self.member_id,
                self._instance_id,
                protocols,
            )
            future = self._client.send(node, req, rebalance_timeout + 5000)
            future.add_both(lambda _v: wakeup())
            self._join_step = ("join", future)
            self._join_topics = frozenset(topics)
            return None
        kind, future = step
        if not future.is_done:
            return None
        self._join_step = None
        if future.exception is not None:
            log.debug("join_group_failed", group=self.group_id, error=repr(future.exception))
            if not getattr(future.exception, "retriable", True):
                raise future.exception
            self.coordinator_dead()
            yield from self._join_again(deadline, wakeup)
            return None
        resp = future.value
        if kind == "join":
            yield from self._on_join_answer(resp, metadata_for, deadline, wakeup)
            if self._join_step is None:
                yield from self._join_again(deadline, wakeup)
            return None
        parts = self._on_sync_answer(resp)
        if parts is None:
            yield from self._join_again(deadline, wakeup)
        elif self._join_topics != frozenset(topics):
            # The subscription changed while the join was under way (Java's check of the
            # subscription it joined with): this assignment is for the old one.
            self.rejoin_needed = True
        return parts

    def _join_again(self, deadline: float, wakeup: Callable[[], None]) -> Step[None]:
        """A join step was refused or lost: the next goes out in the same poll, at once, or
        after a short pause when the coordinator itself failed (it is looked up again)."""
        if self.link.node is None:
            yield Sleep(max(0.0, min(_RETRY_S, deadline - time.monotonic())))
        wakeup()

    def _on_join_answer(
        self,
        resp: Any,
        metadata_for: Callable[[set[str], float], Step[Mapping[str, set[int]]]],
        deadline: float,
        wakeup: Callable[[], None],
    ) -> Step[None]:
        if self._accept_join(resp) is not None:
            return
        # The leader assigns every member's topics, whose metadata it may not have yet: it
        # waits for it up to a request's time, whatever is left of the read's.
        assign_by = max(deadline, time.monotonic() + self._timeout_s())
        assignments = (
            (yield from self._assign(resp, metadata_for, assign_by))
            if resp.leader == resp.member_id
            else []
        )
        sync = wire.sync_group_request(
            self.group_id,
            resp.generation_id,
            resp.member_id,
            self._instance_id,
            resp.protocol_name,
            assignments,
        )
        node = self.link.node
        if node is None:
            return
        timeout_ms = int(self._config["max_poll_interval_ms"]) + 5000
        future = self._client.send(node, sync, timeout_ms)
        future.add_both(lambda _v: wakeup())
        self._join_step = ("sync", future)

    def _on_sync_answer(self, sresp: Any) -> list[TopicPartition] | None:
        serr = wire.error_from_wire(sresp.error_code)
        if serr is not None and issubclass(serr, COORDINATOR_ERRORS):
            self.coordinator_dead()
            return None
        if serr is kerrors.UnknownMemberIdError:
            self.member_id = ""
            self.partitions_lost = True
            return None
        if serr is not None and issubclass(serr, _REJOIN_ERRORS):
            return None
        if serr is not None:
            raise serr()
        assignment = ConsumerProtocolAssignment.decode(sresp.assignment)
        assignor = self._assignors.get(self.protocol or "")
        if assignor is not None and hasattr(assignor, "on_assignment"):
            try:
                assignor.on_assignment(assignment, self.generation)
            except Exception as exc:  # a custom assignor's own bookkeeping
                log.warning("assignor_on_assignment_failed", group=self.group_id, error=repr(exc))
        self.rejoin_needed = False
        self.rebalances += 1
        parts = sorted(assignment.partitions())
        log.info(
            "group_joined",
            group=self.group_id,
            generation=self.generation,
            member_id=self.member_id,
            leader=self.leader,
            protocol=self.protocol,
            partitions=[str(tp) for tp in parts],
        )
        self.start_heartbeats()
        return parts

    def _assign(
        self,
        resp: Any,
        metadata_for: Callable[[set[str], float], Step[Mapping[str, set[int]]]],
        deadline: float,
    ) -> Step[list[tuple[str, bytes]]]:
        assignor = self._assignors[resp.protocol_name]
        all_topics: set[str] = set()
        for member in resp.members:
            member.metadata = ConsumerProtocolSubscription.decode(member.metadata)
            all_topics.update(member.metadata.topics)
        partitions = yield from metadata_for(all_topics, deadline)
        result = assignor.assign(_ClusterView(partitions), resp.members)
        return [(m, a.encode()) for m, a in result.items()]

    def abandon_join(self) -> None:
        """Forget a join under way (the consumer closes): a last commit then
        goes out with the generation this member still has, which the coordinator accepts
        until the next generation is formed."""
        self._join_step = None

    @property
    def rebalancing(self) -> bool:
        """A JoinGroup or SyncGroup is under way."""
        return self._join_step is not None

    def set_owned(self, partitions: Sequence[TopicPartition]) -> None:
        """What this member owns now (cooperative assignors report it in the next join)."""
        for assignor in self._assignors.values():
            set_owned = getattr(assignor, "set_owned", None)
            if set_owned is not None:
                set_owned(partitions)

    def _accept_join(self, resp: Any) -> type[kerrors.KafkaError] | None:
        """Apply a JoinGroup answer, for the eager and the cooperative join alike: ``None``
        when this member joined (member id, generation and protocol taken); else the error
        after the bookkeeping it calls for, and the join is sent again. Raises what
        retrying cannot fix."""
        err = wire.error_from_wire(resp.error_code)
        if err is None:
            with self._lock:
                self.member_id = resp.member_id
                self.generation = resp.generation_id
                self.protocol = resp.protocol_name
            self.leader = resp.leader == resp.member_id
            return None
        retry: type[kerrors.KafkaError] = err  # kept before the comparisons narrow it to Any
        if err is kerrors.MemberIdRequiredError:
            self.member_id = resp.member_id
        elif issubclass(err, COORDINATOR_ERRORS):
            self.coordinator_dead()
        elif err is kerrors.UnknownMemberIdError:
            self.member_id = ""
            self.partitions_lost = True
        elif err is not kerrors.RebalanceInProgressError:
            raise err()
        return retry

    def leave(self, reason: str = "the consumer is being closed") -> Step[None]:
        self.stop_heartbeats()
        self._join_step = None
        self._join_prepared = False
        with self._lock:
            member = self.member_id
            self.member_id = ""
            self.generation = -1
            self.protocol = None
            self.leader = False
        self.rejoin_needed = True
        if not member or self.link.node is None or self._instance_id is not None:
            return
        req = wire.leave_group_request(self.group_id, member, reason)
        try:
            yield from request(self._client, self.link.node, req, min(self._timeout_s(), 2.0))
            log.info("group_left", group=self.group_id, member_id=member, reason=reason)
        except kerrors.KafkaError as exc:
            log.debug("leave_group_failed", group=self.group_id, error=repr(exc))

    # ------------------------------------------------------------------ heartbeats

    def polled(self) -> None:
        self._last_poll = time.monotonic()

    def start_heartbeats(self) -> None:
        self._heartbeats.start(self._heartbeat_loop)

    def stop_heartbeats(self) -> None:
        self._heartbeats.stop()

    def _heartbeat_loop(self, stop: Signal) -> Step[None]:
        interval = self._config["heartbeat_interval_ms"] / 1000
        max_poll = self._config["max_poll_interval_ms"] / 1000
        while not (yield WaitSignal(stop, interval)):
            if time.monotonic() - self._last_poll > max_poll:
                log.warning(
                    "max_poll_interval_exceeded",
                    group=self.group_id,
                    max_poll_interval_ms=self._config["max_poll_interval_ms"],
                )
                yield from self.leave("max_poll_interval_ms exceeded")
                return
            with self._lock:
                generation, member = self.generation, self.member_id
            node = self.link.node
            if node is None or not member:
                continue
            req = wire.heartbeat_request(self.group_id, generation, member, self._instance_id)
            try:
                resp = yield from request(
                    self._client, node, req, min(self._timeout_s(), interval * 3)
                )
            except kerrors.KafkaError as exc:
                log.debug("heartbeat_failed", group=self.group_id, error=repr(exc))
                self.coordinator_dead()
                self.rejoin_needed = True
                return
            self.heartbeats_sent += 1
            if resp.error_code == 0:
                continue
            herr = wire.error_from_wire(resp.error_code)
            if herr is not None and issubclass(herr, COORDINATOR_ERRORS):
                self.coordinator_dead()
            lost = herr in (kerrors.UnknownMemberIdError, kerrors.IllegalGenerationError)
            if lost and self.generation == generation:
                self.partitions_lost = True
            log.info("rebalance_needed", group=self.group_id, error_code=resp.error_code)
            self.rejoin_needed = True
            return
