"""``io_thread``: EpochConsumer serves its connections from the threads that wait in it
(default) or from kafka-python's IO thread; both read, commit and close alike, and a call
made from another thread is answered whichever thread serves the connections."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard import AIOEpochConsumer
from epochguard.consumer import ConsumerConfigError
from epochguard.offsets.position import EpochOffset
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer, read

pytestmark = pytest.mark.timeout(60)

TP = TopicPartition("io", 0)


def _io_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("kafka-io-")]


def _topic(cluster: EmbeddedCluster, n: int = 6) -> None:
    cluster.create_topic("io", partitions=1, replication_factor=2)
    cluster.append("io", 0, [b"v%d" % i for i in range(n)], batch_size=2)


@pytest.mark.parametrize("io_thread", [False, True])
def test_both_drivers_read_commit_and_close(cluster: EmbeddedCluster, io_thread: bool) -> None:
    _topic(cluster)
    before = len(_io_threads())
    c = make_consumer(cluster, group_id="io-group", io_thread=io_thread)
    try:
        assert len(_io_threads()) == before + (1 if io_thread else 0)
        c.assign([TP])
        assert [r.value for r in read(c, 6)] == [b"v%d" % i for i in range(6)]
        c.commit()
        assert c.committed_with_epoch(TP) == EpochOffset(6, cluster.leader_epoch("io", 0))
    finally:
        c.close()
    assert len(_io_threads()) == before


@pytest.mark.parametrize("io_thread", [False, True])
def test_poll_with_no_timeout_in_a_loop_gets_the_records(
    cluster: EmbeddedCluster, io_thread: bool
) -> None:
    """``poll(timeout_ms=0)`` waits for nothing: without an IO thread it must still take in
    the answers that arrived since the last call, or a loop of them never gets a record."""
    _topic(cluster)
    c = make_consumer(cluster, io_thread=io_thread)
    got: list[bytes] = []
    try:
        c.assign([TP])
        deadline = time.monotonic() + 20
        while len(got) < 6 and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=0).values():
                got.extend(r.value for r in records)
        assert got == [b"v%d" % i for i in range(6)]
    finally:
        c.close()


def test_a_commit_from_another_thread_is_answered_while_poll_waits(
    cluster: EmbeddedCluster,
) -> None:
    _topic(cluster)
    # Nothing ends poll()'s wait early (no fetch answer, no metadata refresh due): the
    # commit's answer must wake the committing thread itself.
    c = make_consumer(
        cluster, group_id="io-group", fetch_max_wait_ms=4000, metadata_max_age_ms=60000
    )
    try:
        c.assign([TP])
        assert len(read(c, 6)) == 6
        c.committed_with_epoch(TP)  # the coordinator is known
        done: list[float] = []

        def commit() -> None:
            time.sleep(0.3)  # poll() below is waiting by then, stepping the connections
            start = time.monotonic()
            c.commit({TP: EpochOffset(4, cluster.leader_epoch("io", 0))})
            done.append(time.monotonic() - start)

        other = threading.Thread(target=commit)
        other.start()
        start = time.monotonic()
        assert c.poll(timeout_ms=3000) == {}  # caught up: waits its whole timeout
        assert time.monotonic() - start >= 2.9
        other.join(5)
        # Answered by the thread stepping the connections, not when poll() returned.
        assert done and done[0] < 1.5, done
        assert c.committed(TP) == 4
    finally:
        c.close()


def test_a_call_from_another_thread_serves_the_connections_itself(
    cluster: EmbeddedCluster,
) -> None:
    _topic(cluster)
    c = make_consumer(cluster, group_id="io-group")
    try:
        c.assign([TP])
        assert len(read(c, 6)) == 6
        got: list[Any] = []
        # Nobody polls: the committing thread steps the connections while it waits.
        other = threading.Thread(target=lambda: (c.commit(), got.append(c.committed(TP))))
        other.start()
        other.join(10)
        assert got == [6]
    finally:
        c.close()


def test_io_thread_must_be_a_bool(cluster: EmbeddedCluster) -> None:
    with pytest.raises(ConsumerConfigError, match="io_thread"):
        make_consumer(cluster, io_thread="yes")


def test_aio_epoch_consumer_refuses_io_thread() -> None:
    async def build() -> None:
        AIOEpochConsumer("t", bootstrap_servers="localhost:1", io_thread=False)

    with pytest.raises(ConsumerConfigError, match="io_thread"):
        asyncio.run(build())
