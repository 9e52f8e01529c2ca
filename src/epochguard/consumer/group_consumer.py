"""KIP-848 group membership (``group_protocol="consumer"``): the broker assigns, the member
converges on its assignment one heartbeat at a time.

Two strands, as in the Java client's new consumer: a background heartbeat step (a thread
under the threaded driver, a task under asyncio) sends ConsumerGroupHeartbeat (joining with
epoch 0, then every ``heartbeat_interval_ms`` the coordinator names, and at once after the
application's strand acknowledged a change); the application's strand reconciles inside
``poll`` (:meth:`ConsumerGroupMember.reconcile`), because
that is where commits, rebalance listeners and positions live:

1. partitions the coordinator no longer assigns are **revoked first**: their positions are
   committed with their leader epochs (when auto commit is on, as Java), the listener's
   ``on_partitions_revoked`` runs, their positions are dropped, and the next heartbeat tells
   the coordinator they are released (only then can another member get them);
2. newly assigned partitions get their committed offsets **with epochs** (OffsetFetch v9, as
   this member and epoch), which the trackers validate (OffsetForLeaderEpoch) before any of
   their records are fetched, then ``on_partitions_assigned`` runs;
3. FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID: every partition is lost: positions are dropped
   without a commit (another member may own them already), ``on_partitions_revoked`` runs
   (kafka-python's listener has no ``on_partitions_lost``; Java's default calls revoked),
   and the member joins again with epoch 0 under the same member id;
4. an error retrying cannot fix (UNSUPPORTED_ASSIGNOR, GROUP_AUTHORIZATION_FAILED,
   INVALID_REGULAR_EXPRESSION, UNRELEASED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED, ...) stops the
   member for good, as Java's FATAL state: no more heartbeats, its partitions are lost, and
   every ``poll`` raises the error (kafka-python's class for the code) until ``close``.

Commits carry the member id and member epoch (OffsetCommit v9); a STALE_MEMBER_EPOCH answer
is retried with the epoch the heartbeat thread learnt since, else the commit fails with
``CommitFailedError``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kafka.errors as kerrors
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
from epochguard.consumer.group import (
    CommitFailedError,
    committed_position,
    provenance_metadata,
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

__all__ = ["ConsumerGroupMember"]

log = get_logger("epochguard.consumer")

#: The coordinator no longer knows this member at this epoch: its partitions are lost.
_FENCED_ERRORS = (kerrors.FencedMemberEpochError, kerrors.UnknownMemberIdError)
_OFFSET_FETCH_RETRY = (
    kerrors.CoordinatorLoadInProgressError,
    kerrors.NotCoordinatorError,
    kerrors.UnstableOffsetCommitError,
    kerrors.StaleMemberEpochError,
)
_RETRY_S = 0.05
#: Until the coordinator names one (its first answer), and after transport errors.
_FIRST_INTERVAL_S = 0.1


class ConsumerGroupMember:
    """One member of one KIP-848 group: the coordinator assigns, the member reconciles."""

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
        # KIP-1082: the member makes up its id once and keeps it for its whole life.
        self.member_id = str(uuid.uuid4())
        self.member_epoch = 0
        self._assignor: str | None = config.get("group_remote_assignor")
        self._rack: str | None = config.get("client_rack") or None
        self._lock = threading.Lock()
        # Set whenever the heartbeat strand should look again (a change to send, stopping).
        self._wake = Signal()
        self._heartbeats = Heartbeats(spawn, f"epochguard-heartbeat-{self.group_id}")
        self._last_poll = time.monotonic()
        # Written by the heartbeat strand, read by reconcile (under the lock):
        self._target: dict[str, frozenset[int]] | None = None
        self._fenced = False
        self._fatal: kerrors.KafkaError | None = None
        # Written by reconcile: what this member owns (topic id -> partitions).
        self._owned: dict[str, frozenset[int]] = {}
        self._subscription_sent: tuple[tuple[str, ...] | None, str | None] | None = None
        self._topics: tuple[str, ...] | None = None
        self._regex: str | None = None
        self._regex_sent = False
        self._beat_now = False
        self._interval_s = _FIRST_INTERVAL_S
        self._in_group = False
        self.heartbeats_sent = 0
        self.rebalances = 0

    def _timeout_s(self) -> float:
        return float(self._config["request_timeout_ms"]) / 1000

    @property
    def coordinator_id(self) -> int | None:
        return self.link.coordinator_id

    def coordinator_dead(self) -> None:
        self.link.forget()

    def _call(
        self, req: Any, deadline: float, unanswered: Callable[[], None] | None = None
    ) -> Step[Any]:
        return self.link.call(req, deadline, unanswered=unanswered)

    # "The subscription may have changed": sent with the next heartbeat (no rejoin: KIP-848
    # members update their subscription in place).
    @property
    def rejoin_needed(self) -> bool:
        return self._subscription_sent is None

    @rejoin_needed.setter
    def rejoin_needed(self, value: bool) -> None:
        if value:
            with self._lock:
                self._subscription_sent = None
                self._beat_now = True
            self._wake.set()

    @property
    def generation(self) -> int:
        """The member epoch (what Kafka's ConsumerGroupMetadata calls the generation)."""
        return self.member_epoch if self._in_group and self.member_epoch > 0 else -1

    @property
    def rebalancing(self) -> bool:
        """Never: a KIP-848 assignment arrives with a heartbeat, without a join to wait for."""
        return False

    def abandon_join(self) -> None:
        """Nothing to abandon (no join request is ever under way)."""

    def polled(self) -> None:
        self._last_poll = time.monotonic()

    # ------------------------------------------------------------------ reconciliation

    def reconcile(self, host: MembershipHost, deadline: float) -> Step[None]:
        """Bring the assignment in line with the coordinator's (the poll strand)."""
        topics = None if host.pattern is not None else tuple(sorted(host.subscription_topics or ()))
        regex = None if host.pattern is None else str(host.pattern.pattern)
        with self._lock:
            if (topics, regex) != (self._topics, self._regex):
                self._topics, self._regex = topics, regex
                self._subscription_sent = None
                self._beat_now = True
                self._wake.set()
            fatal = self._fatal
            fenced = self._fenced
            target = None if self._target is None else dict(self._target)
        if fatal is not None:
            if host.assigned:
                # Java's FATAL state: what the member owned is lost (no commit).
                yield from self._lose_all(host)
            # The member stays stopped (no heartbeat restarts it) until close(); each poll
            # raises a fresh instance so tracebacks do not pile up on one object.
            raise type(fatal)(*fatal.args)
        if fenced:
            yield from self._lose_all(host)
        if not self._heartbeats.running and (topics or regex):
            self._in_group = True
            self.start_heartbeats()
        if target is None or fenced:
            return
        ids = host.fetcher.topic_ids
        names = {tid: name for name, tid in ids.items() if tid is not None}
        wanted = {
            TopicPartition(names[tid], p)
            for tid, parts in target.items()
            if tid in names
            for p in parts
        }
        if len(names.keys() & target.keys()) < len(target):
            # A topic of the assignment this consumer has no metadata for yet.
            host.fetcher.request_metadata()
        owned = set(host.assigned)
        revoked = owned - wanted
        added = wanted - owned
        if not revoked and not added:
            return
        if revoked:
            if host.config["enable_auto_commit"]:
                positions = {tp: p for tp, p in host.current_positions().items() if tp in revoked}
                try:
                    if positions:
                        yield from host.commit(positions)
                except kerrors.KafkaError as exc:
                    log.warning("commit_on_revoke_failed", group=self.group_id, error=repr(exc))
            yield from host.call_listener("on_partitions_revoked", set(revoked))
            host.set_assignment([tp for tp in host.assigned if tp not in revoked])
            log.info(
                "partitions_revoked",
                group=self.group_id,
                member_epoch=self.member_epoch,
                partitions=sorted(str(tp) for tp in revoked),
            )
        if added:
            host.set_assignment([*host.assigned, *sorted(added)])
            yield from host.restore_positions(deadline)
            yield from host.call_listener("on_partitions_assigned", set(added))
            log.info(
                "partitions_assigned",
                group=self.group_id,
                member_epoch=self.member_epoch,
                partitions=sorted(str(tp) for tp in added),
            )
        self.rebalances += 1
        self._set_owned(host)

    def _set_owned(self, host: MembershipHost) -> None:
        ids = host.fetcher.topic_ids
        owned: dict[str, set[int]] = {}
        for tp in host.assigned:
            tid = ids.get(tp.topic)
            if tid is not None:
                owned.setdefault(tid, set()).add(tp.partition)
        with self._lock:
            self._owned = {t: frozenset(ps) for t, ps in owned.items()}
            # Acknowledge at once: another member may be waiting for what we released.
            self._beat_now = True
        self._wake.set()

    def _lose_all(self, host: MembershipHost) -> Step[None]:
        lost = set(host.assigned)
        log.warning(
            "partitions_lost",
            group=self.group_id,
            member_id=self.member_id,
            partitions=sorted(str(tp) for tp in lost),
        )
        # No commit: another member may own these partitions already.
        host.set_assignment([])
        if lost:
            yield from host.call_listener("on_partitions_revoked", lost)
        with self._lock:
            self._owned = {}
            self._fenced = False
            self._target = None
            self._subscription_sent = None
            self._beat_now = True
        self._wake.set()

    # ------------------------------------------------------------------ heartbeats

    def start_heartbeats(self) -> None:
        self._heartbeats.start(self._heartbeat_loop)

    def stop_heartbeats(self) -> None:
        self._heartbeats.stop(wake=self._wake)

    def _next_heartbeat(self) -> wire.MemberHeartbeat:
        """Under the lock: the heartbeat to send now (full fields when joining or after the
        subscription changed, as KIP-848 asks)."""
        joining = self.member_epoch == 0
        full = joining or self._subscription_sent is None
        return wire.MemberHeartbeat(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.member_epoch,
            instance_id=self._instance_id if joining else None,
            rack_id=self._rack if joining else None,
            rebalance_timeout_ms=int(self._config["max_poll_interval_ms"]) if joining else None,
            # Names and regex are separate fields the coordinator keeps until changed: a
            # switch from one to the other empties the other ("" is no regex).
            subscribed_topics=(self._topics or ()) if full else None,
            subscribed_regex=(self._regex or ("" if self._regex_sent else None)) if full else None,
            server_assignor=self._assignor if joining else None,
            owned=dict(self._owned),
        )

    def _heartbeat_loop(self, stop: Signal) -> Step[None]:
        max_poll = self._config["max_poll_interval_ms"] / 1000
        next_at = 0.0
        while not stop.is_set():
            with self._lock:
                # Cleared before looking, so a change made after the look wakes the wait.
                self._wake.clear()
                fenced = self._fenced
                wait = 0.0 if self._beat_now else next_at - time.monotonic()
            if stop.is_set():
                return
            if fenced:
                # Wait for the poll strand to drop the lost partitions before rejoining.
                yield WaitSignal(self._wake, 0.1)
                continue
            if wait > 0:
                yield WaitSignal(self._wake, wait)
                continue
            with self._lock:
                self._beat_now = False
                hb = self._next_heartbeat()
                subscription = (self._topics, self._regex)
            if time.monotonic() - self._last_poll > max_poll:
                log.warning(
                    "max_poll_interval_exceeded",
                    group=self.group_id,
                    max_poll_interval_ms=self._config["max_poll_interval_ms"],
                )
                yield from self._send_leave()
                with self._lock:
                    self._fenced = True  # the partitions are lost; poll() rejoins
                    self.member_epoch = 0
                return
            next_at = time.monotonic() + (yield from self._beat(hb, subscription))
            with self._lock:
                if self._fatal is not None:
                    # Retrying cannot help (a missing assignor, no ACL): stop for good, as
                    # Java's FATAL member state does, instead of asking again every second.
                    return

    def _beat(
        self,
        hb: wire.MemberHeartbeat,
        subscription: tuple[tuple[str, ...] | None, str | None],
    ) -> Step[float]:
        """Send one heartbeat and apply the answer; the seconds until the next one."""
        node = self.link.node
        if node is None:
            try:
                node = yield from self.link.ensure(time.monotonic() + self._timeout_s())
            except kerrors.KafkaError as exc:
                if not exc.retriable:
                    with self._lock:
                        self._set_fatal(exc)
                log.debug("coordinator_lookup_failed", group=self.group_id, error=repr(exc))
                return _FIRST_INTERVAL_S
        req = wire.consumer_group_heartbeat_request(hb)
        try:
            resp = yield from request(self._client, node, req, self._timeout_s())
        except kerrors.KafkaError as exc:
            log.debug("heartbeat_failed", group=self.group_id, error=repr(exc))
            self.coordinator_dead()
            return _FIRST_INTERVAL_S
        self.heartbeats_sent += 1
        answer = wire.read_consumer_group_heartbeat(resp)
        err = answer.error
        with self._lock:
            if err is None:
                if answer.member_epoch is not None:
                    if answer.member_epoch != self.member_epoch:
                        log.info(
                            "member_epoch",
                            group=self.group_id,
                            member_id=self.member_id,
                            epoch=answer.member_epoch,
                        )
                    self.member_epoch = answer.member_epoch
                if hb.subscribed_topics is not None or hb.subscribed_regex is not None:
                    self._subscription_sent = subscription
                    self._regex_sent = self._regex_sent or bool(hb.subscribed_regex)
                if answer.assignment is not None:
                    self._target = dict(answer.assignment)
                self._interval_s = max(answer.heartbeat_interval_ms, 1) / 1000
                return self._interval_s
            if issubclass(err, COORDINATOR_ERRORS):
                self.coordinator_dead()
                return _FIRST_INTERVAL_S
            if issubclass(err, _FENCED_ERRORS):
                log.warning(
                    "member_fenced",
                    group=self.group_id,
                    member_id=self.member_id,
                    epoch=hb.member_epoch,
                    error=err.__name__,
                )
                self.member_epoch = 0
                self._fenced = True
                self._target = None
                return 0.0
            if err.retriable:
                return self._interval_s
            # UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION, UNRELEASED_INSTANCE_ID,
            # GROUP_MAX_SIZE_REACHED, authorization: the application has to act.
            self._set_fatal(err(f"group {self.group_id!r}: {answer.error_message or err.__name__}"))
            return 0.0

    def _set_fatal(self, error: kerrors.KafkaError) -> None:
        """Under the lock: the member stops for good; poll() raises ``error`` from now on."""
        log.error(
            "member_fatal",
            group=self.group_id,
            member_id=self.member_id,
            epoch=self.member_epoch,
            error=repr(error),
        )
        self._fatal = error
        # Not in the group any more: close() sends no leave, commits carry no member epoch.
        self.member_epoch = 0
        self._target = None

    def _send_leave(self) -> Step[None]:
        """Leave (epoch -1, or -2 for a static member), following the coordinator if it
        moved: a leave that misses it keeps the partitions from the others until the
        session times out."""
        with self._lock:
            epoch = self.member_epoch
        if epoch <= 0:
            return
        hb = wire.MemberHeartbeat(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            leave="dynamic" if self._instance_id is None else "static",
            instance_id=self._instance_id,
        )
        deadline = time.monotonic() + min(self._timeout_s(), 2.0)
        while True:
            try:
                resp = yield from self._call(wire.consumer_group_heartbeat_request(hb), deadline)
            except kerrors.KafkaError as exc:
                log.debug("leave_group_failed", group=self.group_id, error=repr(exc))
                return
            err = wire.read_consumer_group_heartbeat(resp).error
            if err is not None and issubclass(err, COORDINATOR_ERRORS):
                self.coordinator_dead()
                if time.monotonic() < deadline:
                    yield Sleep(_RETRY_S)
                    continue
            if err is None:
                log.info("group_left", group=self.group_id, member_id=self.member_id)
            else:
                log.debug("leave_group_failed", group=self.group_id, error=err.__name__)
            return

    def leave(self, reason: str = "the consumer is being closed") -> Step[None]:
        self.stop_heartbeats()
        yield from self._send_leave()
        with self._lock:
            self.member_epoch = 0
            self._in_group = False
            self._owned = {}
            self._target = None
            self._fenced = False
            self._subscription_sent = None

    # ------------------------------------------------------------------ offsets

    def fetch_committed(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> Step[dict[TopicPartition, EpochOffset | None]]:
        got = yield from self.fetch_committed_metadata(partitions, deadline)
        return {tp: None if g is None else g[0] for tp, g in got.items()}

    def fetch_committed_metadata(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> Step[dict[TopicPartition, tuple[EpochOffset, str] | None]]:
        """OffsetFetch v9 as this member at its current epoch (the coordinator refuses a
        stale one; asked again with the epoch the heartbeat thread learnt since)."""
        while True:
            with self._lock:
                member = self.member_id if self.member_epoch > 0 else None
                epoch = self.member_epoch if self.member_epoch > 0 else None
            req = wire.member_offset_fetch_request(self.group_id, partitions, member, epoch)
            try:
                resp = yield from self._call(req, deadline)
            except kerrors.KafkaError as exc:
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
                yield Sleep(_RETRY_S)
                continue
            top, parts = wire.read_member_offset_fetch(resp)
            errors = [top] if top is not None else []
            errors += [p.error for p in parts if p.error is not None]
            if not errors:
                return {
                    p.tp: None
                    if p.offset is None
                    else committed_position(p.offset, p.leader_epoch, p.metadata)
                    for p in parts
                }
            retriable = [e for e in errors if issubclass(e, _OFFSET_FETCH_RETRY)]
            if len(retriable) < len(errors):
                raise next(e for e in errors if e not in retriable)()
            if any(issubclass(e, COORDINATOR_ERRORS) for e in errors):
                self.coordinator_dead()
            if time.monotonic() >= deadline:
                raise retriable[0]()
            yield Sleep(_RETRY_S)

    def commit(
        self, offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], deadline: float
    ) -> Step[None]:
        """OffsetCommit v9 with ``committed_leader_epoch``, as this member at its epoch; v10
        (by topic id) when every position names its topic's incarnation."""
        if not offsets:
            return
        entries = [
            (tp, p.offset, p.leader_epoch, provenance_metadata(p, m))
            for tp, (p, m) in offsets.items()
        ]
        naming = CommitNaming(offsets, self.commits_by_topic_id)

        def sent_unanswered() -> None:
            self.own_commits.unanswered(offsets, time.monotonic())

        while True:
            with self._lock:
                epoch, in_group = self.member_epoch, self.member_epoch > 0
            errors: set[type[kerrors.KafkaError]] = set()
            refused: set[str] = set()
            for part, topic_ids in naming.requests(entries):
                if in_group:
                    req = wire.member_offset_commit_request(
                        self.group_id, part, self.member_id, epoch, topic_ids
                    )
                else:
                    # Not a member (yet): the coordinator takes it only while the group is
                    # empty.
                    req = wire.offset_commit_request(self.group_id, part, None, "", None, topic_ids)
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
                    member_epoch=epoch,
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
            if errors == {kerrors.StaleMemberEpochError}:
                with self._lock:
                    moved_on = self.member_epoch != epoch
                if moved_on and time.monotonic() < deadline:
                    continue
            if any(issubclass(e, (*_FENCED_ERRORS, kerrors.StaleMemberEpochError)) for e in errors):
                codes = sorted(int(e.errno) for e in errors)
                raise CommitFailedError(
                    f"group {self.group_id!r}: commit rejected ({codes}) at member epoch "
                    f"{epoch}; the partitions may have moved to another member"
                )
            raise min(errors, key=lambda e: int(e.errno))()
