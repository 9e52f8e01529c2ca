"""KIP-392 follower fetching on both clusters: brokers in racks a, b, c with the rack-aware
replica selector, an EpochConsumer with ``client_rack`` reading from the follower in its
rack. The follower goes away, the leader loses an unclean election: nothing is lost or read
twice without a report, and a truncation is detected even though the consumer was reading
from a follower when it happened."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.consumer.records import ConsumerRecord
from epochguard.offsets import LogTruncationError
from epochguard.testing import ApacheKafkaCluster, Cluster, EmbeddedCluster, produce, wait_until
from epochguard.testing.apache_kafka.pytest_support import require_real_kafka
from epochguard.testing.embedded.state import RACK_AWARE_REPLICA_SELECTOR

pytestmark = pytest.mark.timeout(300)

RACKS = {0: "rack-a", 1: "rack-b", 2: "rack-c"}


@pytest.fixture(
    scope="module",
    params=["embedded", pytest.param("apache", marks=[pytest.mark.real_kafka, pytest.mark.slow])],
)
def rack_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cluster: Cluster
    if request.param == "apache":
        cluster = ApacheKafkaCluster(
            brokers=3,
            jars=require_real_kafka(),
            racks=RACKS,
            replica_selector=RACK_AWARE_REPLICA_SELECTOR,
        )
    else:
        cluster = EmbeddedCluster(
            brokers=3, first_broker_id=0, racks=RACKS, replica_selector=RACK_AWARE_REPLICA_SELECTOR
        )
    with cluster:
        yield cluster


@pytest.fixture
def cluster(rack_cluster: Cluster) -> Iterator[Cluster]:
    yield rack_cluster
    for broker_id in rack_cluster.broker_ids:
        if not rack_cluster.is_running(broker_id):
            rack_cluster.start_broker(broker_id)


def _topic(cluster: Cluster, name: str) -> tuple[str, int, int, int]:
    """A fresh RF=3 topic: (name, leader, the follower to read from, the other follower)."""
    kind = "apache" if isinstance(cluster, ApacheKafkaCluster) else "embedded"
    topic = f"ff-{name}-{kind}-{os.getpid()}"
    cluster.create_topic(topic, replication_factor=3, config={"min.insync.replicas": "1"})
    leader = wait_until("a leader", lambda: cluster.leader(topic, 0))
    wait_until("full ISR", lambda: len(cluster.isr(topic, 0)) == 3)
    near, other = (r for r in cluster.replicas(topic, 0) if r != leader)
    return topic, leader, near, other


def _consumer(cluster: Cluster, topic: str, rack: str, **kw: Any) -> EpochConsumer:
    cfg: dict[str, Any] = {
        "bootstrap_servers": cluster.all_bootstrap_servers,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "client_rack": rack,
        "fetch_max_wait_ms": 100,
        "metadata_max_age_ms": 1000,
        "retry_backoff_ms": 50,
        "request_timeout_ms": 5000,
        "on_truncation": "raise",
    }
    cfg.update(kw)
    consumer = EpochConsumer(**cfg)
    consumer.assign([TopicPartition(topic, 0)])
    return consumer


def _read(consumer: EpochConsumer, n: int, timeout: float = 30.0) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    wait_until(
        f"{n} records",
        lambda: (
            got.extend(r for rs in consumer.poll(timeout_ms=100).values() for r in rs)
            or len(got) >= n
        ),
        timeout=timeout,
        interval=0,
    )
    return got


def _resets(consumer: EpochConsumer) -> int:
    m = consumer.metrics(raw=True)
    assert m is not None
    return int(m["offset_resets"])


def _follower_fetches(consumer: EpochConsumer) -> int:
    m = consumer.metrics(raw=True)
    assert m is not None
    return int(m["fetches_from_followers"])


def test_reads_from_the_follower_in_its_rack_and_survives_it_going_away(cluster: Cluster) -> None:
    topic, _leader, near, _other = _topic(cluster, "away")
    produce(cluster, topic, [f"a{i}" for i in range(10)])
    consumer = _consumer(cluster, topic, RACKS[near])
    try:
        got = _read(consumer, 10)
        assert _follower_fetches(consumer) > 0, "never fetched from the follower in its rack"
        resets = _resets(consumer)  # the first position came from auto_offset_reset
        cluster.stop_broker(near)
        produce(cluster, topic, [f"b{i}" for i in range(10)])
        got += _read(consumer, 10)
        cluster.start_broker(near)
        wait_until("follower back in sync", lambda: len(cluster.isr(topic, 0)) == 3, timeout=60)
        before = _follower_fetches(consumer)
        produce(cluster, topic, [f"c{i}" for i in range(10)])
        got += _read(consumer, 10)
        wait_until(
            "fetching from the follower again",
            lambda: (
                consumer.poll(timeout_ms=100) is not None and _follower_fetches(consumer) > before
            ),
            timeout=30,
            interval=0,
        )
        m = consumer.metrics(raw=True)
        assert m is not None
    finally:
        consumer.close()
    assert [r.offset for r in got] == list(range(30))
    assert [r.value for r in got] == [f"{p}{i}".encode() for p in "abc" for i in range(10)]
    assert m["offset_resets"] == resets and m["truncations_detected"] == 0


def test_unclean_election_while_reading_from_a_follower_is_detected(cluster: Cluster) -> None:
    topic, leader, near, other = _topic(cluster, "unclean")
    produce(cluster, topic, [f"a{i}" for i in range(10)])
    wait_until("replicated", lambda: cluster.log_end_offset(topic, 0, other) == 10)
    consumer = _consumer(cluster, topic, RACKS[near])
    try:
        got = _read(consumer, 10)
        cluster.stop_broker(other)
        wait_until("ISR without the stopped follower", lambda: other not in cluster.isr(topic, 0))
        # The leader and the near follower have these; ``other`` will not.
        produce(cluster, topic, [f"d{i}" for i in range(5)])
        got += _read(consumer, 5)
        assert _follower_fetches(consumer) > 0
        cluster.stop_broker(near)
        cluster.stop_broker(leader)
        cluster.start_broker(other)
        cluster.elect_leader(topic, 0, other, unclean=True)
        wait_until("the unclean leader", lambda: cluster.leader(topic, 0) == other)
        produce(cluster, topic, [f"n{i}" for i in range(3)])
        cluster.start_broker(near)
        cluster.start_broker(leader)
        wait_until("replicas truncated", lambda: len(cluster.isr(topic, 0)) == 3, timeout=60)
        tp = TopicPartition(topic, 0)
        deadline = time.monotonic() + 30
        with pytest.raises(LogTruncationError) as info:
            while time.monotonic() < deadline:
                got.extend(r for rs in consumer.poll(timeout_ms=100).values() for r in rs)
        report = info.value.report
        assert report.divergence is not None and report.divergence.offset == 10
        assert report.lost_count == 5
        consumer.seek(tp, report.divergence)
        fresh = _read(consumer, 3)
    finally:
        consumer.close()
    assert [r.value for r in got] == [f"a{i}".encode() for i in range(10)] + [
        f"d{i}".encode() for i in range(5)
    ]
    assert [(r.offset, r.value) for r in fresh] == [(10 + i, f"n{i}".encode()) for i in range(3)]


def test_a_lagging_follower_does_not_hold_the_consumer_back() -> None:
    """EmbeddedCluster only: replication to the follower stops while the consumer reads from
    it (it serves up to its own high watermark); the choice expires, the leader no longer
    names it (out of the ISR), and the consumer reads the rest from the leader."""
    with EmbeddedCluster(
        brokers=3, first_broker_id=0, racks=RACKS, replica_selector=RACK_AWARE_REPLICA_SELECTOR
    ) as cluster:
        topic, _leader, near, _other = _topic(cluster, "lag")
        produce(cluster, topic, [f"a{i}" for i in range(10)])
        consumer = _consumer(cluster, topic, RACKS[near], metadata_max_age_ms=500)
        try:
            got = _read(consumer, 10)
            assert _follower_fetches(consumer) > 0
            resets = _resets(consumer)
            cluster.pause_replication(near)
            produce(cluster, topic, [f"b{i}" for i in range(10)])
            got += _read(consumer, 10)
            m = consumer.metrics(raw=True)
        finally:
            consumer.close()
        assert [r.offset for r in got] == list(range(20))
        assert m is not None and m["offset_resets"] == resets and m["truncations_detected"] == 0


def test_offset_out_of_range_from_the_follower_is_not_a_reset() -> None:
    """EmbeddedCluster only (fault injection): the follower answers OFFSET_OUT_OF_RANGE; the
    consumer goes back to the leader, validates, and neither skips nor re-reads."""
    from kafka.protocol.consumer import FetchRequest

    with EmbeddedCluster(
        brokers=3, first_broker_id=0, racks=RACKS, replica_selector=RACK_AWARE_REPLICA_SELECTOR
    ) as cluster:
        topic, _leader, near, _other = _topic(cluster, "oor")
        produce(cluster, topic, [f"a{i}" for i in range(10)])
        consumer = _consumer(cluster, topic, RACKS[near], auto_offset_reset="latest")
        consumer.seek(TopicPartition(topic, 0), 0)
        try:
            got = _read(consumer, 10)
            assert _follower_fetches(consumer) > 0
            cluster.faults.inject_error(FetchRequest.API_KEY, 1, count=1, broker=near)
            produce(cluster, topic, [f"b{i}" for i in range(10)])
            got += _read(consumer, 10)
            m = consumer.metrics(raw=True)
        finally:
            consumer.close()
        assert [r.offset for r in got] == list(range(20))
        assert m is not None and m["offset_resets"] == 0
        assert m["validations"] >= 2  # switching to the follower, and back to the leader
