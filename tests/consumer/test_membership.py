"""ClassicMember's reconciliation driven by answers alone: no sockets, no threads, no sleeps.

A fake host stands in for the consumer engine (it records what the member asks of it:
commits, listener calls, assignments, restores), and the coordinator's answers are fed in
through the client's futures: a join, eager or cooperative, never waits for them."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.future import Future
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment
from kafka.structs import TopicPartition

from epochguard.consumer.assignors import CooperativeStickyAssignor
from epochguard.consumer.config import build_config
from epochguard.consumer.effects import Effect, Sleep, Step, block_on, run_blocking
from epochguard.consumer.group import ClassicMember
from epochguard.consumer.membership import MembershipHost
from epochguard.offsets.position import EpochOffset

TOPIC = "t"


def tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in partitions]


class FakeHost:
    """The engine as a membership sees it, recording every call in order."""

    def __init__(self, assigned: list[TopicPartition], auto_commit: bool = True) -> None:
        self.config: dict[str, Any] = {"enable_auto_commit": auto_commit}
        self.assigned = list(assigned)
        self.subscription_topics: set[str] | None = {TOPIC}
        self.fetcher = SimpleNamespace(wakeup=lambda: None)
        #: Whether a pattern subscription has been matched against the cluster's topics.
        self.pattern_matched = True
        self.events: list[tuple[str, Any]] = []

    @property
    def pattern(self) -> Any:
        return None

    def commit(
        self, offsets: Mapping[TopicPartition, Any] | None = None, timeout_ms: int | None = None
    ) -> Step[None]:
        self.events.append(("commit", sorted(self.assigned if offsets is None else offsets)))
        return
        yield

    def current_positions(self) -> dict[TopicPartition, EpochOffset]:
        return {tp: EpochOffset(10 + tp.partition, 3) for tp in self.assigned}

    def set_assignment(self, parts: list[TopicPartition]) -> None:
        self.events.append(("assign", sorted(parts)))
        self.assigned = list(parts)

    def restore_positions(self, deadline: float) -> Step[None]:
        self.events.append(("restore", None))
        return
        yield

    def call_listener(self, method: str, partitions: set[TopicPartition]) -> Step[None]:
        self.events.append((method, sorted(partitions)))
        return
        yield

    def metadata_for(self, topics: set[str], deadline: float) -> Step[dict[str, set[int]]]:
        return {TOPIC: {0, 1, 2}}
        yield


def _spawn(step: Step[None], name: str) -> Any:
    step.close()  # heartbeats are not under test here
    return SimpleNamespace(join=lambda _t: None, is_alive=lambda: False)


def _member(client: Any, **config: Any) -> ClassicMember:
    return ClassicMember(client, build_config({"group_id": "g", **config}), _spawn)


def _join_answer(generation: int = 1, error_code: int = 0, protocol: str = "range") -> Any:
    # A follower's answer: the leader is another member, so this one sends no assignment.
    return SimpleNamespace(
        error_code=error_code,
        generation_id=generation,
        protocol_name=protocol,
        leader="leader",
        member_id="me",
        members=[],
    )


def _sync_answer(*partitions: int, error_code: int = 0) -> Any:
    assignment = ConsumerProtocolAssignment(0, [(TOPIC, list(partitions))], b"")
    return SimpleNamespace(error_code=error_code, assignment=assignment.encode())


def _stepwise(mocker: Any, **config: Any) -> tuple[ClassicMember, list[Any], list[Future]]:
    """A member whose requests go out through the client's futures (answered by the test)
    to coordinator 1."""
    client = mocker.Mock(closed=False)
    sent: list[Any] = []
    futures: list[Future] = []

    def send(node: Any, req: Any, timeout_ms: Any) -> Future:
        sent.append(req)
        futures.append(Future())
        return futures[-1]

    client.send.side_effect = send
    member = _member(client, **config)
    mocker.patch.object(member.link, "ensure", side_effect=lambda *_a: _node(1))
    member.link.coordinator_id = member.link.node = 1
    return member, sent, futures


def _cooperative(mocker: Any) -> tuple[ClassicMember, list[Any], list[Future]]:
    return _stepwise(mocker, partition_assignment_strategy=[CooperativeStickyAssignor()])


def _names(sent: list[Any]) -> list[str]:
    return [type(r).__name__ for r in sent]


def test_an_eager_join_gives_everything_up_first_then_takes_the_new_assignment(
    mocker: Any,
) -> None:
    member, sent, futures = _stepwise(mocker)
    assert not member.cooperative
    host = FakeHost(tps(0, 1, 2))
    run_blocking(member.reconcile(host, 0.0))
    # Everything is given up before the join goes out.
    assert host.events == [
        ("commit", tps(0, 1, 2)),
        ("on_partitions_revoked", tps(0, 1, 2)),
        ("assign", []),
    ]
    assert _names(sent) == ["JoinGroupRequest"] and member.rebalancing
    # The coordinator holds the JoinGroup until every member rejoined: the reconcile (and
    # the poll around it) returns, and the next one neither revokes again nor resends.
    run_blocking(member.reconcile(host, 0.0))
    assert len(host.events) == 3 and len(sent) == 1
    futures[0].success(_join_answer())
    run_blocking(member.reconcile(host, 0.0))
    assert _names(sent) == ["JoinGroupRequest", "SyncGroupRequest"]
    futures[1].success(_sync_answer(1, 2))
    run_blocking(member.reconcile(host, 0.0))
    assert host.events[3:] == [
        ("assign", tps(1, 2)),
        ("restore", None),
        ("on_partitions_assigned", tps(1, 2)),
    ]
    assert (member.generation, member.member_id, member.rebalances) == (1, "me", 1)
    assert not member.rejoin_needed and not member.rebalancing
    # Nothing to do until the group asks again.
    run_blocking(member.reconcile(host, 0.0))
    assert len(host.events) == 6 and len(sent) == 2


def test_an_eager_join_deferred_by_a_poll_revokes_once(mocker: Any) -> None:
    """No coordinator within the poll's time: the poll returns and the next one goes on
    with the join, without revoking (and calling the listener) again."""
    member, sent, futures = _stepwise(mocker, enable_auto_commit=False)
    host = FakeHost(tps(0), auto_commit=False)

    def no_coordinator(*_a: Any) -> Step[int]:
        raise kerrors.KafkaTimeoutError("no coordinator found in time")
        yield

    mocker.patch.object(member.link, "ensure", side_effect=no_coordinator)
    run_blocking(member.reconcile(host, 0.0))
    assert host.events == [("on_partitions_revoked", tps(0)), ("assign", [])]
    assert member.rejoin_needed and sent == []
    mocker.patch.object(member.link, "ensure", side_effect=lambda *_a: _node(1))
    run_blocking(member.reconcile(host, 0.0))
    futures[0].success(_join_answer())
    run_blocking(member.reconcile(host, 0.0))
    futures[1].success(_sync_answer(0))
    run_blocking(member.reconcile(host, 0.0))
    assert host.events[2:] == [
        ("assign", tps(0)),
        ("restore", None),
        ("on_partitions_assigned", tps(0)),
    ]
    assert _names(sent) == ["JoinGroupRequest", "SyncGroupRequest"]


def test_a_join_refused_for_good_reaches_the_poll(mocker: Any) -> None:
    member, _sent, futures = _stepwise(mocker)
    host = FakeHost([])
    run_blocking(member.reconcile(host, 0.0))
    futures[0].success(_join_answer(error_code=30))  # GROUP_AUTHORIZATION_FAILED
    with pytest.raises(kerrors.GroupAuthorizationFailedError):
        run_blocking(member.reconcile(host, 0.0))
    assert host.events == [("on_partitions_revoked", [])]


def _recording(effects: list[Effect]) -> Any:
    """A performer that records the effects and never sleeps."""

    def perform(effect: Effect) -> Any:
        effects.append(effect)
        return None if isinstance(effect, Sleep) else block_on(effect)

    return perform


@pytest.mark.parametrize(
    ("error_code", "coordinator_failed"),
    [
        (79, False),  # MEMBER_ID_REQUIRED: every new member's first JoinGroup
        (25, False),  # UNKNOWN_MEMBER_ID
        (27, False),  # REBALANCE_IN_PROGRESS
        (14, True),  # COORDINATOR_LOAD_IN_PROGRESS
        (16, True),  # NOT_COORDINATOR
    ],
)
def test_a_refused_join_goes_out_again_in_the_same_poll(
    mocker: Any, error_code: int, coordinator_failed: bool
) -> None:
    """The poll that took the refusal is woken to send the next JoinGroup at once (after a
    pause when the coordinator failed, which is looked up again), not left to wait out its
    timeout: a member whose reads wait longer than its session would never join."""
    member, sent, futures = _stepwise(mocker, enable_auto_commit=False)
    host = FakeHost([], auto_commit=False)
    woken = []
    host.fetcher = SimpleNamespace(wakeup=lambda: woken.append(True))
    run_blocking(member.reconcile(host, 0.0))
    assert _names(sent) == ["JoinGroupRequest"] and len(woken) == 0
    refusal = _join_answer(error_code=error_code)
    refusal.member_id = "given" if error_code == 79 else ""
    futures[0].success(refusal)
    woken.clear()  # the answer's own wake-up
    effects: list[Effect] = []
    run_blocking(member.reconcile(host, 0.0), _recording(effects))
    assert woken == [True] and member.rejoin_needed and not member.rebalancing
    assert [type(e).__name__ for e in effects] == (["Sleep"] if coordinator_failed else [])
    if error_code == 79:
        assert member.member_id == "given"
    run_blocking(member.reconcile(host, 0.0))
    assert _names(sent) == ["JoinGroupRequest", "JoinGroupRequest"]


def test_a_refused_sync_and_a_lost_answer_join_again_in_the_same_poll(mocker: Any) -> None:
    member, sent, futures = _stepwise(mocker, enable_auto_commit=False)
    host = FakeHost([], auto_commit=False)
    woken = []
    host.fetcher = SimpleNamespace(wakeup=lambda: woken.append(True))
    run_blocking(member.reconcile(host, 0.0))
    futures[0].success(_join_answer())
    run_blocking(member.reconcile(host, 0.0))
    futures[1].success(_sync_answer(error_code=27))  # REBALANCE_IN_PROGRESS
    woken.clear()
    run_blocking(member.reconcile(host, 0.0))
    assert woken == [True] and member.rejoin_needed
    run_blocking(member.reconcile(host, 0.0))
    futures[2].failure(kerrors.KafkaConnectionError("connection lost"))
    woken.clear()
    effects: list[Effect] = []
    run_blocking(member.reconcile(host, 0.0), _recording(effects))
    assert woken == [True] and [type(e).__name__ for e in effects] == ["Sleep"]
    assert member.link.node is None  # looked up again before the next JoinGroup
    assert _names(sent) == ["JoinGroupRequest", "SyncGroupRequest", "JoinGroupRequest"]


def test_a_subscription_changed_during_the_join_joins_again_after_it(mocker: Any) -> None:
    """Java's check of the subscription a join was sent with: the assignment the join
    brings is for the old topics, so the member rejoins with the new ones."""
    member, sent, futures = _stepwise(mocker, enable_auto_commit=False)
    host = FakeHost([], auto_commit=False)
    run_blocking(member.reconcile(host, 0.0))
    host.subscription_topics = {TOPIC, "other"}
    futures[0].success(_join_answer())
    run_blocking(member.reconcile(host, 0.0))
    futures[1].success(_sync_answer(0))
    run_blocking(member.reconcile(host, 0.0))
    assert host.events[-1] == ("on_partitions_assigned", tps(0))
    assert member.rejoin_needed
    run_blocking(member.reconcile(host, 0.0))
    assert _names(sent)[-1] == "JoinGroupRequest" and len(sent) == 3


def test_nothing_happens_without_a_subscription(mocker: Any) -> None:
    member, sent, _futures = _stepwise(mocker)
    host = FakeHost([])
    host.subscription_topics = None
    run_blocking(member.reconcile(host, 0.0))
    assert host.events == [] and sent == []


def test_a_pattern_joins_once_the_cluster_topics_are_known(mocker: Any) -> None:
    """A pattern subscription matches nothing until a metadata answer names the
    cluster's topics: no join before that (it would be followed by another at once)."""
    member, sent, _futures = _stepwise(mocker)
    host = FakeHost([])
    host.subscription_topics = set()
    host.pattern_matched = False
    run_blocking(member.reconcile(host, 0.0))
    assert host.events == [] and sent == []
    host.pattern_matched = True
    run_blocking(member.reconcile(host, 0.0))
    assert _names(sent) == ["JoinGroupRequest"]


def test_a_pattern_that_matches_nothing_still_joins_and_gives_up_what_it_held(
    mocker: Any,
) -> None:
    """Its topics deleted, a pattern member rejoins with no topics (as Java's does):
    everything it held is revoked and the group's rebalance does not wait for it."""
    member, sent, futures = _stepwise(mocker, enable_auto_commit=False)
    host = FakeHost(tps(0, 1), auto_commit=False)
    host.subscription_topics = set()
    run_blocking(member.reconcile(host, 0.0))
    assert host.events == [("on_partitions_revoked", tps(0, 1)), ("assign", [])]
    assert _names(sent) == ["JoinGroupRequest"]
    futures[0].success(_join_answer())
    run_blocking(member.reconcile(host, 0.0))
    futures[1].success(_sync_answer())
    run_blocking(member.reconcile(host, 0.0))
    assert _names(sent) == ["JoinGroupRequest", "SyncGroupRequest"]
    assert host.assigned == [] and not member.rebalancing and not member.rejoin_needed


def test_a_subscription_emptied_during_the_join_joins_again_with_no_topics(
    mocker: Any,
) -> None:
    member, sent, futures = _stepwise(mocker, enable_auto_commit=False)
    host = FakeHost([], auto_commit=False)
    run_blocking(member.reconcile(host, 0.0))
    host.subscription_topics = set()  # the pattern's topics were deleted meanwhile
    futures[0].success(_join_answer())
    run_blocking(member.reconcile(host, 0.0))
    futures[1].success(_sync_answer(0))
    run_blocking(member.reconcile(host, 0.0))
    assert member.rejoin_needed and not member.rebalancing
    run_blocking(member.reconcile(host, 0.0))
    assert _names(sent) == ["JoinGroupRequest", "SyncGroupRequest", "JoinGroupRequest"]


def _node(node: int) -> Step[int]:
    return node
    yield


def test_a_cooperative_join_moves_only_what_changed_and_asks_for_a_follow_up(
    mocker: Any,
) -> None:
    member, sent, futures = _cooperative(mocker)
    assert member.cooperative
    host = FakeHost(tps(0, 1))
    mocker.patch.object(
        member, "commit", side_effect=lambda positions, _d: _record(host, positions)
    )
    # The join goes out; the member keeps its partitions while the coordinator waits.
    run_blocking(member.reconcile(host, 0.0))
    assert [type(r).__name__ for r in sent] == ["JoinGroupRequest"] and host.events == []
    assert member.rebalancing
    run_blocking(member.reconcile(host, 0.0))  # no answer yet: nothing moves
    assert len(sent) == 1 and host.events == []
    futures[0].success(_join_answer(protocol="cooperative-sticky"))
    run_blocking(member.reconcile(host, 0.0))
    assert [type(r).__name__ for r in sent] == ["JoinGroupRequest", "SyncGroupRequest"]
    futures[1].success(_sync_answer(1, 2))
    run_blocking(member.reconcile(host, 0.0))
    assert host.events == [
        ("commit", {TopicPartition(TOPIC, 0): (EpochOffset(10, 3), "")}),
        ("on_partitions_revoked", tps(0)),
        ("assign", tps(1, 2)),
        ("restore", None),
        ("on_partitions_assigned", tps(2)),
    ]
    # Partition 0's next owner gets it in the next generation, which waits for this member.
    assert member.rejoin_needed and not member.rebalancing


def _record(host: FakeHost, positions: Any) -> Step[None]:
    host.events.append(("commit", dict(positions)))
    return
    yield


def test_a_cooperative_member_the_group_dropped_loses_its_partitions_without_a_commit(
    mocker: Any,
) -> None:
    member, sent, _futures = _cooperative(mocker)
    host = FakeHost(tps(0, 1))
    member.partitions_lost = True
    run_blocking(member.reconcile(host, 0.0))
    assert host.events == [("on_partitions_lost", tps(0, 1)), ("assign", [])]
    assert not member.partitions_lost
    assert [type(r).__name__ for r in sent] == ["JoinGroupRequest"]


def test_an_unknown_member_at_sync_drops_the_member_id_and_joins_again(mocker: Any) -> None:
    member, sent, futures = _cooperative(mocker)
    host = FakeHost(tps(0))
    run_blocking(member.reconcile(host, 0.0))
    futures[0].success(_join_answer(protocol="cooperative-sticky"))
    run_blocking(member.reconcile(host, 0.0))
    futures[1].success(_sync_answer(error_code=25))  # UNKNOWN_MEMBER_ID
    run_blocking(member.reconcile(host, 0.0))
    assert member.member_id == "" and member.partitions_lost
    assert host.events == []
    run_blocking(member.reconcile(host, 0.0))  # lost first, then a new join
    assert host.events == [("on_partitions_lost", tps(0)), ("assign", [])]
    assert [type(r).__name__ for r in sent][-1] == "JoinGroupRequest"


def test_the_host_protocol_is_what_the_engine_offers() -> None:
    from epochguard.consumer.engine import ConsumerEngine

    wanted = {
        name
        for name in dir(MembershipHost)
        if not name.startswith("_") and name not in {"config", "assigned", "fetcher"}
    } | set(MembershipHost.__annotations__)
    missing = {
        name
        for name in wanted
        if not hasattr(ConsumerEngine, name)
        and name not in ConsumerEngine.__init__.__code__.co_names
    }
    assert not missing, missing


def test_range_assignor_is_not_cooperative(mocker: Any) -> None:
    member = _member(
        mocker.Mock(closed=False), partition_assignment_strategy=[RangePartitionAssignor()]
    )
    assert not member.cooperative
