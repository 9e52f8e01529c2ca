"""Two unclean elections in a row, on both clusters: each one is reported, exactly.

RF=3 on brokers A (leader), B and C; min.insync.replicas=1, acks=1. Found by the seeded
chaos test (tests/consumer/test_chaos.py): a second unclean election can go back to an
even older replica, below the first divergence point.

a0..a2 on A, B, C (offsets 0..2, epoch 0) -> stop C -> b0..b2 on A, B (3..5) -> stop B ->
c0, c1 on A alone (6, 7) -> the consumers read 0..7 -> stop A, start B, unclean election
of B -> d0, d1 (6, 7 in B's epoch) -> the consumers detect the first truncation (c0, c1
lost: divergence 6) and read d0, d1 -> stop B, start C, unclean election of C (C has only
0..2) -> e0, e1 (3, 4) -> the consumers detect the second truncation (b0..b2, d0, d1 lost:
divergence 3 in epoch 0, which they read a2 in) and read e0, e1 -> A and B come back and
truncate to C's log.

Every policy must report both, at those divergence points, and deliver everything else
exactly once: what the application holds, once each report's range is dropped, is the
final log.

On a Raft-term cluster (``embedded-raft``) records go the Raft way: a majority that held
visible acks=1 records loses power. A loss there can never reach below records that
survived an earlier one (the new leader wrote them to disk with its term, and a majority
voted for that log), so its second loss takes the new leader's own records instead: a0..a2
everywhere and b0..b2 on A and B are on disk; C lags; c0, c1 (6, 7) are visible on A and B ->
the consumers read 0..7 -> B and A lose power; B comes back and leads with C (term ``eb``) ->
d0, d1 (6, 7) on B and C -> first truncation (divergence 6, c0 and c1 lost) -> C and B lose
power; A and C come back and C leads (term ``ec``) -> e0, e1 (6, 7) -> second truncation
(divergence 6 again, d0 and d1 lost, found by asking twice: term ``eb`` holds nothing
there any more) -> B comes back. Final log: a0..a2, b0..b2, e0, e1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.testing import Cluster, EmbeddedCluster, produce
from epochguard.testing import wait_until as eventually

from ..shared_kafka import start_stopped, start_together
from .conftest import CLUSTERS_AND_DRIVERS, scenario_cluster
from .epoch_subjects import (
    POLICIES,
    StagedRun,
    Subject,
    drive,
    records,
    settle_quietly,
    staged,
    write_results,
)
from .observe import Observer
from .test_unclean_truncation import is_raft, kind

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

E0 = 0
A_VALUES, B_VALUES, C_VALUES = ["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1"]
D_VALUES, E_VALUES = ["d0", "d1"], ["e0", "e1"]


@pytest.fixture(scope="module", params=CLUSTERS_AND_DRIVERS)
def module_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """This module's scenarios also run with AIOEpochConsumer subjects."""
    with scenario_cluster(request.param, request) as cluster:
        yield cluster


class SuccessiveRun(StagedRun):
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kind = kind(cluster)
        self.topic = f"eg-twice-{os.getpid()}-{self.kind}"
        self.tp = TopicPartition(self.topic, 0)
        self.subjects: dict[str, Subject] = {}
        self.epochs: dict[str, int] = {}
        self.final_log: list[tuple[int, int, str]] = []
        self.raft = is_raft(cluster)

    def _unclean(self, old: int, new: int) -> int:
        cluster, topic = self.cluster, self.topic
        cluster.stop_broker(old)
        if cluster.running_broker_ids:  # real Kafka answers through a running broker only
            eventually("no leader", lambda: cluster.leader(topic, 0) is None)
        cluster.start_broker(new)
        # The stale replica is back, and must not have found a leader to follow.
        assert eventually("metadata", lambda: (cluster.leader(topic, 0),)) == (None,)
        cluster.elect_leader(topic, 0, new, unclean=True)
        eventually("the new leader", lambda: cluster.leader(topic, 0) == new)
        obs = Observer(cluster)
        epoch = cluster.leader_epoch(topic, 0)
        eventually("metadata shows it", lambda: obs.leader_and_epoch(topic, 0)[1] == epoch)
        return epoch

    def _lose_power(self, stop: tuple[int, int], start: tuple[int, ...]) -> int:
        """Raft: the brokers ``stop`` lose power in turn (their unflushed records with them:
        the follower first, so that no new term's flush saves them), then ``start`` come
        back and elect. Returns the new term."""
        cluster, topic = self.cluster, self.topic
        for b in stop:
            cluster.stop_broker(b)
        eventually("no leader", lambda: cluster.leader(topic, 0) is None)
        for b in cluster.replicas(topic, 0):
            cluster.resume_replication(b)
        for b in start:
            cluster.start_broker(b)
        eventually("a new leader", lambda: cluster.leader(topic, 0) is not None)
        obs = Observer(cluster)
        epoch = cluster.leader_epoch(topic, 0)
        eventually("metadata shows it", lambda: obs.leader_and_epoch(topic, 0)[1] == epoch)
        return epoch

    def run_raft(self) -> None:
        cluster, topic = self.cluster, self.topic
        assert isinstance(cluster, EmbeddedCluster)
        cluster.create_topic(topic, replication_factor=3)
        a = eventually("a leader", lambda: cluster.leader(topic, 0))
        b, c = [r for r in cluster.replicas(topic, 0) if r != a]
        produce(cluster, topic, A_VALUES)
        eventually("ISR of three", lambda: len(cluster.isr(topic, 0)) == 3)
        cluster.pause_replication(c)
        produce(cluster, topic, B_VALUES)
        cluster.flush(topic)  # a0..a2 on disk everywhere, b0..b2 on A and B
        produce(cluster, topic, C_VALUES)
        for policy in POLICIES:
            self.subjects[policy] = s = Subject(cluster, self.tp, policy, "twice")
            s.read(8)

        # C is back with B: B's log ends at 6, C's at 3, so B leads.
        self.epochs["b"] = self._lose_power((b, a), (b,))
        assert cluster.leader(topic, 0) == b
        for s in self.subjects.values():
            s.set_phase("after-first")
        produce(cluster, topic, D_VALUES)
        drive(self.subjects.values(), lambda s: len(s.reports) >= 1 and len(s.delivered) >= 10)

        # A, down since the first loss, comes back: alone it cannot elect, then C (term
        # eb on disk) wins over it (term 1).
        self.epochs["c"] = self._lose_power((c, b), (a, c))
        assert cluster.leader(topic, 0) == c
        for s in self.subjects.values():
            s.set_phase("after-second")
        produce(cluster, topic, E_VALUES)
        drive(self.subjects.values(), lambda s: len(s.reports) >= 2 and len(s.delivered) >= 12)
        settle_quietly(self.subjects.values())

        cluster.start_broker(b)
        eventually(
            "every replica at the leader's log",
            lambda: all(cluster.log_end_offset(topic, 0, r) == 8 for r in (a, b, c)),
        )
        # The Observer fetches with v12, above what a Raft-term broker serves: read the log.
        epochs = {
            o: epoch
            for base, last, epoch in cluster.replica_log(topic, 0, c).batches
            for o in range(base, last + 1)
        }
        self.final_log = [
            (o, epochs[o], (value or b"").decode())
            for o, _key, value in cluster.read_records(topic, 0, c)
        ]

    def run(self) -> None:
        if self.raft:
            self.run_raft()
            return
        cluster, topic = self.cluster, self.topic
        cluster.create_topic(topic, replication_factor=3, config={"min.insync.replicas": "1"})
        a = eventually("a leader", lambda: cluster.leader(topic, 0))
        b, c = [r for r in cluster.replicas(topic, 0) if r != a]
        produce(cluster, topic, A_VALUES)
        eventually(
            "all replicas at 3",
            lambda: all(cluster.log_end_offset(topic, 0, r) == 3 for r in (b, c)),
        )
        eventually("ISR of three", lambda: len(cluster.isr(topic, 0)) == 3)
        cluster.stop_broker(c)
        eventually("ISR [A, B]", lambda: sorted(cluster.isr(topic, 0)) == sorted([a, b]))
        produce(cluster, topic, B_VALUES)
        eventually("B at 6", lambda: cluster.log_end_offset(topic, 0, b) == 6)
        cluster.stop_broker(b)
        eventually("ISR [A]", lambda: cluster.isr(topic, 0) == [a])
        produce(cluster, topic, C_VALUES)
        for policy in POLICIES:
            self.subjects[policy] = s = Subject(cluster, self.tp, policy, "twice")
            s.read(8)

        self.epochs["b"] = self._unclean(a, b)
        for s in self.subjects.values():
            s.set_phase("after-first")
        produce(cluster, topic, D_VALUES)
        drive(self.subjects.values(), lambda s: len(s.reports) >= 1 and len(s.delivered) >= 10)

        self.epochs["c"] = self._unclean(b, c)
        for s in self.subjects.values():
            s.set_phase("after-second")
        produce(cluster, topic, E_VALUES)
        drive(self.subjects.values(), lambda s: len(s.reports) >= 2 and len(s.delivered) >= 12)
        settle_quietly(self.subjects.values())

        start_together(cluster, [a, b])
        eventually(
            "A and B truncated to C's log",
            lambda: all(cluster.log_end_offset(topic, 0, r) == 5 for r in (a, b)),
        )
        self.final_log = list(Observer(cluster).fetch(topic, 0, 0).records)

    def close(self) -> None:
        super().close()
        start_stopped(self.cluster)

    def results(self) -> None:
        write_results(
            "successive-unclean-elections",
            self.kind,
            self.subjects.values(),
            {"epochs": self.epochs},
        )


@pytest.fixture(scope="module")
def twice(module_cluster: Cluster) -> Iterator[SuccessiveRun]:
    yield from staged(SuccessiveRun(module_cluster))


def _view_after_reports(s: Subject) -> dict[int, str]:
    """What the application holds once every report's lost range has been dropped."""
    held: dict[int, str] = {}
    reports = iter(s.reports)
    # Replay: records and reports in the order the application saw them.
    events = [
        e
        for phase in s.events.values()
        for e in phase
        if e["event"] in ("record", "truncation_report")
    ]
    for e in events:
        if e["event"] == "record":
            assert e["offset"] not in held, f"{s.name}: offset {e['offset']} twice unreported"
            held[e["offset"]] = e["value"]
        else:
            report = next(reports)
            start = 0 if report.divergence is None else report.divergence.offset
            for offset in [o for o in held if o >= start]:
                del held[offset]
    return held


@pytest.mark.parametrize("policy", list(POLICIES))
def test_two_unclean_elections_are_each_reported_exactly(twice: SuccessiveRun, policy: str) -> None:
    if twice.raft:
        expect_two_raft_losses(twice, policy)
        return
    s = twice.subjects[policy]
    eb, ec = twice.epochs["b"], twice.epochs["c"]
    assert E0 < eb < ec
    first, second = s.reports
    assert (first.consumed_to, first.divergence, first.lost_count, first.new_leader_epoch) == (
        EpochOffset(8, E0),
        EpochOffset(6, E0),
        2,
        eb,
    )
    assert (second.consumed_to, second.divergence, second.lost_count, second.new_leader_epoch) == (
        EpochOffset(8, eb),
        EpochOffset(3, E0),
        5,
        ec,
    )
    assert {first.detected_by, second.detected_by} <= {
        DetectedBy.METADATA,
        DetectedBy.FENCED,
        DetectedBy.DIVERGING_EPOCH,
    }
    assert s.delivered == (
        records(A_VALUES + B_VALUES + C_VALUES, 0, E0)
        + records(D_VALUES, 6, eb)
        + records(E_VALUES, 3, ec)
    )
    if s.raising:
        assert s.seeks == [EpochOffset(6, E0), EpochOffset(3, E0)]
        assert len(s.errors) == 2
    else:
        assert s.errors == [] and s.seeks == []
    m: dict[str, Any] = s.consumer.metrics(raw=True)
    assert (m["truncations_detected"], m["records_lost"]) == (2, 7)
    final = {offset: value for offset, _epoch, value in twice.final_log}
    assert final == {0: "a0", 1: "a1", 2: "a2", 3: "e0", 4: "e1"}
    assert _view_after_reports(s) == final


def expect_two_raft_losses(twice: SuccessiveRun, policy: str) -> None:
    s = twice.subjects[policy]
    e0, eb, ec = 1, twice.epochs["b"], twice.epochs["c"]
    # Terms skip the failed elections while no majority ran (A alone: one more).
    assert e0 + 1 < eb and eb + 2 < ec
    first, second = s.reports
    assert (first.consumed_to, first.divergence, first.lost_count, first.new_leader_epoch) == (
        EpochOffset(8, e0),
        EpochOffset(6, e0),
        2,
        eb,
    )
    assert (second.consumed_to, second.divergence, second.lost_count, second.new_leader_epoch) == (
        EpochOffset(8, eb),
        EpochOffset(6, e0),
        2,
        ec,
    )
    # Fetch v11 carries no DivergingEpoch: OffsetForLeaderEpoch finds both.
    assert {first.detected_by, second.detected_by} <= {DetectedBy.METADATA, DetectedBy.FENCED}
    assert s.delivered == (
        records(A_VALUES + B_VALUES + C_VALUES, 0, e0)
        + records(D_VALUES, 6, eb)
        + records(E_VALUES, 6, ec)
    )
    if s.raising:
        assert s.seeks == [EpochOffset(6, e0), EpochOffset(6, e0)]
        assert len(s.errors) == 2
    else:
        assert s.errors == [] and s.seeks == []
    m: dict[str, Any] = s.consumer.metrics(raw=True)
    assert (m["truncations_detected"], m["records_lost"]) == (2, 4)
    final = {offset: value for offset, _epoch, value in twice.final_log}
    assert final == dict(enumerate(A_VALUES + B_VALUES + E_VALUES))
    assert _view_after_reports(s) == final
