"""EpochConsumer on brokers with Raft-term epochs (``EmbeddedCluster(epochs="raft")``,
Redpanda's rules): the shapes Kafka's controller never makes. Epochs that skip numbers and
hold no record, the same leader under a new term (with and without its records), and
answers that echo the epoch asked about."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epochguard.consumer import EpochConsumer
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy, TruncationReport
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, make_consumer, poll_until, read

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def raft() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=3, epochs="raft") as c:
        yield c


def validations(consumer: EpochConsumer) -> int:
    return int(consumer.metrics(raw=True)["validations"])


def test_empty_terms_and_skipped_numbers_lose_nothing(raft: EmbeddedCluster) -> None:
    raft.create_topic("t", replication_factor=3)
    leader = raft.leader("t", 0)
    assert leader is not None
    raft.append("t", 0, [b"a%d" % i for i in range(5)], batch_size=1)
    reports: list[TruncationReport] = []
    with make_consumer(raft, on_truncation_report=reports.append) as consumer:
        consumer.assign([TP0])
        assert [r.leader_epoch for r in read(consumer, 5)] == [1] * 5
        # The same leader twice more, after failed rounds: terms 4 and 7 hold no record.
        raft.elect_leader("t", 0, leader, failed_attempts=2)
        poll_until(consumer, lambda: validations(consumer) >= 1)
        raft.elect_leader("t", 0, leader, failed_attempts=2)
        poll_until(consumer, lambda: validations(consumer) >= 2)
        assert raft.leader_epoch("t", 0) == 7
        assert consumer.position_with_epoch(TP0) == EpochOffset(5, 1)
        # Another broker, then records: they carry term 8.
        other = next(b for b in raft.replicas("t", 0) if b != leader)
        raft.elect_leader("t", 0, other)
        raft.append("t", 0, [b"b%d" % i for i in range(3)], batch_size=1)
        got = read(consumer, 3)
        assert [(r.offset, r.leader_epoch) for r in got] == [(5, 8), (6, 8), (7, 8)]
        assert reports == []
        assert consumer.metrics(raw=True)["truncations_detected"] == 0


def test_the_same_leader_back_without_its_records_is_a_truncation(
    raft: EmbeddedCluster,
) -> None:
    """One replica: acks=1 records are visible at once and lost with its power; it comes
    back as the same leader under a new term, and new records take the lost offsets."""
    raft.create_topic("t", replication_factor=1)
    leader = raft.leader("t", 0)
    assert leader is not None
    raft.append("t", 0, [b"kept-%d" % i for i in range(5)], batch_size=1)
    raft.flush("t")
    raft.append("t", 0, [b"lost-%d" % i for i in range(3)], batch_size=1)
    reports: list[TruncationReport] = []
    with make_consumer(
        raft, on_truncation="rewind", on_truncation_report=reports.append
    ) as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 8)) == 8
        raft.stop_broker(leader)
        raft.start_broker(leader)
        assert raft.leader("t", 0) == leader
        term = raft.leader_epoch("t", 0)
        assert term >= 2
        raft.append("t", 0, [b"new-%d" % i for i in range(6)], batch_size=1)
        got = read(consumer, 6)
        assert [(r.offset, r.value) for r in got] == [(5 + i, b"new-%d" % i) for i in range(6)]
        assert all(r.leader_epoch == term for r in got)
        [rep] = reports
        assert (rep.divergence, rep.consumed_to) == (EpochOffset(5, 1), EpochOffset(8, 1))
        assert rep.new_leader_epoch == term and rep.lost_count == 3
        assert rep.detected_by in (DetectedBy.METADATA, DetectedBy.FENCED)


def test_records_of_a_term_of_their_own_lost_with_the_majority(raft: EmbeddedCluster) -> None:
    """The lost records are alone in their term: the new leader echoes it with where the
    next term starts, and the consumer asks again for the term it read below to place the
    divergence exactly."""
    raft.create_topic("t", replication_factor=3)
    a = raft.leader("t", 0)
    assert a is not None
    b, c = [r for r in raft.replicas("t", 0) if r != a]
    raft.append("t", 0, [b"kept-%d" % i for i in range(4)], batch_size=1)
    raft.flush("t")
    raft.pause_replication(c)
    raft.elect_leader("t", 0, a)  # term 2, on disk on a and b
    raft.append("t", 0, [b"lost-%d" % i for i in range(3)], batch_size=1)
    reports: list[TruncationReport] = []
    with make_consumer(
        raft, on_truncation="rewind", on_truncation_report=reports.append
    ) as consumer:
        consumer.assign([TP0])
        got = read(consumer, 7)
        assert [r.leader_epoch for r in got] == [1] * 4 + [2] * 3
        asked_before = consumer.metrics(raw=True)["offset_for_leader_epoch_requests"]
        raft.stop_broker(b)
        raft.stop_broker(a)
        raft.resume_replication(c)
        raft.start_broker(b)
        new = raft.leader("t", 0)
        assert new is not None
        term = raft.leader_epoch("t", 0)
        raft.append("t", 0, [b"new-%d" % i for i in range(2)], batch_size=1)
        got = read(consumer, 2)
        assert [(r.offset, r.value, r.leader_epoch) for r in got] == [
            (4, b"new-0", term),
            (5, b"new-1", term),
        ]
        [rep] = reports
        assert (rep.divergence, rep.consumed_to) == (EpochOffset(4, 1), EpochOffset(7, 2))
        # Term 2 ends at 4 here (nothing of it is left), and 3 was read in term 1: asked
        # again, the same answer places the divergence at 4 in term 1.
        asked = consumer.metrics(raw=True)["offset_for_leader_epoch_requests"] - asked_before
        assert asked >= 2


def test_a_reset_position_carries_the_current_term_and_stays_valid(
    raft: EmbeddedCluster,
) -> None:
    """ListOffsets names the current term, whatever the query: a position reset to the
    earliest offset has the term of no record before it. A new term validates it."""
    raft.create_topic("t", replication_factor=3)
    leader = raft.leader("t", 0)
    assert leader is not None
    raft.append("t", 0, [b"a%d" % i for i in range(6)], batch_size=1)
    raft.elect_leader("t", 0, leader, failed_attempts=1)  # term 3, no record
    raft.delete_records("t", 0, 2)
    reports: list[TruncationReport] = []
    with make_consumer(
        raft, auto_offset_reset="earliest", on_truncation_report=reports.append
    ) as c:
        c.assign([TP0])
        poll_until(c, lambda: c.position_with_epoch(TP0) is not None)
        assert c.position_with_epoch(TP0) == EpochOffset(2, 3)
        raft.elect_leader("t", 0, leader)  # term 4
        got = read(c, 4)
        assert [(r.offset, r.leader_epoch) for r in got] == [(o, 1) for o in range(2, 6)]
        assert reports == []
