"""EpochConsumer in the scenario suite, asserted exactly, on the EmbeddedCluster and real Kafka.

Every policy watches every scenario side by side: one staged unclean election per cluster is
observed by 30 consumers (5 policies x mid-stream below/past/buffered, caught up below/past,
restarted from a committed offset), because staging it on real Kafka costs seconds.

The unclean election (RF=2 on brokers A and B, min.insync.replicas=1, acks=1):
a0..a4 replicated (offsets 0..4, epoch 0) -> stop B -> d0..d4 on A alone (5..9) -> stop A ->
start B -> unclean election of B (epoch 2: 1 was the leaderless epoch) -> b0, b1 (5, 6) ->
the "below" consumers poll -> b2..b7 (7..12) -> the "past" and restarted consumers poll ->
start A (it truncates to 5 and copies b0..b7).

Consumers, by position when the election happens (all read epoch 0):
* mid-below: position 9 with d4 (9) not fetched: lagging; B's log (7) ends below it.
* mid-buffered: position 7 like mid-past, but d2..d4 (7..9) already fetched and buffered:
  they may be handed out after the election, before anything reveals it; if so they were
  consumed like any other record and count as lost (the report's consumed_to moves on).
* caught-up-below: position 10, idle at the log end; B's log (7) ends below it.
* mid-past: position 7, lagging; B's log is refilled to 13, past it: offsets 7..12 exist
  again, holding b2..b7 (the dangerous case: a bare offset looks valid).
* caught-up-past: position 10, idle; B refilled to 13.
* restart: committed (10, epoch 0) and closed before the election; a new consumer of the
  same group restores it after B was refilled to 13.

Whatever the policy, each must report exactly one truncation: divergence (5, epoch 0),
consumed_to (position, epoch 0), lost = position - 5. Rewinding policies then deliver
b0..b7 exactly once; raising ones raise once, deliver nothing until the application seeks to
the divergence point, then deliver b0..b7 exactly once. No d record after the detection.

On a Raft-term cluster (``embedded-raft``) there is no unclean election: the same records are
lost the Raft way (RF=3, a0..a4 on disk everywhere, the third replica lagging while d0..d4 are
visible on the other two, then a power cut of those two). Terms start at 1 and the new leader's
skips the term of the failed election in between; every other expectation is the same.
Every scenario takes the first epoch from the cluster (0 on Kafka, 1 on Raft terms).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka import KafkaProducer
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer, LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.testing import Cluster, EmbeddedCluster, recreate_topic

from .conftest import CLUSTERS_AND_DRIVERS, scenario_cluster
from .epoch_subjects import (
    POLICIES,
    StagedRun,
    Subject,
    consumer_config,
    drive,
    records,
    settle_quietly,
    staged,
    write_results,
)
from .observe import Observer
from .test_unclean_truncation import eventually, is_raft, kind, produce

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Kafka's epochs: the first leader's, and the unclean election's (1 was leaderless).
E0, UNCLEAN = 0, 2
A_VALUES = [f"a{i}" for i in range(5)]
D_VALUES = [f"d{i}" for i in range(5)]
B_VALUES = [f"b{i}" for i in range(8)]
#: Idle consumers poll this long at the log end before the election (empty fetches).
IDLE = 1.0
#: Long enough for a consumer's last long-poll fetch (fetch_max_wait_ms=100) to come back
#: empty, so records written afterwards are not already buffered in it.
SETTLE = 0.4

#: situation -> (position at the election, B's log end when it first polls after it)
UNCLEAN_SITUATIONS = {
    "mid-below": (9, 7),
    "caught-up-below": (10, 7),
    "mid-past": (7, 13),
    "mid-buffered": (7, 13),
    "caught-up-past": (10, 13),
    "restart": (10, 13),
}
LIVE_DETECTORS = {
    DetectedBy.METADATA,
    DetectedBy.FENCED,
    DetectedBy.DIVERGING_EPOCH,
    DetectedBy.OFFSET_OUT_OF_RANGE,
}


@pytest.fixture(scope="module", params=CLUSTERS_AND_DRIVERS)
def module_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """This module's scenarios also run with AIOEpochConsumer subjects."""
    with scenario_cluster(request.param, request) as cluster:
        yield cluster


def _rebuild(cluster: Cluster) -> None:
    for broker in cluster.broker_ids:
        if not cluster.is_running(broker):
            cluster.start_broker(broker)


def _done_after(expected_after: int) -> Any:
    def done(s: Subject) -> bool:
        told = bool(s.reports) and (not s.raising or bool(s.seeks))
        after = len(s.delivered) - (s.detected_at or 0)
        return told and after >= expected_after

    return done


class UncleanRun(StagedRun):
    """The staged unclean election and every subject that watched it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kind = kind(cluster)
        self.topic = f"eg-unclean-{os.getpid()}-{self.kind}"
        self.tp = TopicPartition(self.topic, 0)
        self.subjects: dict[tuple[str, str], Subject] = {}
        self.committed: dict[str, EpochOffset | None] = {}
        self.first_delivered: dict[str, list[Any]] = {}
        self.new_committed: dict[str, EpochOffset | None] = {}
        self.timings: dict[str, float] = {}
        self.e0 = -1
        self.epoch_after = -1
        self.raft = is_raft(cluster)

    def _group(self, situation: str) -> list[Subject]:
        return [s for (sit, _p), s in self.subjects.items() if sit == situation]

    def _add(self, situation: str, **kw: Any) -> list[Subject]:
        for policy in POLICIES:
            self.subjects[(situation, policy)] = Subject(
                self.cluster, self.tp, policy, situation, **kw
            )
        return self._group(situation)

    def run(self) -> None:
        cluster, topic = self.cluster, self.topic
        t0 = time.monotonic()
        rf = 3 if self.raft else 2
        cluster.create_topic(topic, replication_factor=rf, config={"min.insync.replicas": "1"})
        a = eventually("a leader", lambda: cluster.leader(topic, 0))
        self.e0 = cluster.leader_epoch(topic, 0)
        b, *lagging = [r for r in cluster.replicas(topic, 0) if r != a]
        produce(cluster, topic, A_VALUES)
        eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == 5)
        eventually("ISR [A, B]", lambda: {a, b} <= set(cluster.isr(topic, 0)))
        if self.raft:
            assert isinstance(cluster, EmbeddedCluster)
            cluster.flush(topic)  # a0..a4 on disk everywhere
            cluster.pause_replication(lagging[0])  # it will not get d0..d4
            eventually("ISR [A, B]", lambda: sorted(cluster.isr(topic, 0)) == sorted([a, b]))
        else:
            cluster.stop_broker(b)
            eventually("ISR [A]", lambda: cluster.isr(topic, 0) == [a])

        # d0, d1: the mid-past consumers read up to 7 and stop there, lagging once d2.. land.
        produce(cluster, topic, D_VALUES[:2])
        for s in self._add("mid-past"):
            s.read(7)
        time.sleep(SETTLE)
        produce(cluster, topic, D_VALUES[2:4])
        for s in self._add("mid-below"):
            s.read(9)
        time.sleep(SETTLE)
        produce(cluster, topic, D_VALUES[4:])
        for s in self._add("mid-buffered"):
            s.read(7)
        idle = self._add("caught-up-below") + self._add("caught-up-past")
        for s in idle:
            s.read(10)
        deadline = time.monotonic() + IDLE
        while time.monotonic() < deadline:
            for s in idle:
                s.poll(timeout_ms=20)
        for s in idle:
            assert s.consumer.position_with_epoch(self.tp) == EpochOffset(10, self.e0), s.name
        # The restarted group: read everything, commit (with the epoch), close.
        for policy in POLICIES:
            first = Subject(
                cluster, self.tp, policy, "restart-first", group_id=f"g-{topic}-{policy}"
            )
            try:
                first.read(10)
                first.consumer.commit()
                self.first_delivered[policy] = first.delivered
                self.committed[policy] = first.consumer.committed_with_epoch(self.tp)
            finally:
                first.close()
        self.timings["setup"] = time.monotonic() - t0

        t1 = time.monotonic()
        if self.raft:
            assert isinstance(cluster, EmbeddedCluster)
            # The majority that held d0..d4 loses power (the follower first: the leader
            # stays, so no new term's flush saves them); the lagging replica is back and
            # elects with B, whose log ends at 5 as its own.
            cluster.stop_broker(b)
            cluster.stop_broker(a)
            eventually("no leader", lambda: cluster.leader(topic, 0) is None)
            cluster.resume_replication(lagging[0])
            cluster.start_broker(b)
            eventually("a new leader", lambda: cluster.leader(topic, 0) is not None)
            expected = cluster.leader_epoch(topic, 0)
        else:
            cluster.stop_broker(a)
            eventually("no leader", lambda: cluster.leader(topic, 0) is None)
            cluster.start_broker(b)
            cluster.elect_leader(topic, 0, b, unclean=True)
            expected = UNCLEAN
        obs = Observer(cluster)
        eventually("metadata shows B", lambda: obs.leader_and_epoch(topic, 0)[1] == expected)
        self.epoch_after = cluster.leader_epoch(topic, 0)
        self.timings["election"] = time.monotonic() - t1

        t2 = time.monotonic()
        for s in self.subjects.values():
            s.set_phase("after")
        produce(cluster, topic, B_VALUES[:2])
        below = self._group("mid-below") + self._group("caught-up-below")
        # Detection (and for raising policies the seek) with B's log ending at 7.
        drive(below, lambda s: bool(s.reports) and (not s.raising or bool(s.seeks)))
        produce(cluster, topic, B_VALUES[2:])
        for policy in POLICIES:
            self.subjects[("restart", policy)] = Subject(
                cluster, self.tp, policy, "restart", group_id=f"g-{topic}-{policy}", start=None
            )
            self.subjects[("restart", policy)].set_phase("after")
        drive(self.subjects.values(), _done_after(len(B_VALUES)))
        settle_quietly(self.subjects.values())
        for policy in POLICIES:
            restarted = self.subjects[("restart", policy)]
            restarted.consumer.commit()
            self.new_committed[policy] = restarted.consumer.committed_with_epoch(self.tp)
        self.timings["detection_and_reads"] = time.monotonic() - t2

        t3 = time.monotonic()
        cluster.start_broker(a)
        eventually("A truncated and refilled", lambda: cluster.log_end_offset(topic, 0, a) == 13)
        self.timings["old_leader_returns"] = time.monotonic() - t3

    def close(self) -> None:
        super().close()
        _rebuild(self.cluster)

    def results(self) -> None:
        for situation, (position, leo) in UNCLEAN_SITUATIONS.items():
            subjects = [s for (sit, _p), s in self.subjects.items() if sit == situation]
            write_results(
                SCENARIO_NAMES[situation],
                self.kind,
                subjects,
                {
                    "position_at_election": position,
                    "new_leader_log_end_at_first_poll": leo,
                    "timings": self.timings,
                },
            )


SCENARIO_NAMES = {
    "mid-below": "refill-below-position",
    "mid-past": "refill-past-position",
    "mid-buffered": "refill-past-position-records-buffered",
    "caught-up-below": "caught-up-clients-refill-below-position",
    "caught-up-past": "caught-up-clients-refill-past-position",
    "restart": "unclean-while-stopped-restart-from-committed",
}


@pytest.fixture(scope="module")
def unclean(module_cluster: Cluster) -> Iterator[UncleanRun]:
    yield from staged(UncleanRun(module_cluster))


def expect_truncation(
    run: UncleanRun,
    s: Subject,
    position: int,
    detectors: set[DetectedBy],
    restarted: bool = False,
) -> None:
    """The exact outcome of one subject watching the unclean election (``restarted``: the
    records before it were read by the consumer whose commit it restored)."""
    e0 = run.e0
    before = records(A_VALUES, 0, e0) + records(D_VALUES[: position - 5], 5, e0)
    if restarted:
        before = []
    after = records(B_VALUES, 5, run.epoch_after)
    [rep] = s.reports
    assert rep.tp == s.tp
    assert rep.divergence == EpochOffset(5, e0), rep
    assert rep.consumed_to == EpochOffset(position, e0), rep
    assert (rep.lost_from, rep.lost_to, rep.lost_count) == (5, position, position - 5)
    assert rep.new_leader_epoch == run.epoch_after
    assert rep.detected_by in detectors, rep
    # Exactly what the application received: the old records up to its position, then the
    # new leader's from the divergence point, once. Nothing of d0..d4 after the detection.
    assert s.detected_at == len(before)
    assert s.delivered == before + after, s.delivered
    m = s.consumer.metrics(raw=True)
    assert (m["truncations_detected"], m["records_lost"]) == (1, position - 5)
    if s.policy == "callable":
        assert s.handler_reports == [rep]
    if s.raising:
        [err] = s.errors
        assert isinstance(err, LogTruncationError)
        assert err.truncations == {s.tp: rep}
        assert err.truncation_offsets() == {s.tp: EpochOffset(5, e0)}
        # Stopped until the seek: polls delivered nothing and position() raised.
        assert s.stopped_deliveries == 0
        assert s.position_error_while_stopped == "LogTruncationError"
        assert s.seeks == [EpochOffset(5, e0)]
    else:
        assert s.errors == [] and s.seeks == []


def expect_epochs(run: UncleanRun) -> None:
    if run.raft:
        # Terms start at 1, and the failed election while no majority ran took one: the
        # new leader's term skips it.
        assert run.e0 == 1 and run.epoch_after >= run.e0 + 2
    else:
        assert (run.e0, run.epoch_after) == (E0, UNCLEAN)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("situation", ["mid-below", "mid-past"])
def test_unclean_election_mid_stream(unclean: UncleanRun, situation: str, policy: str) -> None:
    expect_epochs(unclean)
    position, _leo = UNCLEAN_SITUATIONS[situation]
    expect_truncation(unclean, unclean.subjects[(situation, policy)], position, LIVE_DETECTORS)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_unclean_election_mid_stream_with_buffered_records(
    unclean: UncleanRun, policy: str
) -> None:
    s = unclean.subjects[("mid-buffered", policy)]
    # The application was given 7 records before the election; any of d2..d4 handed out
    # after it came before the detection (they were fetched from the then leader), so the
    # report covers them, and nothing of them follows it.
    assert s.detected_at is not None and 7 <= s.detected_at <= 10
    expect_truncation(unclean, s, s.detected_at, LIVE_DETECTORS)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("situation", ["caught-up-below", "caught-up-past"])
def test_unclean_election_caught_up_idle(unclean: UncleanRun, situation: str, policy: str) -> None:
    position, _leo = UNCLEAN_SITUATIONS[situation]
    expect_truncation(unclean, unclean.subjects[(situation, policy)], position, LIVE_DETECTORS)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_unclean_election_while_stopped_restart_from_committed(
    unclean: UncleanRun, policy: str
) -> None:
    e0 = unclean.e0
    # The group commit carried the epoch of the last record read...
    assert unclean.committed[policy] == EpochOffset(10, e0)
    s = unclean.subjects[("restart", policy)]
    # ...so the restarted consumer validated it before its first fetch: nothing of the new
    # leader's log at 10..12 (b5..b7) was read as if it followed d4.
    assert unclean.first_delivered[policy] == records(A_VALUES + D_VALUES, 0, e0)
    expect_truncation(unclean, s, 10, {DetectedBy.RESTORE}, restarted=True)
    assert s.reports[0].position_source == "committed"
    # And its own commit carries the new leader's epoch.
    assert unclean.new_committed[policy] == EpochOffset(13, unclean.epoch_after)


# ----------------------------------------------------------------------- clean leader change


class CleanRun(StagedRun):
    """A clean (preferred) leader change: every record stays; nothing may be reported.

    x0..x4 replicated on A and B (epoch 0); lagging consumers have read x0..x2, caught-up ones
    x0..x4 and sat idle, a third group committed (5, epoch 0) and closed; B becomes leader
    cleanly (epoch bump) and gets y0..y4 (5..9).
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kind = kind(cluster)
        self.topic = f"eg-clean-{os.getpid()}-{self.kind}"
        self.tp = TopicPartition(self.topic, 0)
        self.subjects: dict[tuple[str, str], Subject] = {}
        self.e0 = -1
        self.new_epoch = -1
        self.committed: dict[str, EpochOffset | None] = {}

    def run(self) -> None:
        cluster, topic, tp = self.cluster, self.topic, self.tp
        cluster.create_topic(topic, replication_factor=2, config={"min.insync.replicas": "1"})
        a = eventually("a leader", lambda: cluster.leader(topic, 0))
        self.e0 = cluster.leader_epoch(topic, 0)
        (b,) = [r for r in cluster.replicas(topic, 0) if r != a]
        produce(cluster, topic, X_VALUES[:3])
        for policy in POLICIES:
            self.subjects[("mid", policy)] = s = Subject(cluster, tp, policy, "clean-mid")
            s.read(3)
        time.sleep(SETTLE)
        produce(cluster, topic, X_VALUES[3:])
        idle = [Subject(cluster, tp, policy, "clean-caught-up") for policy in POLICIES]
        for s in idle:
            self.subjects[("caught-up", s.policy)] = s
            s.read(5)
        for policy in POLICIES:
            first = Subject(
                cluster, tp, policy, "clean-restart-first", group_id=f"g-{topic}-{policy}"
            )
            try:
                first.read(5)
                first.consumer.commit()
            finally:
                first.close()
        deadline = time.monotonic() + IDLE
        while time.monotonic() < deadline:
            for s in idle:
                s.poll(timeout_ms=20)
        eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == 5)
        eventually("ISR [A, B]", lambda: sorted(cluster.isr(topic, 0)) == sorted([a, b]))

        cluster.elect_leader(topic, 0, b)
        obs = Observer(cluster)
        eventually("metadata shows B", lambda: obs.leader_and_epoch(topic, 0)[1] > self.e0)
        self.new_epoch = cluster.leader_epoch(topic, 0)
        for s in self.subjects.values():
            s.set_phase("after")
        produce(cluster, topic, Y_VALUES)
        for policy in POLICIES:
            s = Subject(
                cluster, tp, policy, "clean-restart", group_id=f"g-{topic}-{policy}", start=None
            )
            s.set_phase("after")
            self.subjects[("restart", policy)] = s
        want = {"mid": 10, "caught-up": 10, "restart": 5}
        drive(self.subjects.values(), lambda s: len(s.delivered) >= want[s.label[6:]])
        settle_quietly(self.subjects.values())
        for policy in POLICIES:
            restarted = self.subjects[("restart", policy)].consumer
            restarted.commit()
            self.committed[policy] = restarted.committed_with_epoch(tp)

    def results(self) -> None:
        write_results(
            "clean-leader-change",
            self.kind,
            self.subjects.values(),
            {"new_leader_epoch": self.new_epoch},
        )


X_VALUES = [f"x{i}" for i in range(5)]
Y_VALUES = [f"y{i}" for i in range(5)]


@pytest.fixture(scope="module")
def clean(module_cluster: Cluster) -> Iterator[CleanRun]:
    yield from staged(CleanRun(module_cluster))


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("situation", ["mid", "caught-up", "restart"])
def test_clean_leader_change_loses_and_repeats_nothing(
    clean: CleanRun, situation: str, policy: str
) -> None:
    epoch, e0 = clean.new_epoch, clean.e0
    assert epoch > e0 and epoch == clean.cluster.leader_epoch(clean.topic, 0)
    s = clean.subjects[(situation, policy)]
    expected = records(X_VALUES, 0, e0) + records(Y_VALUES, 5, epoch)
    if situation == "restart":
        expected = expected[5:]
        assert clean.committed[policy] == EpochOffset(10, epoch)
    assert s.delivered == expected
    assert s.reports == [] and s.errors == [] and s.handler_reports == []
    m = s.consumer.metrics(raw=True)
    assert (m["truncations_detected"], m["records_lost"]) == (0, 0)
    assert s.consumer.position_with_epoch(s.tp) == EpochOffset(10, epoch)


# --------------------------------------------------------------------------------- retention


R_VALUES = [f"r{i}" for i in range(11)]
LOG_START = 6


class RetentionRun(StagedRun):
    """Retention (DeleteRecords) moves the log start past lagging consumers' position 3.

    r0..r2 read (epoch 0), then r3..r9 written, log start moved to 6, r10 written. Not a
    truncation: nothing they read is gone from what the log says happened. Only
    ``auto_offset_reset`` applies: earliest moves to the new log start silently, "none"
    stops the partition with an out-of-range error until the application seeks.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kind = kind(cluster)
        self.topic = f"eg-retention-{os.getpid()}-{self.kind}"
        self.tp = TopicPartition(self.topic, 0)
        self.subjects: dict[str, Subject] = {}
        self.e0 = -1

    def run(self) -> None:
        cluster, topic, tp = self.cluster, self.topic, self.tp
        cluster.create_topic(topic, replication_factor=2)
        eventually("a leader", lambda: cluster.leader(topic, 0))
        self.e0 = cluster.leader_epoch(topic, 0)
        produce(cluster, topic, R_VALUES[:3])
        for policy in POLICIES:
            self.subjects[policy] = s = Subject(cluster, tp, policy, "retention")
            s.read(3)
        time.sleep(SETTLE)
        produce(cluster, topic, R_VALUES[3:10])
        cluster.delete_records(topic, 0, LOG_START)
        produce(cluster, topic, R_VALUES[10:])
        for s in self.subjects.values():
            s.set_phase("after")
        drive(self.subjects.values(), lambda s: len(s.delivered) >= 3 + 11 - LOG_START)
        settle_quietly(self.subjects.values())

    def results(self) -> None:
        write_results(
            "retention-past-position",
            self.kind,
            self.subjects.values(),
            {"log_start": LOG_START, "position": 3},
        )


@pytest.fixture(scope="module")
def retention(module_cluster: Cluster) -> Iterator[RetentionRun]:
    yield from staged(RetentionRun(module_cluster))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_retention_past_position_is_not_a_truncation(retention: RetentionRun, policy: str) -> None:
    s, e0 = retention.subjects[policy], retention.e0
    assert s.reports == [] and s.handler_reports == []
    assert s.delivered == records(R_VALUES[:3], 0, e0) + records(R_VALUES[LOG_START:], 6, e0)
    assert s.detected_at is (3 if policy == "auto-none" else None)
    if policy == "auto-none":
        # No reset policy: the application is told, as kafka-python and Java tell it.
        [err] = s.errors
        assert isinstance(err, kerrors.OffsetOutOfRangeError), type(err).__mro__
        assert not isinstance(err, LogTruncationError)
        assert err.offset == 3  # type: ignore[attr-defined]
        assert s.stopped_deliveries == 0
        assert s.position_error_while_stopped == type(err).__name__
        assert s.seeks == ["beginning"]
    else:
        assert s.errors == [] and s.seeks == []
    assert s.consumer.metrics(raw=True)["truncations_detected"] == 0
    assert s.consumer.position_with_epoch(s.tp) == EpochOffset(11, e0)


# ---------------------------------------------------------------------------- topic recreate


Z_VALUES = [f"z{i}" for i in range(8)]


class RecreateRun(StagedRun):
    """The topic is deleted and re-created under the same name while consumers sit at 5.

    t0..t4 read (epoch 0 of the first topic); the new topic gets z0..z7, so offsets 5..7
    exist again (the dangerous case: a fetch by name at 5 would return z5 as if it followed
    t4). One group polls while the topic is gone, the other not at all until z0..z7 exist.
    Every consumer must report ``topic_recreated`` (divergence 0: nothing of the old log is
    in the new one) and read the new topic from its start under rewinding policies.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kind = kind(cluster)
        self.topic = f"eg-recreate-{os.getpid()}-{self.kind}"
        self.tp = TopicPartition(self.topic, 0)
        self.subjects: dict[tuple[str, str], Subject] = {}
        self.leaders: list[int] = []
        self.e0 = -1

    def run(self) -> None:
        cluster, topic, tp = self.cluster, self.topic, self.tp
        cluster.create_topic(topic, replication_factor=2)
        self.leaders.append(eventually("a leader", lambda: cluster.leader(topic, 0)))
        self.e0 = cluster.leader_epoch(topic, 0)
        produce(cluster, topic, T_VALUES)
        for situation in recreate_situations(cluster):
            for policy in POLICIES:
                s = Subject(
                    cluster, tp, policy, f"recreate-{situation}", allow_auto_create_topics=False
                )
                self.subjects[(situation, policy)] = s
                s.read(5)
        # Idle at the log end first, so that nothing (a metadata refresh still due from the
        # start) is pending when the idle-through group next polls.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            for s in self.subjects.values():
                s.poll(timeout_ms=10)
        time.sleep(SETTLE)
        for s in self.subjects.values():
            s.set_phase("after")
        cluster.delete_topic(topic)
        polling = [s for (sit, _p), s in self.subjects.items() if sit == "polling"]
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            for s in polling:
                s.poll(timeout_ms=10)

        self.leaders.append(recreate_topic(cluster, topic, replication_factor=2, delete=False))
        produce(cluster, topic, Z_VALUES)
        drive(self.subjects.values(), _done_after(len(Z_VALUES)))
        settle_quietly(self.subjects.values())

    def results(self) -> None:
        write_results(
            "topic-recreate",
            self.kind,
            self.subjects.values(),
            {"position": 5, "leaders": self.leaders},
        )


T_VALUES = [f"t{i}" for i in range(5)]


def recreate_situations(cluster: Cluster) -> tuple[str, ...]:
    """A Raft-term cluster serves Fetch up to v11, Redpanda's: fetches name topics, not ids,
    so a consumer that slept through the re-creation reads the new topic as the old one until
    metadata shows the new id (the Fetch-by-name limit in the consumer guide's Known limits,
    not a matter of terms). Only the consumers that poll while the topic is gone are asked
    to see it there."""
    return ("polling",) if is_raft(cluster) else ("polling", "idle-through")


@pytest.fixture(scope="module")
def recreate(module_cluster: Cluster) -> Iterator[RecreateRun]:
    yield from staged(RecreateRun(module_cluster))


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("situation", ["polling", "idle-through"])
def test_topic_recreated_is_reported_once(
    recreate: RecreateRun, situation: str, policy: str
) -> None:
    if situation not in recreate_situations(recreate.cluster):
        pytest.skip("Fetch v11 names topics: the documented Fetch-by-name limit")
    s, e0 = recreate.subjects[(situation, policy)], recreate.e0
    [rep] = s.reports
    assert rep.detected_by is DetectedBy.TOPIC_RECREATED
    assert rep.consumed_to == EpochOffset(5, e0)
    assert rep.divergence == EpochOffset(0, None)
    assert (rep.lost_from, rep.lost_to, rep.lost_count) == (0, 5, 5)
    assert s.detected_at == 5
    assert s.delivered == records(T_VALUES, 0, e0) + records(Z_VALUES, 0, e0)
    if s.policy == "callable":
        assert s.handler_reports == [rep]
    if s.raising:
        [err] = s.errors
        assert isinstance(err, LogTruncationError) and err.truncations == {s.tp: rep}
        assert s.stopped_deliveries == 0
        assert s.position_error_while_stopped == "LogTruncationError"
        assert s.seeks == [EpochOffset(0, None)]
    else:
        assert s.errors == [] and s.seeks == []


# ------------------------------------------------------------------------------------ groups


def test_group_rebalance_commits_epochs(module_cluster: Cluster) -> None:
    """Two group members split 4 partitions; what the first read before the rebalance is
    committed on revoke (with its leader epoch), so nothing is read twice."""
    cluster = module_cluster
    topic = f"eg-group-{os.getpid()}-{kind(cluster)}"
    cluster.create_topic(topic, partitions=4, replication_factor=2)
    producer = KafkaProducer(
        bootstrap_servers=cluster.all_bootstrap_servers,
        acks=1,
        enable_idempotence=False,
        linger_ms=0,
    )
    try:
        for p in range(4):
            for i in range(5):
                producer.send(topic, b"%d-%d" % (p, i), partition=p).get(timeout=15)
    finally:
        producer.close(timeout=5)
    cfg = consumer_config(
        cluster,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=200,
        session_timeout_ms=10000,
        heartbeat_interval_ms=300,
        max_poll_interval_ms=20000,
        fetch_max_wait_ms=200,
        metadata_max_age_ms=1000,
    )
    consumers = [EpochConsumer(**cfg), EpochConsumer(**cfg)]
    got: list[list[Any]] = [[], []]
    stop = threading.Event()

    def run(i: int) -> None:
        consumers[i].subscribe([topic])
        while not stop.is_set():
            for recs in consumers[i].poll(timeout_ms=100).values():
                got[i] += recs

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    try:
        threads[0].start()
        eventually("first member reads all", lambda: len(got[0]) == 20, 60)
        threads[1].start()
        eventually("partitions split", lambda: all(len(c.assignment()) == 2 for c in consumers), 60)
        assert consumers[0].assignment().isdisjoint(consumers[1].assignment())
        seen = [(r.partition, r.offset) for r in got[0] + got[1]]
        assert len(seen) == len(set(seen)) == 20
        tp = TopicPartition(topic, 0)
        assert consumers[0].committed_with_epoch(tp) == EpochOffset(
            5, cluster.leader_epoch(topic, 0)
        )
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        for c in consumers:
            c.close()


def test_subjects_run_the_driver_their_cluster_names(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """The ``embedded-asyncio`` runs of this module really drive AIOEpochConsumer (so the
    second run cannot silently become a copy of the first)."""
    from .epoch_subjects import LoopDriven, Subject

    topic = "driver-check"
    cluster.create_topic(topic, partitions=1, replication_factor=1)
    s = Subject(cluster, TopicPartition(topic, 0), "raise", "driver-check")
    try:
        asyncio = request.node.callspec.id.endswith("asyncio")
        assert isinstance(s.consumer, LoopDriven) == asyncio
    finally:
        s.close()
