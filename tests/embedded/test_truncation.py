"""Unclean elections with divergent replica logs, seen through real clients.

Scenario (RF=2): offsets 0..9 are replicated under epoch 0; the follower stops; the leader
alone appends 10..14 (acks=1, still epoch 0) which the consumers read; the leader stops;
the follower is elected uncleanly (epoch 2) and appends 8 new records at 10..17, past the
consumers' position 15; the old leader rejoins and truncates to 10. The true divergence
point is offset 10.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from kafka.errors import LogTruncationError

from epochguard.testing import EmbeddedCluster, wait_until

pytestmark = pytest.mark.timeout(90)

DIVERGENCE = 10


def confluent_consumer(cluster: EmbeddedCluster) -> Any:
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "trunc",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "topic.metadata.refresh.interval.ms": 500,
            "log_level": 0,
        }
    )
    c.assign([TopicPartition("t", 0, 0)])
    return c


def kafka_python_consumer(cluster: EmbeddedCluster) -> KafkaConsumer:
    c = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="none",
        enable_auto_commit=False,
        max_poll_records=3,
        metadata_max_age_ms=500,
    )
    c.assign([KTopicPartition("t", 0)])
    c.seek(KTopicPartition("t", 0), 0)
    return c


def confluent_read(consumer: Any, until_offset: int) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + 20
    while (not got or got[-1] < until_offset) and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            got.append(m.offset())
    return got


def kafka_python_read(consumer: KafkaConsumer, n: int) -> list[int]:
    """Read ``n`` records, leaving the rest buffered so the position keeps its epoch."""
    got: list[int] = []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=200, max_records=n - len(got)).values():
            got += [r.offset for r in recs]
    return got


def stage_divergence(
    cluster: EmbeddedCluster, unclean: bool, during: Any = None
) -> tuple[int, int]:
    cluster.create_topic("t", replication_factor=2)
    old = cluster.leader("t", 0)
    assert old is not None
    new = next(b for b in cluster.replicas("t", 0) if b != old)
    cluster.append("t", 0, [b"kept-%d" % i for i in range(10)], batch_size=1)
    if unclean:
        cluster.stop_broker(new)
    cluster.append("t", 0, [b"maybe-lost-%d" % i for i in range(5)], batch_size=1)
    if during is not None:
        during()
    if unclean:
        cluster.stop_broker(old)
        cluster.start_broker(new)
        cluster.elect_leader("t", 0, new, unclean=True)
    else:
        cluster.elect_leader("t", 0, new)
    cluster.append("t", 0, [b"new-%d" % i for i in range(8)], batch_size=1)
    if unclean:
        cluster.start_broker(old)
    return old, new


def test_unclean_election_truncates_old_leader_and_logs_converge(cluster: EmbeddedCluster) -> None:
    old, new = stage_divergence(cluster, unclean=True)
    assert cluster.leader("t", 0) == new
    assert cluster.leader_epoch("t", 0) == 2
    a, b = cluster.replica_log("t", 0, old), cluster.replica_log("t", 0, new)
    assert a.epoch_cache == b.epoch_cache
    assert [(e.epoch, e.start_offset) for e in b.epoch_cache] == [(0, 0), (2, DIVERGENCE)]
    assert a.batches == b.batches
    assert a.log_end_offset == b.log_end_offset == 18
    assert cluster.read_records("t", 0, old) == cluster.read_records("t", 0, new)
    values = [v for _, _, v in cluster.read_records("t", 0, new)]
    assert b"maybe-lost-0" not in values and values[DIVERGENCE] == b"new-0"
    # The old leader joins the ISR once it has caught up, after the new one.
    wait_until("old leader back in sync", lambda: cluster.isr("t", 0) == [new, old])


def test_librdkafka_reports_truncation_at_the_divergence_point(cluster: EmbeddedCluster) -> None:
    consumer = None

    def read_lost_records() -> None:
        nonlocal consumer
        consumer = confluent_consumer(cluster)
        assert confluent_read(consumer, 14)[-1] == 14

    try:
        stage_divergence(cluster, unclean=True, during=read_lost_records)
        assert consumer is not None
        error = None
        deadline = time.monotonic() + 30
        while error is None and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and m.error():
                error = m.error()
            elif m is not None:
                pytest.fail(f"read offset {m.offset()} {m.value()!r} without noticing")
        assert error is not None
        assert error.code() == KafkaError._AUTO_OFFSET_RESET
        assert "truncation" in error.str()
        assert f"broker end offset is {DIVERGENCE} " in error.str()
    finally:
        if consumer is not None:
            consumer.close()


def test_kafka_python_raises_log_truncation_at_the_divergence_point(
    cluster: EmbeddedCluster,
) -> None:
    consumer = None

    def read_lost_records() -> None:
        nonlocal consumer
        consumer = kafka_python_consumer(cluster)
        assert kafka_python_read(consumer, 13) == list(range(13))

    try:
        stage_divergence(cluster, unclean=True, during=read_lost_records)
        assert consumer is not None
        deadline = time.monotonic() + 30
        with pytest.raises(LogTruncationError) as info:
            while time.monotonic() < deadline:
                for recs in consumer.poll(timeout_ms=200).values():
                    for r in recs:
                        assert r.offset < 15, f"read {r.offset} {r.value!r} silently"
        (divergent,) = info.value.divergent_offsets.values()
        assert (divergent.offset, divergent.leader_epoch) == (DIVERGENCE, 0)
    finally:
        if consumer is not None:
            consumer.close()


def test_clean_election_is_not_truncation_for_either_client(cluster: EmbeddedCluster) -> None:
    consumers: dict[str, Any] = {}

    def read_up_to_14() -> None:
        consumers["confluent"] = confluent_consumer(cluster)
        assert confluent_read(consumers["confluent"], 14)[-1] == 14
        consumers["kafka"] = kafka_python_consumer(cluster)
        assert kafka_python_read(consumers["kafka"], 13) == list(range(13))

    try:
        stage_divergence(cluster, unclean=False, during=read_up_to_14)
        assert cluster.leader_epoch("t", 0) == 1
        assert confluent_read(consumers["confluent"], 22)[-1] == 22
        got = kafka_python_read(consumers["kafka"], 10)
        assert got == list(range(13, 23))
    finally:
        for c in consumers.values():
            c.close()
