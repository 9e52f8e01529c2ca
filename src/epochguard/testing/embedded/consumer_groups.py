"""KIP-848 consumer groups of the embedded cluster (``group.protocol=consumer``).

Sans-IO like ``groups.py`` (the classic coordinator, which this module does not touch): every
call takes the time in milliseconds, and the handlers (``handlers/consumer_group_*.py``)
call :meth:`ConsumerGroupCoordinator.tick` from a loop timer. The rules follow Kafka's
``GroupMetadataManager`` / ``ConsumerGroup`` / ``CurrentAssignmentBuilder``:

- a **group epoch** is bumped whenever what the assignment depends on changes (members,
  their subscriptions or assignor, the partitions of the subscribed topics); the server-side
  assignor then computes a **target assignment** for that epoch (the assignment epoch);
- each member converges on its target one step per heartbeat: partitions it must give up
  are **revoked** first, keeping its old member epoch (state ``UNREVOKED_PARTITIONS``) until
  a heartbeat's owned partitions no longer hold them; then it moves to the new epoch and is
  given those of its new partitions that no other member still owns
  (``UNRELEASED_PARTITIONS`` until the rest are released), so a partition never has two
  owners;
- a heartbeat with an epoch the member does not have is FENCED_MEMBER_EPOCH (the member's
  previous epoch is accepted when its owned partitions are a subset of its assignment: the
  answer that moved it on was lost), an unknown member id UNKNOWN_MEMBER_ID;
- epoch -1 leaves; -2 leaves a static member's assignment in place until its session
  expires, and the same ``instance_id`` joining again takes it over without a rebalance;
- a member that does not heartbeat for the session timeout, or does not revoke within its
  rebalance timeout, is removed.

Subscriptions are topic names and/or a regex (their union; an empty regex is none) matched
against whole topic names, as Kafka does with RE2/J: constructs RE2 does not have
(look-around, back-references, possessive or atomic groups) are INVALID_REGULAR_EXPRESSION,
not Python semantics. Kafka resolves regexes in the background; here they are resolved on
every heartbeat.

Committed offsets of these groups live here, checked by member id and member epoch
(OffsetCommit v9+: STALE_MEMBER_EPOCH for another epoch, UNSUPPORTED_VERSION below v9).
"""

from __future__ import annotations

import enum
import re
import uuid
import weakref
from collections.abc import Iterable, Mapping

import attrs

from epochguard._errors import ErrorCode
from epochguard._log import get_logger
from epochguard.testing.embedded.groups import MAX_OFFSET_METADATA, CommittedOffset

__all__ = [
    "ASSIGNORS",
    "ConsumerGroup",
    "ConsumerGroupCoordinator",
    "GroupDescription",
    "HeartbeatRequest",
    "HeartbeatResult",
    "MemberState",
    "TopicInfo",
    "consumer_coordinator",
]

log = get_logger("epochguard.testing.embedded.consumer_groups")

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

TopicPartition = tuple[str, int]
#: A partition as assignments name it: (topic id, partition).
IdPartition = tuple[uuid.UUID, int]


@attrs.frozen
class TopicInfo:
    topic_id: uuid.UUID
    partitions: int


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@attrs.frozen
class HeartbeatRequest:
    """A decoded ConsumerGroupHeartbeat, wire values as they came (``None``: unchanged)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: frozenset[IdPartition] | None = None
    client_id: str = ""
    client_host: str = ""
    version: int = 1


@attrs.frozen
class HeartbeatResult:
    error: int
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = LEAVE_EPOCH
    heartbeat_interval_ms: int = 0
    #: ``None``: not sent (unchanged).
    assignment: frozenset[IdPartition] | None = None


@attrs.define(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed_names: tuple[str, ...] = ()
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: set[IdPartition] = attrs.field(factory=set)
    revoking: set[IdPartition] = attrs.field(factory=set)
    session_deadline_ms: int = 0
    revoke_deadline_ms: int = 0
    #: The assignment last sent, so that an unchanged one is not sent again.
    sent: frozenset[IdPartition] | None = None


@attrs.define(eq=False)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Member] = attrs.field(factory=dict)
    #: instance id -> member id of static members.
    static_members: dict[str, str] = attrs.field(factory=dict)
    target: dict[str, frozenset[IdPartition]] = attrs.field(factory=dict)
    #: What the current target assignment was computed from (topics and partition counts).
    subscription_metadata: frozenset[tuple[str, uuid.UUID, int]] = frozenset()
    assignor: str = ""
    offsets: dict[TopicPartition, CommittedOffset] = attrs.field(factory=dict)
    # TxnOffsetCommit: producer id -> offsets committed when its transaction commits.
    pending_txn_offsets: dict[int, dict[TopicPartition, CommittedOffset]] = attrs.field(
        factory=dict
    )

    def state(self) -> str:
        """Kafka's ``ConsumerGroup.ConsumerGroupState`` names."""
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(
            m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members.values()
        ):
            return "Reconciling"
        return "Stable"

    def owner_of(self, tp: IdPartition, excluding: str) -> str | None:
        for m in self.members.values():
            if m.member_id != excluding and (tp in m.assigned or tp in m.revoking):
                return m.member_id
        return None


@attrs.frozen
class MemberDescription:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: frozenset[IdPartition]
    target_assignment: frozenset[IdPartition]


@attrs.frozen
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]


# ------------------------------------------------------------------------------ assignors


def _range(
    members: Mapping[str, set[str]],
    topics: Mapping[str, TopicInfo],
    current: Mapping[str, frozenset[IdPartition]],
) -> dict[str, set[IdPartition]]:
    """Per topic, contiguous ranges over the subscribed members in member-id order (the
    classic RangeAssignor; Kafka's server-side one is also sticky, this one is not)."""
    out: dict[str, set[IdPartition]] = {m: set() for m in members}
    for name in sorted(topics):
        info = topics[name]
        subs = sorted(m for m, t in members.items() if name in t)
        if not subs:
            continue
        per, extra = divmod(info.partitions, len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = per + (1 if i < extra else 0)
            out[m].update((info.topic_id, p) for p in range(start, start + n))
            start += n
    return out


def _uniform(
    members: Mapping[str, set[str]],
    topics: Mapping[str, TopicInfo],
    current: Mapping[str, frozenset[IdPartition]],
) -> dict[str, set[IdPartition]]:
    """Balanced and sticky, like Kafka's UniformAssignor: a partition stays with its current
    owner while that owner is subscribed and under its share; the rest go, one at a time,
    to the subscribed member with the fewest partitions."""
    out: dict[str, set[IdPartition]] = {m: set() for m in members}
    if not members:
        return out
    by_id = {info.topic_id: name for name, info in topics.items()}
    all_parts = sorted(
        ((info.topic_id, p) for info in topics.values() for p in range(info.partitions)),
        key=lambda tp: (by_id[tp[0]], tp[1]),
    )
    eligible = {tp: [m for m in sorted(members) if by_id[tp[0]] in members[m]] for tp in all_parts}
    wanted = [tp for tp in all_parts if eligible[tp]]
    owners = {tp: m for m, parts in current.items() if m in members for tp in parts}
    # Shares differ by at most one; the larger shares go to the members that own the most
    # already, so that as little as possible moves.
    base, extra = divmod(len(wanted), len(members))
    held = {m: sum(1 for tp in wanted if owners.get(tp) == m) for m in members}
    order = sorted(members, key=lambda m: (-held[m], m))
    cap = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    left = []
    for tp in wanted:
        m = owners.get(tp)
        if m is not None and m in eligible[tp] and len(out[m]) < cap[m]:
            out[m].add(tp)
        else:
            left.append(tp)
    for tp in left:
        best = min(eligible[tp], key=lambda m: (len(out[m]) >= cap[m], len(out[m]), m))
        out[best].add(tp)
    return out


ASSIGNORS = {"uniform": _uniform, "range": _range}
DEFAULT_ASSIGNOR = "uniform"

# RE2/J (Kafka's regex engine for subscriptions) has no look-around, back-references,
# possessive quantifiers or atomic groups; Python's re has them, so they are refused here.
_NOT_RE2 = re.compile(r"\(\?(?:=|!|<=|<!|>|P=)|\\[1-9]|\\g<|[*+?}]\+")


def compile_subscription_regex(pattern: str) -> re.Pattern[str]:
    """The compiled regex, or ``ValueError`` naming what RE2/J would reject."""
    bad = _NOT_RE2.search(pattern)
    if bad is not None:
        raise ValueError(f"{bad.group(0)!r} is not supported by RE2/J")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(str(exc)) from None


# ---------------------------------------------------------------------------- coordinator


class ConsumerGroupCoordinator:
    """Every KIP-848 group of one cluster and their committed offsets."""

    def __init__(
        self,
        *,
        session_timeout_ms: int = 45_000,
        # Kafka's default is 5000 ms; 1000 keeps rebalances in tests short (a member learns
        # of partitions another member released at its next heartbeat).
        heartbeat_interval_ms: int = 1_000,
        max_group_size: int = 2**31 - 1,
    ) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_group_size = max_group_size
        self.groups: dict[str, ConsumerGroup] = {}
        #: Set by the handler layer once its session timer runs.
        self.ticking = False

    # -- heartbeat ---------------------------------------------------------------------------

    def heartbeat(
        self, req: HeartbeatRequest, topics: Mapping[str, TopicInfo], now_ms: int
    ) -> HeartbeatResult:
        try:
            return self._heartbeat(req, topics, now_ms)
        except _Refused as refused:
            return HeartbeatResult(refused.code, refused.message)

    def _heartbeat(
        self, req: HeartbeatRequest, topics: Mapping[str, TopicInfo], now_ms: int
    ) -> HeartbeatResult:
        self._validate(req)
        group = self.groups.get(req.group_id)
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, req, topics, now_ms)
        if group is None:
            if req.member_epoch != JOIN_EPOCH:
                raise _Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"group {req.group_id} is empty")
            group = self.groups[req.group_id] = ConsumerGroup(req.group_id)
        if group.group_epoch == 0:
            # Kafka 4.3.1 starts a group at epoch 1 (measured: a first member without a
            # subscription is answered with epoch 1, one with topics with 2 after a single
            # logged bump), so a member epoch is never the join epoch 0 once joined.
            group.group_epoch = 1
        epoch_before = group.group_epoch
        member = self._member_for(group, req, now_ms)
        member.session_deadline_ms = now_ms + self.session_timeout_ms
        changed = self._update_member(member, req)
        # One bump per heartbeat at most, and only when what the assignment depends on
        # changed (a subscription, an assignor, a rack, the topics): a member joining with
        # no subscription does not move the group epoch (Kafka 4.3.1 answers it at the
        # current one).
        group.group_epoch = epoch_before
        self._refresh_target(group, topics, bump=changed)
        self._reconcile(group, member, req.owned, now_ms)
        assignment: frozenset[IdPartition] | None = None
        current = frozenset(member.assigned)
        full = req.member_epoch == JOIN_EPOCH or req.owned is not None
        if member.sent != current or (full and req.owned != current):
            assignment = current
            member.sent = current
        return HeartbeatResult(
            ErrorCode.NONE,
            None,
            member.member_id,
            member.member_epoch,
            self.heartbeat_interval_ms,
            assignment,
        )

    def _validate(self, req: HeartbeatRequest) -> None:
        if not req.group_id:
            raise _Refused(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
        if req.version >= 1 and not req.member_id:
            raise _Refused(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
        if req.member_epoch < STATIC_LEAVE_EPOCH:
            raise _Refused(ErrorCode.INVALID_REQUEST, f"MemberEpoch {req.member_epoch} is invalid")
        if req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
            raise _Refused(ErrorCode.INVALID_REQUEST, "InstanceId can't be null with epoch -2.")
        if req.member_epoch == JOIN_EPOCH:
            if req.rebalance_timeout_ms < 0:
                raise _Refused(ErrorCode.INVALID_REQUEST, "RebalanceTimeoutMs must be provided.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                raise _Refused(
                    ErrorCode.INVALID_REQUEST,
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                )
        if req.subscribed_topic_regex:
            try:
                compile_subscription_regex(req.subscribed_topic_regex)
            except ValueError as exc:
                raise _Refused(
                    ErrorCode.INVALID_REGULAR_EXPRESSION,
                    f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is not a valid "
                    f"regular expression: {exc}.",
                ) from None
        if req.server_assignor is not None and req.server_assignor not in ASSIGNORS:
            raise _Refused(
                ErrorCode.UNSUPPORTED_ASSIGNOR,
                f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                f"{', '.join(sorted(ASSIGNORS))}.",
            )

    def _member_for(self, group: ConsumerGroup, req: HeartbeatRequest, now_ms: int) -> Member:
        member_id = req.member_id or f"{req.client_id or 'member'}-{uuid.uuid4()}"
        if req.member_epoch == JOIN_EPOCH:
            return self._join(group, req, member_id, now_ms)
        member = group.members.get(member_id)
        if member is None:
            raise _Refused(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {member_id} is not a member of group {group.group_id}.",
            )
        if req.instance_id is not None and group.static_members.get(req.instance_id) not in (
            None,
            member_id,
        ):
            raise _Refused(
                ErrorCode.FENCED_INSTANCE_ID, f"Static member {req.instance_id} was replaced."
            )
        epoch = req.member_epoch
        if epoch != member.member_epoch:
            lost_answer = (
                epoch == member.previous_member_epoch
                and req.owned is not None
                and req.owned <= member.assigned
            )
            if not lost_answer:
                raise _Refused(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The consumer group member has a member epoch ({epoch}) different from the"
                    f" one known by the group coordinator ({member.member_epoch}).",
                )
        return member

    def _join(
        self, group: ConsumerGroup, req: HeartbeatRequest, member_id: str, now_ms: int
    ) -> Member:
        if req.instance_id is not None:
            old_id = group.static_members.get(req.instance_id)
            old = None if old_id is None else group.members.get(old_id)
            if old is not None:
                if old.member_epoch != STATIC_LEAVE_EPOCH and old_id != member_id:
                    raise _Refused(
                        ErrorCode.UNRELEASED_INSTANCE_ID,
                        f"Static member {old_id} with instance id {req.instance_id} is present"
                        " in the consumer group.",
                    )
                # The static member is back: it takes over its old assignment and epoch; the
                # group epoch does not move (no rebalance for a restart within the session).
                del group.members[old.member_id]
                old.member_id = member_id
                # Its epoch from before the static leave (kept in previous_member_epoch).
                old.member_epoch = old.previous_member_epoch
                old.previous_member_epoch = -1
                old.sent = None
                group.members[member_id] = old
                group.static_members[req.instance_id] = member_id
                group.target[member_id] = group.target.pop(old_id or "", frozenset())
                log.info("consumer_group_static_member_rejoined", group=group.group_id)
                return old
        existing = group.members.pop(member_id, None)
        if existing is not None:
            # A join with a known id: the member lost its state (fenced, or the answer to
            # its join was lost); it owns nothing now.
            group.target.pop(member_id, None)
        elif len(group.members) >= self.max_group_size:
            raise _Refused(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of "
                f"{self.max_group_size} members.",
            )
        member = Member(
            member_id,
            req.instance_id,
            req.rack_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
        )
        group.members[member_id] = member
        if req.instance_id is not None:
            group.static_members[req.instance_id] = member_id
        group.group_epoch += 1
        log.info(
            "consumer_group_member_joined",
            group=group.group_id,
            member_id=member_id,
            group_epoch=group.group_epoch,
        )
        return member

    @staticmethod
    def _update_member(member: Member, req: HeartbeatRequest) -> bool:
        """Apply the fields the heartbeat changed; True when the assignment depends on one."""
        changed = False
        if req.rack_id is not None and req.rack_id != member.rack_id:
            member.rack_id = req.rack_id
            changed = True
        if req.rebalance_timeout_ms >= 0:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        # Names and regex are two fields, each kept until a heartbeat changes it; the
        # member subscribes to their union (Kafka's ConsumerGroupMember). librdkafka sends
        # names with an empty regex on every heartbeat: "" adds nothing.
        if req.subscribed_topic_names is not None:
            names = tuple(sorted(set(req.subscribed_topic_names)))
            if names != member.subscribed_names:
                member.subscribed_names = names
                changed = True
        regex = req.subscribed_topic_regex
        if regex is not None and regex != (member.subscribed_regex or ""):
            member.subscribed_regex = regex or None
            changed = True
        if req.server_assignor is not None and req.server_assignor != member.server_assignor:
            member.server_assignor = req.server_assignor
            changed = True
        return changed

    @staticmethod
    def _subscribed(member: Member, topics: Mapping[str, TopicInfo]) -> set[str]:
        out = {t for t in member.subscribed_names if t in topics}
        if member.subscribed_regex:
            pattern = compile_subscription_regex(member.subscribed_regex)
            out.update(t for t in topics if pattern.fullmatch(t))
        return out

    def _refresh_target(
        self, group: ConsumerGroup, topics: Mapping[str, TopicInfo], bump: bool
    ) -> None:
        """Bump the group epoch if the assignment's inputs changed, then compute the target
        assignment for the new epoch."""
        subs = {m.member_id: self._subscribed(m, topics) for m in group.members.values()}
        used = set().union(*subs.values()) if subs else set()
        metadata = frozenset((t, topics[t].topic_id, topics[t].partitions) for t in used)
        if metadata != group.subscription_metadata:
            group.subscription_metadata = metadata
            bump = True
        if bump:
            group.group_epoch += 1
        if group.group_epoch <= group.assignment_epoch:
            return
        votes: dict[str, int] = {}
        for m in group.members.values():
            if m.server_assignor is not None:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        group.assignor = max(sorted(votes), key=lambda a: votes[a]) if votes else DEFAULT_ASSIGNOR
        used_topics = {t: topics[t] for t in used}
        target = ASSIGNORS[group.assignor](subs, used_topics, group.target)
        group.target = {m: frozenset(parts) for m, parts in target.items()}
        group.assignment_epoch = group.group_epoch
        log.info(
            "consumer_group_target_assignment",
            group=group.group_id,
            epoch=group.assignment_epoch,
            assignor=group.assignor,
            members=len(group.members),
        )

    def _reconcile(
        self,
        group: ConsumerGroup,
        member: Member,
        owned: frozenset[IdPartition] | None,
        now_ms: int,
    ) -> None:
        """One step of the member towards its target (Kafka's CurrentAssignmentBuilder)."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or owned & member.revoking:
                return  # still revoking
            member.revoking = set()
            member.state = MemberState.STABLE
        target = group.target.get(member.member_id, frozenset())
        epoch = group.assignment_epoch
        if member.member_epoch == epoch and member.state is MemberState.STABLE:
            return
        kept = member.assigned & target
        revoke = member.assigned - target
        if revoke:
            member.assigned = set(kept)
            member.revoking = set(revoke)
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.revoke_deadline_ms = now_ms + max(member.rebalance_timeout_ms, 0)
            return
        free = {tp for tp in target - kept if group.owner_of(tp, member.member_id) is None}
        if member.member_epoch != epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = epoch
        member.assigned = set(kept) | free
        member.state = (
            MemberState.UNRELEASED_PARTITIONS if target - member.assigned else MemberState.STABLE
        )

    def _leave(
        self,
        group: ConsumerGroup | None,
        req: HeartbeatRequest,
        topics: Mapping[str, TopicInfo],
        now_ms: int,
    ) -> HeartbeatResult:
        member_id = req.member_id
        if req.instance_id is not None and group is not None:
            member_id = group.static_members.get(req.instance_id, member_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            raise _Refused(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {req.member_id} is not a member of group {req.group_id}.",
            )
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            # Kept, assignment and all, until its session runs out or it comes back.
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = STATIC_LEAVE_EPOCH
            member.session_deadline_ms = now_ms + self.session_timeout_ms
            log.info("consumer_group_static_member_left", group=group.group_id)
            return HeartbeatResult(
                ErrorCode.NONE, None, req.member_id, STATIC_LEAVE_EPOCH, self.heartbeat_interval_ms
            )
        self._remove(group, member, topics, "left")
        return HeartbeatResult(
            ErrorCode.NONE, None, req.member_id, LEAVE_EPOCH, self.heartbeat_interval_ms
        )

    def _remove(
        self,
        group: ConsumerGroup,
        member: Member,
        topics: Mapping[str, TopicInfo] | None,
        reason: str,
    ) -> None:
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        instance = member.instance_id
        if instance is not None and group.static_members.get(instance) == member.member_id:
            del group.static_members[instance]
        group.group_epoch += 1
        if topics is not None:
            self._refresh_target(group, topics, bump=False)
        log.info(
            "consumer_group_member_removed",
            group=group.group_id,
            member_id=member.member_id,
            reason=reason,
            group_epoch=group.group_epoch,
        )

    def tick(self, now_ms: int, topics: Mapping[str, TopicInfo]) -> None:
        """Expire sessions and revocations that ran past their rebalance timeout."""
        for group in list(self.groups.values()):
            for m in list(group.members.values()):
                if m.session_deadline_ms <= now_ms:
                    self._remove(group, m, topics, "session_timeout")
                elif m.state is MemberState.UNREVOKED_PARTITIONS and m.revoke_deadline_ms <= now_ms:
                    self._remove(group, m, topics, "rebalance_timeout")

    # -- offsets ---------------------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        member_epoch: int,
        member_id: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
        now_ms: int,
        version: int,
    ) -> dict[TopicPartition, int]:
        group = self.groups[group_id]
        error = self._commit_error(group, member_epoch, member_id, now_ms, version)
        out: dict[TopicPartition, int] = {}
        for tp, committed in offsets.items():
            if error:
                out[tp] = error
            elif committed.metadata is not None and len(committed.metadata) > MAX_OFFSET_METADATA:
                out[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                group.offsets[tp] = committed
                out[tp] = ErrorCode.NONE
        return out

    @staticmethod
    def _commit_error(
        group: ConsumerGroup, member_epoch: int, member_id: str, now_ms: int, version: int
    ) -> int:
        # ConsumerGroup.validateOffsetCommit: -1 from an admin or assign() user, if empty.
        if member_epoch < 0 and not group.members:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def txn_commit_offsets(
        self,
        group_id: str,
        producer_id: int,
        member_epoch: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> dict[TopicPartition, int]:
        """TxnOffsetCommit: hold ``offsets`` until the producer's transaction ends.

        As Kafka's ``ConsumerGroup.validateOffsetCommit`` for transactional commits: with
        no member id, epoch or instance id (the producer was given the group id alone) any
        state is accepted; otherwise the member must exist and have that epoch (the
        generation of its group metadata), else UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION."""
        group = self.groups[group_id]
        error = ErrorCode.NONE
        anonymous = member_epoch < 0 and not member_id and group_instance_id is None
        if not (member_epoch < 0 and not group.members) and not anonymous:
            member = group.members.get(member_id)
            if member is None:
                error = ErrorCode.UNKNOWN_MEMBER_ID
            elif member_epoch != member.member_epoch:
                # STALE_MEMBER_EPOCH is not among TxnOffsetCommit's errors: Kafka answers
                # ILLEGAL_GENERATION, which transactional producers know.
                error = ErrorCode.ILLEGAL_GENERATION
        out: dict[TopicPartition, int] = {}
        for tp, committed in offsets.items():
            if error:
                out[tp] = error
            elif committed.metadata is not None and len(committed.metadata) > MAX_OFFSET_METADATA:
                out[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                group.pending_txn_offsets.setdefault(producer_id, {})[tp] = committed
                out[tp] = ErrorCode.NONE
        return out

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

    def fetch_error(self, group_id: str, member_id: str | None, member_epoch: int) -> int:
        """ConsumerGroup.validateOffsetFetch: a member asking must have that epoch."""
        if member_id is None and member_epoch < 0:
            return ErrorCode.NONE
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset]:
        group = self.groups.get(group_id)
        if group is None:
            return {}
        if partitions is None:
            return dict(group.offsets)
        return {tp: group.offsets[tp] for tp in partitions if tp in group.offsets}

    # -- admin -----------------------------------------------------------------------------

    def topic_deleted(self, topic: str) -> None:
        """Drop every group's offsets of ``topic`` (Kafka does when a topic is deleted)."""
        for group in self.groups.values():
            for tp in [tp for tp in group.offsets if tp[0] == topic]:
                del group.offsets[tp]

    def describe(self, group_id: str) -> GroupDescription | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        return GroupDescription(
            group.group_id,
            group.state(),
            group.group_epoch,
            group.assignment_epoch,
            group.assignor or DEFAULT_ASSIGNOR,
            tuple(
                MemberDescription(
                    m.member_id,
                    m.instance_id,
                    m.rack_id,
                    m.member_epoch,
                    m.client_id,
                    m.client_host,
                    m.subscribed_names,
                    m.subscribed_regex,
                    frozenset(m.assigned),
                    group.target.get(m.member_id, frozenset()),
                )
                for m in group.members.values()
            ),
        )


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# The coordinator of each cluster: ClusterState's ``groups`` hook belongs to the classic
# coordinator, so these live beside it, keyed by the cluster.
_COORDINATORS: weakref.WeakKeyDictionary[object, ConsumerGroupCoordinator] = (
    weakref.WeakKeyDictionary()
)


def consumer_coordinator(cluster: object) -> ConsumerGroupCoordinator | None:
    """The KIP-848 coordinator of ``cluster`` (a ``ClusterState``), None before first use."""
    return _COORDINATORS.get(cluster)


def install_consumer_coordinator(
    cluster: object, coordinator: ConsumerGroupCoordinator | None = None
) -> ConsumerGroupCoordinator:
    """The coordinator of ``cluster``, created (or replaced by ``coordinator``: tests set
    short timeouts this way) when needed."""
    if coordinator is not None:
        _COORDINATORS[cluster] = coordinator
        return coordinator
    existing = _COORDINATORS.get(cluster)
    if existing is None:
        existing = _COORDINATORS[cluster] = ConsumerGroupCoordinator()
    return existing
