"""Positions restored from commits, seeks with epochs, external validation, detection paths."""

from __future__ import annotations

import time

import pytest
from kafka.structs import OffsetAndMetadata

from epochguard.consumer import LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy

from .conftest import TP0, diverge, make_consumer, poll_until, read, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)


def test_commit_carries_epoch_and_restart_after_unclean_election_rewinds(cluster) -> None:
    old, new = setup_topic(cluster)
    with make_consumer(cluster, group_id="g1") as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        diverge(cluster, old, new)
        assert len(read(consumer, 5)) == 5
        consumer.commit()
        assert consumer.committed_with_epoch(TP0) == EpochOffset(15, 0)
    # Stopped while the log is truncated and refilled past the committed offset.
    unclean_elect(cluster, old, new)
    with make_consumer(cluster, group_id="g1", on_truncation="rewind") as consumer:
        consumer.assign([TP0])
        got = read(consumer, 8)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]
        [rep] = consumer.truncation_reports()
        assert rep.detected_by is DetectedBy.RESTORE
        # (Which epoch a restored position's divergence point carries is the tracker's rule,
        # tested in tests/offsets; the driver must deliver the offset and the loss.)
        assert rep.divergence is not None and rep.divergence.offset == 10
        assert rep.lost_count == 5
        consumer.commit()
        assert consumer.committed_with_epoch(TP0) == EpochOffset(18, 2)


def test_commit_of_caught_up_position_keeps_epoch(cluster) -> None:
    setup_topic(cluster)
    with make_consumer(cluster, group_id="g2") as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        for _ in range(5):  # empty fetches
            consumer.poll(timeout_ms=50)
        consumer.commit()
        assert consumer.committed_with_epoch(TP0) == EpochOffset(10, 0)
        consumer.commit({TP0: OffsetAndMetadata(7, "m", 0)})
        assert consumer.committed_with_epoch(TP0) == EpochOffset(7, 0)


def test_seek_with_epoch_to_truncated_position_raises(cluster) -> None:
    old, new = setup_topic(cluster)
    diverge(cluster, old, new)
    unclean_elect(cluster, old, new)
    with make_consumer(cluster, on_truncation="raise") as consumer:
        consumer.assign([TP0])
        consumer.seek(TP0, EpochOffset(15, 0))
        with pytest.raises(LogTruncationError) as info:
            poll_until(consumer, lambda: False)
        [(tp, div)] = info.value.truncation_offsets().items()
        assert tp == TP0 and div is not None and div.offset == 10
        # A valid epoch position is accepted and fetched from.
        consumer.seek(TP0, EpochOffset(5, 0))
        assert [r.offset for r in read(consumer, 13)] == list(range(5, 18))


def test_validate_offsets_does_not_assign(cluster) -> None:
    old, new = setup_topic(cluster)
    diverge(cluster, old, new)
    unclean_elect(cluster, old, new)
    with make_consumer(cluster) as consumer:
        bad = consumer.validate_offsets({TP0: EpochOffset(15, 0)})[TP0]
        assert not bad.valid and bad.report is not None
        assert bad.safe_position is not None and bad.safe_position.offset == 10
        assert bad.report.lost_count == 5
        good = consumer.validate_offsets({TP0: EpochOffset(8, 0)})[TP0]
        assert good.valid and good.safe_position is not None
        assert good.safe_position.offset == 8
        current = consumer.validate_offsets({TP0: EpochOffset(17, 2)})[TP0]
        assert current.valid
        assert consumer.assignment() == set()


def test_offset_for_leader_epoch_path_with_fetch_v11(cluster) -> None:
    """Java's behaviour: no LastFetchedEpoch; detection by metadata + OffsetForLeaderEpoch."""
    old, new = setup_topic(cluster)
    with make_consumer(cluster, max_fetch_version=11, on_truncation="rewind") as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        diverge(cluster, old, new)
        assert len(read(consumer, 5)) == 5
        unclean_elect(cluster, old, new)
        assert [r.offset for r in read(consumer, 8)] == list(range(10, 18))
        [rep] = consumer.truncation_reports()
        assert rep.divergence == EpochOffset(10, 0)
        m = consumer.metrics(raw=True)
        assert m["offset_for_leader_epoch_requests"] >= 1
        assert m["diverging_epoch_responses"] == 0


def test_diverging_epoch_path_needs_no_extra_round_trip(cluster) -> None:
    """Metadata without epochs (v6) and the same leader after the election round trip: only
    Fetch v12 DivergingEpoch can reveal the truncation, and it is acted on directly."""
    old, new = setup_topic(cluster)
    with make_consumer(cluster, max_metadata_version=6, on_truncation="rewind") as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        diverge(cluster, old, new)
        assert len(read(consumer, 5)) == 5
        # Not polling: the consumer never sees the intermediate leader.
        unclean_elect(cluster, old, new)
        deadline = time.monotonic() + 10
        # Caught up (18 records) and back in the ISR, which it joins a moment after that.
        while cluster.replica_log("t", 0, old).log_end_offset != 18 or old not in cluster.isr(
            "t", 0
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cluster.elect_leader("t", 0, old)
        got = read(consumer, 8)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]
        [rep] = consumer.truncation_reports()
        assert rep.detected_by is DetectedBy.DIVERGING_EPOCH
        assert rep.divergence == EpochOffset(10, 0) and rep.lost_count == 5
        m = consumer.metrics(raw=True)
        assert m["diverging_epoch_responses"] == 1
        assert m["offset_for_leader_epoch_requests"] == 0


def test_stale_metadata_is_ignored(cluster) -> None:
    _old, new = setup_topic(cluster)
    with make_consumer(cluster, metadata_max_age_ms=50, on_truncation="raise") as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        lagging = [b for b in cluster.broker_ids if b != new]
        for b in lagging:
            cluster.set_metadata_delay(b, 3.0)
        cluster.elect_leader("t", 0, new)
        cluster.append("t", 0, [b"after"])
        got = read(consumer, 1, timeout=15)
        assert [r.offset for r in got] == [10]
        epochs: set[int | None] = set()
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            consumer.poll(timeout_ms=50)
            epochs.add(consumer._engine.fetcher.trackers[TP0].leader_epoch)
        # Whichever broker answered, the known epoch never went back.
        assert epochs == {cluster.leader_epoch("t", 0)}
        assert consumer.truncation_reports() == []


def test_fenced_fetch_triggers_validation_not_reset(cluster) -> None:
    """FENCED_LEADER_EPOCH on a fetch: refresh metadata, validate, carry on (no loss, no
    duplicates, no truncation report)."""
    setup_topic(cluster)
    # Fetch v11: validated by OffsetForLeaderEpoch. At v12+ a leader that answered before
    # waits for metadata past the refused epoch and its next fetch (LastFetchedEpoch) judges.
    with make_consumer(cluster, on_truncation="raise", max_fetch_version=11) as consumer:
        consumer.assign([TP0])
        assert [r.offset for r in read(consumer, 10)] == list(range(10))
        validations = consumer.metrics(raw=True)["offset_for_leader_epoch_requests"]
        # Let the long-poll fetch still in flight come back empty first: otherwise it could
        # carry the appended records and the injected error would never be used.
        time.sleep(0.3)
        cluster.faults.inject_error(api_key=1, error_code=74, count=1)  # FENCED_LEADER_EPOCH
        cluster.append("t", 0, [b"x-%d" % i for i in range(3)])
        assert [r.offset for r in read(consumer, 3)] == [10, 11, 12]
        m = consumer.metrics(raw=True)
        assert m["fetch_errors"] >= 1
        assert m["offset_for_leader_epoch_requests"] > validations
        assert consumer.truncation_reports() == []
