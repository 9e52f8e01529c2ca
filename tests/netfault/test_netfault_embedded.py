"""The loopback fault proxy in front of an EmbeddedCluster, with EpochConsumer and with
independent clients: every fault kind, and after it every record exactly once, in order,
with no truncation reported (none happened) and no hang."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pytest

from epochguard.testing import EmbeddedCluster
from epochguard.testing.netfault import FaultProxy, FaultProxyError
from tests.netfault.readers import CLIENTS, FETCH, RECORDS, Reader

# independent: each test reads its own topic; a worker that takes some of them starts its own
# cluster and proxy (a fraction of a second), and the waits for faults to heal overlap.
pytestmark = [pytest.mark.independent, pytest.mark.timeout(120)]

_topics = itertools.count()


@pytest.fixture(scope="module")
def proxied() -> Iterator[tuple[EmbeddedCluster, FaultProxy]]:
    with EmbeddedCluster(brokers=3) as cluster, FaultProxy() as proxy:
        proxy.attach_embedded(cluster)
        yield cluster, proxy


@pytest.fixture
def setup(
    proxied: tuple[EmbeddedCluster, FaultProxy],
) -> Iterator[tuple[EmbeddedCluster, FaultProxy, str]]:
    cluster, proxy = proxied
    topic = f"netfault-{next(_topics)}"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    yield cluster, proxy, topic
    proxy.heal()


def _produce(cluster: EmbeddedCluster, topic: str, first: int, count: int, size: int = 10) -> None:
    cluster.append(
        topic, 0, [b"%06d" % i + b"." * max(0, size - 6) for i in range(first, first + count)]
    )


def _run(
    setup: tuple[EmbeddedCluster, FaultProxy, str],
    client: str,
    inject: Callable[[FaultProxy, int], None],
    *,
    size: int = 10,
) -> tuple[Reader, float]:
    """Read half the records, inject the fault at the leader, write and read the rest."""
    cluster, proxy, topic = setup
    leader = cluster.leader(topic, 0)
    assert leader is not None
    reader = Reader(client, proxy.bootstrap_servers, topic)
    try:
        _produce(cluster, topic, 0, RECORDS // 2, size)
        reader.read_until(RECORDS // 2)
        # The leader's records came through its proxy listener: Metadata named the proxy.
        assert proxy.connections(leader) >= 1
        inject(proxy, leader)
        _produce(cluster, topic, RECORDS // 2, RECORDS - RECORDS // 2, size)
        took = reader.read_until(RECORDS)
        reader.settle()
        assert reader.offsets == list(range(RECORDS)), "lost, re-read or reordered"
        assert [int(v[:6]) for v in reader.values] == list(range(RECORDS))
        assert reader.reports() == []
        return reader, took
    finally:
        reader.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_latency_and_jitter(setup: tuple[EmbeddedCluster, FaultProxy, str], client: str) -> None:
    _, took = _run(setup, client, lambda p, b: p.set_latency(b, 0.15, jitter_s=0.1))
    # At least the answer carrying the new records crossed the slowed link (its request may
    # have been waiting at the broker already).
    assert took >= 0.15


@pytest.mark.parametrize("client", CLIENTS)
def test_bandwidth_cap(setup: tuple[EmbeddedCluster, FaultProxy, str], client: str) -> None:
    # 30 records of 1,000 bytes at 40,000 bytes/s: about 0.75 s, within the clients' 1.5 s
    # request timeout (an answer that cannot cross the link within it is retried forever).
    _, took = _run(setup, client, lambda p, b: p.set_bandwidth(b, 40_000), size=1000)
    assert took >= 0.6


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("at_byte", [2, 30, 120])
def test_answer_cut_at_a_byte(
    setup: tuple[EmbeddedCluster, FaultProxy, str], client: str, at_byte: int
) -> None:
    _, proxy, _ = setup
    before = proxy.stats["cut"]
    _run(setup, client, lambda p, b: p.cut_answer(b, at_byte, api_key=FETCH, count=2))
    assert proxy.stats["cut"] >= before + 1


@pytest.mark.parametrize("client", CLIENTS)
def test_blackhole(setup: tuple[EmbeddedCluster, FaultProxy, str], client: str) -> None:
    _, proxy, _ = setup
    before = proxy.stats["blackholed"]

    def inject(p: FaultProxy, broker: int) -> None:
        p.blackhole(broker, seconds=2.0)
        p.reset(broker)  # the client's next connection lands in the blackhole

    _run(setup, client, inject)
    assert proxy.stats["blackholed"] >= before + 1


@pytest.mark.parametrize("client", CLIENTS)
def test_reset(setup: tuple[EmbeddedCluster, FaultProxy, str], client: str) -> None:
    _, proxy, _ = setup
    before = proxy.stats["reset"]

    def inject(p: FaultProxy, broker: int) -> None:
        p.reset(broker)

    _run(setup, client, inject)
    assert proxy.stats["reset"] >= before + 1


@pytest.mark.parametrize("client", CLIENTS)
def test_one_broker_partition(setup: tuple[EmbeddedCluster, FaultProxy, str], client: str) -> None:
    _, took = _run(setup, client, lambda p, b: p.partition(b, seconds=1.5))
    assert took >= 1.0  # nothing came from the leader until the partition healed


def test_a_partition_holds_new_connections_until_it_heals(
    setup: tuple[EmbeddedCluster, FaultProxy, str],
) -> None:
    cluster, proxy, topic = setup
    leader = cluster.leader(topic, 0)
    assert leader is not None
    _produce(cluster, topic, 0, 5)
    proxy.partition(leader)
    # Bootstrapped through the other brokers: kafka-python tries one bootstrap address at
    # random, and one held by the partition would use up its whole bootstrap timeout.
    others = ",".join("{}:{}".format(*proxy.address(b)) for b in proxy.broker_ids if b != leader)
    reader = Reader("kafka-python", others, topic)
    try:
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            reader.poll()
        assert reader.offsets == []
        proxy.heal(leader)
        reader.read_until(5)
        assert reader.offsets == list(range(5))
    finally:
        reader.close()


def test_metadata_names_the_proxy(proxied: tuple[EmbeddedCluster, FaultProxy]) -> None:
    import confluent_kafka.admin

    cluster, proxy = proxied
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    brokers = admin.list_topics(timeout=10).brokers
    named = {b.id: (str(b.host), b.port) for b in brokers.values()}
    assert named == {b: proxy.address(b) for b in proxy.broker_ids}


def test_bad_faults_are_refused(proxied: tuple[EmbeddedCluster, FaultProxy]) -> None:
    _, proxy = proxied
    with pytest.raises(FaultProxyError, match="no broker 9"):
        proxy.partition(9)
    with pytest.raises(FaultProxyError, match="latency_s"):
        proxy.set_latency(1, -1.0)
    with pytest.raises(FaultProxyError, match="bytes_per_second"):
        proxy.set_bandwidth(1, 0)
    with pytest.raises(FaultProxyError, match="at_byte"):
        proxy.cut_answer(1, -3)
    with pytest.raises(FaultProxyError, match="seconds"):
        proxy.blackhole(1, seconds=-1)


def test_the_example_in_docs_testing_runs() -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md").read_text()
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "FaultProxy()" in b
    ]
    exec(compile(block, "docs/guides/testing.md:netfault", "exec"), {})
