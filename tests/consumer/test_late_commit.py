"""A commit cut off unanswered can still reach the coordinator, after a later one.

An OffsetCommit whose answer never came (a timeout, a lost connection) may still be in the
network, and the coordinator handles it whenever it arrives: after a later commit it
acknowledged, the group holds the older position again. The member that gets the partition
back and finds there one of its own unanswered commits, older than the one acknowledged
after it, resumes from the acknowledged position and commits it again
(``membership.OwnCommits``); any other commit it finds is the group's to follow."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka import ConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata, TopicPartition

from epochguard import AIOEpochConsumer
from epochguard.consumer import EpochConsumer
from epochguard.consumer.membership import OwnCommits
from epochguard.consumer.records import ConsumerRecord
from epochguard.offsets.position import EpochOffset
from epochguard.testing import EmbeddedCluster

from .conftest import aread, consumer_config, poll_until, read

pytestmark = pytest.mark.timeout(60)

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)
OFFSET_COMMIT = 8
HEARTBEAT = 12
REBALANCE_IN_PROGRESS = 27
#: Longer than the consumer's request timeout: the first attempt is given up, and reaches
#: the coordinator after the commits that follow it.
HOLD_S = 2.0


def _at(offset: int, epoch: int | None = 0) -> tuple[EpochOffset, str]:
    return EpochOffset(offset, epoch), ""


@pytest.mark.parametrize(
    ("events", "found", "resume_from"),
    [
        # sent 5 unanswered, 5 acknowledged, 20 acknowledged; the first 5 lands: 20
        ([("unanswered", 5), ("acknowledged", 5), ("acknowledged", 20)], 5, 20),
        # the same without the answered retry
        ([("unanswered", 5), ("acknowledged", 20)], 5, 20),
        # what the group holds is the acknowledged commit itself
        ([("unanswered", 5), ("acknowledged", 20)], 20, None),
        # not one of this member's unanswered commits: the group's to follow
        ([("unanswered", 5), ("acknowledged", 20)], 7, None),
        # unanswered after the last acknowledgement: it may be the newest commit
        ([("acknowledged", 20), ("unanswered", 30)], 30, None),
        ([("acknowledged", 20), ("unanswered", 5)], 5, None),
        # sent again after the acknowledgement: it may be the newest commit
        ([("unanswered", 5), ("acknowledged", 20), ("unanswered", 5)], 5, None),
        # the application went back to 5 itself, acknowledged last
        ([("unanswered", 5), ("acknowledged", 20), ("acknowledged", 5)], 5, None),
        # nothing unanswered: nothing overtaken
        ([("acknowledged", 5), ("acknowledged", 20)], 5, None),
        # no acknowledgement after the unanswered commit
        ([("unanswered", 5)], 5, None),
    ],
)
def test_own_commits_overtaken(
    events: list[tuple[str, int]], found: int, resume_from: int | None
) -> None:
    own = OwnCommits()
    for i, (what, offset) in enumerate(events):
        getattr(own, what)({TP: _at(offset)}, float(i))
    got = own.overtaken(TP, EpochOffset(found, 0), float(len(events)))
    assert got == (None if resume_from is None else _at(resume_from))
    # another partition, and nothing found, are never overtaken
    assert own.overtaken(OTHER, EpochOffset(found, 0), float(len(events))) is None
    assert own.overtaken(TP, None, float(len(events))) is None


def test_own_commits_compare_offset_and_leader_epoch() -> None:
    own = OwnCommits()
    own.unanswered({TP: _at(5, epoch=1)}, 0.0)
    own.acknowledged({TP: _at(20, epoch=1)}, 1.0)
    assert own.overtaken(TP, EpochOffset(5, 0), 2.0) is None
    assert own.overtaken(TP, EpochOffset(5, 1), 2.0) == _at(20, epoch=1)


def test_own_commits_forget_after_their_time() -> None:
    own = OwnCommits(ttl_s=10.0)
    own.unanswered({TP: _at(5)}, 0.0)
    own.acknowledged({TP: _at(20)}, 1.0)
    assert own.overtaken(TP, EpochOffset(5, 0), 9.0) == _at(20)
    assert own.overtaken(TP, EpochOffset(5, 0), 10.0) is None
    own.acknowledged({TP: _at(30)}, 11.0)  # nothing held any more: nothing kept
    assert own.overtaken(TP, EpochOffset(20, 0), 12.0) is None


class _Assignments(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.count = 0

    def on_partitions_revoked(self, revoked: Any) -> None:
        pass

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.count += 1


class _AsyncAssignments:
    def __init__(self) -> None:
        self.count = 0

    async def on_partitions_revoked(self, revoked: Any) -> None:
        pass

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.count += 1


def _cluster_with_records() -> EmbeddedCluster:
    cluster = EmbeddedCluster(brokers=1)
    cluster.start()
    cluster.create_topic("t", partitions=1, replication_factor=1)
    cluster.append("t", 0, [b"r%d" % i for i in range(20)])
    return cluster


def _config(cluster: EmbeddedCluster) -> dict[str, Any]:
    return consumer_config(cluster, group_id="g", request_timeout_ms=1000)


def _held(cluster: EmbeddedCluster) -> int | None:
    committed = cluster.call(lambda: cluster.state.groups.groups["g"].offsets.get(TP))
    return None if committed is None else committed.offset


def _group_holds(cluster: EmbeddedCluster, offset: int) -> None:
    deadline = time.monotonic() + 10
    while _held(cluster) != offset:
        assert time.monotonic() < deadline, _held(cluster)
        time.sleep(0.05)


def test_a_late_commit_does_not_move_its_member_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="epochguard.consumer")
    with _cluster_with_records() as cluster:
        consumer = EpochConsumer(**_config(cluster))
        try:
            assignments = _Assignments()
            consumer.subscribe(["t"], listener=assignments)
            assert len(read(consumer, 20)) == 20
            cluster.faults.hold_requests(HOLD_S, api_key=OFFSET_COMMIT)
            with pytest.raises(kerrors.RequestTimedOutError):
                consumer.commit({TP: OffsetAndMetadata(5, "", 0)})
            consumer.commit({TP: OffsetAndMetadata(5, "", 0)})  # the application retries
            consumer.commit({TP: OffsetAndMetadata(20, "", 0)})
            _group_holds(cluster, 5)  # the first attempt landed last
            cluster.faults.inject_error(HEARTBEAT, REBALANCE_IN_PROGRESS)
            got: list[ConsumerRecord] = []
            poll_until(consumer, lambda: assignments.count == 2, timeout=15, sink=got)
            cluster.append("t", 0, [b"new"])
            got += read(consumer, 1, timeout=15)
            assert [r.value for r in got] == [b"new"], [r.offset for r in got]
            _group_holds(cluster, 20)  # put back for whoever reads next
        finally:
            consumer.close()
    assert "commit_overtaken" in caplog.text


async def _values(consumer: AIOEpochConsumer) -> list[bytes]:
    batch = await consumer.getmany(timeout_ms=200)
    return [r.value for recs in batch.values() for r in recs]


def test_a_late_commit_does_not_move_its_asyncio_member_back() -> None:
    async def main(cluster: EmbeddedCluster) -> None:
        consumer = AIOEpochConsumer(**_config(cluster))
        await consumer.start()
        try:
            assignments = _AsyncAssignments()
            consumer.subscribe(["t"], listener=assignments)
            assert len(await aread(consumer, 20, timeout=15)) == 20
            cluster.faults.hold_requests(HOLD_S, api_key=OFFSET_COMMIT)
            with pytest.raises(kerrors.RequestTimedOutError):
                await consumer.commit({TP: OffsetAndMetadata(5, "", 0)})
            await consumer.commit({TP: OffsetAndMetadata(5, "", 0)})
            await consumer.commit({TP: OffsetAndMetadata(20, "", 0)})
            await asyncio.to_thread(_group_holds, cluster, 5)
            cluster.faults.inject_error(HEARTBEAT, REBALANCE_IN_PROGRESS)
            values: list[bytes] = []
            deadline = time.monotonic() + 15
            while assignments.count < 2 and time.monotonic() < deadline:
                values += await _values(consumer)
            cluster.append("t", 0, [b"new"])
            while not values and time.monotonic() < deadline:
                values += await _values(consumer)
            assert assignments.count == 2
            assert values == [b"new"]
            await asyncio.to_thread(_group_holds, cluster, 20)
        finally:
            await consumer.stop()

    with _cluster_with_records() as cluster:
        asyncio.run(main(cluster))
