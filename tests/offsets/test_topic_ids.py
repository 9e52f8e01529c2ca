"""Which topic incarnation a position belongs to, judged on evidence (docs/design.md, "Topic
ids"): a topic id that differs from the position's is a re-creation only once a leader serves
it, and an id a leader stopped serving before is a broker behind the re-creation.

Seen order is not incarnation order: a broker whose metadata lags names the deleted topic's
id after the new one, and a consumer given the partition after the re-creation may never
have had the old id at all. These tests feed metadata, positions and fetch answers to one
tracker, sans-IO."""

from __future__ import annotations

from epochguard.offsets import (
    DetectedBy,
    EpochOffset,
    ErrorCode,
    MetadataRefreshNeeded,
    OffsetPolicy,
    PartitionState,
    PartitionTracker,
    TopicPartition,
    WaitAction,
)

from .test_state_rules import fetch, truncations, validate

TP = TopicPartition("t", 0)
S = PartitionState
OLD, NEW, NEWER = "topic-old", "topic-new", "topic-newer"


def reading(topic: str, offset: int = 10, epoch: int = 0, **policy: str) -> PartitionTracker:
    """A tracker that has read [0, offset) of ``topic`` in ``epoch`` from leader 1."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", policy.get("on_truncation", "auto")))
    tr.on_metadata(1, epoch, topic)
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, offset - 1, epoch)
    tr.drain_events()
    return tr


def given_commit_while_metadata_lags(commit: EpochOffset) -> PartitionTracker:
    """A group member given the partition after the topic was re-created: its metadata comes
    from a broker still behind the re-creation (the old id, that broker's leader), the
    group's commit was made by a member that read the new incarnation."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(2, 4, OLD)
    tr.restore(commit)
    return tr


# ------------------------------------------------------------ spurious reports (the flap)


def test_a_commit_of_the_new_incarnation_is_not_judged_by_metadata_behind_it() -> None:
    commit = EpochOffset(6, 0, topic_id=NEW, epoch_exact=True)
    tr = given_commit_while_metadata_lags(commit)
    assert truncations(tr) == [] and tr.position == EpochOffset(6, 0)
    assert tr.position is not None and tr.position.topic_id == NEW
    # Nothing but a fetch under the id metadata names can tell which incarnation is live;
    # the broker behind does not know the new id, the current ones no longer know the old.
    probe = fetch(tr)
    assert probe.topic_probe and probe.topic_id == OLD and probe.leader_id == 2
    assert tr.on_fetch_error(probe, ErrorCode.UNKNOWN_TOPIC_ID, 0.0)
    assert truncations(tr) == []
    # Metadata from an up-to-date broker names the commit's incarnation: validate it there.
    assert tr.on_metadata(1, 0, NEW)
    v = validate(tr)
    assert v.position == EpochOffset(6, 0) and v.leader_id == 1
    tr.on_validation(v, 0, 0, 9, 0.0)
    f = fetch(tr)
    assert (f.offset, f.topic_id, f.topic_probe) == (6, NEW, False)
    assert tr.on_records(f, 6, 8, 0)
    # The lagging broker answers metadata again: a leader has served the new id since the
    # old one was named, so the old one is stale now, not a re-creation.
    assert not tr.on_metadata(2, 4, OLD)
    assert truncations(tr) == [] and fetch(tr).offset == 9


def test_an_id_named_after_the_position_was_read_is_stale_when_a_leader_keeps_serving() -> None:
    # A tracker made after the re-creation reads the new incarnation; a broker behind it
    # names the deleted topic's id, which this tracker never had.
    tr = reading(NEW)
    assert tr.on_metadata(2, 3, OLD)
    assert truncations(tr) == []
    probe = fetch(tr)
    assert probe.topic_probe and probe.topic_id == OLD
    # The probe's records are never delivered, whatever the answer.
    assert tr.on_fetch_error(probe, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0.0)
    assert truncations(tr) == [] and tr.position == EpochOffset(10, 0)
    assert tr.on_metadata(1, 0, NEW)
    f = fetch(tr)
    assert not f.topic_probe and f.topic_id == NEW and tr.on_records(f, 10, 11, 0)
    assert not tr.on_metadata(2, 3, OLD)  # judged: behind
    assert truncations(tr) == [] and tr.position == EpochOffset(12, 0)


def test_a_probe_answer_is_never_delivered() -> None:
    tr = reading(NEW)
    tr.on_metadata(2, 3, OLD)
    probe = fetch(tr)
    # Even if a driver hands the answer's records over, they are refused (here the probe
    # is answered, so OLD is the live incarnation: a real re-creation).
    assert not tr.on_records(probe, 10, 12, 3)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert tr.topic_id == OLD


# ------------------------------------------------------------- real re-creations


def test_a_real_re_creation_is_reported_once_a_leader_serves_the_new_id() -> None:
    tr = reading(OLD, 10, epoch=4)
    assert tr.on_metadata(2, 0, NEW)
    assert truncations(tr) == []  # no evidence yet
    probe = fetch(tr)
    assert probe.topic_probe and probe.topic_id == NEW and probe.leader_id == 2
    assert tr.on_empty_fetch(probe)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert ev.report.consumed_to == EpochOffset(10, 4)
    assert ev.report.divergence == EpochOffset(0) and ev.report.lost_count == 10
    f = fetch(tr)
    assert (f.offset, f.topic_id, f.topic_probe, f.current_leader_epoch) == (0, NEW, False, 0)
    # The deleted topic's id, named again by a broker behind, is stale from now on.
    assert not tr.on_metadata(1, 4, OLD)
    assert truncations(tr) == []


def test_a_real_re_creation_raises_under_raise() -> None:
    tr = reading(OLD, 10, epoch=4, on_truncation="raise")
    tr.on_metadata(2, 0, NEW)
    probe = fetch(tr)
    # An out-of-range answer is the new log answering too (shorter than our position).
    assert tr.on_fetch_error(probe, ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    assert tr.state is S.TRUNCATED and tr.leader_epoch == 0
    (ev,) = truncations(tr)
    assert ev.report.lost_count == 10


def test_a_re_creation_waits_for_the_new_topic_s_leader() -> None:
    # The new topic's leader is not ready yet: nothing is judged and nothing is delivered
    # until a leader serves the new id.
    tr = reading(OLD, 10)
    tr.on_metadata(2, 0, NEW)
    probe = fetch(tr)
    assert tr.on_fetch_error(probe, ErrorCode.NOT_LEADER_OR_FOLLOWER, 0.0)
    assert any(isinstance(e, MetadataRefreshNeeded) for e in tr.drain_events())
    w = tr.next_action(0.0)
    assert isinstance(w, WaitAction)
    assert tr.on_metadata(3, 1, NEW)
    probe = fetch(tr, w.until)
    assert probe.topic_probe and probe.leader_id == 3
    assert not tr.on_records(probe, 0, 2, 1)
    (ev,) = truncations(tr)
    assert ev.report.lost_count == 10 and fetch(tr, w.until).offset == 0


def test_the_probe_goes_out_while_validating_and_while_paused() -> None:
    # Validation by name (OffsetForLeaderEpoch) would compare the position with whichever
    # incarnation the broker holds: the topic id is settled first.
    tr = reading(OLD, 10, epoch=1)
    tr.on_metadata(1, 2, OLD)
    assert tr.state is S.AWAIT_VALIDATION
    tr.pause()
    tr.on_metadata(2, 0, NEW)
    probe = fetch(tr)
    assert probe.topic_probe and tr.awaits(probe)
    assert tr.on_empty_fetch(probe)
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert ev.report.consumed_to == EpochOffset(10, 1)


def test_a_position_of_a_deleted_incarnation_is_reported_at_once() -> None:
    # Evidence already in hand: a leader served NEW after OLD was named.
    tr = reading(OLD, 10, epoch=4)
    tr.on_metadata(2, 0, NEW)
    tr.on_empty_fetch(fetch(tr))
    tr.seek(EpochOffset(0))
    assert tr.on_records(fetch(tr), 0, 2, 0)
    truncations(tr)
    tr.seek(EpochOffset(7, 4, topic_id=OLD))
    (ev,) = truncations(tr)
    assert ev.report.detected_by is DetectedBy.TOPIC_RECREATED
    assert ev.report.consumed_to == EpochOffset(7, 4)
    assert fetch(tr).topic_id == NEW


def test_a_position_of_an_unknown_id_is_judged_by_a_probe_of_metadata_s_id() -> None:
    # A stored position names an id this tracker never had; metadata names another. The
    # leader serving metadata's id proves the stored one deleted: reported.
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "rewind"))
    tr.on_metadata(1, 0, NEW)
    tr.restore(EpochOffset(10, 3, topic_id=OLD), source="offset_store")
    assert truncations(tr) == []
    probe = fetch(tr)
    assert probe.topic_probe and probe.topic_id == NEW
    assert not tr.on_records(probe, 0, 4, 0)
    (ev,) = truncations(tr)
    assert ev.report.consumed_to == EpochOffset(10, 3)
    assert ev.report.position_source == "offset_store"
    assert fetch(tr).offset == 0 and tr.topic_id == NEW


def test_a_third_id_after_a_re_creation_is_a_re_creation_again() -> None:
    tr = reading(OLD, 10)
    tr.on_metadata(2, 0, NEW)
    tr.on_empty_fetch(fetch(tr))
    assert len(truncations(tr)) == 1
    assert tr.on_records(fetch(tr), 0, 2, 0)
    assert not tr.on_metadata(1, 4, OLD)
    assert tr.on_metadata(2, 0, NEWER)
    assert tr.on_empty_fetch(fetch(tr))
    (ev,) = truncations(tr)
    assert ev.report.consumed_to == EpochOffset(3, 0) and tr.topic_id == NEWER
    # Both former ids are known to be behind now.
    assert not tr.on_metadata(1, 4, OLD) and not tr.on_metadata(2, 0, NEW)


def test_metadata_back_on_the_position_s_id_ends_the_probe() -> None:
    # The broker that named another id was behind; the next answer names ours again: fetch
    # on, without a report. A leader serving ours then settles the other id as stale.
    tr = reading(NEW, 10)
    tr.on_metadata(2, 3, OLD)
    probe = fetch(tr)
    assert tr.on_metadata(1, 0, NEW)
    assert not tr.on_empty_fetch(probe)  # the probe's late answer no longer counts
    f = fetch(tr)
    assert not f.topic_probe and tr.on_empty_fetch(f)
    assert not tr.on_metadata(2, 3, OLD)
    assert truncations(tr) == [] and tr.state is S.FETCHING
