"""Conformance with librdkafka (confluent-kafka) and aiokafka over TCP."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as ATopicPartition
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.codec import has_snappy

from epochguard.testing import EmbeddedCluster

pytestmark = pytest.mark.timeout(60)


def test_confluent_producer_and_assigned_consumer(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=3)
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    for i in range(300):
        producer.produce("t", key=b"k%d" % i, value=b"v%d" % i, partition=i % 3)
    assert producer.flush(20) == 0
    for p in range(3):
        assert cluster.high_watermark("t", p) == 100
        assert {cluster.log_end_offset("t", p, b) for b in cluster.replicas("t", p)} == {100}

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "g",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition("t", p, 0) for p in range(3)])
    got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + 20
    try:
        while sum(map(len, got.values())) < 300 and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                continue
            assert not m.error(), m.error()
            got[m.partition()].append((m.offset(), m.value()))
            assert m.leader_epoch() == 0
    finally:
        consumer.close()
    for p in range(3):
        assert got[p] == [(i, b"v%d" % (3 * i + p)) for i in range(100)]


def test_confluent_acks_all_below_min_isr_fails(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=2, config={"min.insync.replicas": "2"})
    leader = cluster.leader("t", 0)
    follower = next(b for b in cluster.replicas("t", 0) if b != leader)
    cluster.stop_broker(follower)
    errors: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "message.timeout.ms": 2000,
            "retries": 0,
            "log_level": 0,
        }
    )
    producer.produce(
        "t",
        value=b"x",
        partition=0,
        on_delivery=lambda err, msg: errors.append(str(err and err.name())),
    )
    producer.flush(10)
    assert errors == ["NOT_ENOUGH_REPLICAS"]
    assert cluster.log_end_offset("t", 0) == 0


def test_aiokafka_producer_and_consumer(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2)

    async def run() -> list[tuple[int, int, bytes | None]]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait("t", value=b"a%d" % i, partition=i % 2)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        got: list[tuple[int, int, bytes | None]] = []
        try:
            consumer.assign([ATopicPartition("t", 0), ATopicPartition("t", 1)])
            async with asyncio.timeout(20):
                while len(got) < 20:
                    batch = await consumer.getmany(timeout_ms=200)
                    for recs in batch.values():
                        got += [(r.partition, r.offset, r.value) for r in recs]
        finally:
            await consumer.stop()
        return got

    got = sorted(asyncio.run(run()))
    assert got == sorted((i % 2, i // 2, b"a%d" % i) for i in range(20))


def test_confluent_admin_metadata_sees_stopped_broker_and_new_leader(
    cluster: EmbeddedCluster,
) -> None:
    from confluent_kafka.admin import AdminClient

    cluster.create_topic("t", replication_factor=3)
    leader = cluster.leader("t", 0)
    assert leader is not None
    cluster.stop_broker(leader)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
    md = admin.list_topics("t", timeout=10)
    p = md.topics["t"].partitions[0]
    assert p.leader == cluster.leader("t", 0) != leader
    assert leader not in p.isrs
    assert leader not in md.brokers


def test_librdkafka_uses_topic_id_fetches_and_offset_for_leader_epoch(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("t", replication_factor=3)
    cluster.append("t", 0, [b"a", b"b"])
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "g",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    # Seeking with a leader epoch makes librdkafka validate it (OffsetForLeaderEpoch v2+).
    consumer.assign([TopicPartition("t", 0, 1, leader_epoch=0)])
    try:
        deadline = time.monotonic() + 15
        got = None
        while got is None and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and not m.error():
                got = (m.offset(), m.value())
    finally:
        consumer.close()
    assert got == (1, b"b")
    seen = cluster.requests_seen()
    fetch_versions = {v for (k, v) in seen if k == 1}
    assert max(fetch_versions) >= 13, fetch_versions
    assert any(k == 23 for (k, _) in seen)


def test_fetch_by_stale_topic_id_after_recreate(cluster: EmbeddedCluster) -> None:
    from kafka.protocol.consumer import FetchRequest, FetchResponse

    from .wire import Wire

    cluster.create_topic("t")
    import uuid

    old_id = uuid.UUID(cluster.topic_id("t"))
    cluster.delete_topic("t")
    cluster.create_topic("t")
    leader = cluster.leader("t", 0)
    assert leader is not None
    FT = FetchRequest.FetchTopic

    def req(tid: uuid.UUID) -> object:
        return FetchRequest(
            version=13,
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1000,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[
                FT(
                    version=13,
                    topic_id=tid,
                    partitions=[
                        FT.FetchPartition(
                            version=13,
                            partition=0,
                            current_leader_epoch=-1,
                            fetch_offset=0,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1000,
                        )
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )

    w = Wire.to(cluster, leader)
    try:
        stale = w.call(req(old_id), FetchResponse).responses[0]
        fresh = w.call(req(uuid.UUID(cluster.topic_id("t"))), FetchResponse).responses[0]
    finally:
        w.close()
    assert stale.topic_id == old_id and stale.partitions[0].error_code == 100
    assert fresh.partitions[0].error_code == 0


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_compressed_batches_pass_through(cluster: EmbeddedCluster, codec: str) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    cluster.create_topic("t")
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "compression.type": codec,
            "linger.ms": 20,
            "log_level": 0,
        }
    )
    for i in range(200):
        producer.produce("t", value=b"value-%d" % i, partition=0, timestamp=1_000 + i)
    assert producer.flush(10) == 0
    assert cluster.high_watermark("t", 0) == 200
    assert len(cluster.replica_log("t", 0, cluster.replicas("t", 0)[1]).batches) < 200
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, enable_auto_commit=False)
    tp = KTopicPartition("t", 0)
    try:
        consumer.assign([tp])
        # By timestamp inside compressed batches: the exact record, not its batch.
        found = consumer.offsets_for_times({tp: 1_150})[tp]
        assert found is not None and found.offset == 150
        consumer.seek(tp, 190)
        got: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(got) < 10 and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                got += [r.value for r in recs]
    finally:
        consumer.close()
    assert got == [b"value-%d" % i for i in range(190, 200)]


def test_snappy_batches_pass_through_with_or_without_a_codec_on_the_broker(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("t")
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "compression.type": "snappy",
            "linger.ms": 20,
            "log_level": 0,
        }
    )
    for i in range(200):
        producer.produce("t", value=b"value-%d" % i, partition=0, timestamp=1_000 + i)
    assert producer.flush(10) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "g",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        (found,) = consumer.offsets_for_times([TopicPartition("t", 0, 1_150)], timeout=10)
        if has_snappy():
            assert found.offset == 150
        else:
            # Batch granularity: at or before the exact record, never after it.
            batches = cluster.replica_log("t", 0, cluster.replicas("t", 0)[0]).batches
            assert found.offset == next(base for base, last, _ in batches if base <= 150 <= last)
        consumer.assign([TopicPartition("t", 0, 150)])
        got: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(got) < 50 and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
    finally:
        consumer.close()
    assert got == [b"value-%d" % i for i in range(150, 200)]


@pytest.mark.parametrize("version", [4, 11, 12, 13])
def test_large_batches_are_served_to_every_fetch_version(
    cluster: EmbeddedCluster, version: int
) -> None:
    # Records sections of 4 KiB and more travel as the stored batches themselves (written
    # with writev); below v12 nothing follows the last of them in the answer.
    from kafka.structs import TopicPartition as KTopicPartition

    from epochguard.consumer import EpochConsumer
    from epochguard.testing.embedded.records import build_batch

    cluster.create_topic("big")
    values = [bytes([i % 256]) * 6_000 for i in range(40)]
    for start in range(0, 40, 10):
        cluster.append_raw("big", 0, build_batch(values[start : start + 10], base_offset=start))
    consumer = EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_fetch_version=version,
    )
    got: list[bytes] = []
    try:
        consumer.assign([KTopicPartition("big", 0)])
        deadline = time.monotonic() + 20
        while len(got) < 40 and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                got += [r.value for r in recs]
    finally:
        consumer.close()
    assert got == values
