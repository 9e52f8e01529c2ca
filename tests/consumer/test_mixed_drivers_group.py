"""One classic group of EpochConsumer (threads), AIOEpochConsumer and aiokafka's
AIOKafkaConsumer: each record is read once through members joining and leaving, and a
truncation is carried from a member of one driver to the next owner of the other, through
the commit and its leader epoch. (The Java client joins such groups on real Kafka:
tests/apache_kafka/test_apache_java_group.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor as AIORange
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.structs import TopicPartition

from epochguard import AIOEpochConsumer, EpochConsumer, LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.testing import EmbeddedCluster

from .conftest import setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(120)

TOPIC, PARTS = "mixed-drivers", 6
GROUP_TIMING: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 200,
    "max_poll_interval_ms": 20000,
}


def _produce(cluster: EmbeddedCluster, first: int, last: int) -> None:
    for p in range(PARTS):
        cluster.append(TOPIC, p, [b"%d-%d" % (p, i) for i in range(first, last)])


class _Thread(threading.Thread):
    """Polls the threaded member in its own thread (a classic join waits for every member)."""

    def __init__(self, consumer: EpochConsumer) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.records: list[tuple[int, int]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for recs in self.consumer.poll(timeout_ms=50).values():
                    self.records += [(r.partition, r.offset) for r in recs]
        except BaseException as exc:
            self.error = exc


async def _drain(consumer: Any, into: list[tuple[int, int]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        batch = await consumer.getmany(timeout_ms=50)
        for recs in batch.values():
            into += [(r.partition, r.offset) for r in recs]


async def _until(cond: Callable[[], bool], what: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_a_group_of_both_drivers_and_aiokafka_reads_each_record_once(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic(TOPIC, partitions=PARTS, replication_factor=2)
    _produce(cluster, 0, 5)
    threaded = EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        group_id="mixed-drivers",
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=200,
        partition_assignment_strategy=[RangePartitionAssignor],
        **GROUP_TIMING,
    )
    threaded.subscribe([TOPIC])
    runner = _Thread(threaded)
    runner.start()

    async def main() -> None:
        await _until(lambda: len(runner.records) == 5 * PARTS, "the first member reads all")
        common = {
            "bootstrap_servers": cluster.bootstrap_servers,
            "group_id": "mixed-drivers",
            "auto_offset_reset": "earliest",
            "enable_auto_commit": True,
            "auto_commit_interval_ms": 200,
            "partition_assignment_strategy": (AIORange,),
            **GROUP_TIMING,
        }
        ours = AIOEpochConsumer(TOPIC, **common)
        theirs = AIOKafkaConsumer(TOPIC, **common)
        await ours.start()
        await theirs.start()
        stop_ours, stop_theirs = asyncio.Event(), asyncio.Event()
        got_ours: list[tuple[int, int]] = []
        got_theirs: list[tuple[int, int]] = []
        tasks = [
            asyncio.create_task(_drain(ours, got_ours, stop_ours)),
            asyncio.create_task(_drain(theirs, got_theirs, stop_theirs)),
        ]

        def seen() -> list[tuple[int, int]]:
            return runner.records + got_ours + got_theirs

        def held(*members: Any) -> list[set[int]]:
            return [{tp.partition for tp in m.assignment()} for m in members]

        def split(*members: Any) -> bool:
            parts = held(*members)
            return all(parts) and sum(map(len, parts)) == PARTS

        try:
            await _until(lambda: split(threaded, ours, theirs), "a three-way split")
            _produce(cluster, 5, 10)
            await _until(lambda: len(seen()) >= 10 * PARTS, "every record once, three ways")
            assert got_ours and got_theirs, "each asyncio member read its share"
            stop_theirs.set()
            await tasks[1]
            await theirs.stop()  # commits, then leaves: its partitions move with their commits
            await _until(lambda: split(threaded, ours), "a two-way split")
            _produce(cluster, 10, 15)
            await _until(lambda: len(seen()) >= 15 * PARTS, "every record once, two ways")
            await asyncio.sleep(0.3)  # nothing more arrives
        finally:
            stop_ours.set()
            stop_theirs.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await ours.stop()
            await theirs.stop()
        got = seen()
        assert len(got) == len(set(got)) == 15 * PARTS, sorted(got)

    try:
        asyncio.run(main())
    finally:
        runner.stop.set()
        runner.join(10)
        threaded.close()
    assert runner.error is None


@pytest.mark.parametrize("first", ["asyncio", "threads"])
def test_a_truncation_is_carried_to_the_next_owner_of_the_other_driver(
    cluster: EmbeddedCluster, first: str
) -> None:
    """The first member reads past what an unclean election will drop, commits with its
    epoch and leaves; the next owner, of the other driver, restores the commit and reports
    the truncation before reading anything of the new log."""
    old, new = setup_topic(cluster)  # topic "t", 10 records on both replicas
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"lost-%d" % i for i in range(5)], batch_size=1)
    tp = TopicPartition("t", 0)
    config: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "group_id": f"carry-{first}",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "on_truncation": "raise",
        "metadata_max_age_ms": 500,
        **GROUP_TIMING,
    }

    async def aio_reads_and_commits() -> EpochOffset | None:
        c = AIOEpochConsumer("t", **config)
        await c.start()
        try:
            got = 0
            deadline = time.monotonic() + 30
            while got < 15:
                assert time.monotonic() < deadline
                got += sum(len(v) for v in (await c.getmany(timeout_ms=100)).values())
            await c.commit()
            return await c.committed_with_epoch(tp)
        finally:
            await c.stop()

    def threaded_reads_and_commits() -> EpochOffset | None:
        c = EpochConsumer("t", **config)
        try:
            got = 0
            deadline = time.monotonic() + 30
            while got < 15:
                assert time.monotonic() < deadline
                got += sum(len(v) for v in c.poll(timeout_ms=100).values())
            c.commit()
            return c.committed_with_epoch(tp)
        finally:
            c.close()

    async def aio_detects() -> LogTruncationError:
        c = AIOEpochConsumer("t", **config)
        await c.start()
        try:
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "no truncation reported"
                try:
                    batch = await c.getmany(timeout_ms=100)
                except LogTruncationError as exc:
                    return exc
                assert not any(batch.values()), batch
        finally:
            await c.stop()

    def threaded_detects() -> LogTruncationError:
        c = EpochConsumer("t", **config)
        try:
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "no truncation reported"
                try:
                    batch = c.poll(timeout_ms=100)
                except LogTruncationError as exc:
                    return exc
                assert not any(batch.values()), batch
        finally:
            c.close()

    if first == "asyncio":
        committed = asyncio.run(aio_reads_and_commits())
    else:
        committed = threaded_reads_and_commits()
    assert committed is not None and committed.offset == 15
    epoch = committed.leader_epoch
    unclean_elect(cluster, old, new)
    error = threaded_detects() if first == "asyncio" else asyncio.run(aio_detects())
    report = error.truncations[tp]
    assert error.truncation_offsets() == {tp: EpochOffset(10, epoch)}
    assert (report.lost_from, report.lost_to, report.lost_count) == (10, 15, 5)
