"""Real-Kafka chaos with network faults (``generate_apache(network=True)``): the fault proxy in
front of every broker, Metadata naming the proxy, every client of the scoreboard (EpochConsumer,
the Java consumer, kafka-python, confluent-kafka, aiokafka) on the same schedule, judged by the
same oracle. The 60-schedule figures are ``make chaos-apache SEEDS=60 CHAOS_ARGS=--network``
(docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epochguard.testing.apache_kafka import ApacheKafkaCluster, KafkaJars
from epochguard.testing.chaos.apache import (
    ALL_APPS,
    default_clients,
    run_apache_schedule,
    verdicts,
)
from epochguard.testing.chaos.oracle import Delivered
from epochguard.testing.chaos.schedule import (
    Elect,
    NetFault,
    Produce,
    RestartConsumer,
    Schedule,
)
from epochguard.testing.netfault import FaultProxy, LinkFaults

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

FETCH, METADATA, OFFSET_FOR_LEADER_EPOCH = 1, 3, 23

#: Every proxy fault kind around an unclean election. Picks name brokers (``pick % 3``):
#: 0 and 1 hold the partition, 2 coordinates the groups.
SCHEDULE = Schedule(
    seed=90101,
    partitions=1,
    policy="raise",
    steps=(
        Produce(0, 4),
        NetFault("cut", 0, at_byte=30, api=FETCH),  # a Fetch answer cut mid-way, then reset
        NetFault("latency", 1, 1.0, latency_s=0.1),
        Produce(0, 3),
        RestartConsumer(0),
        Elect(0, True, 1),  # records on the old leader only, then the unclean election
        NetFault("partition", 2, 1.0),  # the coordinator unreachable: commits wait
        Produce(0, 3),
        NetFault("cut", 1, at_byte=8, api=OFFSET_FOR_LEADER_EPOCH),
        NetFault("bandwidth", 0, 1.0, bytes_per_s=20_000),
        NetFault("reset", 1),
        Produce(0, 2),
        NetFault("blackhole", 0, 1.0),
        Produce(0, 2),
    ),
)


@pytest.fixture(scope="module")
def proxied(kafka_jars: KafkaJars) -> Iterator[tuple[ApacheKafkaCluster, FaultProxy]]:
    with (
        FaultProxy() as proxy,
        ApacheKafkaCluster(brokers=3, jars=kafka_jars, fault_proxy=proxy) as cluster,
    ):
        yield cluster, proxy


def test_every_client_through_the_proxy_on_one_schedule(
    proxied: tuple[ApacheKafkaCluster, FaultProxy],
) -> None:
    cluster, proxy = proxied
    result = run_apache_schedule(SCHEDULE, cluster, default_clients(cluster), proxy=proxy)
    log = "\n".join(result.step_log)
    assert "written to the old leader only" in result.step_log[5], log
    vs = verdicts(result, ALL_APPS)
    # The project's promise, with the network between the clients and the brokers bad too.
    assert vs["epochguard"].ok, f"{vs['epochguard'].describe()}\n{log}"
    assert vs["epochguard"].reports >= 1, vs["epochguard"].describe()

    # Every client consumed through the proxy (the brokers' own listeners are not theirs to
    # find: Metadata named the proxy), and the faults reached connections.
    delivered = {e.app for e in result.history.events if isinstance(e, Delivered)}
    assert delivered == set(ALL_APPS), delivered
    assert proxy.stats["accepted"] >= len(ALL_APPS)
    assert proxy.stats["cut"] >= 1 and proxy.stats["reset"] >= 1, dict(proxy.stats)
    # Nothing is left behind for the next schedule: every fault healed.
    assert all(proxy.faults_of(b) == LinkFaults() for b in proxy.broker_ids)
