"""KIP-392 follower fetching in the tracker: where fetches go, and that every change of the
replica serving a partition validates the position with the leader first."""

from __future__ import annotations

import pytest

from epochguard.offsets import (
    DetectedBy,
    EpochOffset,
    ErrorCode,
    FetchAction,
    MetadataRefreshNeeded,
    OffsetPolicy,
    PartitionState,
    PartitionTracker,
    PositionValidated,
    TopicPartition,
    TruncationDetected,
    ValidateAction,
)

from .test_state_rules import fetch, validate

TP = TopicPartition("t", 0)
S = PartitionState
LEADER, NEAR, FAR = 1, 2, 3
REPLICAS = (LEADER, NEAR, FAR)


def fetching(offset: int = 10, epoch: int = 1) -> PartitionTracker:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(LEADER, epoch, "topic-a", REPLICAS)
    tr.seek(EpochOffset(0))
    f = fetch(tr)
    assert tr.on_records(f, 0, offset - 1, epoch)
    tr.drain_events()
    return tr


def on_near(tr: PartitionTracker, until: float = 100.0) -> FetchAction:
    """The leader names NEAR; the tracker validates with the leader, then fetches there."""
    assert tr.on_preferred_replica(fetch(tr), NEAR, 0.0, until)
    assert tr.state is S.AWAIT_VALIDATION
    v = validate(tr)
    assert v.leader_id == LEADER  # OffsetForLeaderEpoch always goes to the leader
    assert tr.on_validation(v, ErrorCode.NONE, 1, 10, 0.0)
    events = tr.drain_events()
    assert any(
        isinstance(e, PositionValidated) and e.cause is DetectedBy.REPLICA_CHANGED for e in events
    )
    f = fetch(tr)
    assert (f.read_replica, f.node_id, f.leader_id) == (NEAR, NEAR, LEADER)
    return f


def test_preferred_replica_is_validated_with_the_leader_then_fetched_from() -> None:
    tr = fetching()
    on_near(tr)
    assert tr.read_replica == NEAR and tr.fetch_node == NEAR


def test_a_diverged_follower_found_by_the_switch_validation_is_a_truncation() -> None:
    tr = fetching()
    assert tr.on_preferred_replica(fetch(tr), NEAR, 0.0, 100.0)
    v = validate(tr)
    # The leader's own log ends epoch 1 at 7: records 7..9 we read are gone.
    assert tr.on_validation(v, ErrorCode.NONE, 1, 7, 0.0)
    assert tr.state is S.TRUNCATED
    (event,) = [e for e in tr.drain_events() if isinstance(e, TruncationDetected)]
    assert event.report.divergence == EpochOffset(7, 1)
    assert event.report.detected_by is DetectedBy.REPLICA_CHANGED


def test_offset_out_of_range_from_a_follower_is_not_a_reset() -> None:
    tr = fetching()
    f = on_near(tr)
    assert tr.on_fetch_error(f, ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    # Back to the leader, validating there; no ListOffsets, no NoValidOffset.
    assert tr.state is S.AWAIT_VALIDATION and tr.read_replica is None
    v = validate(tr)
    assert tr.on_validation(v, ErrorCode.NONE, 1, 10, 0.0)
    f = fetch(tr)
    assert f.read_replica is None and f.node_id == LEADER and f.offset == 10


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.REPLICA_NOT_AVAILABLE,
    ],
)
def test_an_error_from_a_follower_goes_back_to_the_leader_and_refreshes(code: int) -> None:
    tr = fetching()
    f = on_near(tr)
    assert tr.on_fetch_error(f, code, 0.0)
    assert tr.read_replica is None and tr.state is S.AWAIT_VALIDATION
    assert any(isinstance(e, MetadataRefreshNeeded) for e in tr.drain_events())
    assert validate(tr).leader_id == LEADER


def test_an_unreachable_follower_sends_fetches_back_to_the_leader() -> None:
    tr = fetching()
    f = on_near(tr)
    assert tr.on_request_failed(f, 0.0)
    assert tr.read_replica is None
    v = validate(tr)  # no backoff: the leader is another broker
    assert tr.on_validation(v, ErrorCode.NONE, 1, 10, 0.0)
    assert fetch(tr).node_id == LEADER


def test_a_follower_gone_from_metadata_is_left() -> None:
    tr = fetching()
    on_near(tr)
    tr.on_metadata(LEADER, 1, "topic-a", (LEADER, FAR))
    assert tr.read_replica is None and tr.state is S.AWAIT_VALIDATION


def test_a_new_leader_epoch_drops_the_read_replica() -> None:
    tr = fetching()
    on_near(tr)
    tr.on_metadata(FAR, 2, "topic-a", REPLICAS)
    assert tr.read_replica is None
    assert validate(tr).leader_id == FAR


def test_the_read_replica_expires_back_to_the_leader() -> None:
    tr = fetching()
    tr.cancel(on_near(tr, until=5.0))
    assert isinstance(tr.next_action(6.0), ValidateAction)
    assert tr.read_replica is None


def test_a_replica_not_in_metadata_is_not_followed() -> None:
    tr = fetching()
    assert tr.on_preferred_replica(fetch(tr), 9, 0.0, 100.0)
    assert tr.read_replica is None and tr.state is S.FETCHING


def test_without_an_epoch_the_switch_needs_no_validation() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(LEADER, 1, "topic-a", REPLICAS)
    tr.seek(EpochOffset(0))
    assert tr.on_preferred_replica(fetch(tr), NEAR, 0.0, 100.0)
    assert tr.state is S.FETCHING
    assert fetch(tr).node_id == NEAR


def test_a_stale_answer_naming_a_replica_is_ignored() -> None:
    tr = fetching()
    old = fetch(tr)
    tr.on_metadata(FAR, 2, "topic-a", REPLICAS)
    assert not tr.on_preferred_replica(old, NEAR, 0.0, 100.0)
    assert tr.read_replica is None
