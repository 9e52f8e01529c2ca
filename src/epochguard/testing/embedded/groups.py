"""The group coordinator of the embedded cluster: classic consumer groups and committed offsets.

Sans-IO: every call takes the current time in milliseconds and answers through return values
or, for the two requests a Kafka coordinator holds open (JoinGroup until the rebalance
completes, SyncGroup until the leader sends the assignment), through a callback invoked
exactly once. The handler layer (``handlers/_group_common.py``) turns callbacks into asyncio
futures and calls :meth:`GroupCoordinator.tick` from a loop timer; tests drive it directly.

The state machine follows Kafka's classic ``GroupCoordinator`` (Empty, PreparingRebalance,
CompletingRebalance, Stable): KIP-394 member ids for JoinGroup v4+, KIP-345 static members
(a restarted static member replaces its old member id and fences it), session expiry,
rebalance timeouts and generation/member checks on commits. It has no
``group.initial.rebalance.delay.ms``: a rebalance completes as soon as every member rejoined.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from epochguard._errors import ErrorCode
from epochguard._log import get_logger

log = get_logger("epochguard.testing.embedded.groups")


NO_GENERATION = -1
NO_MEMBER_ID = ""
MAX_OFFSET_METADATA = 4096

TopicPartition = tuple[str, int]


class GroupState(enum.Enum):
    """Kafka's names, as DescribeGroups and ListGroups report them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@attrs.frozen
class CommittedOffset:
    """One committed position. ``topic_id`` ties it to one incarnation of the topic."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    commit_timestamp_ms: int = -1
    topic_id: uuid.UUID | None = None


@attrs.frozen
class JoinRequest:
    group_id: str
    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = "/127.0.0.1"
    # JoinGroup v4+ (KIP-394): a new dynamic member first gets MEMBER_ID_REQUIRED.
    require_known_member_id: bool = True
    # JoinGroup v9+ (KIP-814): a returning static leader can be told to skip the assignment.
    supports_skip_assignment: bool = False


@attrs.frozen
class JoinMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@attrs.frozen
class JoinResult:
    error_code: int
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = NO_MEMBER_ID
    members: tuple[JoinMember, ...] = ()
    skip_assignment: bool = False


@attrs.frozen
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    assignments: tuple[tuple[str, bytes], ...] = ()
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None


@attrs.frozen
class SyncResult:
    error_code: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@attrs.frozen
class LeaveResult:
    member_id: str
    group_instance_id: str | None
    error_code: int


@attrs.frozen
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@attrs.frozen
class GroupDescription:
    group_id: str
    state: GroupState
    protocol_type: str
    protocol_name: str
    members: tuple[MemberDescription, ...]


JoinCallback = Callable[[JoinResult], None]
SyncCallback = Callable[[SyncResult], None]


@attrs.define(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    last_heartbeat_ms: int
    assignment: bytes = b""
    join_callback: JoinCallback | None = None
    sync_callback: SyncCallback | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_callback is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_callback is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def vote(self, candidates: set[str]) -> str:
        return next(name for name, _ in self.protocols if name in candidates)


@attrs.define(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = attrs.field(factory=dict)
    # KIP-394: member ids handed out with MEMBER_ID_REQUIRED -> expiry deadline (ms).
    pending_members: dict[str, int] = attrs.field(factory=dict)
    static_members: dict[str, str] = attrs.field(factory=dict)
    offsets: dict[TopicPartition, CommittedOffset] = attrs.field(factory=dict)
    # TxnOffsetCommit: producer id -> offsets committed when its transaction commits.
    pending_txn_offsets: dict[int, dict[TopicPartition, CommittedOffset]] = attrs.field(
        factory=dict
    )
    rebalance_deadline_ms: int = 0
    # Members of the current generation that have not sent SyncGroup yet, and until when
    # they may (Kafka's pending-sync timeout: the rebalance timeout).
    pending_sync: set[str] = attrs.field(factory=set)
    sync_deadline_ms: int = 0

    def is_static_member_fenced(self, instance_id: str | None, member_id: str) -> bool:
        if instance_id is None:
            return False
        current = self.static_members.get(instance_id)
        return current is not None and current != member_id

    def candidate_protocols(self, excluding: str | None = None) -> set[str] | None:
        """Protocols every other member supports; None when there is no other member."""
        out: set[str] | None = None
        for m in self.members.values():
            if m.member_id == excluding:
                continue
            names = set(m.protocol_names())
            out = names if out is None else out & names
        return out

    def supports(
        self, protocol_type: str, names: Sequence[str], member_id: str | None = None
    ) -> bool:
        if not protocol_type or not names:
            return False
        others = self.candidate_protocols(excluding=member_id)
        if others is None:
            return True
        return self.protocol_type == protocol_type and bool(others & set(names))

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        assert candidates, "members share no protocol"
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        best = max(votes.values())
        # Kafka breaks ties arbitrarily; the leader's preference order is deterministic.
        leader = self.members.get(self.leader_id or "")
        order = leader.protocol_names() if leader else sorted(votes)
        return next(p for p in order + sorted(votes) if votes.get(p) == best)


class GroupCoordinator:
    """Every consumer group of one cluster and its committed offsets.

    The cluster decides which broker answers for a group; this object is the shared state
    behind all of them (Kafka reloads the same state from ``__consumer_offsets`` when the
    coordinator moves).
    """

    def __init__(
        self,
        *,
        min_session_timeout_ms: int = 6000,
        max_session_timeout_ms: int = 1_800_000,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.groups: dict[str, Group] = {}
        self._new_id = member_id_factory or (lambda prefix: f"{prefix}-{uuid.uuid4()}")

    # -- JoinGroup -------------------------------------------------------------------------

    def join(self, req: JoinRequest, now_ms: int, respond: JoinCallback) -> None:
        """Handle JoinGroup; ``respond`` is called once, maybe only after a later call."""
        if not req.group_id:
            respond(JoinResult(ErrorCode.INVALID_GROUP_ID, member_id=req.member_id))
            return
        if not (
            self.min_session_timeout_ms <= req.session_timeout_ms <= self.max_session_timeout_ms
        ):
            respond(JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=req.member_id))
            return
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id != NO_MEMBER_ID:
                respond(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=req.member_id))
                return
            group = self.groups[req.group_id] = Group(req.group_id)
        if req.member_id == NO_MEMBER_ID:
            self._join_unknown_member(group, req, now_ms, respond)
        else:
            self._join_known_member(group, req, now_ms, respond)

    def _join_unknown_member(
        self, group: Group, req: JoinRequest, now_ms: int, respond: JoinCallback
    ) -> None:
        names = [n for n, _ in req.protocols]
        if not group.supports(req.protocol_type, names):
            respond(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        prefix = req.group_instance_id if req.group_instance_id else (req.client_id or "member")
        member_id = self._new_id(prefix)
        instance = req.group_instance_id
        if instance is not None and group.static_members.get(instance) in group.members:
            self._replace_static_member(group, instance, member_id, req, now_ms, respond)
        elif req.require_known_member_id and instance is None:
            group.pending_members[member_id] = now_ms + req.session_timeout_ms
            respond(JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id))
        else:
            self._add_member_and_rebalance(group, member_id, req, now_ms, respond)

    def _replace_static_member(
        self,
        group: Group,
        instance: str,
        member_id: str,
        req: JoinRequest,
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        """KIP-345: a restarted static member takes over its old identity (and assignment);
        the old member id is fenced. Like Kafka, a Stable group whose protocol choice does not
        change is not rebalanced: the member gets the current generation back."""
        old_id = group.static_members[instance]
        member = group.members.pop(old_id)
        log.info(
            "group_static_member_replaced",
            group=group.group_id,
            group_instance_id=instance,
            old_member_id=old_id,
            member_id=member_id,
        )
        self._fail_callbacks(member, ErrorCode.FENCED_INSTANCE_ID)
        old_leader = group.leader_id
        member.member_id = member_id
        group.members[member_id] = member
        group.static_members[instance] = member_id
        if group.leader_id == old_id:
            group.leader_id = member_id
        member.protocols = req.protocols
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id = req.client_id
        member.last_heartbeat_ms = now_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            member.join_callback = respond
            self._try_complete_join(group, now_ms)
            return
        if group.state is GroupState.COMPLETING_REBALANCE or (
            group.state is GroupState.STABLE and group.select_protocol() != group.protocol_name
        ):
            # Mid-rebalance the leader may already be assigning to the old member id, so
            # (like Kafka) start over rather than leave the new id without an assignment.
            member.join_callback = respond
            self._maybe_prepare_rebalance(group, now_ms, reason="static_member_protocols")
            self._try_complete_join(group, now_ms)
            return
        # KIP-814: from JoinGroup v9 the returning leader is told it leads but must not
        # reassign; older versions name the old leader id so it behaves as a follower.
        is_leader = group.leader_id == member_id
        skip = is_leader and req.supports_skip_assignment
        members: tuple[JoinMember, ...] = ()
        if skip:
            proto = group.protocol_name or ""
            members = tuple(
                JoinMember(m.member_id, m.group_instance_id, m.metadata_for(proto))
                for m in group.members.values()
            )
        leader = group.leader_id if skip else (old_leader if is_leader else group.leader_id)
        respond(
            JoinResult(
                ErrorCode.NONE,
                group.generation_id,
                group.protocol_type,
                group.protocol_name,
                leader or "",
                member_id,
                members,
                skip_assignment=skip,
            )
        )

    def _join_known_member(
        self, group: Group, req: JoinRequest, now_ms: int, respond: JoinCallback
    ) -> None:
        member_id = req.member_id
        names = [n for n, _ in req.protocols]
        if member_id in group.pending_members:
            if not group.supports(req.protocol_type, names):
                respond(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))
                return
            del group.pending_members[member_id]
            self._add_member_and_rebalance(group, member_id, req, now_ms, respond)
            return
        if group.is_static_member_fenced(req.group_instance_id, member_id):
            respond(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=member_id))
            return
        member = group.members.get(member_id)
        if member is None or group.state in (GroupState.EMPTY, GroupState.DEAD):
            respond(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id))
            return
        if not group.supports(req.protocol_type, names, member_id=member_id):
            respond(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))
            return
        same = member.protocols == req.protocols
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, req, now_ms, respond)
        elif group.state is GroupState.COMPLETING_REBALANCE and same:
            # A member that lost its JoinGroup response gets the same one again.
            respond(self._join_result(group, member))
        elif group.state is GroupState.STABLE and same and member_id != group.leader_id:
            respond(self._join_result(group, member, with_members=False))
        else:
            self._update_member_and_rebalance(group, member, req, now_ms, respond)

    def _join_result(
        self,
        group: Group,
        member: Member,
        with_members: bool = True,
    ) -> JoinResult:
        members: tuple[JoinMember, ...] = ()
        if with_members and member.member_id == group.leader_id:
            proto = group.protocol_name or ""
            members = tuple(
                JoinMember(m.member_id, m.group_instance_id, m.metadata_for(proto))
                for m in group.members.values()
            )
        return JoinResult(
            ErrorCode.NONE,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            member.member_id,
            members,
        )

    def _add_member_and_rebalance(
        self, group: Group, member_id: str, req: JoinRequest, now_ms: int, respond: JoinCallback
    ) -> None:
        member = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.session_timeout_ms,
            req.rebalance_timeout_ms,
            req.protocol_type,
            req.protocols,
            now_ms,
            join_callback=respond,
        )
        if not group.members:
            group.protocol_type = req.protocol_type
        group.members[member_id] = member
        if group.leader_id is None:
            group.leader_id = member_id
        if req.group_instance_id is not None:
            group.static_members[req.group_instance_id] = member_id
        log.info(
            "group_member_added",
            group=group.group_id,
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            protocols=member.protocol_names(),
        )
        self._maybe_prepare_rebalance(group, now_ms, reason="member_joined")
        self._try_complete_join(group, now_ms)

    def _update_member_and_rebalance(
        self, group: Group, member: Member, req: JoinRequest, now_ms: int, respond: JoinCallback
    ) -> None:
        same_protocols = member.protocols == req.protocols
        if member.join_callback is not None:
            # A retried JoinGroup supersedes the one still held; that one is told to retry.
            member.join_callback(
                JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member.member_id)
            )
        member.protocols = req.protocols
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.join_callback = respond
        member.last_heartbeat_ms = now_ms
        if group.state is not GroupState.PREPARING_REBALANCE:
            log.info(
                "group_member_rejoined",
                group=group.group_id,
                member_id=member.member_id,
                state=group.state.value,
                protocols_changed=not same_protocols,
            )
        self._maybe_prepare_rebalance(group, now_ms, reason="member_rejoined")
        self._try_complete_join(group, now_ms)

    def _maybe_prepare_rebalance(self, group: Group, now_ms: int, reason: str) -> None:
        if group.state not in (
            GroupState.EMPTY,
            GroupState.STABLE,
            GroupState.COMPLETING_REBALANCE,
        ):
            return
        if group.state is GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                m.assignment = b""
                if m.sync_callback is not None:
                    cb, m.sync_callback = m.sync_callback, None
                    cb(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline_ms = now_ms + timeout
        group.state = GroupState.PREPARING_REBALANCE
        group.pending_sync.clear()
        log.info(
            "group_rebalance_started",
            group=group.group_id,
            generation=group.generation_id,
            reason=reason,
            members=len(group.members),
        )

    def _try_complete_join(self, group: Group, now_ms: int) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        if group.pending_members or not all(m.awaiting_join for m in group.members.values()):
            return
        self._complete_join(group, now_ms)

    def _complete_join(self, group: Group, now_ms: int) -> None:
        for m in list(group.members.values()):
            if not m.awaiting_join and m.group_instance_id is None:
                log.info(
                    "group_member_removed",
                    group=group.group_id,
                    member_id=m.member_id,
                    reason="not_rejoined",
                )
                self._remove_member(group, m.member_id)
        joined = [m for m in group.members.values() if m.awaiting_join]
        if joined and group.leader_id not in {m.member_id for m in joined}:
            group.leader_id = joined[0].member_id
        elif group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.generation_id += 1
        # Static members that did not rejoin stay members (KIP-345) until their session ends.
        if group.members:
            group.protocol_name = group.select_protocol()
            group.state = GroupState.COMPLETING_REBALANCE
            group.pending_sync = set(group.members)
            group.sync_deadline_ms = now_ms + max(
                m.rebalance_timeout_ms for m in group.members.values()
            )
        else:
            group.protocol_type = None
            group.protocol_name = None
            group.leader_id = None
            group.state = GroupState.EMPTY
        log.info(
            "group_join_completed",
            group=group.group_id,
            generation=group.generation_id,
            protocol=group.protocol_name,
            leader=group.leader_id,
            members=sorted(group.members),
        )
        for m in joined:
            cb, m.join_callback = m.join_callback, None
            m.last_heartbeat_ms = now_ms
            assert cb is not None
            cb(self._join_result(group, m))

    # -- SyncGroup -------------------------------------------------------------------------

    def sync(self, req: SyncRequest, now_ms: int, respond: SyncCallback) -> None:
        group = self.groups.get(req.group_id)
        if group is None:
            respond(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            return
        if group.is_static_member_fenced(req.group_instance_id, req.member_id):
            respond(SyncResult(ErrorCode.FENCED_INSTANCE_ID))
            return
        member = group.members.get(req.member_id)
        if member is None:
            respond(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            return
        if req.generation_id != group.generation_id:
            respond(SyncResult(ErrorCode.ILLEGAL_GENERATION))
            return
        if (req.protocol_type is not None and req.protocol_type != group.protocol_type) or (
            req.protocol_name is not None and req.protocol_name != group.protocol_name
        ):
            respond(SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        if group.state is GroupState.PREPARING_REBALANCE:
            respond(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
            return
        if group.state is GroupState.STABLE:
            member.last_heartbeat_ms = now_ms
            group.pending_sync.discard(member.member_id)
            respond(
                SyncResult(
                    ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
                )
            )
            return
        if group.state is not GroupState.COMPLETING_REBALANCE:
            respond(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            return
        if member.sync_callback is not None:
            member.sync_callback(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_callback = respond
        member.last_heartbeat_ms = now_ms
        group.pending_sync.discard(member.member_id)
        if req.member_id != group.leader_id:
            return
        given = dict(req.assignments)
        for m in group.members.values():
            m.assignment = given.get(m.member_id, b"")
        group.state = GroupState.STABLE
        log.info(
            "group_stable",
            group=group.group_id,
            generation=group.generation_id,
            protocol=group.protocol_name,
            members=sorted(group.members),
        )
        for m in group.members.values():
            m.last_heartbeat_ms = now_ms
            if m.sync_callback is not None:
                cb, m.sync_callback = m.sync_callback, None
                cb(
                    SyncResult(
                        ErrorCode.NONE, group.protocol_type, group.protocol_name, m.assignment
                    )
                )

    # -- Heartbeat -------------------------------------------------------------------------

    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        now_ms: int,
    ) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.is_static_member_fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None or group.state is GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member.last_heartbeat_ms = now_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    # -- LeaveGroup ------------------------------------------------------------------------

    def leave(
        self,
        group_id: str,
        members: Iterable[tuple[str, str | None]],
        now_ms: int,
    ) -> list[LeaveResult]:
        """Remove ``(member_id, group_instance_id)`` pairs; a static member may be named by
        its instance id alone (member id ``""``), as the admin client does."""
        group = self.groups.get(group_id)
        out: list[LeaveResult] = []
        for member_id, instance in members:
            if group is None:
                out.append(LeaveResult(member_id, instance, ErrorCode.UNKNOWN_MEMBER_ID))
                continue
            if member_id == NO_MEMBER_ID and instance is not None:
                member_id = group.static_members.get(instance, NO_MEMBER_ID)
                if member_id == NO_MEMBER_ID:
                    out.append(LeaveResult(NO_MEMBER_ID, instance, ErrorCode.UNKNOWN_MEMBER_ID))
                    continue
            elif group.is_static_member_fenced(instance, member_id):
                out.append(LeaveResult(member_id, instance, ErrorCode.FENCED_INSTANCE_ID))
                continue
            if member_id in group.pending_members:
                del group.pending_members[member_id]
                self._try_complete_join(group, now_ms)
                out.append(LeaveResult(member_id, instance, ErrorCode.NONE))
                continue
            if member_id not in group.members:
                out.append(LeaveResult(member_id, instance, ErrorCode.UNKNOWN_MEMBER_ID))
                continue
            log.info("group_member_removed", group=group_id, member_id=member_id, reason="left")
            self._remove_member_and_update(group, member_id, now_ms)
            out.append(LeaveResult(member_id, instance, ErrorCode.NONE))
        return out

    # -- membership removal and timers -----------------------------------------------------

    @staticmethod
    def _fail_callbacks(member: Member, error: int) -> None:
        if member.join_callback is not None:
            cb, member.join_callback = member.join_callback, None
            cb(JoinResult(error, member_id=member.member_id))
        if member.sync_callback is not None:
            scb, member.sync_callback = member.sync_callback, None
            scb(SyncResult(error))

    def _remove_member(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id, None)
        if member is None:
            return
        group.pending_sync.discard(member_id)
        if (
            member.group_instance_id is not None
            and group.static_members.get(member.group_instance_id) == member_id
        ):
            del group.static_members[member.group_instance_id]
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)

    def _remove_member_and_update(self, group: Group, member_id: str, now_ms: int) -> None:
        member = group.members.get(member_id)
        if member is None:
            return
        self._fail_callbacks(member, ErrorCode.UNKNOWN_MEMBER_ID)
        self._remove_member(group, member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, now_ms, reason="member_removed")
        self._try_complete_join(group, now_ms)

    def tick(self, now_ms: int) -> None:
        """Expire sessions, pending member ids and rebalance timeouts due at ``now_ms``."""
        for group in list(self.groups.values()):
            for pid, deadline in list(group.pending_members.items()):
                if deadline <= now_ms:
                    del group.pending_members[pid]
                    log.info("group_pending_member_expired", group=group.group_id, member_id=pid)
                    self._try_complete_join(group, now_ms)
            for m in list(group.members.values()):
                if m.awaiting_join or m.awaiting_sync:
                    continue
                if m.last_heartbeat_ms + m.session_timeout_ms <= now_ms:
                    log.info(
                        "group_member_removed",
                        group=group.group_id,
                        member_id=m.member_id,
                        reason="session_timeout",
                    )
                    self._remove_member_and_update(group, m.member_id, now_ms)
            if (
                group.state is GroupState.PREPARING_REBALANCE
                and group.rebalance_deadline_ms <= now_ms
            ):
                group.pending_members.clear()
                self._complete_join(group, now_ms)
            if (
                group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
                and group.pending_sync
                and group.sync_deadline_ms <= now_ms
            ):
                late, group.pending_sync = group.pending_sync, set()
                for mid in sorted(late):
                    if mid in group.members:
                        log.info(
                            "group_member_removed",
                            group=group.group_id,
                            member_id=mid,
                            reason="sync_timeout",
                        )
                        self._remove_member_and_update(group, mid, now_ms)

    # -- offsets ---------------------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, CommittedOffset],
        now_ms: int,
        api_version: int = 8,
    ) -> dict[TopicPartition, int]:
        """Store ``offsets``; returns an error code per partition (Kafka's checks)."""
        error = self._commit_error(
            group_id, generation_id, member_id, group_instance_id, now_ms, api_version
        )
        out: dict[TopicPartition, int] = {}
        group = self.groups.get(group_id)
        for tp, committed in offsets.items():
            if error:
                out[tp] = error
            elif committed.metadata is not None and len(committed.metadata) > MAX_OFFSET_METADATA:
                out[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                assert group is not None
                group.offsets[tp] = committed
                out[tp] = ErrorCode.NONE
        return out

    def _commit_error(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        now_ms: int,
        api_version: int = 8,
    ) -> int:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # Kafka's OffsetMetadataManager.validateOffsetCommit: OffsetCommit v9+ names
                # the missing group, older versions the generation.
                return (
                    ErrorCode.GROUP_ID_NOT_FOUND
                    if api_version >= 9
                    else ErrorCode.ILLEGAL_GENERATION
                )
            # A "simple" consumer (assign() plus commits) uses Kafka only to store offsets.
            self.groups[group_id] = Group(group_id)
            return ErrorCode.NONE
        if group.is_static_member_fenced(group_instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return ErrorCode.NONE
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member.last_heartbeat_ms = now_ms
        return ErrorCode.NONE

    def txn_commit_offsets(
        self,
        group_id: str,
        producer_id: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> dict[TopicPartition, int]:
        """TxnOffsetCommit: hold ``offsets`` until the producer's transaction ends.

        KIP-447 fencing as Kafka's ``validateOffsetCommit`` for transactional commits: a
        request with a generation, a member id or an instance id must come from a current
        member of the current generation; one without any (the producer was given only the
        group id) is accepted in any state.
        """
        error = self._txn_commit_error(group_id, generation_id, member_id, group_instance_id)
        out: dict[TopicPartition, int] = {}
        for tp, committed in offsets.items():
            if error:
                out[tp] = error
            elif committed.metadata is not None and len(committed.metadata) > MAX_OFFSET_METADATA:
                out[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                group = self.groups[group_id]
                group.pending_txn_offsets.setdefault(producer_id, {})[tp] = committed
                out[tp] = ErrorCode.NONE
        return out

    def _txn_commit_error(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> int:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return ErrorCode.ILLEGAL_GENERATION
            self.groups[group_id] = Group(group_id)
            return ErrorCode.NONE
        if group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return ErrorCode.NONE
        if generation_id >= 0 or member_id or group_instance_id is not None:
            if group.is_static_member_fenced(group_instance_id, member_id):
                return ErrorCode.FENCED_INSTANCE_ID
            if member_id not in group.members:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def end_transaction(self, group_id: str, producer_id: int, commit: bool) -> None:
        """The COMMIT or ABORT marker of ``producer_id``'s transaction reached the group."""
        group = self.groups.get(group_id)
        if group is None:
            return
        pending = group.pending_txn_offsets.pop(producer_id, {})
        if commit:
            group.offsets.update(pending)

    def has_pending_txn_offset(self, group_id: str, tp: TopicPartition) -> bool:
        """A transaction holds an uncommitted offset of ``tp`` (KIP-447 ``require_stable``)."""
        group = self.groups.get(group_id)
        return group is not None and any(tp in o for o in group.pending_txn_offsets.values())

    def fetch_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None,
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of ``partitions`` (all of the group's when None); partitions
        without a commit are absent."""
        group = self.groups.get(group_id)
        if group is None:
            return {}
        if partitions is None:
            return dict(group.offsets)
        return {tp: group.offsets[tp] for tp in partitions if tp in group.offsets}

    def topic_deleted(self, topic: str) -> None:
        """Drop every group's offsets of ``topic`` (Kafka does when a topic is deleted)."""
        for group in self.groups.values():
            for tp in [tp for tp in group.offsets if tp[0] == topic]:
                del group.offsets[tp]

    def delete_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
    ) -> tuple[int, dict[TopicPartition, int]]:
        """OffsetDelete: drop commits unless an active member subscribes to the topic."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        subscribed: set[str] = set()
        if group.state is not GroupState.EMPTY and group.protocol_type == "consumer":
            for m in group.members.values():
                subscribed |= consumer_subscription(m.metadata_for(group.protocol_name or ""))
        out: dict[TopicPartition, int] = {}
        for tp in partitions:
            if tp[0] in subscribed:
                out[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                group.offsets.pop(tp, None)
                out[tp] = ErrorCode.NONE
        return ErrorCode.NONE, out

    def delete_group(self, group_id: str) -> int:
        """DeleteGroups: only a group without members can go (with its offsets)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members or group.state is not GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        del self.groups[group_id]
        log.info("group_deleted", group=group_id)
        return ErrorCode.NONE

    # -- admin -----------------------------------------------------------------------------

    def describe(self, group_id: str) -> GroupDescription | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        # Like Kafka, metadata, assignments and the protocol only for a Stable group.
        stable = group.state is GroupState.STABLE
        proto = group.protocol_name or ""
        members = tuple(
            MemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(proto) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupDescription(
            group.group_id, group.state, group.protocol_type or "", proto if stable else "", members
        )

    def list_groups(self) -> list[GroupDescription]:
        out = []
        for gid in sorted(self.groups):
            d = self.describe(gid)
            if d is not None:
                out.append(d)
        return out


def consumer_subscription(metadata: bytes) -> set[str]:
    """Topics of a ``consumer`` protocol subscription (every version starts with
    ``int16 version, array of string topics``); empty when it cannot be parsed."""
    try:
        pos = 2
        count = int.from_bytes(metadata[pos : pos + 4], "big", signed=True)
        pos += 4
        topics = set()
        for _ in range(max(count, 0)):
            n = int.from_bytes(metadata[pos : pos + 2], "big", signed=True)
            pos += 2
            if n < 0 or pos + n > len(metadata):
                return set()
            topics.add(metadata[pos : pos + n].decode())
            pos += n
        return topics
    except (UnicodeDecodeError, ValueError):
        return set()
