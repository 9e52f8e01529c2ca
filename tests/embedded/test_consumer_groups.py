"""The embedded KIP-848 coordinator without sockets: epochs, target assignment, incremental
revocation (no partition ever has two owners), fencing, leave, static members, regex
subscriptions and the offset checks (testing/embedded/consumer_groups.py)."""

from __future__ import annotations

import uuid

import pytest

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.consumer_groups import (
    ConsumerGroupCoordinator,
    HeartbeatRequest,
    HeartbeatResult,
    TopicInfo,
    compile_subscription_regex,
)
from epochguard.testing.embedded.groups import CommittedOffset

T = uuid.UUID(int=1)
U = uuid.UUID(int=2)
TOPICS = {"t": TopicInfo(T, 4), "u": TopicInfo(U, 2)}


class Member:
    """A member following the protocol: revokes what the answer no longer assigns, owns
    what it assigns, and heartbeats its owned partitions every time."""

    def __init__(self, coord: ConsumerGroupCoordinator, member_id: str, **join: object) -> None:
        self.coord = coord
        self.member_id = member_id
        self.epoch = 0
        self.owned: frozenset[tuple[uuid.UUID, int]] = frozenset()
        self.join = join

    def beat(
        self, now: int = 0, topics: dict[str, TopicInfo] | None = None, **fields: object
    ) -> HeartbeatResult:
        kw: dict[str, object] = {"owned": self.owned}
        if self.epoch == 0:
            kw.update({"rebalance_timeout_ms": 30000, "subscribed_topic_names": ("t",)})
            kw.update(self.join)
        kw.update(fields)
        res = self.coord.heartbeat(
            HeartbeatRequest("g", self.member_id, self.epoch, **kw),  # type: ignore[arg-type]
            TOPICS if topics is None else topics,
            now,
        )
        if res.error == 0:
            self.epoch = res.member_epoch
            if res.assignment is not None:
                self.owned = res.assignment
        return res


def owners(members: list[Member]) -> dict[tuple[uuid.UUID, int], list[str]]:
    out: dict[tuple[uuid.UUID, int], list[str]] = {}
    for m in members:
        for tp in m.owned:
            out.setdefault(tp, []).append(m.member_id)
    return out


def settle(members: list[Member], rounds: int = 6) -> None:
    for _ in range(rounds):
        for m in members:
            assert m.beat().error == 0
            # Never two owners, at any point of the hand-over.
            assert all(len(v) == 1 for v in owners(members).values()), owners(members)


def test_first_member_gets_everything_at_epoch_two() -> None:
    """Kafka 4.3.1 starts a group at epoch 1 and bumps it to 2 for the first subscription
    (measured on a real coordinator: answers 2, one bump logged; 1 without a subscription)."""
    coord = ConsumerGroupCoordinator()
    a = Member(coord, "a")
    res = a.beat()
    assert (res.error, res.member_id, res.member_epoch) == (0, "a", 2)
    assert res.assignment == {(T, p) for p in range(4)}
    assert res.heartbeat_interval_ms == coord.heartbeat_interval_ms
    # Nothing changed: the assignment is not sent again.
    assert a.beat().assignment is None


def test_a_partition_moves_only_after_its_owner_revoked_it() -> None:
    coord = ConsumerGroupCoordinator()
    a, b = Member(coord, "a"), Member(coord, "b")
    a.beat()
    res = b.beat()
    # b joined at group epoch 3; a still owns everything, so b gets nothing yet.
    assert res.member_epoch == 3 and res.assignment == frozenset()
    d = coord.describe("g")
    assert d is not None and d.group_epoch == 3 and d.state == "Reconciling"
    # a is told to give up two partitions and stays at epoch 2 until it acknowledges.
    res = a.beat(owned=a.owned)
    assert res.member_epoch == 2 and res.assignment is not None and len(res.assignment) == 2
    revoked = {(T, p) for p in range(4)} - res.assignment
    # b asks again before a acknowledged: still nothing (a still owns them).
    assert b.beat().assignment is None and b.owned == frozenset()
    a.owned = res.assignment  # a revoked
    assert a.beat().member_epoch == 3
    assert b.beat().assignment == revoked
    settle([a, b])
    d = coord.describe("g")
    assert d is not None and d.state == "Stable"
    assert {m.member_id: len(m.assignment) for m in d.members} == {"a": 2, "b": 2}


def test_uniform_assignor_keeps_partitions_where_they_are() -> None:
    coord = ConsumerGroupCoordinator()
    ms = [Member(coord, n) for n in "abc"]
    for m in ms:
        m.beat()
        settle(ms[: ms.index(m) + 1])
    before = {m.member_id: m.owned for m in ms}
    ms[2].beat(owned=ms[2].owned)
    leaver = ms.pop()
    assert leaver.coord.heartbeat(HeartbeatRequest("g", "c", -1), TOPICS, 0).member_epoch == -1
    settle(ms)
    for m in ms:
        assert before[m.member_id] <= m.owned  # nothing taken from a member that stayed


def test_range_assignor_on_request() -> None:
    coord = ConsumerGroupCoordinator()
    a, b = Member(coord, "a", server_assignor="range"), Member(coord, "b", server_assignor="range")
    a.beat()
    b.beat()
    settle([a, b])
    assert a.owned == {(T, 0), (T, 1)} and b.owned == {(T, 2), (T, 3)}
    d = coord.describe("g")
    assert d is not None and d.assignor == "range"


def test_unknown_assignor_is_refused_by_name() -> None:
    res = Member(ConsumerGroupCoordinator(), "a", server_assignor="sticky").beat()
    assert res.error == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert res.message is not None and "sticky" in res.message


def test_wrong_epoch_is_fenced_and_unknown_member_refused() -> None:
    coord = ConsumerGroupCoordinator()
    a = Member(coord, "a")
    a.beat()
    res = coord.heartbeat(HeartbeatRequest("g", "a", 7), TOPICS, 0)
    assert res.error == ErrorCode.FENCED_MEMBER_EPOCH
    res = coord.heartbeat(HeartbeatRequest("g", "zz", 1), TOPICS, 0)
    assert res.error == ErrorCode.UNKNOWN_MEMBER_ID


def test_previous_epoch_is_accepted_when_the_answer_was_lost() -> None:
    coord = ConsumerGroupCoordinator()
    a, b = Member(coord, "a"), Member(coord, "b")
    a.beat()
    b.beat()
    res = a.beat(owned=a.owned)
    a.owned = res.assignment or a.owned
    res = a.beat()
    assert res.member_epoch == 3
    # The answer that moved a to epoch 3 was lost: it retries at epoch 2 with what it owns.
    retry = coord.heartbeat(HeartbeatRequest("g", "a", 2, owned=a.owned), TOPICS, 0)
    assert (retry.error, retry.member_epoch) == (0, 3)
    # Without its owned partitions the old epoch is fenced.
    assert coord.heartbeat(HeartbeatRequest("g", "a", 2), TOPICS, 0).error == (
        ErrorCode.FENCED_MEMBER_EPOCH
    )


def test_a_member_without_a_subscription_does_not_move_the_group_epoch() -> None:
    """As Kafka 4.3.1 answered (measured): a group's first member joining with no topics
    gets epoch 1, a second one too; a member subscribing then moves the group to 2."""
    coord = ConsumerGroupCoordinator()
    a = Member(coord, "a", subscribed_topic_names=())
    assert a.beat().member_epoch == 1
    b = Member(coord, "b", subscribed_topic_names=())
    assert b.beat().member_epoch == 1
    d = coord.describe("g")
    assert d is not None and d.group_epoch == 1
    c = Member(coord, "c")
    assert c.beat().member_epoch == 2


def test_rejoin_with_epoch_zero_after_fencing() -> None:
    coord = ConsumerGroupCoordinator()
    a = Member(coord, "a")
    a.beat()
    a.epoch, a.owned = 0, frozenset()
    res = a.beat()
    assert res.error == 0 and res.member_epoch >= 1
    assert res.assignment == {(T, p) for p in range(4)}


def test_leave_frees_partitions_for_the_others() -> None:
    coord = ConsumerGroupCoordinator()
    a, b = Member(coord, "a"), Member(coord, "b")
    a.beat()
    b.beat()
    settle([a, b])
    res = coord.heartbeat(HeartbeatRequest("g", "a", a.epoch), TOPICS, 0)
    assert res.error == 0
    res = coord.heartbeat(HeartbeatRequest("g", "a", -1), TOPICS, 0)
    assert (res.error, res.member_epoch) == (0, -1)
    settle([b])
    assert b.owned == {(T, p) for p in range(4)}


def test_static_member_returns_to_its_assignment_without_a_rebalance() -> None:
    coord = ConsumerGroupCoordinator()
    a, b = Member(coord, "a", instance_id="ia"), Member(coord, "b")
    a.beat()
    b.beat()
    settle([a, b])
    held = a.owned
    d = coord.describe("g")
    assert d is not None
    epoch = d.group_epoch
    res = coord.heartbeat(HeartbeatRequest("g", "a", a.epoch, instance_id="ia"), TOPICS, 0)
    res = coord.heartbeat(HeartbeatRequest("g", "a", -2, instance_id="ia"), TOPICS, 0)
    assert (res.error, res.member_epoch) == (0, -2)
    # The same instance under a new member id (a restart) gets the same partitions back.
    a2 = Member(coord, "a2", instance_id="ia")
    res = a2.beat()
    assert res.error == 0 and res.assignment == held
    d = coord.describe("g")
    assert d is not None and d.group_epoch == epoch
    # While it is back, another process with that instance id is refused.
    a3 = Member(coord, "a3", instance_id="ia")
    assert a3.beat().error == ErrorCode.UNRELEASED_INSTANCE_ID


def test_static_member_that_stays_away_is_removed_at_session_timeout() -> None:
    coord = ConsumerGroupCoordinator(session_timeout_ms=1000)
    a, b = Member(coord, "a", instance_id="ia"), Member(coord, "b")
    a.beat()
    b.beat()
    settle([a, b])
    coord.heartbeat(HeartbeatRequest("g", "a", -2, instance_id="ia"), TOPICS, 0)
    coord.tick(500, TOPICS)
    b.beat(now=500)
    coord.tick(1200, TOPICS)
    d = coord.describe("g")
    assert d is not None and [m.member_id for m in d.members] == ["b"]


def test_member_that_does_not_revoke_in_time_is_removed() -> None:
    coord = ConsumerGroupCoordinator()
    a = Member(coord, "a", rebalance_timeout_ms=100)
    b = Member(coord, "b")
    a.beat()
    b.beat()
    a.beat(owned=a.owned)  # told to revoke; it never acknowledges
    coord.tick(50, TOPICS)
    assert "a" in coord.groups["g"].members
    coord.tick(150, TOPICS)
    assert "a" not in coord.groups["g"].members
    settle([b])
    assert b.owned == {(T, p) for p in range(4)}


def test_regex_subscription_matches_whole_names_and_follows_new_topics() -> None:
    coord = ConsumerGroupCoordinator()
    a = Member(coord, "a", subscribed_topic_names=None, subscribed_topic_regex="t|u")
    res = a.beat()
    assert res.assignment == {(T, p) for p in range(4)} | {(U, 0), (U, 1)}
    v = uuid.UUID(int=3)
    more = {**TOPICS, "tt": TopicInfo(v, 1)}
    # "tt" does not match "t|u" as a whole name.
    assert a.beat(topics=more).assignment is None
    more["u"] = TopicInfo(U, 3)  # a partition added: group epoch moves
    res = a.beat(topics=more)
    assert (U, 2) in (res.assignment or ())


@pytest.mark.parametrize("pattern", ["(?=t)t", r"(a)\1", "a++", "(?>a)", "("])
def test_regex_re2j_does_not_have_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        compile_subscription_regex(pattern)
    res = Member(
        ConsumerGroupCoordinator(), "a", subscribed_topic_names=None, subscribed_topic_regex=pattern
    ).beat()
    assert res.error == ErrorCode.INVALID_REGULAR_EXPRESSION
    assert res.message is not None and pattern in res.message


@pytest.mark.parametrize(
    ("req", "word"),
    [
        (HeartbeatRequest("", "a", 0), "GroupId"),
        (HeartbeatRequest("g", "", 0), "MemberId"),
        (HeartbeatRequest("g", "a", 0, subscribed_topic_names=("t",)), "RebalanceTimeoutMs"),
        (HeartbeatRequest("g", "a", 0, rebalance_timeout_ms=1), "Subscribed"),
        (HeartbeatRequest("g", "a", -2), "InstanceId"),
        (HeartbeatRequest("g", "a", -3), "MemberEpoch"),
    ],
)
def test_malformed_heartbeats_are_invalid_requests(req: HeartbeatRequest, word: str) -> None:
    res = ConsumerGroupCoordinator().heartbeat(req, TOPICS, 0)
    assert res.error == ErrorCode.INVALID_REQUEST
    assert res.message is not None and word in res.message


def test_commits_are_checked_by_member_epoch() -> None:
    coord = ConsumerGroupCoordinator()
    a = Member(coord, "a")
    a.beat()
    off = {("t", 0): CommittedOffset(5, 2)}
    assert coord.commit_offsets("g", 2, "a", off, 0, 9) == {("t", 0): 0}
    assert coord.fetch_offsets("g", [("t", 0)]) == off
    assert coord.commit_offsets("g", 1, "a", off, 0, 9) == {("t", 0): ErrorCode.STALE_MEMBER_EPOCH}
    assert coord.commit_offsets("g", 2, "b", off, 0, 9) == {("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert coord.commit_offsets("g", 2, "a", off, 0, 8) == {("t", 0): ErrorCode.UNSUPPORTED_VERSION}
    assert coord.commit_offsets("g", -1, "", off, 0, 8) == {("t", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert coord.fetch_error("g", "a", 2) == 0
    assert coord.fetch_error("g", "a", 1) == ErrorCode.STALE_MEMBER_EPOCH
    assert coord.fetch_error("g", "b", 2) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.fetch_error("g", None, -1) == 0
    coord.heartbeat(HeartbeatRequest("g", "a", -1), TOPICS, 0)
    # An empty group takes commits from outside group management.
    assert coord.commit_offsets("g", -1, "", off, 0, 8) == {("t", 0): 0}


def test_uniform_assignor_balances_within_one_and_moves_only_the_surplus() -> None:
    from epochguard.testing.embedded.consumer_groups import ASSIGNORS

    uniform = ASSIGNORS["uniform"]
    topics = {"t": TopicInfo(T, 256)}
    eight = {f"m{i}": {"t"} for i in range(8)}
    first = uniform(eight, topics, {})
    assert sorted(len(p) for p in first.values()) == [32] * 8
    nine = {**eight, "new": {"t"}}
    second = uniform(nine, topics, {m: frozenset(p) for m, p in first.items()})
    sizes = sorted(len(p) for p in second.values())
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 256
    # A member that stays loses only partitions, never gains one from another stayer.
    for m in eight:
        assert second[m] <= first[m]


def test_names_and_regex_are_separate_fields_and_an_empty_regex_is_none() -> None:
    coord = ConsumerGroupCoordinator()
    # librdkafka's way: names and an empty regex on every heartbeat.
    a = Member(coord, "a", subscribed_topic_names=("t",), subscribed_topic_regex="")
    assert a.beat().assignment == {(T, p) for p in range(4)}
    for _ in range(3):
        res = a.beat(subscribed_topic_names=("t",), subscribed_topic_regex="")
        assert res.member_epoch == 2  # nothing changed: no new group epoch
    # A regex adds its topics to the names (the union)...
    res = a.beat(subscribed_topic_regex="u")
    assert res.assignment == {(T, p) for p in range(4)} | {(U, 0), (U, 1)}
    # ...and emptying the names leaves the regex's.
    res = a.beat(subscribed_topic_names=())
    assert res.assignment == {(U, 0), (U, 1)}
