"""Positions of partitions given up: kept long enough to report a topic re-created under a
group, then forgotten, so a long-lived member's memory does not grow with every partition
it ever held."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.consumer.left_positions import LeftPositions
from epochguard.offsets.errors import LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.testing import EmbeddedCluster, produce

from ..examples import scaled
from ..kip848_scenarios import member, wait
from ..scenarios.epoch_subjects import LoopDriven, consumer_config

OPS = st.lists(
    st.tuples(
        st.sampled_from(["remember", "get", "expire"]),
        st.integers(0, 7),  # partition
        st.floats(0, 3, allow_nan=False),  # time step
    ),
    max_size=60,
)


@settings(max_examples=scaled(300), deadline=None)
@given(ops=OPS, ttl=st.floats(0.5, 5), cap=st.integers(1, 5))
def test_left_positions_against_a_model(
    ops: list[tuple[str, int, float]], ttl: float, cap: int
) -> None:
    """The model: the last position remembered for a partition is returned while it is
    younger than the ttl and the partition is among the ``cap`` last remembered."""
    left = LeftPositions(ttl, cap)
    now = 0.0
    order: list[int] = []  # partitions by last remember, oldest first
    last: dict[int, tuple[EpochOffset, float]] = {}
    for n, (op, p, step) in enumerate(ops):
        now += step
        tp = TopicPartition("t", p)
        if op == "remember":
            pos = EpochOffset(n + 1, 0, topic_id="id")
            left.remember(tp, pos, now)
            order = [q for q in order if q != p] + [p]
            last[p] = (pos, now)
        elif op == "expire":
            left.expire(now)
        else:
            kept = p in order[-cap:] and now - last[p][1] < ttl
            assert left.get(tp, now) == (last[p][0] if kept else None)
        assert len(left) <= cap


def test_ten_thousand_partitions_handed_in_and_out_keep_memory_flat() -> None:
    """A member that held 10,000 partitions and keeps getting new ones: the positions kept
    stop growing at the bound, and so does the memory they take."""
    left = LeftPositions(ttl_s=600, max_entries=10_000)
    pos = EpochOffset(5, 1, topic_id="id")

    def hand_out(first: int, now: float) -> None:
        for i in range(first, first + 10_000):
            left.remember(TopicPartition(f"t{i // 100}", i % 100), pos, now)

    hand_out(0, 0.0)  # warm-up: the bound reached
    tracemalloc.start()
    try:
        hand_out(0, 1.0)
        base = tracemalloc.get_traced_memory()[0]
        for round_ in range(1, 6):
            hand_out(round_ * 10_000, 1.0 + round_)  # partitions never held before
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(left) == 10_000
    # Each round replaced 10,000 entries with 10,000 others (~1.2 MB of keys and values):
    # what stays is a small fraction of one round.
    assert grown < 400_000, grown
    # And everything goes once the ttl has passed.
    assert left.expire(10_000.0) and len(left) == 0


def test_the_bound_and_ttl_are_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LeftPositions(0, 10)
    with pytest.raises(ValueError, match="positive"):
        LeftPositions(10, 0)


@pytest.mark.parametrize("forgotten", [False, True], ids=["kept", "forgotten"])
def test_a_re_created_topic_is_reported_while_the_old_position_is_kept(
    cluster: EmbeddedCluster, forgotten: bool
) -> None:
    """A topic deleted from under a KIP-848 group and re-created: reported while the member
    keeps where it stood; once that position has expired, the member starts over at its
    reset position with no report (Kafka deleted the group's commits with the topic)."""
    from .test_group_protocol_consumer import fast_coordinator

    fast_coordinator(cluster)
    topic, tp = "leftpos", TopicPartition("leftpos", 0)
    cluster.create_topic(topic, partitions=1)
    produce(cluster, topic, [f"old-{i}" for i in range(5)])
    c = member(cluster, "gleftpos", on_truncation="rewind", allow_auto_create_topics=False)
    if forgotten:
        c._engine._left_positions.ttl_s = 0.2  # what LEFT_POSITIONS_TTL_S does in 10 minutes
    got: list[Any] = []

    def read(n: int) -> bool:
        for recs in c.poll(timeout_ms=50).values():
            got.extend(recs)
        return len(got) >= n

    try:
        c.subscribe([topic])
        wait(lambda: read(5), "the old records")
        c.commit()
        cluster.delete_topic(topic)
        wait(lambda: not read(6) and not c.assignment(), "the deleted topic revoked")
        if forgotten:
            wait(lambda: c._engine._left_positions.get(tp, time.monotonic()) is None, "expiry")
        cluster.create_topic(topic, partitions=1)
        produce(cluster, topic, [f"new-{i}" for i in range(8)])
        got.clear()
        wait(lambda: read(8), "the new records")
        assert [(r.offset, r.value) for r in got] == [(i, b"new-%d" % i) for i in range(8)]
        reports = c.truncation_reports()
        if forgotten:
            assert reports == []
        else:
            [rep] = reports
            assert rep.detected_by is DetectedBy.TOPIC_RECREATED and rep.lost_count == 5
    finally:
        c.close()


def _given_back_topic(
    cluster: EmbeddedCluster, topic: str
) -> tuple[TopicPartition, TopicPartition, int, int]:
    """Two partitions on two replicas, ``a, b, c`` at 0..2 of partition 0: its two
    partitions, and partition 0's leader and follower."""
    cluster.create_topic(topic, partitions=2, replication_factor=2)
    leader = cluster.leader(topic, 0)
    [follower] = [r for r in cluster.replicas(topic, 0) if r != leader]
    produce(cluster, topic, ["a", "b", "c"])
    return TopicPartition(topic, 0), TopicPartition(topic, 1), leader, follower


def _two_members(
    cluster: EmbeddedCluster, driver: str, group_id: str, on_truncation: str
) -> tuple[dict[str, list[Any]], tuple[Any, Any]]:
    """Consumers "a" and "b" of one group reading from the earliest offset, each with the
    list its truncation reports go to."""
    reports: dict[str, list[Any]] = {"a": [], "b": []}

    def make(name: str) -> Any:
        cfg = consumer_config(
            cluster,
            group_id=group_id,
            on_truncation=on_truncation,
            auto_offset_reset="earliest",
            on_truncation_report=reports[name].append,
        )
        return EpochConsumer(**cfg) if driver == "threads" else LoopDriven(**cfg)

    return reports, (make("a"), make("b"))


def _reader(c: Any, got: list[Any]) -> Any:
    """``read(n)``: one poll of ``c`` into ``got``; whether it holds ``n`` records."""

    def read(n: int) -> bool:
        for recs in c.poll(timeout_ms=50).values():
            got.extend(recs)
        return len(got) >= n

    return read


def _replace_the_doomed_record(
    cluster: EmbeddedCluster,
    topic: str,
    leader: int,
    follower: int,
    values: tuple[str, ...] = ("after1", "after2"),
) -> None:
    """The follower (stopped since the doomed record was written) is elected uncleanly and
    takes ``values`` at the doomed record's offset; the old leader comes back."""
    cluster.stop_broker(leader)
    cluster.start_broker(follower)
    cluster.elect_leader(topic, 0, follower, unclean=True)
    produce(cluster, topic, list(values))
    cluster.start_broker(leader)


def _group_commit_past_lost_records(
    cluster: EmbeddedCluster, topic: str, committer: Any, values: tuple[str, ...]
) -> tuple[TopicPartition, TopicPartition]:
    """``a, b, c, d1, d2`` at 0..4 of partition 0 (d1, d2 on its leader alone), the group's
    commit (5, e0) made by ``committer``, then an unclean election that replaces d1, d2
    with ``values``: the topic's two partitions."""
    tp, other, leader, follower = _given_back_topic(cluster, topic)
    cluster.stop_broker(follower)
    produce(cluster, topic, ["d1", "d2"])
    committer.commit({tp: EpochOffset(5, 0, topic_id=cluster.topic_id(topic))})
    _replace_the_doomed_record(cluster, topic, leader, follower, values)
    return tp, other


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_partition_given_back_reports_a_truncation_of_what_the_failed_commit_left_out(
    cluster: EmbeddedCluster, driver: str
) -> None:
    """A consumer reads 0..2, commits 3, reads the doomed record 3, and has not committed 4
    when the partition is taken away (a rebalance, here an assign() without it) and given
    back. Meanwhile an unclean election replaced offset 3. The committed position (3, e0) is
    valid on the new leader, so restoring it alone would deliver the new offset 3 with the
    doomed one unreported: the consumer validates where it had read to first."""
    topic = "givenback"
    tp, other, leader, follower = _given_back_topic(cluster, topic)
    cfg = consumer_config(
        cluster, group_id="ggivenback", on_truncation="raise", auto_offset_reset="earliest"
    )
    c: Any = EpochConsumer(**cfg) if driver == "threads" else LoopDriven(**cfg)
    got: list[Any] = []
    read = _reader(c, got)
    try:
        c.assign([tp, other])
        wait(lambda: read(3), "a, b, c")
        c.commit()
        cluster.stop_broker(follower)
        produce(cluster, topic, ["doomed"])
        wait(lambda: read(4), "the doomed record")
        assert c.position(tp) == 4
        c.assign([other])
        _replace_the_doomed_record(cluster, topic, leader, follower)
        c.assign([tp, other])
        with pytest.raises(LogTruncationError) as caught:
            wait(lambda: read(len(got) + 1), "the truncation reported")
        [report] = caught.value.truncations.values()
        assert (report.consumed_to.offset, report.consumed_to.leader_epoch) == (4, 0)
        assert (report.lost_from, report.lost_to) == (3, 4)
        assert report.position_source == "left_position"
        assert [r.value for r in got] == [b"a", b"b", b"c", b"doomed"]
        # The application resumes at the divergence and reads the new log.
        c.seek(tp, report.divergence)
        wait(lambda: read(6), "the new records")
        assert [r.value for r in got[4:]] == [b"after1", b"after2"]
    finally:
        c.close()


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_partition_given_back_after_another_member_read_past_a_truncation_starts_at_its_commit(
    cluster: EmbeddedCluster, driver: str
) -> None:
    """Consumer A reads a, b, c and the doomed d (0..3, epoch 0), commits 4 and gives the
    partition up. An unclean election replaces d; B takes the partition over, reports the
    truncation, reads the new log (after1, after2 at 3, 4) and commits 5 with the new
    leader's epoch. Given the partition back, A reports the d it had read, then starts at
    B's commit: rewound to the divergence it read again the two records the group had
    committed (chaos seed 291, AIOEpochConsumer)."""
    topic = "handedback"
    tp, other, leader, follower = _given_back_topic(cluster, topic)
    reports, (a, b) = _two_members(cluster, driver, "ghandedback", "rewind")
    got_a: list[Any] = []
    got_b: list[Any] = []
    try:
        read_a, read_b = _reader(a, got_a), _reader(b, got_b)
        a.assign([tp, other])
        wait(lambda: read_a(3), "a, b, c")
        cluster.stop_broker(follower)
        produce(cluster, topic, ["doomed"])
        wait(lambda: read_a(4), "the doomed record")
        a.commit()
        a.assign([other])
        _replace_the_doomed_record(cluster, topic, leader, follower)
        b.assign([tp])
        wait(lambda: read_b(2), "the new log, by B")
        assert [(r.offset, r.value) for r in got_b] == [(3, b"after1"), (4, b"after2")]
        assert [(r.lost_from, r.lost_to) for r in reports["b"]] == [(3, 4)]
        b.commit()
        committed = b.committed_with_epoch(tp)
        assert committed.offset == 5 and committed.leader_epoch > 0  # the new leader's
        b.assign([other])
        a.assign([tp, other])
        produce(cluster, topic, ["later"])
        wait(lambda: read_a(5), "the record after B's commit")
        assert [(r.offset, r.value) for r in got_a[4:]] == [(5, b"later")]
        [report] = reports["a"]
        assert (report.consumed_to.offset, report.consumed_to.leader_epoch) == (4, 0)
        assert (report.lost_from, report.lost_to, report.position_source) == (3, 4, "left_position")
        assert a.position(tp) == 6
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_partition_given_back_under_a_late_commit_of_an_older_epoch_is_not_reported_again(
    cluster: EmbeddedCluster, driver: str
) -> None:
    """A reads a, b, c, d1, d2 (0..4, epoch 0); an unclean election replaces d1, d2. A
    reports them, reads after1, after2 at 3, 4 and commits (5, e1). Then a commit of
    (5, e0) lands, as a request A had given up on after a timeout can, delayed on the way
    (chaos seed 100902). Given the partition back, A validates where it had read, (5, e1),
    and starts there: validating (5, e0) again reported d1, d2 a second time and read
    after1, after2 again."""
    topic = "latecommit"
    cluster.create_topic(topic, partitions=2, replication_factor=2)
    tp, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    leader = cluster.leader(topic, 0)
    [follower] = [r for r in cluster.replicas(topic, 0) if r != leader]
    produce(cluster, topic, ["a", "b", "c"])
    reports, (a, late) = _two_members(cluster, driver, "glatecommit", "rewind")
    got: list[Any] = []
    try:
        read = _reader(a, got)
        a.assign([tp, other])
        wait(lambda: read(3), "a, b, c")
        cluster.stop_broker(follower)
        produce(cluster, topic, ["d1", "d2"])
        wait(lambda: read(5), "d1, d2")
        cluster.stop_broker(leader)
        cluster.start_broker(follower)
        cluster.elect_leader(topic, 0, follower, unclean=True)
        produce(cluster, topic, ["after1", "after2"])
        cluster.start_broker(leader)
        wait(lambda: read(7), "the new log")
        assert [(r.offset, r.value) for r in got[5:]] == [(3, b"after1"), (4, b"after2")]
        [first] = reports["a"]
        assert (first.consumed_to, first.lost_from, first.lost_to) == (EpochOffset(5, 0), 3, 5)
        a.commit()
        ours = a.committed_with_epoch(tp)
        assert ours is not None and ours.offset == 5 and (ours.leader_epoch or 0) > 0
        # The late request is A's own earlier commit, with what A's commits carry.
        late.commit({tp: EpochOffset(5, 0, topic_id=ours.topic_id)})
        assert a.committed_with_epoch(tp) == EpochOffset(5, 0)
        a.assign([other])
        a.assign([tp, other])
        produce(cluster, topic, ["later"])
        wait(lambda: read(8), "the record after the commit")
        assert [(r.offset, r.value) for r in got[7:]] == [(5, b"later")]
        assert reports["a"] == [first]
        assert a.position(tp) == 6
    finally:
        a.close()
        late.close()


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_partition_given_back_under_the_commit_it_reported_truncated_is_not_reported_again(
    cluster: EmbeddedCluster, driver: str
) -> None:
    """The group's commit is (5, e0), past a, b, c, d1, d2; an unclean election replaces
    d1, d2 with after1. A restores the commit, reports d1, d2, rewinds and reads after1
    (position (4, e1)), and loses the partition before a commit of that. Given it back
    under the same group commit, A validates where it had read and starts there: validating
    (5, e0) again reported d1, d2 a second time (chaos seed 100133, network faults)."""
    topic = "reportedcommit"
    reports, (a, previous) = _two_members(cluster, driver, "greportedcommit", "rewind")
    got: list[Any] = []
    try:
        tp, other = _group_commit_past_lost_records(cluster, topic, previous, ("after1",))
        read = _reader(a, got)
        a.assign([tp, other])
        wait(lambda: read(1), "after1")
        assert [(r.offset, r.value) for r in got] == [(3, b"after1")]
        [first] = reports["a"]
        assert (first.consumed_to, first.lost_from, first.lost_to) == (EpochOffset(5, 0), 3, 5)
        assert a.committed_with_epoch(tp) == EpochOffset(5, 0)
        a.assign([other])
        a.assign([tp, other])
        produce(cluster, topic, ["later"])
        wait(lambda: read(2), "the record after after1")
        assert [(r.offset, r.value) for r in got[1:]] == [(4, b"later")]
        assert reports["a"] == [first]
        assert a.position(tp) == 5
    finally:
        a.close()
        previous.close()


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_partition_stopped_at_its_report_and_given_back_starts_at_the_next_owners_commit(
    cluster: EmbeddedCluster, driver: str
) -> None:
    """The group's commit is (5, e0), past a, b, c, d1, d2; an unclean election replaces
    d1, d2 with after1, after2. Under policy raise A restores the commit, reports d1, d2
    and stops, and loses the partition before the application seeks. B is told the same,
    seeks, reads after1, after2 and commits past them. Given the partition back, A has read
    nothing since its report: it starts from B's commit, and reports nothing again (chaos
    seed 201453, AIOEpochConsumer)."""
    topic = "stoppedreport"
    reports, (a, b) = _two_members(cluster, driver, "gstoppedreport", "raise")
    got_a: list[Any] = []
    got_b: list[Any] = []
    try:
        tp, other = _group_commit_past_lost_records(cluster, topic, b, ("after1", "after2"))
        read_a, read_b = _reader(a, got_a), _reader(b, got_b)
        a.assign([tp, other])
        with pytest.raises(LogTruncationError):
            wait(lambda: read_a(1), "A's report")
        [first] = reports["a"]
        assert (first.consumed_to, first.lost_from, first.lost_to) == (EpochOffset(5, 0), 3, 5)
        a.assign([other])
        b.assign([tp])
        with pytest.raises(LogTruncationError) as caught:
            wait(lambda: read_b(1), "B's report")
        b.seek(tp, caught.value.truncation_offsets()[tp])
        wait(lambda: read_b(2), "after1, after2, by B")
        assert [(r.offset, r.value) for r in got_b] == [(3, b"after1"), (4, b"after2")]
        b.commit()
        b.assign([other])
        a.assign([tp, other])
        produce(cluster, topic, ["later"])
        wait(lambda: read_a(1), "the record after B's commit")
        assert [(r.offset, r.value) for r in got_a] == [(5, b"later")]
        assert reports["a"] == [first]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_partition_given_back_below_the_next_owners_commit_reports_up_to_that_commit(
    cluster: EmbeddedCluster, driver: str
) -> None:
    """Consumer A reads a, b, c (0..2, epoch 0; the follower holds only a), commits 3 and
    gives the partition up. B takes it over, reads d, e (3, 4, still epoch 0) and commits 5.
    An unclean election keeps only a. Given the partition back, A must report everything
    the group delivered past the divergence, b..e, up to B's commit: it reported only what
    it had read itself (b, c), and d, e were lost unreported (chaos seed 72080)."""
    topic = "belowcommit"
    cluster.create_topic(topic, partitions=2, replication_factor=2)
    tp, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    leader = cluster.leader(topic, 0)
    [follower] = [r for r in cluster.replicas(topic, 0) if r != leader]
    produce(cluster, topic, ["a"])
    cluster.stop_broker(follower)
    produce(cluster, topic, ["b", "c"])

    def make() -> Any:
        cfg = consumer_config(
            cluster, group_id="gbelowcommit", on_truncation="raise", auto_offset_reset="earliest"
        )
        return EpochConsumer(**cfg) if driver == "threads" else LoopDriven(**cfg)

    a, b = make(), make()
    got_a: list[Any] = []
    got_b: list[Any] = []
    try:
        read_a, read_b = _reader(a, got_a), _reader(b, got_b)
        a.assign([tp, other])
        wait(lambda: read_a(3), "a, b, c")
        a.commit()
        a.assign([other])
        produce(cluster, topic, ["d", "e"])
        b.assign([tp])
        wait(lambda: read_b(2), "d, e, by B")
        assert [(r.offset, r.value) for r in got_b] == [(3, b"d"), (4, b"e")]
        b.commit()
        assert b.committed_with_epoch(tp) == EpochOffset(5, 0)
        b.assign([other])
        cluster.stop_broker(leader)
        cluster.start_broker(follower)
        cluster.elect_leader(topic, 0, follower, unclean=True)
        produce(cluster, topic, ["after1", "after2"])
        cluster.start_broker(leader)
        a.assign([tp, other])
        with pytest.raises(LogTruncationError) as caught:
            wait(lambda: read_a(len(got_a) + 1), "the truncation reported")
        [report] = caught.value.truncations.values()
        assert (report.consumed_to.offset, report.consumed_to.leader_epoch) == (5, 0)
        assert (report.lost_from, report.lost_to) == (1, 5)
        # The application resumes at the divergence and reads the new log.
        a.seek(tp, report.divergence)
        wait(lambda: read_a(5), "the new records")
        assert [r.value for r in got_a[3:]] == [b"after1", b"after2"]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_partition_given_back_stopped_by_raise_reports_the_next_owners_lost_commit_too(
    cluster: EmbeddedCluster, driver: str
) -> None:
    """Consumer A reads a, b, c (0..2, epoch 0; two followers hold only a) and gives the
    partition up. An unclean election keeps a; B takes the partition over, reads d, e in the
    new epoch (1, 2), commits 3 and gives it up. A second unclean election keeps only a
    again. Given the partition back, A finds b, c gone; stopped with that report alone, it
    would not name B's d, e (read in a later epoch than it says), and nobody would validate
    B's commit once the application seeks and commits the divergence: d, e were lost
    unreported (chaos seed 72072, AIOEpochConsumer). Both reports come before the error,
    which names B's commit."""
    topic = "twoelections"
    cluster.create_topic(topic, partitions=2, replication_factor=3)
    tp, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    leader = cluster.leader(topic, 0)
    first, second = [r for r in cluster.replicas(topic, 0) if r != leader]
    produce(cluster, topic, ["a"])
    cluster.stop_broker(first)
    cluster.stop_broker(second)
    produce(cluster, topic, ["b", "c"])
    reports, (a, b) = _two_members(cluster, driver, "gtwoelections", "raise")
    got_a: list[Any] = []
    got_b: list[Any] = []
    try:
        read_a, read_b = _reader(a, got_a), _reader(b, got_b)
        a.assign([tp, other])
        wait(lambda: read_a(3), "a, b, c")
        a.commit()
        a.assign([other])
        cluster.stop_broker(leader)
        cluster.start_broker(first)
        cluster.elect_leader(topic, 0, first, unclean=True)
        produce(cluster, topic, ["d", "e"])
        b.assign([tp])
        with pytest.raises(LogTruncationError) as caught:
            wait(lambda: read_b(1), "A's truncation reported by B")
        assert [(r.lost_from, r.lost_to) for r in reports["b"]] == [(1, 3)]
        b.seek(tp, caught.value.truncation_offsets()[tp])
        wait(lambda: read_b(2), "d, e, by B")
        assert [(r.offset, r.value) for r in got_b] == [(1, b"d"), (2, b"e")]
        b.commit()
        committed = b.committed_with_epoch(tp)
        assert committed.offset == 3 and committed.leader_epoch > 0
        b.assign([other])
        cluster.stop_broker(first)
        cluster.start_broker(second)
        cluster.elect_leader(topic, 0, second, unclean=True)
        produce(cluster, topic, ["f", "g"])
        cluster.start_broker(leader)
        cluster.start_broker(first)
        a.assign([tp, other])
        with pytest.raises(LogTruncationError) as caught:
            wait(lambda: read_a(len(got_a) + 1), "the truncation reported")
        assert [r.value for r in got_a] == [b"a", b"b", b"c"]
        mine, theirs = reports["a"]
        assert (mine.consumed_to.offset, mine.consumed_to.leader_epoch) == (3, 0)
        assert (mine.lost_from, mine.lost_to, mine.position_source) == (1, 3, "left_position")
        # B's commit carries its epoch exactly: a leader without that epoch cannot say where
        # B's reads in it began, so the divergence is unknown.
        assert theirs.consumed_to == EpochOffset(3, committed.leader_epoch)
        assert (theirs.divergence, theirs.lost_to, theirs.position_source) == (None, 3, "committed")
        [report] = caught.value.truncations.values()
        assert report == theirs
        # The application resumes at the log start, as the error says, and reads the new log.
        a.seek_to_beginning(tp)
        wait(lambda: read_a(6), "the new log")
        assert [(r.offset, r.value) for r in got_a[3:]] == [(0, b"a"), (1, b"f"), (2, b"g")]
    finally:
        a.close()
        b.close()
