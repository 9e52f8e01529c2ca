"""Conformance with kafka-python 3.0.12 over TCP."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from epochguard.testing import EmbeddedCluster

pytestmark = pytest.mark.timeout(60)


def consume(consumer: KafkaConsumer, n: int, seconds: float = 15.0) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=200).values():
            got += [(r.offset, r.value) for r in recs]
    return got


def test_default_idempotent_producer_and_assigned_consumer(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
    try:
        futures = [producer.send("t", value=b"v%d" % i, partition=i % 2) for i in range(20)]
        metas = [f.get(timeout=10) for f in futures]
    finally:
        producer.close()
    assert sorted(m.offset for m in metas if m.partition == 0) == list(range(10))
    for b in cluster.replicas("t", 0):
        assert cluster.log_end_offset("t", 0, broker=b) == 10
    assert cluster.high_watermark("t", 0) == 10

    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        consumer.assign([TopicPartition("t", 0)])
        got = consume(consumer, 10)
    finally:
        consumer.close()
    assert got == [(i, b"v%d" % (2 * i)) for i in range(10)]
