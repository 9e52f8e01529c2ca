"""A connection made while its broker's link was a blackhole never gets its handshake
answered. A request that waits behind that handshake past its own timeout drops the
connection, as kafka-python does for a request that times out in flight, so the next
attempt connects afresh once the link is back, instead of every request waiting for the
handshake's own timeout (``socket_connection_setup_timeout_ms``; a group member's commits
and heartbeats to its coordinator, past its session timeout)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka import TopicPartition

from epochguard import AIOEpochConsumer, EpochConsumer
from epochguard.testing import EmbeddedCluster
from epochguard.testing.netfault import FaultProxy

pytestmark = pytest.mark.timeout(120)

TOPIC = "handshake"
#: Far longer than the test waits: a commit that waits for the handshake to time out fails.
SETUP_TIMEOUT_MS = 60_000
BLACKHOLE_S = 1.0
#: After the blackhole ends, the commits have this long to land (seconds).
DEADLINE_S = 12.0
CONFIG = {
    "group_id": "handshake-group",
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "request_timeout_ms": 1000,
    "socket_connection_setup_timeout_ms": SETUP_TIMEOUT_MS,
    "socket_connection_setup_timeout_max_ms": SETUP_TIMEOUT_MS,
    "session_timeout_ms": 45_000,
    "reconnect_backoff_max_ms": 200,
}


@pytest.fixture
def proxied() -> Iterator[tuple[EmbeddedCluster, FaultProxy]]:
    with EmbeddedCluster(brokers=3) as cluster, FaultProxy() as proxy:
        proxy.attach_embedded(cluster)
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        cluster.append(TOPIC, 0, [b"r%d" % i for i in range(5)])
        yield cluster, proxy


def _cut_off(proxy: FaultProxy, coordinator: int) -> None:
    """New connections to the coordinator go unanswered for a while; open ones end."""
    proxy.blackhole(coordinator, seconds=BLACKHOLE_S)
    assert proxy.reset(coordinator) >= 1


async def _commit_until_it_lands(commit: Callable[[], Any]) -> int:
    """Commit offset 3 until it succeeds (failing past the deadline); the failures before."""
    started = time.monotonic()
    failures = 0
    while True:
        try:
            done = commit()
            if inspect.isawaitable(done):
                await asyncio.wait_for(done, 3)
            return failures
        except (kerrors.KafkaError, TimeoutError):
            failures += 1
            assert time.monotonic() - started < BLACKHOLE_S + DEADLINE_S, (
                f"commits still failing after {failures} attempts"
            )


def test_threaded_commit_reconnects_after_a_handshake_went_unanswered(
    proxied: tuple[EmbeddedCluster, FaultProxy],
) -> None:
    _, proxy = proxied
    consumer = EpochConsumer(TOPIC, bootstrap_servers=proxy.bootstrap_servers, **CONFIG)
    try:
        got = 0
        deadline = time.monotonic() + 20
        while got < 5 and time.monotonic() < deadline:
            got += sum(len(v) for v in consumer.poll(timeout_ms=500).values())
        assert got == 5
        consumer.commit()
        coordinator = consumer._engine.group.coordinator_id
        assert coordinator is not None
        _cut_off(proxy, coordinator)
        failures = asyncio.run(
            _commit_until_it_lands(
                lambda: consumer.commit({TopicPartition(TOPIC, 0): 3}, timeout_ms=1000)
            )
        )
        # The blackhole made at least the first attempt fail: the fault was in the way.
        assert failures >= 1
        assert consumer.committed(TopicPartition(TOPIC, 0)) == 3
    finally:
        consumer.close()


def test_asyncio_commit_reconnects_after_a_handshake_went_unanswered(
    proxied: tuple[EmbeddedCluster, FaultProxy],
) -> None:
    _, proxy = proxied

    async def main() -> int:
        consumer = AIOEpochConsumer(TOPIC, bootstrap_servers=proxy.bootstrap_servers, **CONFIG)
        await consumer.start()
        try:
            got = 0
            deadline = time.monotonic() + 20
            while got < 5 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                got += sum(len(v) for v in batch.values())
            assert got == 5
            await consumer.commit()
            coordinator = consumer._engine.group.coordinator_id
            assert coordinator is not None
            _cut_off(proxy, coordinator)
            failures = await _commit_until_it_lands(
                lambda: consumer.commit({TopicPartition(TOPIC, 0): 3})
            )
            assert failures >= 1
            return await consumer.committed(TopicPartition(TOPIC, 0))
        finally:
            await consumer.stop()

    assert asyncio.run(main()) == 3
