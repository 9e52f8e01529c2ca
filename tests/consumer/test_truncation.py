"""Unclean elections seen through EpochConsumer: exact divergence points and lost counts.

Layout: offsets 0..9 replicated under epoch 0; the follower stops; the leader alone appends
10..14 (read by the consumer); the leader stops; the follower is elected uncleanly (epoch 2)
and appends 8 records at 10..17. Divergence point: offset 10, epoch 0; 5 records lost.
"""

from __future__ import annotations

import pytest

from epochguard.consumer import EpochConsumer, LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, diverge, make_consumer, poll_until, read, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)


def _caught_up(cluster, consumer: EpochConsumer) -> tuple[int, int]:
    old, new = setup_topic(cluster)
    consumer.assign([TP0])
    assert [r.offset for r in read(consumer, 10)] == list(range(10))
    diverge(cluster, old, new)
    assert [r.offset for r in read(consumer, 5)] == list(range(10, 15))
    return old, new


def test_idle_consumer_detects_unclean_election_and_rewinds(cluster) -> None:
    reports: list[TruncationReport] = []
    with make_consumer(
        cluster, on_truncation="rewind", on_truncation_report=reports.append
    ) as consumer:
        old, new = _caught_up(cluster, consumer)
        # Caught up and idle: empty fetches must not drop the position's epoch.
        assert consumer.poll(timeout_ms=300) == {}
        assert consumer.position_with_epoch(TP0) == EpochOffset(15, 0)
        unclean_elect(cluster, old, new)
        got = read(consumer, 8)
        assert [(r.offset, r.value) for r in got] == [(10 + i, b"new-%d" % i) for i in range(8)]
        assert all(r.leader_epoch == 2 for r in got)
        assert len(reports) == 1
        rep = reports[0]
        assert rep.divergence == EpochOffset(10, 0)
        assert rep.consumed_to == EpochOffset(15, 0)
        assert rep.lost_count == 5
        m = consumer.metrics(raw=True)
        assert m["truncations_detected"] == 1 and m["records_lost"] == 5


def test_raise_policy_stops_partition_until_seek(cluster) -> None:
    with make_consumer(cluster, on_truncation="raise") as consumer:
        old, new = _caught_up(cluster, consumer)
        unclean_elect(cluster, old, new)
        with pytest.raises(LogTruncationError) as info:
            poll_until(consumer, lambda: False, timeout=10)
        err = info.value
        assert err.truncation_offsets() == {TP0: EpochOffset(10, 0)}
        assert err.truncations[TP0].lost_count == 5
        # Stopped: nothing is returned until the application seeks.
        assert consumer.poll(timeout_ms=300) == {}
        consumer.seek(TP0, err.truncation_offsets()[TP0])
        got = read(consumer, 8)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]


def test_auto_policy_with_latest_rewinds_to_divergence(cluster) -> None:
    with make_consumer(cluster, auto_offset_reset="latest") as consumer:
        old, new = setup_topic(cluster)
        consumer.assign([TP0])
        consumer.seek(TP0, 0)
        assert len(read(consumer, 10)) == 10
        diverge(cluster, old, new)
        assert len(read(consumer, 5)) == 5
        unclean_elect(cluster, old, new)
        got = read(consumer, 8)
        assert [r.offset for r in got] == list(range(10, 18))
        [rep] = consumer.truncation_reports()
        assert (rep.lost_from, rep.lost_to, rep.lost_count) == (10, 15, 5)


def test_callable_policy_decides(cluster) -> None:
    seen: list[TruncationReport] = []

    def decide(report: TruncationReport) -> EpochOffset:
        seen.append(report)
        return EpochOffset(12, 2)  # skip the first two new records

    with make_consumer(cluster, on_truncation=decide) as consumer:
        old, new = _caught_up(cluster, consumer)
        unclean_elect(cluster, old, new)
        got = read(consumer, 6)
        assert [r.offset for r in got] == list(range(12, 18))
        assert len(seen) == 1 and seen[0].divergence == EpochOffset(10, 0)


def test_clean_election_is_no_truncation(cluster) -> None:
    with make_consumer(cluster, on_truncation="raise") as consumer:
        _old, new = setup_topic(cluster)
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        cluster.elect_leader("t", 0, new)
        cluster.append("t", 0, [b"after-%d" % i for i in range(3)])
        got = read(consumer, 3)
        assert [r.offset for r in got] == [10, 11, 12]
        assert consumer.truncation_reports() == []
        assert consumer.metrics(raw=True)["validations"] >= 1


def _mid_stream(cluster, consumer: EpochConsumer) -> tuple[int, int]:
    """1000 records (500..999 only on the leader); the consumer has taken exactly 700 in
    polls of 50, so more old-leader records are buffered (and prefetched) when the unclean
    election happens."""
    old, new = setup_topic(cluster, kept=0)
    cluster.append("t", 0, [b"kept-%d" % i for i in range(500)], batch_size=50)
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"old-%d" % i for i in range(500, 1000)], batch_size=50)
    consumer.assign([TP0])
    got = read(consumer, 700, max_records=50)
    assert [r.offset for r in got] == list(range(700))
    assert consumer._engine.fetcher.has_buffered()
    return old, new


@pytest.mark.parametrize("policy", ["rewind", "raise"])
def test_mid_stream_unclean_election_drops_buffered_old_records(cluster, policy: str) -> None:
    with make_consumer(cluster, on_truncation=policy) as consumer:
        old, new = _mid_stream(cluster, consumer)
        unclean_elect(cluster, old, new, fresh=100)
        # The consumer learns the new leader epoch (a metadata refresh) while 300 records of
        # the old leader are still buffered or prefetched: none of them may be returned.
        assert consumer.partitions_for_topic("t") == {0}
        assert not consumer._engine.fetcher.has_buffered()
        got: list = []
        if policy == "raise":
            with pytest.raises(LogTruncationError) as info:
                poll_until(consumer, lambda: False, sink=got)
            rep = info.value.truncations[TP0]
            consumer.seek(TP0, info.value.truncation_offsets()[TP0])
        else:
            poll_until(consumer, lambda: bool(consumer.truncation_reports()), sink=got)
            [rep] = consumer.truncation_reports()
        assert all(not r.value.startswith(b"old-") for r in got)
        assert rep.consumed_to == EpochOffset(700, 0)
        assert rep.divergence == EpochOffset(500, 0) and rep.lost_count == 200
        got += read(consumer, 100 - len(got), max_records=50)
        assert [(r.offset, r.value) for r in got] == [(500 + i, b"new-%d" % i) for i in range(100)]


def test_records_delivered_before_detection_are_counted_as_lost(cluster) -> None:
    """Buffered old-leader records handed out before anything revealed the election were
    consumed like any other: the report counts them, and nothing old follows it."""
    with make_consumer(cluster, on_truncation="rewind") as consumer:
        old, new = _mid_stream(cluster, consumer)
        unclean_elect(cluster, old, new, fresh=100)
        got: list = []
        poll_until(consumer, lambda: bool(consumer.truncation_reports()), sink=got)
        [rep] = consumer.truncation_reports()
        delivered_old = [r for r in got if r.value.startswith(b"old-")]
        assert [r.offset for r in delivered_old] == list(range(700, 700 + len(delivered_old)))
        assert rep.consumed_to.offset == 700 + len(delivered_old)
        assert rep.divergence == EpochOffset(500, 0)
        assert rep.lost_count == 200 + len(delivered_old)
        after = got[len(delivered_old) :]
        after += read(consumer, 100 - len(after), max_records=50)
        assert [(r.offset, r.value) for r in after] == [
            (500 + i, b"new-%d" % i) for i in range(100)
        ]


@pytest.mark.parametrize("read_on_b", [6, 8])
def test_a_divergence_below_the_log_start_counts_only_what_the_log_still_holds(
    read_on_b: int,
) -> None:
    """Issue 11 (chaos seeds 1072, 1116); the same runs on real Kafka in
    tests/apache_kafka/test_apache_unclean.py. Broker 1 alone writes a0..a7 and retention
    moves its log start to 6; broker 2, empty, is elected uncleanly and the consumer reads
    its records 0..read_on_b-1; then broker 1 is elected uncleanly again. It answers
    (epoch 0, 8) for the epoch the consumer read in, which never existed there: everything
    the consumer read diverged, but only [6, position) is still in a log to be lost."""
    with EmbeddedCluster(brokers=3) as cluster:  # broker 3 answers metadata throughout
        cluster.create_topic("t", 1, 2)
        assert cluster.replicas("t", 0) == [1, 2]
        cluster.stop_broker(2)
        cluster.append("t", 0, [b"a%d" % i for i in range(8)], batch_size=1)
        cluster.delete_records("t", 0, 6)
        assert cluster.epoch_cache("t", 0, 1) == [(0, 6)]
        cluster.stop_broker(1)
        cluster.start_broker(2)
        cluster.elect_leader("t", 0, 2, unclean=True)
        cluster.append("t", 0, [b"b%d" % i for i in range(read_on_b)], batch_size=1)
        reports: list[TruncationReport] = []
        consumer = make_consumer(
            cluster, on_truncation="rewind", on_truncation_report=reports.append
        )
        try:
            consumer.assign([TP0])
            held = {r.offset: r.value for r in read(consumer, read_on_b)}
            assert held == {i: b"b%d" % i for i in range(read_on_b)}
            cluster.stop_broker(2)
            cluster.start_broker(1)
            cluster.elect_leader("t", 0, 1, unclean=True)
            got: list = []
            poll_until(consumer, lambda: any(r.offset == 7 for r in got), sink=got)
            assert [(r.offset, r.value) for r in got] == [(6, b"a6"), (7, b"a7")]
            if read_on_b == 6:
                assert reports == []
            else:
                (report,) = reports
                assert report.divergence == EpochOffset(6, 0)
                assert (report.lost_from, report.lost_to) == (6, 8)
        finally:
            consumer.close()
