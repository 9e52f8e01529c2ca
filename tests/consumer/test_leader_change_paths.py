"""Leader changes without avoidable round trips, decided on fed answers (no broker):

- metadata goes last to a broker whose connection just failed (it was stopped);
- a refusal by a broker that does not lead makes the metadata refresh go at once;
- a leader known to answer Fetch v12+ judges the position itself (DivergingEpoch), with the
  same truncation report as the OffsetForLeaderEpoch path.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace as NS
from typing import Any

import attrs
import pytest
from kafka.future import Future
from kafka.structs import TopicPartition

from epochguard._errors import ErrorCode
from epochguard.consumer import wire
from epochguard.consumer.client import NodeLoad, least_loaded_node
from epochguard.consumer.config import build_config
from epochguard.consumer.fetcher import Fetcher, FetchSent, MetadataSent
from epochguard.consumer.metadata import Metadata
from epochguard.offsets.events import FetchAction, ValidateAction
from epochguard.offsets.policy import OffsetPolicy
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.offsets.state import PartitionState

TP = TopicPartition("t", 0)
TID = uuid.uuid4()

# ------------------------------------------------------------------ least loaded broker


def _load(node: int, **kw: Any) -> NodeLoad:
    base: dict[str, Any] = {
        "connected": False,
        "in_flight": 0,
        "backing_off": False,
        "failed_at": None,
    }
    return NodeLoad(node, **{**base, **kw})


def test_a_connected_idle_broker_is_taken_first() -> None:
    loads = [_load(0), _load(1, connected=True, in_flight=1), _load(2, connected=True)]
    assert least_loaded_node(loads) == 2


def test_a_broker_that_just_failed_comes_after_an_untried_one() -> None:
    # The leader's broker was stopped: its connection is lost, it is not backing off yet.
    loads = [_load(1, failed_at=100.0), _load(0)]
    assert least_loaded_node(loads) == 0


def test_a_busy_connection_comes_before_a_broker_that_failed() -> None:
    loads = [_load(1, failed_at=100.0), _load(2, connected=True, in_flight=2)]
    assert least_loaded_node(loads) == 2


def test_among_failed_brokers_the_oldest_failure_is_tried() -> None:
    loads = [_load(1, failed_at=100.0), _load(2, failed_at=50.0)]
    assert least_loaded_node(loads) == 2


def test_brokers_backing_off_are_never_chosen() -> None:
    assert least_loaded_node([_load(1, backing_off=True), _load(2, backing_off=True)]) is None
    assert least_loaded_node([_load(1, backing_off=True), _load(2, failed_at=1.0)]) == 2


def test_an_untried_broker_comes_before_a_busy_one() -> None:
    # kafka-python's order: a request does not queue behind a long poll when a broker
    # without a connection (and no failure) can take it.
    loads = [_load(2, connected=True, in_flight=1), _load(0)]
    assert least_loaded_node(loads) == 0


# ------------------------------------------------------------------ metadata after a refusal


def _md() -> Metadata:
    return Metadata(build_config({}))


def _empty_answer() -> wire.MetadataAnswer:
    return wire.read_metadata(NS(topics=[], brokers=[]))


def test_a_refusal_sends_the_refresh_without_the_spacing_after_an_answer() -> None:
    md = _md()
    md.topics.add("t")
    assert md.due(10.0) is not None
    md.on_answer(_empty_answer(), 10.0, ["t"], 10.01)
    md.request()
    assert md.due(10.02) is None  # an ordinary refresh waits retry_backoff_ms
    md.request(refused_at=10.02)
    assert md.wake_at(10.02, 99.0) <= 10.03
    assert md.due(10.02) is not None


def test_a_refusal_seen_before_the_last_request_went_out_does_not_hurry_the_next() -> None:
    md = _md()
    md.topics.add("t")
    md.request(refused_at=9.0)
    assert md.due(10.0) is not None  # sent after the refusal: this answer accounts for it
    md.on_answer(_empty_answer(), 10.0, ["t"], 10.01)
    md.request(refused_at=9.5)
    assert md.due(10.02) is None


def test_a_tracker_asking_again_while_a_refresh_is_on_its_way_is_answered_by_it() -> None:
    md = _md()
    md.topics.add("t")
    assert md.due(10.0) is not None
    md.request(any_answer=True)  # a tracker still waiting for a leader asks again meanwhile
    md.on_answer(_empty_answer(), 10.0, ["t"], 10.5)
    assert md.due(20.0) is None  # nothing more until metadata_max_age_ms


def test_a_refresh_asked_for_now_is_a_request_sent_after_the_one_on_its_way() -> None:
    # The consumer's own waits (partitions_for_topic, position) want an answer to a request
    # sent after they asked: fresh_since(when) holds only then.
    md = _md()
    md.topics.add("t")
    assert md.due(10.0) is not None
    md.request()
    md.on_answer(_empty_answer(), 10.0, ["t"], 10.5)
    assert not md.fresh_since(10.2)
    assert md.due(20.0) is not None


def test_a_refusal_after_the_request_went_out_still_asks_again() -> None:
    md = _md()
    md.topics.add("t")
    assert md.due(10.0) is not None
    md.request(refused_at=10.2, any_answer=True)
    md.on_answer(_empty_answer(), 10.0, ["t"], 10.5)
    assert md.due(10.5) is not None


def test_a_refusal_keeps_the_failure_backoff() -> None:
    md = _md()
    md.topics.add("t")
    assert md.due(10.0) is not None
    md.on_failure(ConnectionError("refused"), 10.0)
    md.request(refused_at=10.01)
    assert md.due(10.02) is None


# ------------------------------------------------------------------ DivergingEpoch as validation


def _metadata(leader: int | None, epoch: int) -> Any:
    part = NS(
        partition_index=0, leader_id=-1 if leader is None else leader, leader_epoch=epoch,
        error_code=0,
    )  # fmt: skip
    topic = NS(name="t", error_code=0, topic_id=TID, is_internal=False, partitions=[part])
    return NS(topics=[topic], brokers=[])


def _fetcher(mocker: Any, events: list[Any]) -> tuple[Fetcher, Any]:
    client = mocker.Mock()
    client.send.return_value = Future()
    f = Fetcher(
        client,
        build_config({}),
        OffsetPolicy(auto_offset_reset="earliest", on_truncation="rewind"),
        None,
        None,
        events.append,
    )
    return f, client


def _fetch_answer(version: int, *, diverging: tuple[int, int] = (-1, -1), error: int = 0) -> Any:
    part = NS(
        partition_index=0,
        error_code=error,
        diverging_epoch=NS(epoch=diverging[0], end_offset=diverging[1]),
        records=b"",
        high_watermark=20,
        aborted_transactions=None,
        current_leader=None,
    )
    return NS(API_VERSION=version, error_code=0, responses=[NS(topic="t", partitions=[part])])


def _sent(client: Any) -> tuple[int, str]:
    node, request = client.send.call_args.args[:2]
    client.send.reset_mock()
    return node, type(request).__name__


def _leader(f: Fetcher, leader: int | None, epoch: int) -> None:
    f._on_metadata(MetadataSent(0.0, ["t"]), Future().success(_metadata(leader, epoch)))


def _fetch_from(f: Fetcher, client: Any, node: int, version: int, **answer: Any) -> FetchAction:
    """Send the tracker's fetch (it must go to ``node``) and feed it a v``version`` answer."""
    f.send_requests(0.0)
    assert _sent(client) == (node, "FetchRequest")
    tracker = f.trackers[TP]
    action = FetchAction(
        TP, node, tracker.position.offset, tracker.leader_epoch, tracker.position.leader_epoch,
        int(tracker._gen), str(TID),
    )  # fmt: skip
    assert tracker.awaits(action)
    f._on_fetch(
        FetchSent(node, {TP: action}, {}), Future().success(_fetch_answer(version, **answer))
    )
    return action


def _reading_at_15_from(f: Fetcher, client: Any, *, leader: int, epoch: int, version: int) -> None:
    """The partition restored at offset 15 (epoch 2), validated with ``leader`` at ``epoch``
    by OffsetForLeaderEpoch, then fetched from it, answered at v``version``."""
    tracker = f.add_partition(TP)
    _leader(f, leader, epoch)
    tracker.restore(EpochOffset(15, 2))
    f.after_input(TP)
    f.send_requests(0.0)
    assert _sent(client) == (leader, "OffsetForLeaderEpochRequest")
    validate = ValidateAction(TP, leader, epoch, 2, EpochOffset(15, 2), int(tracker._gen))
    tracker.on_validation(validate, 0, 2, 15, 0.0)
    f.after_input(TP)
    _fetch_from(f, client, leader, version)


def _at_15_epoch_3(mocker: Any, events: list[Any], *, version: int) -> tuple[Fetcher, Any]:
    """A partition at offset 15 (epoch 2) fetching from broker 1, leader at epoch 3, and
    broker 2, the other replica, leader at epoch 2 before; both answered a v``version``
    fetch."""
    f, client = _fetcher(mocker, events)
    _reading_at_15_from(f, client, leader=2, epoch=2, version=version)
    tracker = f.trackers[TP]
    _leader(f, 1, 3)
    f.after_input(TP)
    f.send_requests(0.0)
    # Broker 1 never answered a fetch: validated by OffsetForLeaderEpoch.
    assert _sent(client) == (1, "OffsetForLeaderEpochRequest")
    tracker.on_validation(ValidateAction(TP, 1, 3, 2, EpochOffset(15, 2), int(tracker._gen)),
                          0, 2, 15, 0.0)  # fmt: skip
    f.after_input(TP)
    _fetch_from(f, client, 1, version)
    return f, client


def _pending(tracker: Any, node: int) -> FetchAction:
    return FetchAction(
        TP, node, tracker.position.offset, tracker.leader_epoch, tracker.position.leader_epoch,
        int(tracker._gen), str(TID),
    )  # fmt: skip


def _unclean_change_to_2(f: Fetcher, client: Any) -> str:
    """Broker 2 becomes leader at epoch 4, its log ending epoch 2 at offset 12: returns the
    request the consumer sends first."""
    _leader(f, 2, 4)
    f.after_input(TP)
    f.send_requests(0.0)
    node, kind = _sent(client)
    assert node == 2
    return kind


def _report(events: list[Any]) -> Any:
    [det] = [e for e in events if e.name == "truncation_detected"]
    return det.report


def test_a_leader_that_answered_v12_judges_the_position_by_diverging_epoch(mocker: Any) -> None:
    events: list[Any] = []
    f, client = _at_15_epoch_3(mocker, events, version=12)
    assert _unclean_change_to_2(f, client) == "FetchRequest"  # no OffsetForLeaderEpoch
    tracker = f.trackers[TP]
    action = _pending(tracker, 2)
    f._on_fetch(
        FetchSent(2, {TP: action}, {}), Future().success(_fetch_answer(12, diverging=(2, 12)))
    )
    report = _report(events)
    assert report.detected_by is DetectedBy.DIVERGING_EPOCH
    assert (report.lost_from, report.lost_to) == (12, 15)
    assert tracker.position == EpochOffset(12, 2)
    assert f.metrics.diverging_epoch_responses == 1


@pytest.mark.parametrize("version", [11, None])
def test_a_leader_not_known_to_answer_v12_is_asked_offset_for_leader_epoch(
    mocker: Any, version: int | None
) -> None:
    """v11: the broker answered at v11 before; None: the new leader never answered (its
    first answer is the one that tells)."""
    events: list[Any] = []
    f, client = _fetcher(mocker, events)
    _reading_at_15_from(f, client, leader=1, epoch=3, version=12 if version is None else version)
    assert _unclean_change_to_2(f, client) == "OffsetForLeaderEpochRequest"


def test_a_leaderless_answer_between_two_leaders_leaves_the_choice_to_the_next(
    mocker: Any,
) -> None:
    events: list[Any] = []
    f, client = _at_15_epoch_3(mocker, events, version=12)
    _leader(f, None, 4)
    f.after_input(TP)
    assert f.trackers[TP].state is PartitionState.FETCHING
    _leader(f, 2, 5)
    f.after_input(TP)
    f.send_requests(0.0)
    assert _sent(client) == (2, "FetchRequest")


def test_a_broker_answering_below_v12_again_is_validated_the_old_way(mocker: Any) -> None:
    events: list[Any] = []
    f, client = _at_15_epoch_3(mocker, events, version=12)
    # Broker 2, leader again, answers v11 now (downgraded): the next change to it is
    # validated by OffsetForLeaderEpoch.
    assert _unclean_change_to_2(f, client) == "FetchRequest"
    tracker = f.trackers[TP]
    f._on_fetch(FetchSent(2, {TP: _pending(tracker, 2)}, {}), Future().success(_fetch_answer(11)))
    _leader(f, 1, 5)
    f.after_input(TP)
    f.send_requests(0.0)
    assert _sent(client)[0] == 1  # broker 1 answered v12 before: a fetch
    tracker.cancel(_pending(tracker, 1))
    _leader(f, 2, 6)
    f.after_input(TP)
    f.send_requests(0.0)
    assert _sent(client) == (2, "OffsetForLeaderEpochRequest")


@pytest.mark.parametrize(
    ("answer", "lost"),
    [((2, 12), (12, 15)), ((1, 9), (9, 15)), ((2, 15), None)],
    ids=["same-epoch-shorter", "older-epoch", "no-truncation"],
)
def test_diverging_epoch_and_offset_for_leader_epoch_report_alike(
    mocker: Any, answer: tuple[int, int], lost: tuple[int, int] | None
) -> None:
    """The same leader answer, once as Fetch DivergingEpoch and once as OffsetForLeaderEpoch:
    the same position afterwards and the same report, but for the detected_by field."""
    outcomes = []
    for version in (12, 11):
        events: list[Any] = []
        f, client = _at_15_epoch_3(mocker, events, version=version)
        kind = _unclean_change_to_2(f, client)
        tracker = f.trackers[TP]
        if version == 12:
            assert kind == "FetchRequest"
            end = answer if answer[1] < 15 else (-1, -1)  # Kafka sends it only if it diverges
            f._on_fetch(
                FetchSent(2, {TP: _pending(tracker, 2)}, {}),
                Future().success(_fetch_answer(12, diverging=end)),
            )
        else:
            assert kind == "OffsetForLeaderEpochRequest"
            validate = ValidateAction(TP, 2, 4, 2, EpochOffset(15, 2), int(tracker._gen))
            tracker.on_validation(validate, 0, answer[0], answer[1], 0.0)
            f.after_input(TP)
        reports = [e.report for e in events if e.name == "truncation_detected"]
        outcomes.append((tracker.position, tracker.state, reports))
    (pos_a, state_a, reports_a), (pos_b, state_b, reports_b) = outcomes
    assert (pos_a, state_a) == (pos_b, state_b)
    if lost is None:
        assert reports_a == reports_b == []
        assert pos_a == EpochOffset(15, 2)
        return
    [a], [b] = reports_a, reports_b
    assert a.detected_by is DetectedBy.DIVERGING_EPOCH
    assert b.detected_by is DetectedBy.METADATA
    assert (a.lost_from, a.lost_to) == (b.lost_from, b.lost_to) == lost
    # Everything else alike: consumed_to, divergence, new_leader_epoch, position_source.
    assert attrs.evolve(a, detected_by=DetectedBy.METADATA) == b
    assert a.position_source is not None


def test_refused_fetch_asks_metadata_at_once(mocker: Any) -> None:
    events: list[Any] = []
    f, client = _at_15_epoch_3(mocker, events, version=12)
    # Metadata just answered (the leader change above): an ordinary refresh would wait.
    f.metadata.on_answer(_empty_answer(), 100.0, ["t"], 100.0)
    tracker = f.trackers[TP]
    f.send_requests(100.0)
    assert _sent(client) == (1, "FetchRequest")
    assert not f.metadata.in_flight
    assert f.metadata.due(100.001) is None
    f._on_fetch(
        FetchSent(1, {TP: _pending(tracker, 1)}, {}),
        Future().success(_fetch_answer(12, error=int(ErrorCode.NOT_LEADER_OR_FOLLOWER))),
    )
    assert f.metadata.due(100.001) is not None


def test_a_fenced_fetch_from_a_leader_that_answered_v12_lets_the_next_leader_judge(
    mocker: Any,
) -> None:
    """Broker 1 was not known to answer v12+ when metadata named it (validated the old way);
    it has answered since. Its FENCED refusal (a controlled shutdown moved the epoch on)
    waits for metadata, and the new leader, known too, judges the position by its fetch."""
    events: list[Any] = []
    f, client = _at_15_epoch_3(mocker, events, version=12)
    tracker = f.trackers[TP]
    f.send_requests(0.0)
    assert _sent(client) == (1, "FetchRequest")
    fenced = _fetch_answer(12, error=int(ErrorCode.FENCED_LEADER_EPOCH))
    f._on_fetch(FetchSent(1, {TP: _pending(tracker, 1)}, {}), Future().success(fenced))
    assert tracker.state is PartitionState.FETCHING  # no validation: metadata decides
    assert _unclean_change_to_2(f, client) == "FetchRequest"
    assert not [e for e in events if e.name == "offset_validation_started" and e.cause == "fenced"]
