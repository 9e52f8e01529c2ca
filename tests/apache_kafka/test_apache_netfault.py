"""The loopback fault proxy in front of real Kafka brokers (``fault_proxy=``): every fault
kind with EpochConsumer and independent clients, each reading every record exactly once, in
order, with no truncation reported and no hang."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator

import pytest

from epochguard.testing import ApacheKafkaCluster, produce
from epochguard.testing.apache_kafka import KafkaJars
from epochguard.testing.netfault import FaultProxy
from tests.netfault.readers import CLIENTS, FETCH, RECORDS, Reader

pytestmark = pytest.mark.timeout(180)

_topics = itertools.count()


@pytest.fixture(scope="module")
def proxied(kafka_jars: KafkaJars) -> Iterator[tuple[ApacheKafkaCluster, FaultProxy]]:
    with (
        FaultProxy() as proxy,
        ApacheKafkaCluster(brokers=3, jars=kafka_jars, fault_proxy=proxy) as cluster,
    ):
        yield cluster, proxy


@pytest.fixture
def topic(proxied: tuple[ApacheKafkaCluster, FaultProxy]) -> Iterator[str]:
    cluster, proxy = proxied
    name = f"netfault-{os.getpid()}-{next(_topics)}"
    cluster.create_topic(name, replication_factor=3)
    yield name
    proxy.heal()


def _values(first: int, count: int) -> list[bytes]:
    return [b"%06d" % i for i in range(first, first + count)]


def _run(
    proxied: tuple[ApacheKafkaCluster, FaultProxy],
    topic: str,
    client: str,
    inject: Callable[[FaultProxy, int], None],
) -> Reader:
    cluster, proxy = proxied
    leader = cluster.leader(topic, 0)
    assert leader is not None
    reader = Reader(client, proxy.bootstrap_servers, topic)
    try:
        produce(cluster, topic, _values(0, RECORDS // 2))
        reader.read_until(RECORDS // 2)
        # The leader's records came through its proxy listener: Metadata named the proxy.
        assert proxy.connections(leader) >= 1
        inject(proxy, leader)
        produce(cluster, topic, _values(RECORDS // 2, RECORDS - RECORDS // 2))
        reader.read_until(RECORDS)
        reader.settle()
        assert reader.offsets == list(range(RECORDS)), "lost, re-read or reordered"
        assert [int(v[:6]) for v in reader.values] == list(range(RECORDS))
        assert reader.reports() == []
        return reader
    finally:
        reader.close()


def _latency(p: FaultProxy, b: int) -> None:
    p.set_latency(b, 0.15, jitter_s=0.1)


def _bandwidth(p: FaultProxy, b: int) -> None:
    p.set_bandwidth(b, 20_000)


def _cut(p: FaultProxy, b: int) -> None:
    p.cut_answer(b, 60, api_key=FETCH, count=2)


def _blackhole(p: FaultProxy, b: int) -> None:
    p.blackhole(b, seconds=2.0)
    p.reset(b)


def _reset(p: FaultProxy, b: int) -> None:
    p.reset(b)


def _partition(p: FaultProxy, b: int) -> None:
    p.partition(b, seconds=1.5)


FAULTS = {
    "latency": _latency,
    "bandwidth": _bandwidth,
    "cut": _cut,
    "blackhole": _blackhole,
    "reset": _reset,
    "partition": _partition,
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_through_the_proxy(
    proxied: tuple[ApacheKafkaCluster, FaultProxy], topic: str, fault: str, client: str
) -> None:
    _, proxy = proxied
    before = dict(proxy.stats)
    _run(proxied, topic, client, FAULTS[fault])
    counter = {"cut": "cut", "blackhole": "blackholed", "reset": "reset"}.get(fault)
    if counter is not None:
        assert proxy.stats[counter] > before.get(counter, 0)


def test_metadata_names_the_proxy_and_replication_bypasses_it(
    proxied: tuple[ApacheKafkaCluster, FaultProxy], topic: str
) -> None:
    import confluent_kafka.admin

    cluster, proxy = proxied
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": proxy.bootstrap_servers})
    brokers = admin.list_topics(timeout=10).brokers
    named = {b.id: (str(b.host), b.port) for b in brokers.values()}
    assert named == {b: proxy.address(b) for b in proxy.broker_ids}
    # A client-side partition of a follower leaves it in the ISR: brokers replicate on
    # their own listener.
    leader = cluster.leader(topic, 0)
    follower = next(b for b in cluster.broker_ids if b != leader)
    proxy.partition(follower)
    produce(cluster, topic, _values(0, 5))
    deadline = time.monotonic() + 20
    while cluster.log_end_offset(topic, 0, follower) < 5:
        assert time.monotonic() < deadline, "the follower stopped replicating"
        time.sleep(0.1)
    assert follower in cluster.isr(topic, 0)
