"""Requests to the group coordinator go on a connection of their own.

A broker answers one connection's requests in order. On the connection that fetches, a
commit (or a heartbeat, a join) would wait behind the long-poll Fetch in flight, up to
``fetch_max_wait_ms``, whenever the coordinator also leads a partition the consumer reads. A
commit that slow also stays exposed to a connection cut for that long (a chaos schedule lost
one that way, then restarted from the commit before it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.structs import OffsetAndMetadata, TopicPartition

from epochguard import AIOEpochConsumer
from epochguard.consumer import EpochConsumer
from epochguard.consumer.client import BrokerClient
from epochguard.testing import EmbeddedCluster

from .conftest import aread, consumer_config, read

TP = TopicPartition("t", 0)
#: Long enough that a commit queued behind the Fetch could not pass for a quick one.
FETCH_MAX_WAIT_MS = 10_000


@pytest.fixture
def one_broker() -> Iterator[EmbeddedCluster]:
    # One broker: the coordinator leads the partition read, so the fetch connection is the
    # coordinator's broker's.
    with EmbeddedCluster(brokers=1) as c:
        c.create_topic("t", partitions=1, replication_factor=1)
        c.append("t", 0, [b"x"] * 10)
        yield c


def _config(cluster: EmbeddedCluster, **kw: Any) -> dict[str, Any]:
    return consumer_config(
        cluster,
        group_id="g",
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        request_timeout_ms=FETCH_MAX_WAIT_MS + 5000,
        **kw,
    )


@pytest.mark.parametrize("io_thread", [True, False])
def test_a_commit_does_not_wait_behind_the_long_poll_fetch(
    one_broker: EmbeddedCluster, io_thread: bool
) -> None:
    consumer = EpochConsumer(**_config(one_broker, io_thread=io_thread))
    try:
        consumer.assign([TP])
        assert len(read(consumer, 10, timeout=20)) == 10
        took = []
        for offset in (4, 7, 10):
            consumer.poll(timeout_ms=50)  # caught up: a Fetch waits at the broker
            started = time.monotonic()
            consumer.commit({TP: OffsetAndMetadata(offset, "", -1)})
            took.append(time.monotonic() - started)
            assert consumer.committed(TP) == offset
        # Behind the Fetch, each would take about FETCH_MAX_WAIT_MS.
        assert max(took) < FETCH_MAX_WAIT_MS / 1000 / 4, took
    finally:
        consumer.close()


def test_an_asyncio_commit_does_not_wait_behind_the_long_poll_fetch(
    one_broker: EmbeddedCluster,
) -> None:
    async def main() -> list[float]:
        consumer = AIOEpochConsumer(**_config(one_broker))
        await consumer.start()
        try:
            consumer.assign([TP])
            assert len(await aread(consumer, 10, timeout=20)) == 10
            took = []
            for offset in (4, 7, 10):
                await consumer.getmany(timeout_ms=50)
                started = time.monotonic()
                await consumer.commit({TP: OffsetAndMetadata(offset, "", -1)})
                took.append(time.monotonic() - started)
                assert await consumer.committed(TP) == offset
            return took
        finally:
            await consumer.stop()

    took = asyncio.run(main())
    assert max(took) < FETCH_MAX_WAIT_MS / 1000 / 4, took


def test_the_coordinator_has_a_node_id_of_its_own() -> None:
    """The connection is kafka-python's coordinator node: another id for the same address,
    which a broker that moves closes with the broker's own connection."""
    client = BrokerClient({"bootstrap_servers": "127.0.0.1:1"}, io_thread=False)
    try:
        answer = SimpleNamespace(error_code=0, node_id=2, host="127.0.0.1", port=9092)
        node = client.coordinator_node("g", answer)
        assert node != 2
        broker = client.manager.cluster.broker_metadata(node)
        assert (broker.host, broker.port) == ("127.0.0.1", 9092)
        assert client.manager.cluster.broker_metadata(2) is None  # not a broker of its own
    finally:
        client.close()


@pytest.mark.parametrize(
    ("coordinator_at", "closed"),
    [
        # Looked up before the move: its connection goes to the old address.
        (("127.0.0.1", 9092), True),
        # Looked up after the move (rebootstrap asks a bootstrap server first): the
        # group's live connection stays, or the member would have to join again.
        (("127.0.0.1", 9093), False),
    ],
)
def test_a_broker_that_moves_closes_its_coordinator_connection_only_when_stale(
    mocker: Any, coordinator_at: tuple[str, int], closed: bool
) -> None:
    from epochguard.consumer import wire

    client = BrokerClient({"bootstrap_servers": "127.0.0.1:1"}, io_thread=False)
    try:
        host, port = coordinator_at
        node = client.coordinator_node(
            "g", SimpleNamespace(error_code=0, node_id=2, host=host, port=port)
        )
        client._addresses = {2: ("127.0.0.1", 9092)}
        mocker.patch.object(wire, "broker_addresses", return_value={2: ("127.0.0.1", 9093)})
        mocker.patch.object(client.manager.cluster, "update_metadata")
        close = mocker.patch.object(client.manager, "close")
        client._apply_brokers(object())
        assert mocker.call(2) in close.call_args_list  # the broker's own connection
        assert (mocker.call(node) in close.call_args_list) is closed
    finally:
        mocker.stopall()
        client.close()
