"""EpochConsumer against real Apache Kafka 4.x brokers (and the EmbeddedCluster, same test).

RF=2 on brokers A and B, min.insync.replicas=1, acks=1: a0..a4 replicated; B stops;
d0..d2 on A alone (offsets 5..7); the consumer reads 0..7 and idles at the log end (empty
fetches); A stops; B is elected uncleanly and gets b0..b4 at offsets 5..9 (refilled past the
consumer's position 8); A returns. The consumer must report 3 lost records (divergence 5)
and read b0..b4; a group commit afterwards carries the new epoch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kafka import KafkaProducer
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.testing import ApacheKafkaCluster, Cluster, EmbeddedCluster
from epochguard.testing.apache_kafka.pytest_support import require_real_kafka

pytestmark = pytest.mark.timeout(300)
T = TypeVar("T")


@pytest.fixture(
    scope="module",
    params=["embedded", pytest.param("apache", marks=[pytest.mark.real_kafka, pytest.mark.slow])],
)
def any_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster: Cluster
    if request.param == "apache":
        cluster = ApacheKafkaCluster(num_brokers=3, jars=require_real_kafka())
    else:
        cluster = EmbeddedCluster(brokers=3, first_broker_id=0)
    with cluster:
        yield cluster


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except Exception as exc:  # clusters raise their own errors while catching up
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def produce(cluster: Cluster, topic: str, values: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=cluster.all_bootstrap_servers, acks=1,
                             enable_idempotence=False, linger_ms=0, retries=5)
    try:
        for value in values:
            producer.send(topic, value.encode(), partition=0).get(timeout=15)
    finally:
        producer.close(timeout=5)


def read(consumer: EpochConsumer, n: int, timeout: float) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=200).values():
            got += recs
    return got


def test_caught_up_consumer_detects_unclean_election(any_cluster: Cluster) -> None:
    cluster = any_cluster
    topic = f"eg-{os.getpid()}-{type(cluster).__name__}"
    tp = TopicPartition(topic, 0)
    cluster.create_topic(topic, replication_factor=2, config={"min.insync.replicas": "1"})
    a = eventually("a leader", lambda: cluster.leader(topic, 0))
    (b,) = [r for r in cluster.replicas(topic, 0) if r != a]
    produce(cluster, topic, [f"a{i}" for i in range(5)])
    eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == 5)
    eventually("ISR [A, B]", lambda: sorted(cluster.isr(topic, 0)) == sorted([a, b]))
    cluster.stop_broker(b)
    eventually("ISR [A]", lambda: cluster.isr(topic, 0) == [a])
    produce(cluster, topic, ["d0", "d1", "d2"])

    reports: list[TruncationReport] = []
    consumer = EpochConsumer(
        bootstrap_servers=cluster.all_bootstrap_servers, group_id=f"g-{topic}",
        auto_offset_reset="earliest", enable_auto_commit=False, on_truncation="rewind",
        on_truncation_report=reports.append, fetch_max_wait_ms=200,
        metadata_max_age_ms=500, retry_backoff_ms=50, reconnect_backoff_max_ms=1000,
        request_timeout_ms=10000)
    try:
        consumer.assign([tp])
        assert [r.value for r in read(consumer, 8, 30)] == [
            b"a0", b"a1", b"a2", b"a3", b"a4", b"d0", b"d1", b"d2"]
        assert read(consumer, 1, 1.5) == []  # caught up: empty fetches
        assert consumer.position_with_epoch(tp) == EpochOffset(8, 0)
        consumer.commit()

        cluster.stop_broker(a)
        eventually("no leader", lambda: cluster.leader(topic, 0) is None)
        cluster.start_broker(b)
        cluster.elect_leader(topic, 0, b, unclean=True)
        eventually("B leads", lambda: cluster.leader(topic, 0) == b)
        produce(cluster, topic, [f"b{i}" for i in range(5)])
        got = read(consumer, 5, 60)
        assert [(r.offset, r.value) for r in got] == [(5 + i, b"b%d" % i) for i in range(5)]
        [rep] = reports
        assert rep.divergence is not None and rep.divergence.offset == 5
        assert rep.consumed_to == EpochOffset(8, 0) and rep.lost_count == 3
        epoch = got[0].leader_epoch
        assert epoch == cluster.leader_epoch(topic, 0) and epoch > 0
        consumer.commit()
        assert consumer.committed(tp) == EpochOffset(10, epoch)
    finally:
        consumer.close()
        cluster.start_broker(a)


def test_group_rebalance_and_commit_with_epochs(any_cluster: Cluster) -> None:
    import threading

    cluster = any_cluster
    topic = f"eg-grp-{os.getpid()}-{type(cluster).__name__}"
    cluster.create_topic(topic, partitions=4, replication_factor=2)
    producer = KafkaProducer(bootstrap_servers=cluster.all_bootstrap_servers, acks=1,
                             enable_idempotence=False, linger_ms=0)
    try:
        for p in range(4):
            for i in range(5):
                producer.send(topic, b"%d-%d" % (p, i), partition=p).get(timeout=15)
    finally:
        producer.close(timeout=5)
    cfg: dict[str, Any] = {
        "bootstrap_servers": cluster.all_bootstrap_servers, "group_id": f"g-{topic}",
        "auto_offset_reset": "earliest", "enable_auto_commit": True,
        "auto_commit_interval_ms": 200, "session_timeout_ms": 10000,
        "heartbeat_interval_ms": 300, "max_poll_interval_ms": 20000,
        "fetch_max_wait_ms": 200, "metadata_max_age_ms": 1000}
    consumers = [EpochConsumer(**cfg), EpochConsumer(**cfg)]
    records: list[list[Any]] = [[], []]
    stop = threading.Event()

    def run(i: int) -> None:
        consumers[i].subscribe([topic])
        while not stop.is_set():
            for recs in consumers[i].poll(timeout_ms=100).values():
                records[i] += recs

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    try:
        threads[0].start()
        eventually("first member reads all", lambda: len(records[0]) == 20, 60)
        threads[1].start()
        eventually("partitions split", lambda: all(len(c.assignment()) == 2 for c in consumers),
                   60)
        assert consumers[0].assignment().isdisjoint(consumers[1].assignment())
        seen = [(r.partition, r.offset) for r in records[0] + records[1]]
        assert len(seen) == len(set(seen)) == 20  # committed on revoke: nothing re-read
        tp = TopicPartition(topic, 0)
        assert consumers[0].committed(tp) == EpochOffset(5, cluster.leader_epoch(topic, 0))
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        for c in consumers:
            c.close()
