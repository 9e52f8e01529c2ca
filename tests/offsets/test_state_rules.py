"""One test per rule of docs/concepts.md and the KIP-320 notes, driving PartitionTracker."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from epochguard.offsets import (
    DetectedBy,
    EpochOffset,
    ErrorCode,
    FetchAction,
    InvalidPolicyError,
    InvalidTransitionError,
    ListOffsetsPurpose,
    LogTruncationError,
    MetadataRefreshNeeded,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    OffsetPolicy,
    OffsetReset,
    PartitionState,
    PartitionTracker,
    PositionValidated,
    ResetAction,
    ResetStrategy,
    TopicPartition,
    Trigger,
    TruncationDecision,
    TruncationDetected,
    TruncationReport,
    ValidateAction,
    WaitAction,
)

TP = TopicPartition("t", 0)
S = PartitionState


def fetching(
    offset: int = 10,
    epoch: int | None = 1,
    leader_epoch: int = 1,
    reset: str = "earliest",
    on_truncation: Any = "auto",
) -> PartitionTracker:
    """A tracker in FETCHING at (offset, epoch) having read [0, offset) in ``epoch``."""
    tr = PartitionTracker(TP, OffsetPolicy(reset, on_truncation))
    tr.on_metadata(1, leader_epoch, "topic-a")
    tr.seek(EpochOffset(0))
    if offset:
        f = fetch(tr)
        assert tr.on_records(f, 0, offset - 1, epoch)
    tr.drain_events()
    assert tr.state is S.FETCHING and tr.position == EpochOffset(offset, epoch)
    return tr


def fetch(tr: PartitionTracker, now: float = 0.0) -> FetchAction:
    a = tr.next_action(now)
    assert isinstance(a, FetchAction), a
    return a


def validate(tr: PartitionTracker, now: float = 0.0) -> ValidateAction:
    a = tr.next_action(now)
    assert isinstance(a, ValidateAction), a
    return a


def list_offsets(tr: PartitionTracker, now: float = 0.0) -> ResetAction:
    a = tr.next_action(now)
    assert isinstance(a, ResetAction), a
    return a


def truncations(tr: PartitionTracker) -> list[TruncationDetected]:
    return [e for e in tr.drain_events() if isinstance(e, TruncationDetected)]


def recreated(
    tr: PartitionTracker, topic: str = "topic-b", leader: int = 2, epoch: int = 0
) -> None:
    """Metadata names a new topic id, and its leader serves it (the probe is answered): the
    evidence that the position's incarnation was deleted (tests/offsets/test_topic_ids.py)."""
    assert tr.on_metadata(leader, epoch, topic)
    probe = tr.next_action(0.0)
    assert isinstance(probe, FetchAction) and probe.topic_probe, probe
    assert probe.topic_id == topic and probe.leader_id == leader
    assert tr.on_empty_fetch(probe)


def elect(tr: PartitionTracker, epoch: int, leader: int = 2) -> ValidateAction:
    tr.on_metadata(leader, epoch, "topic-a")
    assert tr.state is S.AWAIT_VALIDATION
    return validate(tr)


# ----------------------------------------------------------------- the decision table


def test_end_offset_above_position_is_valid() -> None:
    tr = fetching(10, 1)
    v = elect(tr, 2)
    assert (v.current_leader_epoch, v.leader_epoch, v.position) == (2, 1, EpochOffset(10, 1))
    assert tr.on_validation(v, 0, 1, 15, 0.0)
    assert tr.state is S.FETCHING and tr.position == EpochOffset(10, 1)
    assert any(isinstance(e, PositionValidated) for e in tr.drain_events())


def test_position_exactly_at_the_end_is_valid() -> None:
    tr = fetching(10, 1)
    tr.on_validation(elect(tr, 2), 0, 1, 10, 0.0)
    assert tr.state is S.FETCHING and tr.position == EpochOffset(10, 1)
    assert truncations(tr) == []


def test_end_offset_below_position_is_truncation_and_auto_rewinds() -> None:
    tr = fetching(10, 1)
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    (ev,) = truncations(tr)
    assert ev.decision == "rewind" and ev.new_position == EpochOffset(7, 1)
    r = ev.report
    assert (r.divergence, r.consumed_to) == (EpochOffset(7, 1), EpochOffset(10, 1))
    assert (r.lost_from, r.lost_to, r.lost_count) == (7, 10, 3)
    assert r.detected_by is DetectedBy.METADATA and r.new_leader_epoch == 2
    assert tr.state is S.FETCHING and tr.position == EpochOffset(7, 1)
    f = fetch(tr)
    assert (f.offset, f.current_leader_epoch, f.last_fetched_epoch) == (7, 2, 1)


def test_truncation_with_raise_stops_until_seek() -> None:
    tr = fetching(10, 1, on_truncation="raise")
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    (ev,) = truncations(tr)
    assert ev.decision == "raise"
    assert tr.state is S.TRUNCATED
    assert isinstance(tr.error, LogTruncationError) and tr.error.report == ev.report
    assert tr.next_action(0.0) is None and tr.next_action(100.0) is None
    assert tr.position == EpochOffset(10, 1)  # untouched: the app decides
    tr.seek(EpochOffset(7))
    assert tr.error is None and isinstance(tr.next_action(0.0), FetchAction)


def test_auto_with_reset_none_raises() -> None:
    tr = fetching(10, 1, reset="none")
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    assert tr.state is S.TRUNCATED


def test_rewind_with_reset_none_still_rewinds_to_known_divergence() -> None:
    tr = fetching(10, 1, reset="none", on_truncation="rewind")
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    assert tr.state is S.FETCHING and tr.position == EpochOffset(7, 1)


@pytest.mark.parametrize(("end_epoch", "end_offset"), [(-1, -1), (-1, 5), (1, -1)])
def test_undefined_answer_probes_log_start_then_reports_unknown_divergence(
    end_epoch: int, end_offset: int
) -> None:
    tr = fetching(10, 1, reset="latest")
    tr.on_validation(elect(tr, 2), 0, end_epoch, end_offset, 0.0)
    assert tr.state is S.AWAIT_VALIDATION
    probe = list_offsets(tr)
    assert probe.purpose is ListOffsetsPurpose.LOG_START_PROBE
    assert probe.strategy is ResetStrategy.EARLIEST
    tr.on_list_offsets(probe, 0, 2)  # log start 0 < position: the records are gone
    (ev,) = truncations(tr)
    assert ev.report.divergence is None and ev.report.lost_count is None
    assert ev.decision == "reset"
    reset = list_offsets(tr)
    assert reset.purpose is ListOffsetsPurpose.RESET and reset.strategy is ResetStrategy.LATEST
    tr.on_list_offsets(reset, 42, 2)
    # ListOffsets' epoch only bounds the epoch of the record before 42.
    assert tr.state is S.FETCHING and tr.position == EpochOffset(42, 2)
    assert not tr.position_is_exact
    assert [type(e) for e in tr.drain_events()] == [OffsetReset]


def test_undefined_divergence_with_reset_none_raises_even_under_rewind() -> None:
    tr = fetching(10, 1, reset="none", on_truncation="rewind")
    tr.on_validation(elect(tr, 2), 0, -1, -1, 0.0)
    tr.on_list_offsets(list_offsets(tr), 3, 2)
    assert tr.state is S.TRUNCATED
    assert isinstance(tr.error, LogTruncationError) and tr.error.report.divergence is None


def test_undefined_answer_because_of_retention_is_not_truncation() -> None:
    tr = fetching(10, 1, reset="earliest")
    tr.on_validation(elect(tr, 2), 0, -1, -1, 0.0)
    tr.on_list_offsets(list_offsets(tr), 50, 2)  # log start moved past us
    assert truncations(tr) == []
    reset = list_offsets(tr)
    assert reset.purpose is ListOffsetsPurpose.RESET and reset.strategy is ResetStrategy.EARLIEST


def test_undefined_answer_position_at_log_start_is_valid() -> None:
    tr = fetching(10, 1)
    tr.on_validation(elect(tr, 2), 0, -1, -1, 0.0)
    tr.on_list_offsets(list_offsets(tr), 10, 2)
    assert truncations(tr) == []
    assert tr.state is S.FETCHING and tr.position == EpochOffset(10, 2)


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
    ],
)
def test_stale_metadata_answers_refresh_and_retry_with_backoff(code: int) -> None:
    tr = fetching(10, 1)
    v = elect(tr, 2)
    tr.drain_events()
    assert tr.on_validation(v, code, -1, -1, now=100.0)
    assert tr.state is S.AWAIT_VALIDATION
    assert any(isinstance(e, MetadataRefreshNeeded) for e in tr.drain_events())
    wait = tr.next_action(100.0)
    assert isinstance(wait, WaitAction) and wait.until == pytest.approx(100.1)
    if code == ErrorCode.FENCED_LEADER_EPOCH:
        # The same epoch can only be fenced again: wait for metadata past it.
        later = tr.next_action(200.0)
        assert isinstance(later, WaitAction) and later.reason == "metadata_refresh"
        tr.on_metadata(2, 3, "topic-a")
    retry = validate(tr, 200.0)
    assert retry.position == EpochOffset(10, 1)


def test_backoff_grows_and_is_capped() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 1)
    tr.seek(EpochOffset(0))
    now, delays = 0.0, []
    for _ in range(12):
        f = fetch(tr, now)
        tr.on_fetch_error(f, ErrorCode.NOT_LEADER_OR_FOLLOWER, now)
        wait = tr.next_action(now)
        assert isinstance(wait, WaitAction)
        delays.append(round(wait.until - now, 6))
        now = wait.until
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert max(delays) == 10.0 and delays[-1] == 10.0
    f = fetch(tr, now)
    tr.on_empty_fetch(f)
    f = fetch(tr, now)
    tr.on_fetch_error(f, ErrorCode.NOT_LEADER_OR_FOLLOWER, now)
    wait = tr.next_action(now)
    assert isinstance(wait, WaitAction) and wait.until - now == pytest.approx(0.1)


def test_a_new_leader_starts_the_backoff_over() -> None:
    # A long wait for a leader (every replica down) reached the longest backoff; the new
    # leader refuses the first fetch while it applies its election: that retry goes after
    # the first step, not after the longest.
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 1)
    tr.seek(EpochOffset(0))
    tr.on_metadata(None, 2)
    now = 0.0
    for _ in range(8):
        wait = tr.next_action(now)
        assert isinstance(wait, WaitAction)
        now = wait.until
    assert tr.next_action(now).until - now > 1.0  # type: ignore[union-attr]
    tr.on_metadata(2, 3)
    f = fetch(tr, now)
    tr.on_fetch_error(f, ErrorCode.UNKNOWN_LEADER_EPOCH, now)
    wait = tr.next_action(now)
    assert isinstance(wait, WaitAction) and wait.until - now == pytest.approx(0.1)


# ----------------------------------------------------------- when to (re)validate


def test_newer_leader_epoch_in_metadata_triggers_validation() -> None:
    tr = fetching(10, 1)
    tr.on_metadata(1, 2, "topic-a")
    assert tr.state is S.AWAIT_VALIDATION


def test_same_metadata_again_changes_nothing() -> None:
    tr = fetching(10, 1)
    f = fetch(tr)
    assert tr.on_metadata(1, 1, "topic-a")
    assert tr.state is S.FETCHING
    assert tr.on_records(f, 10, 11, 1)


def test_without_position_epoch_there_is_nothing_to_validate() -> None:
    tr = fetching(10, None)
    tr.on_metadata(2, 2, "topic-a")
    assert tr.state is S.FETCHING
    assert fetch(tr).current_leader_epoch == 2


def test_stale_metadata_never_replaces_newer() -> None:
    tr = fetching(10, 1, leader_epoch=5)
    assert not tr.on_metadata(3, 4, "topic-a")
    assert (tr.leader_id, tr.leader_epoch, tr.state) == (1, 5, S.FETCHING)
    assert fetch(tr).current_leader_epoch == 5


def test_metadata_without_epoch_keeps_known_epoch() -> None:
    tr = fetching(10, 1, leader_epoch=5)
    tr.on_metadata(1, None, None)
    assert tr.leader_epoch == 5 and tr.state is S.FETCHING


def test_fenced_fetch_validates_after_metadata_catches_up() -> None:
    tr = fetching(10, 1)
    f = fetch(tr)
    tr.on_fetch_error(f, ErrorCode.FENCED_LEADER_EPOCH, now=0.0)
    assert tr.state is S.AWAIT_VALIDATION
    evs = tr.drain_events()
    refresh = [e for e in evs if isinstance(e, MetadataRefreshNeeded)]
    assert refresh and refresh[-1].min_leader_epoch == 2
    assert isinstance(tr.next_action(50.0), WaitAction)  # still epoch 1
    tr.on_metadata(2, 2, "topic-a")
    v = validate(tr, 50.0)
    tr.on_validation(v, 0, 1, 8, 50.0)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.FENCED and ev.report.divergence == EpochOffset(8, 1)


def test_fenced_fetch_without_epoch_waits_for_metadata_then_fetches() -> None:
    tr = fetching(10, None)
    tr.on_fetch_error(fetch(tr), ErrorCode.FENCED_LEADER_EPOCH, now=0.0)
    assert tr.state is S.FETCHING
    assert isinstance(tr.next_action(99.0), WaitAction)
    tr.on_metadata(1, 2)
    assert fetch(tr, 99.0).current_leader_epoch == 2


def test_diverging_epoch_needs_no_round_trip() -> None:
    tr = fetching(10, 1, leader_epoch=2)
    f = fetch(tr)
    assert tr.on_diverging_epoch(f, 1, 6, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.DIVERGING_EPOCH
    assert ev.report.divergence == EpochOffset(6, 1)
    assert fetch(tr).offset == 6


def test_exact_restored_epoch_unknown_to_leader_is_truncation_with_unknown_divergence() -> None:
    # Offset 9 was read in epoch 5 (the driver stored position_is_exact with it); the leader
    # never had epoch 5 (its epoch 3 reaches 12). Java calls this valid, but the record at 9
    # cannot be the one that was read.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(1, 6)
    tr.restore(EpochOffset(10, 5), epoch_exact=True)
    tr.on_validation(validate(tr), 0, 3, 12, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.divergence is None and ev.report.detected_by is DetectedBy.RESTORE
    assert tr.state is S.TRUNCATED


def test_a_position_that_says_its_epoch_is_exact_is_validated_as_exact() -> None:
    # The same case with the flag carried by the position itself (an offset store keeps it).
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(1, 6)
    tr.restore(EpochOffset(10, 5, epoch_exact=True))
    tr.on_validation(validate(tr), 0, 3, 12, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.divergence is None and tr.state is S.TRUNCATED


def test_position_carries_whether_its_epoch_is_exact() -> None:
    assert fetching(10, 1).position.epoch_exact  # type: ignore[union-attr]
    tr = PartitionTracker(TP, OffsetPolicy("latest"))
    tr.on_metadata(1, 4)
    tr.restore(None)
    tr.on_list_offsets(list_offsets(tr), 10, 4)
    assert tr.position == EpochOffset(10, 4) and not tr.position.epoch_exact


def test_restored_epoch_is_an_upper_bound_by_default() -> None:
    # The same answer for a position committed right after a reset (its epoch, 5, may
    # have no records at all, and followers never learn such epochs): valid, as in Java,
    # and the leader's epoch is adopted so that LastFetchedEpoch does not diverge forever.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(1, 6)
    tr.restore(EpochOffset(10, 5))
    tr.on_validation(validate(tr), 0, 3, 12, 0.0)
    assert truncations(tr) == []
    assert tr.state is S.FETCHING and tr.position == EpochOffset(10, 3)
    assert fetch(tr).last_fetched_epoch == 3


def test_divergence_below_own_reads_is_an_upper_bound_position() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 6)
    tr.restore(EpochOffset(10, 5))
    tr.on_validation(validate(tr), 0, 5, 7, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.divergence == EpochOffset(7, 5) and tr.position == EpochOffset(7, 5)
    assert not tr.position_is_exact  # we did not read offset 6 ourselves
    tr.on_metadata(2, 7)
    tr.on_validation(validate(tr), 0, 3, 9, 0.0)
    assert truncations(tr) == [] and tr.position == EpochOffset(7, 3)


def test_position_is_exact_after_own_reads() -> None:
    tr = fetching(10, 1)
    assert tr.position_is_exact
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    assert tr.position == EpochOffset(7, 1) and tr.position_is_exact


def test_caught_up_consumer_after_latest_reset_reads_records_below_it() -> None:
    # A consumer that started at "latest" (10) and read nothing: an unclean election
    # truncates to 6 and new records fill 6..12. It must go back to 6 (those are new
    # records), but it lost nothing it read: no TruncationReport.
    tr = PartitionTracker(TP, OffsetPolicy("latest", "raise"))
    tr.on_metadata(1, 4)
    tr.restore(None)
    tr.on_list_offsets(list_offsets(tr), 10, 4)
    assert tr.position == EpochOffset(10, 4)
    tr.drain_events()
    tr.on_empty_fetch(fetch(tr))
    tr.on_validation(elect(tr, 5), 0, 4, 6, 0.0)
    assert tr.state is S.FETCHING and tr.position == EpochOffset(6, 4)
    events = tr.drain_events()
    assert not [e for e in events if isinstance(e, TruncationDetected)]
    (reset,) = [e for e in events if isinstance(e, OffsetReset)]
    assert reset.reason == "log_truncated_below_reset_position"
    # Once it has read something, a truncation is a report again.
    assert tr.on_records(fetch(tr), 6, 8, 5)
    tr.on_validation(elect(tr, 6), 0, 5, 7, 0.0)
    assert tr.state is S.TRUNCATED and tr.error is not None


def test_position_zero_has_no_epoch_to_validate() -> None:
    tr = PartitionTracker(TP)
    tr.on_metadata(1, 6)
    tr.seek(EpochOffset(0, 3))
    assert tr.state is S.FETCHING and tr.position == EpochOffset(0)


def test_oor_with_epoch_validates_before_reset() -> None:
    tr = fetching(10, 1, reset="earliest")
    tr.on_fetch_error(fetch(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    assert tr.state is S.AWAIT_VALIDATION
    tr.on_validation(validate(tr), 0, 1, 4, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.OFFSET_OUT_OF_RANGE
    assert ev.new_position == EpochOffset(4, 1)


def test_oor_with_epoch_not_truncated_applies_reset_policy() -> None:
    tr = fetching(10, 1, reset="earliest")
    tr.on_fetch_error(fetch(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    tr.on_validation(validate(tr), 0, 1, 30, 0.0)
    assert truncations(tr) == []
    r = list_offsets(tr)
    assert r.purpose is ListOffsetsPurpose.RESET and r.strategy is ResetStrategy.EARLIEST


def test_oor_without_epoch_resets_directly() -> None:
    tr = fetching(10, None, reset="latest")
    tr.on_fetch_error(fetch(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    assert list_offsets(tr).strategy is ResetStrategy.LATEST


def test_oor_with_reset_none_stops_with_out_of_range_error() -> None:
    tr = fetching(10, None, reset="none")
    tr.on_fetch_error(fetch(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    assert tr.state is S.NO_VALID_OFFSET
    assert type(tr.error) is OffsetOutOfRangeError and tr.error.offset == 10
    assert tr.next_action(0.0) is None


def test_empty_fetch_never_drops_the_epoch() -> None:
    tr = fetching(10, 3, leader_epoch=3)
    for _ in range(3):
        tr.on_empty_fetch(fetch(tr))
    assert tr.position == EpochOffset(10, 3)
    assert fetch(tr).last_fetched_epoch == 3
    # ... so a caught-up consumer still notices an unclean election.
    tr.on_validation(elect(tr, 4), 0, 3, 8, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.lost_count == 2


def test_records_without_epoch_clear_the_epoch() -> None:
    tr = fetching(10, 3, leader_epoch=3)
    tr.on_records(fetch(tr), 10, 12, -1)
    assert tr.position == EpochOffset(13, None)


# ------------------------------------------------------------- restored positions


def test_restore_with_epoch_waits_for_metadata_epoch_then_validates() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 3)
    tr.restore(EpochOffset(10, 5), source="sqlite")
    assert tr.state is S.AWAIT_VALIDATION
    w = tr.next_action(0.0)
    assert isinstance(w, WaitAction) and w.reason == "metadata_refresh"
    (ev,) = [e for e in tr.drain_events() if isinstance(e, MetadataRefreshNeeded)]
    assert ev.min_leader_epoch == 5
    tr.on_metadata(1, 5)
    v = validate(tr, 0.0)
    assert (v.current_leader_epoch, v.leader_epoch) == (5, 5)
    tr.on_validation(v, 0, 5, 8, 0.0)
    (t,) = truncations(tr)
    assert t.report.detected_by is DetectedBy.RESTORE and t.report.position_source == "sqlite"


def given_back(on_truncation: str = "raise") -> PartitionTracker:
    """A tracker given a partition back: committed (3, e0), while it had read to (4, e0)
    before a rebalance took the partition away (the commit of 4 failed on the way)."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", on_truncation))
    tr.on_metadata(2, 2, "topic-a")
    tr.restore(EpochOffset(3, 0, topic_id="topic-a"), read_to=EpochOffset(4, 0, topic_id="topic-a"))
    return tr


def test_a_partition_given_back_validates_what_was_read_before_the_committed_position() -> None:
    tr = given_back()
    v = validate(tr)
    assert (v.leader_epoch, v.position) == (0, EpochOffset(4, 0))
    tr.on_validation(v, 0, 0, 3, 0.0)  # epoch 0 ends at 3 on the new leader: 3 was replaced
    (t,) = truncations(tr)
    r = t.report
    assert (r.consumed_to, r.divergence) == (EpochOffset(4, 0), EpochOffset(3, 0))
    assert (r.lost_from, r.lost_to, r.position_source) == (3, 4, "left_position")
    assert tr.state is S.TRUNCATED


def test_a_partition_given_back_intact_starts_at_the_committed_position() -> None:
    tr = given_back()
    v = validate(tr)
    tr.on_validation(v, 0, 0, 9, 0.0)
    assert truncations(tr) == []
    # Then the committed position itself, validated as any restored one.
    v2 = validate(tr)
    assert v2.position == EpochOffset(3, 0)
    tr.on_validation(v2, 0, 0, 9, 0.0)
    f = fetch(tr)
    assert f.offset == 3 and tr.position == EpochOffset(3, 0)


def test_a_seek_while_validating_a_given_back_partition_drops_the_committed_start() -> None:
    tr = given_back()
    validate(tr)
    tr.seek(EpochOffset(1, 0))
    tr.on_validation(validate(tr), 0, 0, 9, 0.0)
    assert fetch(tr).offset == 1


def given_back_after_an_election(committed: EpochOffset) -> PartitionTracker:
    """A tracker (policy rewind) given a partition back that it had read to (5, e0), whose
    epoch 0 an unclean election replaced meanwhile (the new leader's epoch 1 starts at 0);
    the group's commit is ``committed``."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(2, 1, "topic-a")
    tr.restore(committed, read_to=EpochOffset(5, 0, topic_id="topic-a"))
    v = validate(tr)
    assert v.position == EpochOffset(5, 0)
    tr.on_validation(v, 0, 0, 0, 0.0)  # epoch 0 ends at 0 on the new leader: all replaced
    return tr


def test_a_partition_given_back_truncated_starts_at_a_commit_from_a_later_epoch() -> None:
    # Another member owned the partition through the election: it reported the truncation,
    # read the new log and committed (6, e1). What this consumer read before is reported;
    # then it starts at the commit (validated in turn), not at the divergence: from there
    # it read again the six records the group had committed (chaos seed 291, asyncio).
    tr = given_back_after_an_election(EpochOffset(6, 1, topic_id="topic-a"))
    (t,) = truncations(tr)
    r = t.report
    assert (r.consumed_to, r.lost_from, r.lost_to) == (EpochOffset(5, 0), 0, 5)
    assert r.position_source == "left_position"
    assert t.new_position == EpochOffset(6, 1, topic_id="topic-a")
    v = validate(tr)
    assert v.position == EpochOffset(6, 1)
    tr.on_validation(v, 0, 1, 9, 0.0)
    assert fetch(tr).offset == 6 and tr.position == EpochOffset(6, 1)
    assert truncations(tr) == []


@pytest.mark.parametrize(
    "committed",
    [
        EpochOffset(3, 0, topic_id="topic-a"),  # of the replaced epoch: gone too
        EpochOffset(6, None, topic_id="topic-a"),  # no epoch: which log, unknown
    ],
    ids=["same-epoch", "no-epoch"],
)
def test_a_partition_given_back_truncated_rewinds_past_a_commit_not_from_a_later_epoch(
    committed: EpochOffset,
) -> None:
    tr = given_back_after_an_election(committed)
    (t,) = truncations(tr)
    assert t.report.lost_from == 0 and t.new_position is not None
    assert t.new_position.offset == 0
    assert fetch(tr).offset == 0


@pytest.mark.parametrize("on_truncation", ["raise", "rewind"])
def test_a_partition_given_back_below_a_commit_of_its_epoch_reports_up_to_the_commit(
    on_truncation: str,
) -> None:
    # This consumer read to (5, e0) and gave the partition up; the next owner read on in
    # epoch 0 and committed (10, e0). An unclean election then kept epoch 0 only up to 1.
    # The commit covers what this consumer read (one epoch is one leader's log): the report
    # runs to the commit, as it did for the next owner, not to where this consumer stopped
    # (the group's 5..9 were lost unreported: chaos seed 72080, roundrobin groups).
    tr = PartitionTracker(TP, OffsetPolicy("earliest", on_truncation))
    tr.on_metadata(2, 1, "topic-a")
    tr.restore(
        EpochOffset(10, 0, topic_id="topic-a"), read_to=EpochOffset(5, 0, topic_id="topic-a")
    )
    tr.on_validation(validate(tr), 0, 0, 1, 0.0)  # epoch 0 ends at 1 on the new leader
    (t,) = truncations(tr)
    r = t.report
    assert (r.consumed_to, r.divergence) == (EpochOffset(10, 0), EpochOffset(1, 0))
    assert (r.lost_from, r.lost_to, r.position_source) == (1, 10, "committed")


def test_a_partition_given_back_below_an_intact_commit_of_its_epoch_starts_there() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(2, 1, "topic-a")
    tr.restore(
        EpochOffset(10, 0, topic_id="topic-a"), read_to=EpochOffset(5, 0, topic_id="topic-a")
    )
    tr.on_validation(validate(tr), 0, 0, 12, 0.0)
    assert truncations(tr) == []
    assert fetch(tr).offset == 10 and tr.position == EpochOffset(10, 0)


def given_back_after_two_elections(on_truncation: Any = "raise") -> PartitionTracker:
    """A tracker given a partition back that it had read to (20, e1) before an unclean
    election kept 0..1 (epoch 2 starts at 2). Another member then read the new log 2..15
    in epoch 2 and committed (16, e2); the current leader (epoch 3) has epoch 1 up to 2
    and nothing of epoch 2 if a second unclean election took it. Validating (20, e1) finds
    the divergence at 2."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", on_truncation))
    tr.on_metadata(2, 3, "topic-a")
    tr.restore(
        EpochOffset(16, 2, topic_id="topic-a"), read_to=EpochOffset(20, 1, topic_id="topic-a")
    )
    v = validate(tr)
    assert (v.position, v.leader_epoch) == (EpochOffset(20, 1), 1)
    tr.on_validation(v, 0, 1, 2, 0.0)  # epoch 1 ends at 2 on the leader of epoch 3
    return tr


@pytest.mark.parametrize("handler", [False, True], ids=["raise", "handler"])
def test_a_stop_on_a_given_back_partition_reports_a_later_commit_truncated_too(
    handler: bool,
) -> None:
    # The second election took the other member's 2..15 of epoch 2 as well. Stopped on what
    # this consumer read (20, e1) alone, the report names epoch 1: the group's epoch-2
    # records, committed at (16, e2), are not in it, and once the application has answered
    # it (seek and commit the divergence) nobody validates that commit (chaos seed 72072,
    # asyncio: 14 records lost unreported). It is validated before the stop.
    asked: list[TruncationReport] = []

    def stop(report: TruncationReport) -> TruncationDecision:
        asked.append(report)
        return TruncationDecision.RAISE

    tr = given_back_after_two_elections(stop if handler else "raise")
    assert truncations(tr) == [] and tr.state is S.AWAIT_VALIDATION and tr.error is None
    v = validate(tr)
    assert (v.position, v.leader_epoch) == (EpochOffset(16, 2), 2)
    tr.on_validation(v, 0, 1, 2, 0.0)  # no epoch 2: the leader's epochs <= 2 end at 2
    left, commit = truncations(tr)
    assert (left.report.consumed_to, left.report.divergence) == (
        EpochOffset(20, 1),
        EpochOffset(2, 1),
    )
    assert left.report.position_source == "left_position" and left.decision == "raise"
    assert (commit.report.consumed_to, commit.report.divergence) == (
        EpochOffset(16, 2),
        EpochOffset(2, 1),
    )
    assert (commit.report.lost_from, commit.report.lost_to) == (2, 16)
    assert commit.report.position_source == "committed" and commit.decision == "raise"
    assert tr.state is S.TRUNCATED and tr.next_action(0.0) is None
    assert isinstance(tr.error, LogTruncationError) and tr.error.report == commit.report
    assert tr.last_report == commit.report
    # A handler decides once, on what this consumer read: the stop it chose holds.
    assert asked == ([left.report] if handler else [])
    # The application seeks to the divergence, as the error says.
    tr.seek(EpochOffset(2, 1))
    tr.on_validation(validate(tr), 0, 1, 2, 0.0)
    assert fetch(tr).offset == 2 and truncations(tr) == []


def test_a_stop_on_a_given_back_partition_with_an_intact_later_commit_reports_only_its_reads() -> (
    None
):
    tr = given_back_after_two_elections()
    v = validate(tr)
    tr.on_validation(v, 0, 2, 18, 0.0)  # the leader holds epoch 2 up to 18
    (left,) = truncations(tr)
    assert left.report.consumed_to == EpochOffset(20, 1) and left.decision == "raise"
    assert tr.state is S.TRUNCATED and tr.error is not None
    assert tr.error.report == left.report == tr.last_report


def test_a_stop_on_a_given_back_partition_whose_later_commit_fell_to_retention() -> None:
    tr = given_back_after_two_elections()
    v = validate(tr)
    tr.on_validation(v, 0, None, None, 0.0)  # the leader knows no epoch <= 2 any more
    tr.on_list_offsets(list_offsets(tr), 30, 3)  # retention: the log starts at 30
    (left,) = truncations(tr)
    assert left.report.consumed_to == EpochOffset(20, 1)
    assert tr.state is S.TRUNCATED and tr.error is not None
    assert tr.error.report == left.report


def test_a_seek_while_a_given_back_stop_waits_for_the_later_commit_drops_both() -> None:
    # As a seek during the validation of where this consumer had read to drops it.
    tr = given_back_after_two_elections()
    validate(tr)
    tr.seek(EpochOffset(5, 3))
    tr.on_validation(validate(tr), 0, 3, 9, 0.0)
    assert truncations(tr) == [] and fetch(tr).offset == 5 and tr.error is None


def test_a_commit_at_the_same_offset_in_an_older_epoch_is_covered_by_what_was_read() -> None:
    # This consumer reported epoch 1's loss at 5, read the new log to (6, e2) and committed
    # that; a commit of (6, e1) it had given up on landed after it (chaos seed 100902, a
    # delayed request). Given the partition back, it validates what it read and starts
    # there: validating (6, e1) again reported the same loss twice and read 5 again.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(2, 2, "topic-a")
    tr.restore(EpochOffset(6, 1, topic_id="topic-a"), read_to=EpochOffset(6, 2, topic_id="topic-a"))
    v = validate(tr)
    assert v.position == EpochOffset(6, 2)
    tr.on_validation(v, 0, 2, 9, 0.0)
    assert truncations(tr) == []
    assert fetch(tr).offset == 6 and tr.position == EpochOffset(6, 2, topic_id="topic-a")


def test_what_was_read_truncated_under_an_older_commit_at_its_offset_rewinds() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(2, 3, "topic-a")
    tr.restore(EpochOffset(6, 1, topic_id="topic-a"), read_to=EpochOffset(6, 2, topic_id="topic-a"))
    tr.on_validation(validate(tr), 0, 2, 4, 0.0)  # epoch 2 ends at 4 on the new leader
    (t,) = truncations(tr)
    assert (t.report.consumed_to, t.report.divergence) == (EpochOffset(6, 2), EpochOffset(4, 2))
    assert t.new_position == EpochOffset(4, 2)
    assert fetch(tr).offset == 4


def _given_back(
    on_truncation: str, committed: int, read_to: tuple[int, int], reported: int | None
) -> PartitionTracker:
    """A tracker (leader 2, epoch 1) given back under the group's commit (``committed``,
    e0), having read to ``read_to`` and last reported (``reported``, e0) truncated."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", on_truncation))
    tr.on_metadata(2, 1, "topic-a")
    tr.restore(
        EpochOffset(committed, 0, topic_id="topic-a"),
        read_to=EpochOffset(*read_to, topic_id="topic-a"),
        reported=None if reported is None else EpochOffset(reported, 0, topic_id="topic-a"),
    )
    return tr


@pytest.mark.parametrize("reported", [22, 18], ids=["the-commit", "an-older-position"])
def test_a_commit_this_consumer_reported_truncated_is_covered_by_what_it_read_since(
    reported: int,
) -> None:
    # This consumer restored the group's commit (22, e0), reported its loss (divergence
    # 20), rewound, read the new log to (21, e1) and lost the partition before its commit
    # of that landed (chaos seed 100133, network faults). Given the partition back with
    # the group's commit still (22, e0), it validates what it read and starts there:
    # validating (22, e0) again reported the same loss a second time. When its report was
    # of another position (an older commit), the group's commit is validated after what it
    # read, and its loss reported.
    tr = _given_back("rewind", 22, (21, 1), reported)
    v = validate(tr)
    assert v.position == EpochOffset(21, 1)
    tr.on_validation(v, 0, 1, 30, 0.0)
    if reported == 22:
        assert truncations(tr) == []
        assert fetch(tr).offset == 21 and tr.position == EpochOffset(21, 1, topic_id="topic-a")
        return
    v = validate(tr)
    assert v.position == EpochOffset(22, 0)
    tr.on_validation(v, 0, 0, 20, 0.0)  # epoch 0 ends at 20 on this leader
    (t,) = truncations(tr)
    assert (t.report.consumed_to, t.report.divergence) == (EpochOffset(22, 0), EpochOffset(20, 0))


@pytest.mark.parametrize("reported", [True, False], ids=["reported", "not-reported"])
def test_a_left_position_this_consumer_reported_truncated_is_not_validated_again(
    reported: bool,
) -> None:
    # This consumer restored the group's commit (4, e0), found it truncated (the log starts
    # over at 0 in epoch 1) and stopped (policy raise), and lost the partition before the
    # application sought: its left position is (4, e0), the report's consumed_to. Another
    # member read the new log and committed (1, e1). Given the partition back, it has read
    # nothing since its report: it starts from the commit (chaos seed 201453). A left
    # position it did not report is validated first, as before.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(2, 1, "topic-a")
    left = EpochOffset(4, 0, topic_id="topic-a")
    tr.restore(
        EpochOffset(1, 1, topic_id="topic-a"), read_to=left, reported=left if reported else None
    )
    v = validate(tr)
    if reported:
        assert v.position == EpochOffset(1, 1)
        tr.on_validation(v, 0, 1, 5, 0.0)
        assert truncations(tr) == [] and fetch(tr).offset == 1
    else:
        assert v.position == EpochOffset(4, 0)


def test_read_to_equal_to_the_position_is_one_validation() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(2, 2, "topic-a")
    tr.restore(EpochOffset(4, 0), read_to=EpochOffset(4, 0))
    tr.on_validation(validate(tr), 0, 0, 9, 0.0)
    assert fetch(tr).offset == 4


def test_restore_without_epoch_fetches_directly() -> None:
    tr = PartitionTracker(TP)
    tr.on_metadata(1, 3)
    tr.restore(EpochOffset(10))
    assert fetch(tr).offset == 10


def test_restore_nothing_applies_reset_policy() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 3)
    tr.restore(None)
    a = list_offsets(tr)
    assert a.strategy is ResetStrategy.EARLIEST and a.current_leader_epoch == 3
    tr.on_list_offsets(a, 5, 3)
    (ev,) = tr.drain_events()
    assert isinstance(ev, OffsetReset) and ev.reason == "no_committed_offset"
    assert tr.position == EpochOffset(5, 3)


def test_restore_nothing_with_reset_none_stops() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("none"))
    tr.on_metadata(1, 3)
    tr.restore(None)
    assert tr.state is S.NO_VALID_OFFSET and isinstance(tr.error, NoOffsetForPartitionError)


def test_nothing_happens_before_a_position_or_metadata() -> None:
    tr = PartitionTracker(TP)
    assert tr.state is S.INITIALIZING and tr.next_action(0.0) is None
    tr.seek(3)
    w = tr.next_action(0.0)
    assert isinstance(w, WaitAction) and w.reason == "metadata_refresh"
    assert [e.reason for e in tr.drain_events() if isinstance(e, MetadataRefreshNeeded)] == [
        "leader_unknown"
    ]
    tr.on_metadata(1, 0)
    assert fetch(tr).offset == 3


# ----------------------------------------------------------------- stale answers


def test_validation_answer_after_seek_is_ignored() -> None:
    tr = fetching(10, 1)
    v = elect(tr, 2)
    tr.seek(EpochOffset(3))
    assert not tr.on_validation(v, 0, 1, 0, 0.0)
    assert tr.state is S.FETCHING and tr.position == EpochOffset(3)
    assert truncations(tr) == []


def test_list_offsets_answer_after_seek_is_ignored() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 1)
    tr.restore(None)
    a = list_offsets(tr)
    tr.seek(EpochOffset(7))
    assert not tr.on_list_offsets(a, 0, 1)
    assert tr.position == EpochOffset(7)


def test_validation_answer_from_before_a_leader_change_is_ignored() -> None:
    tr = fetching(10, 1)
    v = elect(tr, 2)
    tr.on_metadata(3, 3, "topic-a")
    assert not tr.on_validation(v, 0, 1, 15, 0.0)
    v3 = validate(tr)
    assert v3.current_leader_epoch == 3


def test_fetch_answer_after_seek_or_pause_is_refused() -> None:
    tr = fetching(10, 1)
    f = fetch(tr)
    tr.seek(EpochOffset(10))
    assert not tr.on_records(f, 10, 12, 1)
    f2 = fetch(tr)
    tr.pause()
    assert not tr.on_records(f2, 10, 12, 1)
    assert tr.next_action(0.0) is None
    tr.resume()
    assert fetch(tr).offset == 10


def test_duplicate_records_are_refused() -> None:
    tr = fetching(10, 1)
    f = fetch(tr)
    assert tr.on_records(f, 10, 14, 1)
    assert not tr.on_records(f, 10, 14, 1)
    assert tr.on_records(f, 15, 16, 1)  # the rest of the same batch, delivered later
    assert tr.position == EpochOffset(17, 1)


def test_one_request_at_a_time_and_cancel() -> None:
    tr = fetching(10, 1)
    f = fetch(tr)
    assert tr.next_action(0.0) is None
    tr.cancel(f)
    assert fetch(tr) == f


def test_transport_failure_retries_with_backoff() -> None:
    tr = fetching(10, 1)
    v = elect(tr, 2)
    assert tr.on_request_failed(v, now=5.0)
    w = tr.next_action(5.0)
    assert isinstance(w, WaitAction) and w.until == pytest.approx(5.1)
    assert validate(tr, 6.0).token == v.token


# ---------------------------------------------------------------- topic recreated


def test_topic_recreated_is_reported_as_truncation_to_the_new_log() -> None:
    tr = fetching(10, 4, leader_epoch=4)
    recreated(tr)  # epoch 0 < 4 but a new topic id
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert ev.report.divergence == EpochOffset(0) and ev.report.lost_count == 10
    f = fetch(tr)
    assert (f.offset, f.current_leader_epoch, f.last_fetched_epoch) == (0, 0, None)


def test_topic_recreated_with_raise() -> None:
    tr = fetching(10, 4, leader_epoch=4, on_truncation="raise")
    recreated(tr)
    assert tr.state is S.TRUNCATED and tr.leader_epoch == 0


def test_a_broker_still_naming_the_old_topic_id_is_stale_not_a_second_recreation() -> None:
    # Metadata from a broker that has not heard of the re-creation yet names the old id
    # again: ids are never reused, so that answer is behind. Reporting it would tell the
    # application its new reads were lost, and send it back to the old log's offsets.
    tr = fetching(10, 4, leader_epoch=4)
    recreated(tr)
    assert len(truncations(tr)) == 1
    assert not tr.on_metadata(1, 4, "topic-a")  # stale at once: a leader served topic-b
    assert tr.on_records(fetch(tr), 0, 2, 0)
    assert not tr.on_metadata(1, 4, "topic-a")
    assert truncations(tr) == [] and tr.topic_id == "topic-b" and tr.leader_epoch == 0
    assert fetch(tr).offset == 3
    assert tr.on_metadata(2, 0, "topic-b")
    assert truncations(tr) == []
    # A third id is a real re-creation again, once its leader serves it.
    recreated(tr, "topic-c")
    assert len(truncations(tr)) == 1


def test_an_id_no_leader_serves_gives_way_to_the_next_metadata() -> None:
    # A tracker on topic-a hears topic-0 from a broker that is behind: no leader serves
    # topic-0 (the probe is refused), and the next metadata naming topic-a goes on with it.
    tr = fetching(0, None, leader_epoch=0)
    tr.on_metadata(1, 0, "topic-0")
    assert tr.topic_id == "topic-a"
    probe = fetch(tr)
    assert probe.topic_probe and probe.topic_id == "topic-0"
    tr.on_fetch_error(probe, ErrorCode.UNKNOWN_TOPIC_ID, 0.0)
    assert tr.on_metadata(1, 0, "topic-a")
    assert tr.topic_id == "topic-a" and truncations(tr) == []
    f = fetch(tr)
    assert f.topic_id == "topic-a" and not f.topic_probe


def test_topic_recreated_before_reading_anything_is_silent() -> None:
    tr = fetching(0, None, leader_epoch=4)
    recreated(tr)
    assert truncations(tr) == [] and fetch(tr).offset == 0


# --------------------------------------------------------------------- policies


def test_callable_policy_can_seek_elsewhere() -> None:
    seen: list[TruncationReport] = []

    def handler(report: TruncationReport) -> EpochOffset:
        seen.append(report)
        return EpochOffset(2)

    tr = fetching(10, 1, on_truncation=handler)
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    assert [r.lost_count for r in seen] == [3]
    (ev,) = truncations(tr)
    assert ev.decision == "seek" and tr.position == EpochOffset(2)


def test_callable_policy_can_raise_via_decision() -> None:
    tr = fetching(10, 1, on_truncation=lambda r: TruncationDecision.RAISE)
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    assert tr.state is S.TRUNCATED


def test_callable_that_fails_leaves_partition_stopped() -> None:
    def handler(report: TruncationReport) -> TruncationDecision:
        raise RuntimeError("boom")

    tr = fetching(10, 1, on_truncation=handler)
    with pytest.raises(RuntimeError):
        tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    assert tr.state is S.TRUNCATED and tr.next_action(0.0) is None


def test_callable_with_bad_answer_stops_and_raises_policy_error() -> None:
    tr = fetching(10, 1, on_truncation=lambda r: "maybe")
    with pytest.raises(InvalidPolicyError):
        tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    assert tr.state is S.TRUNCATED


def test_request_reset_needs_a_real_strategy() -> None:
    tr = fetching(10, 1)
    with pytest.raises(InvalidPolicyError):
        tr.request_reset("none")
    tr.request_reset("latest")
    assert list_offsets(tr).strategy is ResetStrategy.LATEST


def test_invalid_transition_is_a_typed_bug_report() -> None:
    tr = PartitionTracker(TP)
    with pytest.raises(InvalidTransitionError, match="INITIALIZING"):
        tr._goto(Trigger.VALIDATED)


def test_two_rounds_pin_the_divergence_when_leader_names_an_epoch_we_never_read() -> None:
    # We read epoch 3 at [0, 8) and epoch 5 at [8, 10). The leader has epoch 3 at [0, 6),
    # epoch 4 at [6, 12) and never had epoch 5. Java would call position 10 valid
    # (end offset 12 >= 10) and silently keep the wrong records 6..9.
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 5)
    tr.seek(EpochOffset(0))
    f = fetch(tr)
    tr.on_records(f, 0, 7, 3)
    tr.on_records(f, 8, 9, 5)
    assert tr.epoch_history == ((3, 0), (5, 8))
    v1 = elect(tr, 6)
    assert v1.leader_epoch == 5
    tr.on_validation(v1, 0, 4, 12, 0.0)
    v2 = validate(tr)
    assert v2.leader_epoch == 3 and v2.position == EpochOffset(10, 5)
    tr.on_validation(v2, 0, 3, 6, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.divergence == EpochOffset(6, 3) and ev.report.lost_count == 4
    assert tr.position == EpochOffset(6, 3) and tr.epoch_history == ((3, 0),)


def test_events_log_with_stable_names_and_keys(caplog: pytest.LogCaptureFixture) -> None:
    from epochguard.offsets import log_events

    tr = fetching(10, 1)
    tr.on_validation(elect(tr, 2), 0, 1, 7, 0.0)
    with caplog.at_level(logging.DEBUG, logger="epochguard.offsets"):
        log_events(tr.drain_events())
    # Through stdlib logging: each record's msg is the event dict (name + keys).
    logs = [r.msg for r in caplog.records if r.name == "epochguard.offsets"]
    assert all(isinstance(entry, dict) for entry in logs)
    names = [
        (r.msg["event"], r.levelname.lower())
        for r in caplog.records
        if r.name == "epochguard.offsets"
    ]
    assert names == [
        ("offset_validation_started", "debug"),
        ("truncation_detected", "warning"),
    ]
    assert logs[1]["lost_from"] == 7 and logs[1]["decision"] == "rewind"
    assert logs[1]["new_position"] == {"offset": 7, "leader_epoch": 1}


def test_history_is_bounded_and_old_divergence_becomes_unknown() -> None:
    from epochguard.offsets.state import MAX_EPOCH_HISTORY

    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 1000)
    tr.seek(EpochOffset(0))
    f = fetch(tr)
    for epoch in range(1, MAX_EPOCH_HISTORY + 10):
        tr.on_records(f, epoch * 10, epoch * 10 + 9, epoch)
    assert len(tr.epoch_history) == MAX_EPOCH_HISTORY
    v = elect(tr, 1001)
    # The leader only shares epochs up to 2: that history was dropped, so the exact point
    # is unknown (never a wrong one).
    tr.on_validation(v, 0, 2, 30, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.divergence is None


@pytest.mark.parametrize(
    "zero",
    [
        uuid.UUID(int=0),
        "00000000-0000-0000-0000-000000000000",
        "AAAAAAAAAAAAAAAAAAAAAA",
    ],
)
def test_zero_topic_id_is_no_topic_id(zero: object) -> None:
    tr = fetching(10, 4, leader_epoch=4)
    assert tr.on_metadata(1, 4, zero)
    assert tr.topic_id == "topic-a" and truncations(tr) == []
    assert tr.state is S.FETCHING


def test_repr_is_readable() -> None:
    tr = fetching(10, 1)
    tr.pause()
    assert repr(tr) == "<PartitionTracker t-0 FETCHING position=10@e1 leader=1@e1 paused>"


def test_topic_recreated_after_reading_from_a_reset_position_is_reported() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 3, "topic-a")
    tr.restore(None)
    tr.on_list_offsets(list_offsets(tr), 0, 3)
    assert tr.on_records(fetch(tr), 0, 4, 3)
    tr.drain_events()
    recreated(tr, leader=1)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED and ev.report.lost_count == 5


def fell_off_the_log_start(on_truncation: Any = "auto") -> PartitionTracker:
    """A group member's tracker: it restored the group's commit 6 (epoch 0) in topic-a,
    retention had moved the log start to 9, so it reset to 9 and has read nothing since (the
    records 0..5 below the commit were another member's deliveries)."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", on_truncation))
    tr.on_metadata(1, 0, "topic-a")
    tr.restore(EpochOffset(6, 0))
    tr.on_validation(validate(tr), 0, 0, 9, 0.0)
    tr.on_fetch_error(fetch(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    tr.on_validation(validate(tr), 0, 0, 9, 0.0)
    tr.on_list_offsets(list_offsets(tr), 9, 0)
    assert tr.on_empty_fetch(fetch(tr))
    assert tr.position == EpochOffset(9, 0) and truncations(tr) == []
    return tr


def test_topic_recreated_after_a_reset_past_the_commit_reports_what_was_consumed() -> None:
    # Nothing was read since the reset, but the application had consumed to 6 of the
    # deleted log: the new log's offsets 0..5 are other records. Moved silently, the member
    # delivered them as if they were the ones already processed (chaos seed 20218).
    tr = fell_off_the_log_start()
    recreated(tr)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert ev.report.consumed_to == EpochOffset(6, 0) and ev.report.divergence == EpochOffset(0)
    assert ev.report.lost_count == 6 and ev.report.position_source == "committed"
    assert fetch(tr).offset == 0 and tr.topic_id == "topic-b"


def test_topic_recreated_after_a_reset_past_the_commit_raises_under_raise() -> None:
    tr = fell_off_the_log_start("raise")
    recreated(tr)
    assert tr.state is S.TRUNCATED and isinstance(tr.error, LogTruncationError)
    (ev,) = truncations(tr)
    assert ev.report.consumed_to == EpochOffset(6, 0)
    tr.seek(EpochOffset(0))
    assert fetch(tr).offset == 0
    # Told once: the next re-creation finds the position at 0 of a log it has not read.
    recreated(tr, "topic-c")
    assert truncations(tr) == [] and tr.state is S.FETCHING


def test_a_second_reset_keeps_the_position_the_first_one_replaced() -> None:
    # Retention passes the reset position too: what the application consumed is still the
    # commit, not the position the first reset chose.
    tr = fell_off_the_log_start()
    tr.on_fetch_error(fetch(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    tr.on_validation(validate(tr), 0, 0, 12, 0.0)
    tr.on_list_offsets(list_offsets(tr), 12, 0)
    recreated(tr)
    (ev,) = truncations(tr)
    assert ev.report.consumed_to == EpochOffset(6, 0)


def test_topic_recreated_while_resetting_past_the_commit_reports_what_was_consumed() -> None:
    # The re-creation arrives while the reset past retention is under way: the reset is
    # moot, and the new log's earliest offset must not be compared with the old position.
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 0, "topic-a")
    tr.restore(EpochOffset(6, 0))
    tr.on_validation(validate(tr), 0, 0, 9, 0.0)
    tr.on_fetch_error(fetch(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    tr.on_validation(validate(tr), 0, 0, 9, 0.0)
    stale = list_offsets(tr)
    recreated(tr)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert ev.report.consumed_to == EpochOffset(6, 0) and ev.report.divergence == EpochOffset(0)
    assert not tr.on_list_offsets(stale, 9, 0)
    assert fetch(tr).offset == 0 and tr.state is S.FETCHING


def test_topic_recreated_while_resetting_without_a_commit_stays_silent() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 0, "topic-a")
    tr.restore(None)
    stale = list_offsets(tr)
    recreated(tr)
    assert not tr.on_list_offsets(stale, 9, 0)
    tr.on_list_offsets(list_offsets(tr), 0, 0)
    assert truncations(tr) == [] and fetch(tr).offset == 0


def test_topic_recreated_after_a_reset_without_a_commit_stays_silent() -> None:
    # No commit: the application had consumed nothing of the old log, nothing to report.
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 0, "topic-a")
    tr.restore(None)
    tr.on_list_offsets(list_offsets(tr), 9, 0)
    recreated(tr)
    assert truncations(tr) == [] and fetch(tr).offset == 0


def test_fetch_detects_divergence_skips_the_round_trip_on_leader_change() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 1, "topic-a", fetch_detects_divergence=True)
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, 9, 1)
    tr.on_metadata(2, 2, "topic-a", fetch_detects_divergence=True)
    assert tr.state is S.FETCHING  # no OffsetForLeaderEpoch: the fetch compares
    f = fetch(tr)
    assert (f.leader_id, f.current_leader_epoch, f.last_fetched_epoch) == (2, 2, 1)
    tr.on_diverging_epoch(f, 1, 7, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.DIVERGING_EPOCH
    assert ev.report.divergence == EpochOffset(7, 1) and tr.position == EpochOffset(7, 1)


@pytest.mark.parametrize("judged_by_fetch", [True, False])
def test_fetch_detects_divergence_after_a_fenced_fetch_lets_the_next_leader_decide(
    judged_by_fetch: bool,
) -> None:
    """A FENCED fetch waits for metadata past the refused epoch; the leader it names then
    either judges the position by its next fetch, or (it does not compare, as the driver
    says) is asked OffsetForLeaderEpoch, reported as a metadata validation."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 1, "topic-a", fetch_detects_divergence=True)
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, 9, 1)
    tr.on_fetch_error(
        fetch(tr), ErrorCode.FENCED_LEADER_EPOCH, now=0.0, fetch_detects_divergence=True
    )
    assert tr.state is S.FETCHING
    refresh = [e for e in tr.drain_events() if isinstance(e, MetadataRefreshNeeded)]
    assert refresh and refresh[-1].min_leader_epoch == 2
    assert isinstance(tr.next_action(50.0), WaitAction)  # metadata still at epoch 1
    tr.on_metadata(1, 1, "topic-a", fetch_detects_divergence=True)
    assert isinstance(tr.next_action(50.0), WaitAction)
    tr.on_metadata(2, 3, "topic-a", fetch_detects_divergence=judged_by_fetch)
    if judged_by_fetch:
        f = fetch(tr, 50.0)
        assert (f.leader_id, f.current_leader_epoch, f.last_fetched_epoch) == (2, 3, 1)
        tr.on_diverging_epoch(f, 1, 7, 50.0)
        cause = DetectedBy.DIVERGING_EPOCH
    else:
        tr.on_validation(validate(tr, 50.0), 0, 1, 7, 50.0)
        cause = DetectedBy.METADATA
    (ev,) = truncations(tr)
    assert ev.report.detected_by is cause
    assert ev.report.divergence == EpochOffset(7, 1) and tr.position == EpochOffset(7, 1)


def test_fetch_detects_divergence_still_validates_restored_positions() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest"))
    tr.on_metadata(1, 5, fetch_detects_divergence=True)
    tr.restore(EpochOffset(10, 5))
    assert isinstance(tr.next_action(0.0), ValidateAction)


def test_reads_after_a_reset_end_the_nothing_read_exemption() -> None:
    # Read after a reset, then a probe (UNDEFINED, position at log start) moves the reads to
    # another log (a splice; the earlier reads stay in the history, the position's epoch is an
    # upper bound): a later truncation is still a report, since records were read.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(1, 1)
    tr.restore(None)
    tr.on_list_offsets(list_offsets(tr), 0, 1)
    assert tr.on_records(fetch(tr), 0, 4, 1)
    tr.on_validation(elect(tr, 2), 0, -1, -1, 0.0)
    tr.on_list_offsets(list_offsets(tr), 5, 2)  # probe: log start == position
    assert tr.state is S.FETCHING and tr.epoch_history == ((1, 0),)
    assert not tr.position_is_exact
    tr.on_validation(elect(tr, 3), 0, 1, 2, 0.0)
    assert tr.state is S.TRUNCATED


# ------------------------------------------- divergence below the leader's log start (#11)


def read_in(tr: PartitionTracker, *runs: tuple[int, int, int]) -> None:
    """Deliver ``(first, last, epoch)`` batches from one fetch."""
    f = fetch(tr)
    for first, last, epoch in runs:
        assert tr.on_records(f, first, last, epoch)
    tr.drain_events()


def test_divergence_below_the_log_start_is_reported_from_the_log_start() -> None:
    # We read 0..3 in epoch 2. The new (unclean) leader never had epoch 2: epoch 0 ends at 7
    # there, and retention moved its log start to 2 (its epoch cache now starts with (0, 2),
    # Kafka's truncateFromStart). Offsets 0..1 are gone for every reader: only 2..3 are lost.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(1, 2, "topic-a")
    tr.seek(EpochOffset(0))
    read_in(tr, (0, 3, 2))
    tr.on_validation(elect(tr, 5), 0, 0, 7, 0.0)
    assert tr.state is S.AWAIT_VALIDATION and truncations(tr) == []
    probe = list_offsets(tr)
    assert probe.purpose is ListOffsetsPurpose.LOG_START_PROBE
    assert probe.strategy is ResetStrategy.EARLIEST
    tr.on_list_offsets(probe, 2, 0)
    (ev,) = truncations(tr)
    assert ev.report.divergence == EpochOffset(2, 0)
    assert (ev.report.lost_from, ev.report.lost_to, ev.report.lost_count) == (2, 4, 2)
    assert ev.decision == "rewind"
    # What we read in epoch 2 below the log start stays in the history as the earlier log's
    # (a later leader may hold it again); the next records start an entry of their own.
    assert tr.state is S.FETCHING and tr.position == EpochOffset(2, 0)
    assert tr.epoch_history == ((2, 0),) and not tr.position_is_exact
    assert tr.on_records(fetch(tr), 2, 6, 0)
    assert tr.epoch_history == ((2, 0), (0, 2)) and tr.position_is_exact


def spliced(policy: str = "rewind", fetch_detects: bool = False) -> PartitionTracker:
    """Read offset 0 in epoch 1; an unclean leader (epoch 3) holds an older log whose epoch 0
    reaches 2 but whose log start retention moved to 1: the tracker continues at 1 in that
    log (a splice at 1), what it read at 0 kept in its history as the earlier log's."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", policy))
    tr.on_metadata(1, 1, "topic-a", fetch_detects_divergence=fetch_detects)
    tr.seek(EpochOffset(0))
    read_in(tr, (0, 0, 1))
    if fetch_detects:
        tr.on_metadata(0, 3, "topic-a", fetch_detects_divergence=True)
        assert tr.on_diverging_epoch(fetch(tr), 0, 2, 0.0)
    else:
        tr.on_validation(elect(tr, 3, leader=0), 0, 0, 2, 0.0)
    tr.on_list_offsets(list_offsets(tr), 1, 0)
    assert truncations(tr) == [] and tr.state is S.FETCHING
    assert tr.position == EpochOffset(1, 0) and not tr.position_is_exact
    assert tr.epoch_history == ((1, 0),)
    return tr


def test_a_later_leader_holding_the_earlier_log_is_judged_by_its_epochs() -> None:
    # Found by the model property test in CI: after the splice the tracker read offset 1 in
    # epoch 0; the next leader (epoch 4) is the one it read offset 0 from (epoch 1 there).
    # Epoch 0 ends at 0 on it, but that only says the reads since the splice are gone: the
    # tracker asks about epoch 1, which reaches 1, so only offset 1 is lost, not offset 0.
    tr = spliced()
    read_in(tr, (1, 1, 0))
    assert tr.epoch_history == ((1, 0), (0, 1)) and tr.position_is_exact
    first = elect(tr, 4, leader=1)
    assert first.leader_epoch == 0
    tr.on_validation(first, 0, 0, 0, 0.0)
    assert truncations(tr) == []
    second = validate(tr)
    assert second.leader_epoch == 1
    tr.on_validation(second, 0, 1, 1, 0.0)
    (ev,) = truncations(tr)
    assert ev.report.divergence == EpochOffset(1, 1)
    assert (ev.report.lost_from, ev.report.lost_to) == (1, 2)
    assert tr.position == EpochOffset(1, 1)


def test_a_later_leader_holding_neither_log_loses_both() -> None:
    tr = spliced()
    read_in(tr, (1, 1, 0))
    tr.on_validation(elect(tr, 4, leader=2), 0, 0, 0, 0.0)
    second = validate(tr)
    assert second.leader_epoch == 1
    tr.on_validation(second, 0, 1, 0, 0.0)  # epoch 1 ends at 0 there: offset 0 differs too
    (ev,) = truncations(tr)
    assert ev.report.divergence == EpochOffset(0, None)
    assert (ev.report.lost_from, ev.report.lost_to) == (0, 2)


def test_at_the_splice_with_nothing_read_the_earlier_log_is_asked_about() -> None:
    # Nothing read since the splice: the position's epoch came from the log start, so the
    # leader is asked about the epoch the tracker did read (1); holding it, it validates the
    # position in that log and the splice is gone.
    tr = spliced()
    v = elect(tr, 4, leader=1)
    assert v.leader_epoch == 1
    tr.on_validation(v, 0, 1, 1, 0.0)
    assert truncations(tr) == [] and tr.state is S.FETCHING
    assert tr.position == EpochOffset(1, 1) and tr.position_is_exact


def test_at_the_splice_a_diverging_epoch_answer_is_checked_with_the_earlier_epoch() -> None:
    # Fetch v12+: the fetch carries the log start's epoch (0); its DivergingEpoch answer is
    # about that epoch, not about what was read, so the tracker asks about epoch 1 instead.
    tr = spliced(fetch_detects=True)
    tr.on_metadata(1, 4, "topic-a", fetch_detects_divergence=True)
    f = fetch(tr)
    assert f.last_fetched_epoch == 0
    assert tr.on_diverging_epoch(f, 0, 0, 0.0)
    assert truncations(tr) == []
    v = validate(tr)
    assert v.leader_epoch == 1
    tr.on_validation(v, 0, 1, 1, 0.0)
    assert truncations(tr) == [] and tr.position == EpochOffset(1, 1)


def test_divergence_from_own_reads_above_the_log_start_is_kept() -> None:
    # 0..2 in epoch 1, 3..5 in epoch 3; the leader has epoch 1 up to 10 and no epoch 3.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(1, 3, "topic-a")
    tr.seek(EpochOffset(0))
    read_in(tr, (0, 2, 1), (3, 5, 3))
    tr.on_validation(elect(tr, 4), 0, 1, 10, 0.0)
    tr.on_list_offsets(list_offsets(tr), 1, 1)  # log start 1 is below the divergence
    assert tr.state is S.TRUNCATED
    assert isinstance(tr.error, LogTruncationError)
    report = tr.error.report
    assert report.divergence == EpochOffset(3, 1) and report.lost_count == 3


def test_diverged_reads_all_below_the_log_start_are_not_a_truncation() -> None:
    # Seed 1116: we read 0..5 in epoch 5 on an unclean leader. The next leader has epochs
    # 2 and 3 up to 18 but retention had moved its log start to 6: nothing it can serve
    # differs from what we read, so the position is valid and nothing is reported.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(3, 5, "topic-a")
    tr.seek(EpochOffset(0))
    read_in(tr, (0, 5, 5))
    tr.on_validation(elect(tr, 7, leader=1), 0, 3, 18, 0.0)
    tr.on_list_offsets(list_offsets(tr), 6, 2)
    events = tr.drain_events()
    assert not [e for e in events if isinstance(e, TruncationDetected)]
    assert [type(e) for e in events][-1] is PositionValidated
    assert tr.state is S.FETCHING and tr.position == EpochOffset(6, 2)


def test_diverged_reads_with_the_log_start_past_the_position_apply_the_reset_policy() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("latest", "rewind"))
    tr.on_metadata(1, 2, "topic-a")
    tr.seek(EpochOffset(0))
    read_in(tr, (0, 3, 2))
    tr.on_validation(elect(tr, 5), 0, 0, 9, 0.0)
    tr.on_list_offsets(list_offsets(tr), 6, 0)
    assert truncations(tr) == []
    reset = list_offsets(tr)
    assert reset.purpose is ListOffsetsPurpose.RESET and reset.strategy is ResetStrategy.LATEST


def test_a_leader_change_during_the_log_start_probe_starts_validation_over() -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(1, 2, "topic-a")
    tr.seek(EpochOffset(0))
    read_in(tr, (0, 3, 2))
    tr.on_validation(elect(tr, 5), 0, 0, 7, 0.0)
    stale_probe = list_offsets(tr)
    again = elect(tr, 6, leader=3)  # the probe's answer no longer counts
    assert not tr.on_list_offsets(stale_probe, 2, 0)
    assert again.leader_epoch == 2
    tr.on_validation(again, 0, 2, 9, 0.0)  # the newest leader has all we read
    assert truncations(tr) == [] and tr.state is S.FETCHING
    assert tr.position == EpochOffset(4, 2)


def test_a_restored_position_on_a_former_topic_id_retires_that_id() -> None:
    # Found in review: restoring a position of topic id X when metadata already names Y
    # reported the re-creation but retired Y instead of X, so a broker still naming X later
    # sent the tracker back to the deleted log with a second report.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(1, 0, "topic-y")
    tr.restore(EpochOffset(10, 3, topic_id="topic-x"), source="left_position")
    assert truncations(tr) == []  # until a leader serves topic-y
    assert tr.on_empty_fetch(fetch(tr))
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert tr.on_records(fetch(tr), 0, 4, 0)
    assert not tr.on_metadata(1, 3, "topic-x")  # a broker behind the re-creation
    assert truncations(tr) == [] and tr.topic_id == "topic-y" and tr.position == EpochOffset(5, 0)


def test_a_log_start_below_an_older_splice_replaces_it() -> None:
    # Found in review: reads from log A [0, 10) and log B [10, 20) (a splice at 10); leader C
    # has its log start at 8 and the divergence at 5. The rewind goes to 8 in C's log: the
    # splice must move to 8 (it was dropped, and A's diverged entries then shared a stretch
    # with C's records). The history is set directly: reaching it through answers takes
    # three leaders.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(1, 5, "topic-a")
    tr.seek(EpochOffset(20, 3))
    tr._hist[:] = [(1, 0), (2, 5), (3, 10)]
    tr._hist_epoch, tr._hist_inexact = 3, False
    tr._splices[:] = [10]
    tr._probe, tr._probe_divergence = True, EpochOffset(5, 2)
    tr.on_list_offsets(list_offsets(tr), 8, 4)
    (ev,) = truncations(tr)
    assert ev.report.divergence == EpochOffset(8, 4)
    assert tr.position == EpochOffset(8, 4) and tr.epoch_history == ((1, 0), (2, 5))
    assert not tr.position_is_exact  # nothing read in C's log yet
    assert tr.on_records(fetch(tr), 8, 9, 4)
    assert tr.epoch_history == ((1, 0), (2, 5), (4, 8))


def test_awaits_names_only_the_request_in_flight() -> None:
    """A driver asks ``awaits`` before touching its own state for an answer: only the
    request handed out last, not yet answered, at the tracker's generation is current."""
    tr = fetching(10, 1)
    old = fetch(tr)
    assert tr.awaits(old)
    tr.on_metadata(2, 2, "topic-a")  # a new leader: the fetch to the old one is stale
    assert not tr.awaits(old)
    asked = validate(tr)
    assert tr.awaits(asked)
    assert tr.on_validation(asked, 0, 1, 10, 0.0)
    assert not tr.awaits(asked)  # answered
    current = fetch(tr)
    assert tr.awaits(current) and not tr.awaits(old)
    tr.cancel(current)
    assert not tr.awaits(current)
    again = fetch(tr)  # handed out once more after the cancel, at the same generation
    assert tr.awaits(again) and tr.awaits(current)


def test_a_tracker_made_again_for_a_partition_ignores_its_predecessors_answers() -> None:
    """Chaos seed 72: a group member gave a partition up and got it back; the answer to the
    first tracker's OffsetForLeaderEpoch (about 5@e0, from the old leader) reached the new
    tracker (restored at 23@e1), whose generation counter had started over at the same
    number: it took the answer and reported a truncation of [0, 23) that never happened."""
    policy = OffsetPolicy("earliest", "auto")
    first = PartitionTracker(TP, policy)
    first.on_metadata(1, 0, "topic-a")
    first.seek(EpochOffset(5, 0))
    asked = validate(first)
    again = PartitionTracker(TP, policy)
    again.on_metadata(2, 1, "topic-a")
    again.restore(EpochOffset(23, 1))
    mine = validate(again)
    assert not again.awaits(asked) and again.awaits(mine)
    assert not again.on_validation(asked, 0, 0, 5, 0.0)
    assert again.state is S.AWAIT_VALIDATION and again.last_report is None
    assert again.on_validation(mine, 0, 1, 30, 0.0)
    assert again.state is S.FETCHING and again.position == EpochOffset(23, 1)


def test_a_seek_to_the_reported_divergence_keeps_what_was_read_below_it() -> None:
    """Found by `make explore`: the application seeks to the divergence of the tracker's own
    report (policy raise, the documented answer). The seek cleared the epochs read below it,
    so the reported epoch was an upper bound only, and a later leader answering an older
    epoch ending at the position validated it, although the record below had been read in
    an epoch that leader never had."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(2, 2, "topic-a")
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, 1, 2)  # 0..1 read in epoch 2
    tr.on_metadata(1, 3, "topic-a")  # an unclean election kept only offset 0
    tr.on_validation(validate(tr), 0, 2, 1, 0.0)
    report = tr.last_report
    assert tr.state is S.TRUNCATED and report is not None
    assert report.divergence == EpochOffset(1, 2)
    tr.seek(report.divergence)  # the application resumes there
    assert tr.on_validation(validate(tr), 0, 2, 1, 0.0)  # the same leader agrees
    assert tr.state is S.FETCHING and tr.position == EpochOffset(1, 2)
    tr.drain_events()
    # Another unclean election: this leader has offset 0 in epoch 0 and never had epoch 2.
    tr.on_metadata(0, 4, "topic-a")
    tr.on_validation(validate(tr), 0, 0, 1, 0.0)
    while tr.state is S.AWAIT_VALIDATION:  # a log start probe, if the tracker asks for one
        probe = tr.next_action(0.0)
        assert isinstance(probe, ResetAction)
        tr.on_list_offsets(probe, 0, 0)
    assert tr.state is S.TRUNCATED
    again = tr.last_report
    assert again is not None and again is not report
    assert again.divergence is None or again.divergence.offset == 0


def test_a_handler_resuming_at_the_divergence_keeps_what_was_read_below_it() -> None:
    """The callable policy's usual answer, the report's own divergence, is a rewind: the
    epochs read below it stay known. Found on Raft-term brokers (Redpanda's rules: the
    leader echoes the epoch asked about): after the handler's seek cleared them, a second
    loss was reported at 6 with the epoch of the lost records (an upper bound) instead of
    the epoch offset 5 was read in. The same clearing let the Kafka case of the test above
    validate a replaced record with the callable policy."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", lambda report: report.divergence))
    tr.on_metadata(2, 2, "topic-a")
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, 1, 2)  # 0..1 read in epoch 2
    tr.on_metadata(1, 3, "topic-a")  # an unclean election kept only offset 0
    tr.on_validation(validate(tr), 0, 2, 1, 0.0)
    report = tr.last_report
    assert report is not None and report.divergence == EpochOffset(1, 2)
    assert tr.on_validation(validate(tr), 0, 2, 1, 0.0)  # the handler's seek, validated
    assert tr.state is S.FETCHING and tr.position == EpochOffset(1, 2)
    assert tr.epoch_history == ((2, 0),)
    tr.drain_events()
    # Another unclean election: this leader has offset 0 in epoch 0 and never had epoch 2.
    tr.on_metadata(0, 4, "topic-a")
    tr.on_validation(validate(tr), 0, 0, 1, 0.0)
    while tr.state is S.AWAIT_VALIDATION:  # a log start probe, if the tracker asks for one
        probe = tr.next_action(0.0)
        assert isinstance(probe, ResetAction)
        tr.on_list_offsets(probe, 0, 0)
    again = tr.last_report
    assert again is not None and again is not report
    assert again.divergence is None or again.divergence.offset == 0


def test_raft_terms_a_handler_resume_then_a_second_loss_names_the_epoch_read() -> None:
    """Raft terms (Redpanda): 0..5 read in term 1, 6..7 in term 4; a loss takes 6..7 and the
    handler resumes at 6@1; 6..7 read again in term 7 are lost too. The leader echoes term 7
    (it holds the term, with no record): only what was read at 5 places the divergence."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", lambda report: report.divergence))
    tr.on_metadata(1, 1, "topic-a")
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, 5, 1)
    assert tr.on_records(fetch(tr), 6, 7, 4)
    tr.on_metadata(2, 6, "topic-a")
    tr.on_validation(validate(tr), 0, 4, 6, 0.0)  # term 4 ends at 6 here: echoed
    v = validate(tr)  # 5 was read in term 1: asked again
    assert v.leader_epoch == 1
    tr.on_validation(v, 0, 1, 6, 0.0)
    first = tr.last_report
    assert first is not None and first.divergence == EpochOffset(6, 1)
    assert tr.on_validation(validate(tr), 0, 1, 6, 0.0)  # the handler's seek, validated
    assert tr.on_records(fetch(tr), 6, 7, 7)
    tr.on_metadata(3, 9, "topic-a")
    tr.on_validation(validate(tr), 0, 7, 6, 0.0)
    v = validate(tr)
    assert v.leader_epoch == 1
    tr.on_validation(v, 0, 1, 6, 0.0)
    second = tr.last_report
    assert second is not None and second is not first
    assert (second.divergence, second.consumed_to) == (EpochOffset(6, 1), EpochOffset(8, 7))


def test_a_seek_elsewhere_after_a_report_starts_afresh() -> None:
    """Only the reported divergence keeps the history: a seek anywhere else is a new
    position whose epoch is an upper bound, as before."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(2, 2, "topic-a")
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, 1, 2)
    tr.on_metadata(1, 3, "topic-a")
    tr.on_validation(validate(tr), 0, 2, 1, 0.0)
    assert tr.state is S.TRUNCATED
    tr.seek(EpochOffset(1, 1))  # not the report's divergence (1@e2)
    assert tr.epoch_history == ()
