"""The sans-IO group coordinator, driven directly with explicit times (no sockets)."""

from __future__ import annotations

import itertools
import uuid

import pytest

from epochguard._errors import ErrorCode
from epochguard.testing.embedded import groups as g
from epochguard.testing.embedded.groups import (
    CommittedOffset,
    GroupCoordinator,
    GroupState,
    JoinRequest,
    JoinResult,
    SyncRequest,
    SyncResult,
)

SESSION = 10_000
REBALANCE = 30_000


class Box:
    """Collects the (single) answer of a held call."""

    def __init__(self) -> None:
        self.results: list[object] = []

    def __call__(self, result: object) -> None:
        self.results.append(result)

    @property
    def done(self) -> bool:
        return bool(self.results)

    @property
    def join(self) -> JoinResult:
        assert len(self.results) == 1, self.results
        r = self.results[0]
        assert isinstance(r, JoinResult)
        return r

    @property
    def sync(self) -> SyncResult:
        assert len(self.results) == 1, self.results
        r = self.results[0]
        assert isinstance(r, SyncResult)
        return r


@pytest.fixture
def coord() -> GroupCoordinator:
    counter = itertools.count(1)
    return GroupCoordinator(member_id_factory=lambda prefix: f"{prefix}-{next(counter)}")


def join_req(
    member_id: str = "",
    protocols: tuple[str, ...] = ("range",),
    instance: str | None = None,
    v4: bool = True,
    client: str = "c",
    session: int = SESSION,
    rebalance: int = REBALANCE,
    protocol_type: str = "consumer",
) -> JoinRequest:
    return JoinRequest(
        group_id="G",
        member_id=member_id,
        session_timeout_ms=session,
        rebalance_timeout_ms=rebalance,
        protocol_type=protocol_type,
        protocols=tuple((p, f"{client}:{p}".encode()) for p in protocols),
        group_instance_id=instance,
        client_id=client,
        require_known_member_id=v4,
    )


def join(coord: GroupCoordinator, now: int, **kw: object) -> Box:
    box = Box()
    coord.join(join_req(**kw), now, box)  # type: ignore[arg-type]
    return box


def new_member(coord: GroupCoordinator, now: int, **kw: object) -> tuple[str, Box]:
    """KIP-394: first join gets a member id, the second join is held."""
    first = join(coord, now, **kw)
    assert first.join.error_code == ErrorCode.MEMBER_ID_REQUIRED
    member_id = first.join.member_id
    assert member_id
    return member_id, join(coord, now, member_id=member_id, **kw)


def sync(
    coord: GroupCoordinator,
    now: int,
    member_id: str,
    generation: int,
    assignments: dict[str, bytes] | None = None,
) -> Box:
    box = Box()
    coord.sync(
        SyncRequest("G", generation, member_id, tuple((assignments or {}).items())), now, box
    )
    return box


def form_group(coord: GroupCoordinator, n: int, now: int = 0) -> tuple[list[str], int]:
    """n members, joined and synced; returns member ids (leader first) and generation."""
    ids: list[str] = []
    boxes: list[Box] = []
    for i in range(n):
        if i > 0:
            # Existing members learn of the rebalance through their heartbeat and rejoin.
            gen = coord.groups["G"].generation_id
            for mid in ids:
                if coord.groups["G"].state is not GroupState.PREPARING_REBALANCE:
                    break
                assert coord.heartbeat("G", gen, mid, None, now) in (
                    ErrorCode.REBALANCE_IN_PROGRESS,
                    ErrorCode.NONE,
                )
        mid, box = new_member(coord, now, client=f"c{i}")
        ids.append(mid)
        boxes.append(box)
        boxes = [b for b in boxes if not b.done]
        for j, old in enumerate(ids[:-1]):
            if coord.groups["G"].members[old].awaiting_join:
                continue
            b = join(coord, now, member_id=old, client=f"c{j}")
            boxes.append(b)
    grp = coord.groups["G"]
    assert grp.state is GroupState.COMPLETING_REBALANCE
    gen = grp.generation_id
    leader = grp.leader_id
    assert leader is not None
    syncs = [sync(coord, now, m, gen) for m in ids if m != leader]
    assert not any(s.done for s in syncs)
    lead = sync(coord, now, leader, gen, {m: m.encode() for m in ids})
    assert lead.sync.error_code == ErrorCode.NONE
    for s, m in zip(syncs, [m for m in ids if m != leader], strict=True):
        assert s.sync.assignment == m.encode()
    return [leader, *[m for m in ids if m != leader]], gen


def test_single_member_rebalance(coord: GroupCoordinator) -> None:
    first = join(coord, 0)
    assert first.join.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert first.join.generation_id == -1
    member_id = first.join.member_id
    assert coord.groups["G"].state is GroupState.EMPTY

    second = join(coord, 5, member_id=member_id)
    r = second.join
    assert (r.error_code, r.generation_id, r.protocol_name) == (ErrorCode.NONE, 1, "range")
    assert r.leader == member_id == r.member_id
    assert [(m.member_id, m.metadata) for m in r.members] == [(member_id, b"c:range")]

    s = sync(coord, 6, member_id, 1, {member_id: b"assignment"})
    assert s.sync == SyncResult(ErrorCode.NONE, "consumer", "range", b"assignment")
    assert coord.groups["G"].state is GroupState.STABLE
    assert coord.heartbeat("G", 1, member_id, None, 7) == ErrorCode.NONE


def test_join_v3_gets_member_id_without_round_trip(coord: GroupCoordinator) -> None:
    box = join(coord, 0, v4=False)
    assert box.join.error_code == ErrorCode.NONE
    assert box.join.member_id.startswith("c-")
    assert box.join.generation_id == 1


def test_two_members_second_join_holds_until_first_rejoins(coord: GroupCoordinator) -> None:
    (a,), gen = form_group(coord, 1)
    b, b_join = new_member(coord, 100, client="c1")
    assert not b_join.done, "held until every known member rejoined"
    assert coord.groups["G"].state is GroupState.PREPARING_REBALANCE
    assert coord.heartbeat("G", gen, a, None, 110) == ErrorCode.REBALANCE_IN_PROGRESS
    # Commits of the old generation are still fine while preparing (revocation commits).
    errs = coord.commit_offsets("G", gen, a, None, {("t", 0): CommittedOffset(3, 1)}, 115)
    assert errs == {("t", 0): ErrorCode.NONE}

    a_join = join(coord, 120, member_id=a, client="c0")
    assert a_join.join.generation_id == b_join.join.generation_id == gen + 1
    assert a_join.join.leader == a, "the leader stays the leader"
    assert {m.member_id for m in a_join.join.members} == {a, b}
    assert b_join.join.members == ()
    assert coord.heartbeat("G", gen, a, None, 130) == ErrorCode.ILLEGAL_GENERATION

    b_sync = sync(coord, 130, b, gen + 1)
    assert not b_sync.done
    a_sync = sync(coord, 131, a, gen + 1, {a: b"A", b: b"B"})
    assert a_sync.sync.assignment == b"A"
    assert b_sync.sync.assignment == b"B"
    assert coord.groups["G"].state is GroupState.STABLE


def test_three_members_and_generation_bumps(coord: GroupCoordinator) -> None:
    ids, gen = form_group(coord, 3)
    assert gen == 3, "one generation per member that joined"
    grp = coord.groups["G"]
    assert set(grp.members) == set(ids)
    for m in ids:
        assert grp.members[m].assignment == m.encode()
        assert coord.heartbeat("G", gen, m, None, 1) == ErrorCode.NONE


def test_leave_triggers_rebalance_and_remaining_rejoin(coord: GroupCoordinator) -> None:
    (a, b, c), gen = form_group(coord, 3)
    res = coord.leave("G", [(b, None)], 200)
    assert [r.error_code for r in res] == [ErrorCode.NONE]
    assert coord.groups["G"].state is GroupState.PREPARING_REBALANCE
    assert coord.heartbeat("G", gen, a, None, 201) == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.heartbeat("G", gen, b, None, 201) == ErrorCode.UNKNOWN_MEMBER_ID
    ja = join(coord, 202, member_id=a, client="c0")
    assert not ja.done
    jc = join(coord, 203, member_id=c, client="c2")
    assert ja.join.generation_id == jc.join.generation_id == gen + 1
    assert {m.member_id for m in ja.join.members} == {a, c}


def test_batch_leave_v3_form_reports_each_member(coord: GroupCoordinator) -> None:
    (a, b), _ = form_group(coord, 2)
    res = coord.leave("G", [(a, None), ("nobody", None), (b, None)], 10)
    assert [(r.member_id, r.error_code) for r in res] == [
        (a, ErrorCode.NONE),
        ("nobody", ErrorCode.UNKNOWN_MEMBER_ID),
        (b, ErrorCode.NONE),
    ]
    grp = coord.groups["G"]
    assert grp.state is GroupState.EMPTY
    assert grp.members == {}
    assert coord.leave("other", [(a, None)], 11)[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_leader_leaving_hands_leadership_over(coord: GroupCoordinator) -> None:
    (a, b), gen = form_group(coord, 2)
    coord.leave("G", [(a, None)], 10)
    jb = join(coord, 11, member_id=b, client="c1")
    assert jb.join.leader == b
    assert jb.join.generation_id == gen + 1
    assert [m.member_id for m in jb.join.members] == [b]


def test_session_timeout_expels_member(coord: GroupCoordinator) -> None:
    (a, b), gen = form_group(coord, 2, now=0)
    # a keeps heartbeating, b goes silent.
    for t in range(1000, SESSION, 1000):
        assert coord.heartbeat("G", gen, a, None, t) == ErrorCode.NONE
        coord.tick(t)
        assert b in coord.groups["G"].members
    coord.tick(SESSION)
    assert b not in coord.groups["G"].members
    assert coord.groups["G"].state is GroupState.PREPARING_REBALANCE
    assert coord.heartbeat("G", gen, a, None, SESSION + 1) == ErrorCode.REBALANCE_IN_PROGRESS
    ja = join(coord, SESSION + 2, member_id=a, client="c0")
    assert ja.join.generation_id == gen + 1
    assert coord.heartbeat("G", gen, b, None, SESSION + 3) == ErrorCode.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_drops_members_that_did_not_rejoin(coord: GroupCoordinator) -> None:
    (a, b), gen = form_group(coord, 2, now=0)
    c, jc = new_member(coord, 1000, client="c2", rebalance=5000)
    ja = join(coord, 1001, member_id=a, client="c0")
    # b heartbeats (so its session is alive) but never rejoins.
    for t in range(1500, 33_000, 500):
        if jc.done:
            break
        assert coord.heartbeat("G", gen, b, None, t) == ErrorCode.REBALANCE_IN_PROGRESS
        coord.tick(t)
    assert jc.done and ja.done
    deadline = 1000 + REBALANCE
    assert coord.groups["G"].generation_id == gen + 1
    assert set(coord.groups["G"].members) == {a, c}
    assert coord.heartbeat("G", gen + 1, b, None, deadline + 1) == ErrorCode.UNKNOWN_MEMBER_ID


def test_pending_member_id_expires(coord: GroupCoordinator) -> None:
    (_a,), _gen = form_group(coord, 1)
    first = join(coord, 0, client="late")
    pending = first.join.member_id
    assert pending in coord.groups["G"].pending_members
    coord.tick(SESSION + 1)
    assert pending not in coord.groups["G"].pending_members
    late = join(coord, SESSION + 2, member_id=pending, client="late")
    assert late.join.error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_protocol_selection_prefers_common_choice(coord: GroupCoordinator) -> None:
    a, ja = new_member(coord, 0, protocols=("cooperative-sticky", "range"), client="a")
    assert ja.join.protocol_name == "cooperative-sticky"
    sync(coord, 1, a, 1, {a: b""})
    b, jb = new_member(coord, 2, protocols=("roundrobin", "range"), client="b")
    ja2 = join(coord, 3, member_id=a, protocols=("cooperative-sticky", "range"), client="a")
    assert ja2.join.protocol_name == jb.join.protocol_name == "range"
    assert {m.member_id: m.metadata for m in ja2.join.members} == {a: b"a:range", b: b"b:range"}


def test_inconsistent_protocols_rejected(coord: GroupCoordinator) -> None:
    form_group(coord, 1)
    bad = join(coord, 1, protocols=("sticky",), client="x")
    assert bad.join.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    other_type = join(coord, 1, protocol_type="connect", client="x")
    assert other_type.join.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert join(coord, 1, protocols=()).join.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_invalid_session_timeout_and_group_id(coord: GroupCoordinator) -> None:
    assert join(coord, 0, session=10).join.error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    box = Box()
    coord.join(JoinRequest("", "", SESSION, REBALANCE, "consumer", (("range", b""),)), 0, box)
    assert box.join.error_code == ErrorCode.INVALID_GROUP_ID


def test_unknown_member_and_illegal_generation(coord: GroupCoordinator) -> None:
    assert join(coord, 0, member_id="ghost").join.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    (a,), gen = form_group(coord, 1)
    assert coord.heartbeat("G", gen, "ghost", None, 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat("G", gen + 1, a, None, 1) == ErrorCode.ILLEGAL_GENERATION
    assert coord.heartbeat("nope", gen, a, None, 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert sync(coord, 1, a, gen - 1).sync.error_code == ErrorCode.ILLEGAL_GENERATION
    assert sync(coord, 1, "ghost", gen).sync.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert join(coord, 1, member_id="ghost").join.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    tp = ("t", 0)
    co = {tp: CommittedOffset(1)}
    assert coord.commit_offsets("G", gen + 1, a, None, co, 1) == {tp: ErrorCode.ILLEGAL_GENERATION}
    assert coord.commit_offsets("G", gen, "ghost", None, co, 1) == {tp: ErrorCode.UNKNOWN_MEMBER_ID}
    assert coord.commit_offsets("G", -1, "", None, co, 1) == {tp: ErrorCode.UNKNOWN_MEMBER_ID}, (
        "simple commits are refused while the group has members"
    )
    assert coord.commit_offsets("new", 3, "x", None, co, 1) == {tp: ErrorCode.ILLEGAL_GENERATION}
    assert coord.fetch_offsets("G", [tp]) == {}


def test_rebalance_in_progress_errors(coord: GroupCoordinator) -> None:
    (a, b), gen = form_group(coord, 2)
    coord.leave("G", [(b, None)], 1)
    assert sync(coord, 2, a, gen).sync.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.heartbeat("G", gen, a, None, 2) == ErrorCode.REBALANCE_IN_PROGRESS
    ja = join(coord, 3, member_id=a, client="c0")
    assert coord.groups["G"].state is GroupState.COMPLETING_REBALANCE
    # Commits between JoinGroup and SyncGroup are refused, as Kafka does.
    co = {("t", 0): CommittedOffset(1)}
    assert coord.commit_offsets("G", ja.join.generation_id, a, None, co, 4) == {
        ("t", 0): ErrorCode.REBALANCE_IN_PROGRESS
    }


def test_new_member_during_completing_rebalance_fails_pending_syncs(
    coord: GroupCoordinator,
) -> None:
    a, _ja = new_member(coord, 0, client="a")
    b, jb = new_member(coord, 1, client="b")
    assert not jb.done
    ja2 = join(coord, 2, member_id=a, client="a")
    gen = ja2.join.generation_id
    sb = sync(coord, 3, b, gen)
    assert not sb.done
    _, jc = new_member(coord, 4, client="c")
    assert sb.sync.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.groups["G"].state is GroupState.PREPARING_REBALANCE
    assert not jc.done


def test_simple_commit_and_fetch_with_epochs(coord: GroupCoordinator) -> None:
    tid = uuid.uuid4()
    offsets = {
        ("t", 0): CommittedOffset(42, 7, "meta", 1, tid),
        ("t", 1): CommittedOffset(5, -1, None, 1, tid),
    }
    assert coord.commit_offsets("assigner", -1, "", None, offsets, 1) == {
        ("t", 0): ErrorCode.NONE,
        ("t", 1): ErrorCode.NONE,
    }
    got = coord.fetch_offsets("assigner", [("t", 0), ("t", 1), ("t", 2)])
    assert got == offsets
    assert got[("t", 0)].leader_epoch == 7
    assert coord.fetch_offsets("assigner", None) == offsets
    # A newer commit replaces the older one, epoch included.
    coord.commit_offsets("assigner", -1, "", None, {("t", 0): CommittedOffset(50, 9)}, 2)
    assert coord.fetch_offsets("assigner", [("t", 0)])[("t", 0)].leader_epoch == 9
    assert coord.fetch_offsets("nobody", [("t", 0)]) == {}


def test_group_member_commit_and_metadata_limit(coord: GroupCoordinator) -> None:
    (a,), gen = form_group(coord, 1)
    ok = coord.commit_offsets(
        "G",
        gen,
        a,
        None,
        {
            ("t", 0): CommittedOffset(10, 3, "x" * g.MAX_OFFSET_METADATA),
            ("t", 1): CommittedOffset(10, 3, "x" * (g.MAX_OFFSET_METADATA + 1)),
        },
        1,
    )
    assert ok == {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.OFFSET_METADATA_TOO_LARGE}
    assert set(coord.fetch_offsets("G", None)) == {("t", 0)}


def test_offsets_survive_group_emptying_and_allow_simple_commits(coord: GroupCoordinator) -> None:
    (a,), gen = form_group(coord, 1)
    coord.commit_offsets("G", gen, a, None, {("t", 0): CommittedOffset(7, 2)}, 1)
    coord.leave("G", [(a, None)], 2)
    assert coord.groups["G"].state is GroupState.EMPTY
    assert coord.fetch_offsets("G", [("t", 0)])[("t", 0)].offset == 7
    assert coord.commit_offsets("G", -1, "", None, {("t", 0): CommittedOffset(8, 2)}, 3) == {
        ("t", 0): ErrorCode.NONE
    }


def test_topic_deleted_drops_offsets(coord: GroupCoordinator) -> None:
    coord.commit_offsets(
        "A", -1, "", None, {("t", 0): CommittedOffset(1), ("u", 0): CommittedOffset(2)}, 0
    )
    coord.commit_offsets("B", -1, "", None, {("t", 3): CommittedOffset(3)}, 0)
    coord.topic_deleted("t")
    assert coord.fetch_offsets("A", None) == {("u", 0): CommittedOffset(2)}
    assert coord.fetch_offsets("B", None) == {}


def test_static_member_rejoin_fences_old_id(coord: GroupCoordinator) -> None:
    first = join(coord, 0, instance="i-1", client="s")
    assert first.join.error_code == ErrorCode.NONE, "static members skip MEMBER_ID_REQUIRED"
    old = first.join.member_id
    assert old.startswith("i-1-")
    sync(coord, 1, old, 1, {old: b"x"})
    again = join(coord, 2, instance="i-1", client="s")
    new = again.join.member_id
    assert again.join.error_code == ErrorCode.NONE and new != old
    assert coord.heartbeat("G", again.join.generation_id, old, "i-1", 3) == (
        ErrorCode.FENCED_INSTANCE_ID
    )
    assert join(coord, 3, member_id=old, instance="i-1").join.error_code == (
        ErrorCode.FENCED_INSTANCE_ID
    )
    res = coord.leave("G", [("", "i-1")], 4)
    assert [(r.member_id, r.error_code) for r in res] == [(new, ErrorCode.NONE)]
    assert coord.groups["G"].members == {}


def test_static_member_survives_rebalance_without_rejoining(coord: GroupCoordinator) -> None:
    s = join(coord, 0, instance="i-1", client="s").join.member_id
    sync(coord, 1, s, 1, {s: b""})
    d, jd = new_member(coord, 2, client="d")
    for t in range(1000, REBALANCE, 1000):
        assert coord.heartbeat("G", 1, s, "i-1", t) == ErrorCode.REBALANCE_IN_PROGRESS
        coord.tick(t)
    assert not jd.done
    coord.tick(2 + REBALANCE)
    assert jd.join.error_code == ErrorCode.NONE
    assert set(coord.groups["G"].members) == {s, d}, "static members are kept (KIP-345)"
    assert jd.join.leader == d, "leadership moves to a member that rejoined"


def test_describe_and_list(coord: GroupCoordinator) -> None:
    assert coord.describe("G") is None
    (a, b), _ = form_group(coord, 2)
    d = coord.describe("G")
    assert d is not None
    assert (d.state, d.protocol_type, d.protocol_name) == (GroupState.STABLE, "consumer", "range")
    assert {m.member_id: m.assignment for m in d.members} == {a: a.encode(), b: b.encode()}
    assert [x.group_id for x in coord.list_groups()] == ["G"]


def test_static_member_restart_keeps_generation_and_assignment(coord: GroupCoordinator) -> None:
    s = join(coord, 0, instance="i-1", client="s").join.member_id
    d, _ = new_member(coord, 1, client="d")
    js = join(coord, 2, member_id=s, instance="i-1", client="s")
    gen = js.join.generation_id
    assert js.join.leader == s
    sync(coord, 3, d, gen)
    sync(coord, 3, s, gen, {s: b"S", d: b"D"})
    # The static leader restarts (new process, no LeaveGroup) with the same protocols.
    again = join(coord, 4, instance="i-1", client="s")
    r = again.join
    assert (r.error_code, r.generation_id) == (ErrorCode.NONE, gen), "no rebalance"
    assert r.member_id != s
    assert r.leader == s and r.members == (), "before v9 it is told to act as a follower"
    assert coord.groups["G"].state is GroupState.STABLE
    assert sync(coord, 5, r.member_id, gen).sync.assignment == b"S"
    assert coord.heartbeat("G", gen, d, None, 6) == ErrorCode.NONE
    assert coord.groups["G"].leader_id == r.member_id


def test_static_leader_restart_v9_skips_assignment(coord: GroupCoordinator) -> None:
    s = join(coord, 0, instance="i-1", client="s").join.member_id
    sync(coord, 1, s, 1, {s: b"S"})
    box = Box()
    coord.join(
        attrs_evolve(join_req(instance="i-1", client="s"), supports_skip_assignment=True), 2, box
    )
    r = box.join
    assert (r.generation_id, r.skip_assignment) == (1, True)
    assert r.leader == r.member_id != s
    assert [m.member_id for m in r.members] == [r.member_id]


def test_static_member_restart_with_new_protocol_rebalances(coord: GroupCoordinator) -> None:
    s = join(coord, 0, instance="i-1", client="s").join.member_id
    sync(coord, 1, s, 1, {s: b"S"})
    r = join(coord, 2, instance="i-1", client="s", protocols=("roundrobin", "range")).join
    assert (r.generation_id, r.protocol_name) == (2, "roundrobin")


def attrs_evolve(req: JoinRequest, **changes: object) -> JoinRequest:
    import attrs

    return attrs.evolve(req, **changes)  # type: ignore[arg-type]


def subscription(*topics: str) -> bytes:
    out = (1).to_bytes(2, "big") + len(topics).to_bytes(4, "big")
    for t in topics:
        out += len(t).to_bytes(2, "big") + t.encode()
    return out + b"\xff\xff\xff\xff"  # null user data


def test_consumer_subscription_parsing() -> None:
    assert g.consumer_subscription(subscription("a", "bb")) == {"a", "bb"}
    assert g.consumer_subscription(b"") == set()
    assert g.consumer_subscription(b"\x00\x00\x00\x00\x00\x01\x00\x09ab") == set()


def test_delete_offsets_refused_for_subscribed_topics(coord: GroupCoordinator) -> None:
    box = Box()
    coord.join(
        JoinRequest(
            "G",
            "",
            SESSION,
            REBALANCE,
            "consumer",
            (("range", subscription("t")),),
            require_known_member_id=False,
        ),
        0,
        box,
    )
    m = box.join.member_id
    sync(coord, 1, m, 1, {m: b""})
    co = {("t", 0): CommittedOffset(1), ("u", 0): CommittedOffset(2)}
    coord.commit_offsets("G", 1, m, None, co, 2)
    err, res = coord.delete_offsets("G", [("t", 0), ("u", 0)])
    assert (err, res) == (
        ErrorCode.NONE,
        {("t", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): ErrorCode.NONE},
    )
    assert set(coord.fetch_offsets("G", None)) == {("t", 0)}
    assert coord.delete_offsets("nope", [("t", 0)]) == (ErrorCode.GROUP_ID_NOT_FOUND, {})
    assert coord.delete_group("G") == ErrorCode.NON_EMPTY_GROUP
    coord.leave("G", [(m, None)], 3)
    assert coord.delete_offsets("G", [("t", 0)]) == (ErrorCode.NONE, {("t", 0): ErrorCode.NONE})
    assert coord.delete_group("G") == ErrorCode.NONE
    assert coord.delete_group("G") == ErrorCode.GROUP_ID_NOT_FOUND
    assert coord.fetch_offsets("G", None) == {}


def test_only_silent_static_members_left_keeps_group_non_empty(coord: GroupCoordinator) -> None:
    s = join(coord, 0, instance="i-1", client="s").join.member_id
    sync(coord, 1, s, 1, {s: b"S"})
    d, jd = new_member(coord, 2, client="d")
    coord.leave("G", [(d, None)], 3)
    assert jd.join.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    # The static member heartbeats but never rejoins; the rebalance times out around it.
    for t in range(1000, REBALANCE + 2000, 1000):
        coord.heartbeat("G", 1, s, "i-1", t)
        coord.tick(t)
    grp = coord.groups["G"]
    assert grp.state is GroupState.COMPLETING_REBALANCE
    assert (grp.generation_id, grp.leader_id) == (2, s)
    assert coord.heartbeat("G", 2, s, "i-1", REBALANCE + 1500) == ErrorCode.NONE
    coord.tick(REBALANCE + 1500 + SESSION)
    assert coord.groups["G"].members == {}


def test_leader_that_never_syncs_is_removed_at_the_sync_deadline(coord: GroupCoordinator) -> None:
    a, _ja = new_member(coord, 0, client="a", rebalance=5000)
    b, _jb = new_member(coord, 1, client="b", rebalance=5000)
    join(coord, 2, member_id=a, client="a", rebalance=5000)
    gen = coord.groups["G"].generation_id
    leader = coord.groups["G"].leader_id
    follower = b if leader == a else a
    waiting = sync(coord, 3, follower, gen)
    # The leader keeps heartbeating but never sends SyncGroup.
    for t in range(500, 5000, 500):
        assert coord.heartbeat("G", gen, leader or "", None, t) == ErrorCode.NONE
        coord.tick(t)
    assert not waiting.done
    coord.tick(5002)
    assert waiting.sync.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert set(coord.groups["G"].members) == {follower}
    assert coord.groups["G"].state is GroupState.PREPARING_REBALANCE


def test_follower_that_never_syncs_is_removed_after_the_group_is_stable(
    coord: GroupCoordinator,
) -> None:
    a, _ = new_member(coord, 0, client="a", rebalance=5000)
    b, _jb = new_member(coord, 1, client="b", rebalance=5000)
    ja = join(coord, 2, member_id=a, client="a", rebalance=5000)
    gen = ja.join.generation_id
    assert sync(coord, 3, a, gen, {a: b"A", b: b"B"}).sync.assignment == b"A"
    assert coord.groups["G"].state is GroupState.STABLE
    coord.tick(4000)
    assert coord.groups["G"].members.keys() == {a, b}
    coord.tick(5003)
    assert set(coord.groups["G"].members) == {a}


def test_static_member_restart_mid_rebalance_starts_over(coord: GroupCoordinator) -> None:
    s = join(coord, 0, instance="i-1", client="s").join.member_id
    sync(coord, 1, s, 1, {s: b""})
    d, _jd = new_member(coord, 2, client="d")
    js = join(coord, 3, member_id=s, instance="i-1", client="s")
    assert coord.groups["G"].state is GroupState.COMPLETING_REBALANCE
    again = join(coord, 4, instance="i-1", client="s")
    assert not again.done
    assert coord.groups["G"].state is GroupState.PREPARING_REBALANCE
    jd2 = join(coord, 5, member_id=d, client="d")
    assert again.join.generation_id == jd2.join.generation_id == js.join.generation_id + 1
