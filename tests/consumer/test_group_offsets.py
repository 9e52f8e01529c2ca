"""ClassicMember's offset calls and CoordinatorLink's lookups, against answers built with
kafka-python's classes."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, UnknownTopicIdError
from kafka.future import Future
from kafka.protocol.consumer import OffsetCommitResponse, OffsetFetchResponse
from kafka.structs import TopicPartition

from epochguard.consumer import wire
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.config import build_config
from epochguard.consumer.effects import Step, run_blocking
from epochguard.consumer.group import ClassicMember, CommitFailedError
from epochguard.consumer.group_consumer import ConsumerGroupMember
from epochguard.consumer.membership import CoordinatorLink
from epochguard.offsets.position import EpochOffset

TP = TopicPartition("t", 0)


def _offset_fetch(error_code: int, offset: int = 5, epoch: int = 0) -> Any:
    T = OffsetFetchResponse.OffsetFetchResponseTopic
    P = T.OffsetFetchResponsePartition
    part = P(
        partition_index=0,
        committed_offset=offset,
        committed_leader_epoch=epoch,
        metadata="",
        error_code=error_code,
    )
    return OffsetFetchResponse(
        version=7, throttle_time_ms=0, error_code=0, topics=[T(name="t", partitions=[part])]
    )


def _answered(value: Any) -> Step[Any]:
    """A coordinator call that answers ``value`` at once."""
    return value
    yield  # a generator: what the engine's steps are


def test_unstable_offset_commit_is_asked_again(mocker: Any) -> None:
    """UNSTABLE_OFFSET_COMMIT (88: a transaction is committing offsets) is retried, and the
    committed epoch 0 comes back as 0."""
    coord = ClassicMember(mocker.Mock(), build_config({"group_id": "g"}))
    answers = [_offset_fetch(88), _offset_fetch(0)]
    call = mocker.patch.object(
        coord, "_call", side_effect=lambda *_a, **_k: _answered(answers.pop(0))
    )
    got = run_blocking(coord.fetch_committed([TP], time.monotonic() + 60))
    assert got == {TP: EpochOffset(5, 0)}
    assert call.call_count == 2


def test_nothing_committed_is_none(mocker: Any) -> None:
    coord = ClassicMember(mocker.Mock(), build_config({"group_id": "g"}))
    mocker.patch.object(
        coord, "_call", side_effect=lambda *_a, **_k: _answered(_offset_fetch(0, -1, -1))
    )
    assert run_blocking(coord.fetch_committed([TP], time.monotonic() + 60)) == {TP: None}


def test_a_short_wait_does_not_shorten_the_coordinator_lookup(mocker: Any) -> None:
    """FindCoordinator goes out with the full request timeout, whatever is left of the
    caller's (a request that times out closes its connection, and poll(timeout_ms=1) would
    drop it every time); a lookup still on its way serves the next call."""
    lookup = Future()
    client = mocker.Mock(closed=False)
    client.send.return_value = lookup
    client.wait = BrokerClient.wait
    coord = CoordinatorLink(client, "g", request_timeout_s=30.0)
    with pytest.raises(KafkaTimeoutError, match="no coordinator found in time"):
        run_blocking(coord.ensure(time.monotonic() + 0.01))
    assert client.send.call_count == 1
    assert client.send.call_args.args[2] == 30000  # timeout_ms: the full request timeout
    answer = SimpleNamespace(error_code=0, node_id=7)
    lookup.success(answer)
    node = run_blocking(coord.ensure(time.monotonic() + 5))
    assert coord.coordinator_id == 7
    client.coordinator_node.assert_called_once_with("g", answer)
    assert node is client.coordinator_node.return_value
    assert client.send.call_count == 1


def test_a_connection_closed_on_a_correlation_id_out_of_order_is_retried(mocker: Any) -> None:
    """The transport closes a connection whose answer does not match the request in flight
    (CorrelationIdError, a KafkaProtocolError): the coordinator call forgets the coordinator
    and sends again, as after a disconnect (found by the chaos schedules, where it escaped
    poll() from a group join)."""
    from kafka.errors import CorrelationIdError

    client = mocker.Mock(closed=False)
    answers: list[Any] = [
        Future().failure(CorrelationIdError("sent 10, recv 11")),
        Future().success("answer"),
    ]
    client.send.side_effect = lambda *_a: answers.pop(0)
    coord = CoordinatorLink(client, "g", request_timeout_s=30.0)
    mocker.patch.object(coord, "ensure", side_effect=lambda *_a: _answered(7))
    dead = mocker.patch.object(coord, "forget")
    assert run_blocking(coord.call(object(), time.monotonic() + 5)) == "answer"
    assert client.send.call_count == 2
    dead.assert_called_once()


def _commit_answer(error_code: int, version: int = 10) -> Any:
    T = OffsetCommitResponse.OffsetCommitResponseTopic
    P = T.OffsetCommitResponsePartition
    return OffsetCommitResponse(
        version=version,
        throttle_time_ms=0,
        topics=[T(topic_id=TID, partitions=[P(partition_index=0, error_code=error_code)])],
    )


TID = "5b8a1f0e-3f6b-4c4e-9a77-0d2b7a1c9e31"


@pytest.mark.parametrize("member_class", [ClassicMember, ConsumerGroupMember])
def test_a_commit_by_topic_id_is_asked_again_until_the_coordinator_knows_the_id(
    mocker: Any, member_class: Any
) -> None:
    """UNKNOWN_TOPIC_ID (100): the coordinator's metadata does not know the topic's id yet
    (it lags a re-creation). The same request goes again, by id, until it is taken."""
    member = member_class(mocker.Mock(), build_config({"group_id": "g"}))
    member.commits_by_topic_id = True
    answers = [_commit_answer(100), _commit_answer(100), _commit_answer(0)]
    sent: list[Any] = []

    def call(req: Any, *_a: Any, **_k: Any) -> Step[Any]:
        sent.append(req)
        return _answered(answers.pop(0))

    mocker.patch.object(member, "_call", side_effect=call)
    mocker.patch("epochguard.consumer.group._RETRY_S", 0.0)
    mocker.patch("epochguard.consumer.group_consumer._RETRY_S", 0.0)
    run_blocking(member.commit({TP: (EpochOffset(5, 1, topic_id=TID), "")}, time.monotonic() + 5))
    assert len(sent) == 3
    for req in sent:
        assert req._max_version == wire.OFFSETS_BY_ID_VERSION
        (topic,) = req.topics
        assert str(topic.topic_id) == TID


@pytest.mark.parametrize("member_class", [ClassicMember, ConsumerGroupMember])
def test_unknown_topic_id_past_the_deadline_reaches_the_caller(
    mocker: Any, member_class: Any
) -> None:
    """Never a commit lost quietly: a coordinator that still does not know the id when the
    commit's time is up fails the commit."""
    member = member_class(mocker.Mock(), build_config({"group_id": "g"}))
    member.commits_by_topic_id = True
    mocker.patch.object(
        member, "_call", side_effect=lambda *_a, **_k: _answered(_commit_answer(100))
    )
    with pytest.raises(UnknownTopicIdError):
        run_blocking(
            member.commit({TP: (EpochOffset(5, 1, topic_id=TID), "")}, time.monotonic() + 0.2)
        )


@pytest.mark.parametrize("member_class", [ClassicMember, ConsumerGroupMember])
def test_a_position_without_a_topic_id_is_committed_by_name(mocker: Any, member_class: Any) -> None:
    member = member_class(mocker.Mock(), build_config({"group_id": "g"}))
    member.commits_by_topic_id = True
    sent: list[Any] = []

    def call(req: Any, *_a: Any, **_k: Any) -> Step[Any]:
        sent.append(req)
        return _answered(_commit_answer(0, version=8))

    mocker.patch.object(member, "_call", side_effect=call)
    other = TopicPartition("t", 1)
    run_blocking(
        member.commit(
            {TP: (EpochOffset(5, 1, topic_id=TID), ""), other: (EpochOffset(3), "")},
            time.monotonic() + 5,
        )
    )
    (req,) = sent
    assert req._max_version < wire.OFFSETS_BY_ID_VERSION
    assert [t.name for t in req.topics] == ["t"]


def test_a_group_the_coordinator_no_longer_has_ends_the_generation(mocker: Any) -> None:
    """GROUP_ID_NOT_FOUND (69) to a member's commit (OffsetCommit v9+; ILLEGAL_GENERATION
    before): the group is gone, and what this member owned with it."""
    member = ClassicMember(mocker.Mock(), build_config({"group_id": "g"}))
    member.protocol, member.generation, member.member_id = "range", 3, "m"
    member.rejoin_needed = False
    mocker.patch.object(
        member, "_call", side_effect=lambda *_a, **_k: _answered(_commit_answer(69))
    )
    with pytest.raises(CommitFailedError):
        run_blocking(
            member.commit({TP: (EpochOffset(5, 1, topic_id=TID), "")}, time.monotonic() + 5)
        )
    assert member.rejoin_needed and member.partitions_lost
