"""A commit by topic id refused with UNKNOWN_TOPIC_ID (membership.CommitNaming), against
answers built with kafka-python's classes: a partition leader's Metadata answer tells a
coordinator that lags the topic (the leader names the commit's id: asked again by id) from
a position in a deleted incarnation (another id: committed by name, the deleted id in the
commit's metadata). Either member kind, no broker."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kafka.errors import NodeNotReadyError, UnknownTopicIdError
from kafka.future import Future
from kafka.protocol.consumer import OffsetCommitResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.structs import TopicPartition

from epochguard.consumer import wire
from epochguard.consumer.config import build_config
from epochguard.consumer.effects import Step, run_blocking
from epochguard.consumer.group import ClassicMember
from epochguard.consumer.group_consumer import ConsumerGroupMember
from epochguard.consumer.membership import CommitNaming, CommitView, refused_id_deleted
from epochguard.offsets.position import EpochOffset

TP = TopicPartition("t", 0)
OTHER = TopicPartition("u", 0)
OLD = "5b8a1f0e-3f6b-4c4e-9a77-0d2b7a1c9e31"
NEW = "0c3e9d62-8a8f-4f7e-b1a4-2e5f6a7b8c9d"
U_ID = "7f1d2c3b-4a5e-4f60-8a9b-0c1d2e3f4a5b"
LEADER = 3

members = pytest.mark.parametrize("member_class", [ClassicMember, ConsumerGroupMember])


def _answered(value: Any) -> Step[Any]:
    return value
    yield  # a generator: what the engine's steps are


def _commit_answer(req: Any, refuse: set[str]) -> Any:
    """The coordinator's answer to ``req``: UNKNOWN_TOPIC_ID for an id in ``refuse``."""
    T = OffsetCommitResponse.OffsetCommitResponseTopic
    P = T.OffsetCommitResponsePartition
    by_id = req._max_version >= wire.OFFSETS_BY_ID_VERSION
    topics = []
    for t in req.topics:
        refused = by_id and str(t.topic_id) in refuse
        parts = [
            P(partition_index=p.partition_index, error_code=100 if refused else 0)
            for p in t.partitions
        ]
        if by_id:
            topics.append(T(topic_id=t.topic_id, partitions=parts))
        else:
            topics.append(T(name=t.name, partitions=parts))
    return OffsetCommitResponse(version=10 if by_id else 8, throttle_time_ms=0, topics=topics)


def _metadata(topic: str, topic_id: str | None, error_code: int = 0) -> Any:
    R = MetadataResponse
    T = R.MetadataResponseTopic
    P = T.MetadataResponsePartition
    parts = (
        []
        if error_code
        else [
            P(
                error_code=0,
                partition_index=0,
                leader_id=LEADER,
                leader_epoch=0,
                replica_nodes=[LEADER],
                isr_nodes=[LEADER],
                offline_replicas=[],
            )
        ]
    )
    return R(
        version=12,
        throttle_time_ms=0,
        brokers=[],
        cluster_id=None,
        controller_id=1,
        topics=[
            T(
                error_code=error_code,
                name=topic,
                topic_id=uuid.UUID(topic_id) if topic_id else uuid.UUID(int=0),
                is_internal=False,
                partitions=parts,
            )
        ],
    )


class Harness:
    """A member whose coordinator refuses the ids in ``refuse`` and whose partition leaders
    answer Metadata from ``leader_ids`` (a topic's live id; ``None``: no such topic; a
    missing topic: the request fails)."""

    def __init__(
        self,
        mocker: Any,
        member_class: Any,
        refuse: set[str],
        leader_ids: dict[str, str | None],
        leaders: list[int] | None = None,
        older: frozenset[str] = frozenset(),
    ) -> None:
        self.client = mocker.Mock(closed=False)
        self.member = member_class(self.client, build_config({"group_id": "g"}))
        self.refuse = refuse
        self.leader_ids = leader_ids
        self.commits: list[Any] = []
        self.asked: list[tuple[int, list[str]]] = []
        self.member.commit_view = lambda _topic, _parts: CommitView(
            (LEADER,) if leaders is None else tuple(leaders), older
        )
        mocker.patch.object(self.member, "_call", side_effect=self._call)
        mocker.patch("epochguard.consumer.group._RETRY_S", 0.0)
        mocker.patch("epochguard.consumer.group_consumer._RETRY_S", 0.0)
        self.client.send.side_effect = self._send

    def _call(self, req: Any, *_a: Any, **_k: Any) -> Step[Any]:
        self.commits.append(req)
        return _answered(_commit_answer(req, self.refuse))

    def _send(self, node: int, req: Any, _timeout_ms: float) -> Any:
        assert isinstance(req, MetadataRequest)
        names = [t.name for t in req.topics]
        self.asked.append((node, names))
        (name,) = names
        if name not in self.leader_ids:
            return Future().failure(NodeNotReadyError(node))
        tid = self.leader_ids[name]
        return Future().success(_metadata(name, tid, 0 if tid else 3))

    def commit(self, offsets: dict[TopicPartition, str], timeout_s: float = 5.0) -> None:
        run_blocking(
            self.member.commit(
                {tp: (EpochOffset(5, 1, topic_id=tid), "") for tp, tid in offsets.items()},
                time.monotonic() + timeout_s,
            )
        )


def _by_id(req: Any) -> bool:
    return bool(req._max_version >= wire.OFFSETS_BY_ID_VERSION)


@members
def test_a_lagging_coordinator_is_asked_again_by_id(mocker: Any, member_class: Any) -> None:
    """The leader names the commit's own id: the coordinator lags the topic, so the commit
    waits for it by id (by name it would be filed under the id the coordinator's view gives
    the name, a deleted one)."""
    h = Harness(mocker, member_class, refuse={NEW}, leader_ids={"t": NEW})
    answers = iter([True, True, False])  # refused twice, then the coordinator knows NEW

    def call(req: Any, *_a: Any, **_k: Any) -> Step[Any]:
        h.commits.append(req)
        return _answered(_commit_answer(req, {NEW} if next(answers) else set()))

    mocker.patch.object(h.member, "_call", side_effect=call)
    h.commit({TP: NEW})
    assert len(h.commits) == 3 and all(_by_id(r) for r in h.commits)
    assert h.asked == [(LEADER, ["t"]), (LEADER, ["t"])]  # asked again each refusal


@members
@pytest.mark.parametrize("position_id", [OLD, OLD.upper()])
def test_a_deleted_id_is_committed_by_name(
    mocker: Any, member_class: Any, position_id: str
) -> None:
    """The leader names another id: the position's incarnation is deleted, and by id the
    commit would be refused for good. It goes by name, carrying the deleted id in its
    metadata (where the next owner sees the re-creation). An id restored in upper case is
    the same id the answers name."""
    h = Harness(mocker, member_class, refuse={OLD}, leader_ids={"t": NEW})
    h.commit({TP: position_id})
    first, second = h.commits
    assert _by_id(first) and not _by_id(second)
    (topic,) = second.topics
    assert topic.name == "t"
    (part,) = topic.partitions
    assert part.committed_offset == 5 and position_id in part.committed_metadata
    assert h.asked == [(LEADER, ["t"])]


@members
def test_only_the_deleted_topic_goes_by_name(mocker: Any, member_class: Any) -> None:
    """Two topics, one of them re-created: the other stays by id, in a request of its own."""
    h = Harness(mocker, member_class, refuse={OLD}, leader_ids={"t": NEW, "u": U_ID})
    h.commit({TP: OLD, OTHER: U_ID})
    first, *rest = h.commits
    assert _by_id(first) and sorted(str(t.topic_id) for t in first.topics) == sorted([OLD, U_ID])
    assert len(rest) == 2
    by_id = [r for r in rest if _by_id(r)]
    by_name = [r for r in rest if not _by_id(r)]
    assert [str(t.topic_id) for r in by_id for t in r.topics] == [U_ID]
    assert [t.name for r in by_name for t in r.topics] == ["t"]
    assert h.asked == [(LEADER, ["t"])]


@members
def test_a_leader_that_lags_the_deletion_is_asked_again(mocker: Any, member_class: Any) -> None:
    """A leader that has not applied the deletion still names the old id: asked again at
    the next refusal, it names the new one once it has, and the commit goes by name."""
    h = Harness(mocker, member_class, refuse={OLD}, leader_ids={"t": OLD})
    views = iter([OLD, OLD, NEW])
    original = h._send

    def send(node: int, req: Any, timeout_ms: float) -> Any:
        h.leader_ids["t"] = next(views)
        return original(node, req, timeout_ms)

    h.client.send.side_effect = send
    h.commit({TP: OLD})
    assert [_by_id(r) for r in h.commits] == [True, True, True, False]
    assert len(h.asked) == 3


@members
def test_a_leader_naming_an_id_known_to_be_deleted_is_asked_again(
    mocker: Any, member_class: Any
) -> None:
    """The leader names an id the partition's tracker knows to be older than one a leader
    served since (a broker behind both the deletion and the re-creation): that says nothing
    about the commit's id, so the commit stays by id, and goes by name once the leader
    names yet another id."""
    h = Harness(mocker, member_class, refuse={NEW}, leader_ids={"t": OLD}, older=frozenset({OLD}))
    views = iter([OLD, OLD, U_ID])
    original = h._send

    def send(node: int, req: Any, timeout_ms: float) -> Any:
        h.leader_ids["t"] = next(views)
        return original(node, req, timeout_ms)

    h.client.send.side_effect = send
    h.commit({TP: NEW})
    assert [_by_id(r) for r in h.commits] == [True, True, True, False]


@members
def test_a_topic_the_leader_does_not_know_stays_by_id(mocker: Any, member_class: Any) -> None:
    """No topic by that name at the leader decides nothing: a leader behind the topic's
    creation says the same, and by name a coordinator as far behind would file the commit
    under a deleted id. The commit is asked again by id until its deadline, and the error
    reaches the caller (as it would by name: Kafka refuses a commit by name of a topic it
    does not know)."""
    h = Harness(mocker, member_class, refuse={OLD}, leader_ids={"t": None})
    with pytest.raises(UnknownTopicIdError):
        h.commit({TP: OLD}, timeout_s=1.0)
    assert h.commits and all(_by_id(r) for r in h.commits)
    assert len(h.asked) >= 2


@members
def test_no_leader_known_leaves_the_commit_by_id_until_its_deadline(
    mocker: Any, member_class: Any
) -> None:
    h = Harness(mocker, member_class, refuse={OLD}, leader_ids={"t": NEW}, leaders=[])
    with pytest.raises(UnknownTopicIdError):
        h.commit({TP: OLD}, timeout_s=0.3)
    assert all(_by_id(r) for r in h.commits) and h.asked == []


@members
def test_a_leader_that_does_not_answer_tries_the_next(mocker: Any, member_class: Any) -> None:
    """The first leader's request fails (not ready): another leader of the topic is asked."""
    h = Harness(mocker, member_class, refuse={OLD}, leader_ids={"t": NEW}, leaders=[LEADER, 4])
    original = h._send

    def send(node: int, req: Any, timeout_ms: float) -> Any:
        if node == LEADER:
            h.asked.append((node, ["t"]))
            return Future().failure(NodeNotReadyError(node))
        return original(node, req, timeout_ms)

    h.client.send.side_effect = send
    h.commit({TP: OLD})
    assert [_by_id(r) for r in h.commits] == [True, False]
    assert h.asked == [(LEADER, ["t"]), (4, ["t"])]


@members
def test_a_leader_slower_than_the_deadline_is_not_waited_for(
    mocker: Any, member_class: Any
) -> None:
    """The leader never answers: the commit ends by its deadline with the coordinator's
    refusal, the error the caller saw before (never lost quietly)."""
    h = Harness(mocker, member_class, refuse={OLD}, leader_ids={"t": NEW})
    h.client.send.side_effect = lambda *_a: Future()
    start = time.monotonic()
    with pytest.raises(UnknownTopicIdError):
        h.commit({TP: OLD}, timeout_s=1.0)
    assert time.monotonic() - start < 1.0 + 0.5  # request()'s own half second at most
    assert all(_by_id(r) for r in h.commits)


def test_refused_id_deleted_reads_the_leaders_answer() -> None:
    def answer(tid: str | None, error: int = 0, name: str = "t") -> wire.MetadataAnswer:
        return wire.read_metadata(_metadata(name, tid, error))

    assert refused_id_deleted(OLD, "t", answer(NEW))
    assert not refused_id_deleted(OLD, "t", answer(OLD))
    assert not refused_id_deleted(OLD.upper(), "t", answer(OLD))  # the same id, other case
    assert not refused_id_deleted(OLD, "t", answer(None, 3))  # unknown topic: no verdict
    assert not refused_id_deleted(OLD, "t", answer(None))  # no id (an old broker)
    assert not refused_id_deleted(OLD, "t", answer(NEW, name="other"))
    assert not refused_id_deleted(NEW, "t", answer(OLD), older={OLD.upper()})  # known older


def test_one_position_without_an_id_names_every_topic_by_name() -> None:
    naming = CommitNaming(
        {TP: (EpochOffset(5, topic_id=OLD), ""), OTHER: (EpochOffset(3), "")}, by_id=True
    )
    entries = [(TP, 5, None, ""), (OTHER, 3, None, "")]
    assert naming.requests(entries) == [(entries, None)]
    assert naming.refused({OLD}) == {}
