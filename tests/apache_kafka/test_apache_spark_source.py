"""The Spark source's driver and executor checks on real Kafka 4.x brokers (no Spark needed).

Truncation staged as in test_apache_unclean (RF=2 on brokers A=0 and B=1, acks=1): a0..a4
replicated, d0..d2 (offsets 5..7) on A only, A stopped, B elected uncleanly and refilled
past the offset the query had reached (b0..b4 at offsets 5..9).
"""

from __future__ import annotations

import itertools
import os
import time

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from epochguard.offsets import EpochOffset
from epochguard.spark_connector import datasource, executor
from epochguard.spark_connector.errors import SparkLogTruncationError
from epochguard.spark_connector.options import parse_options
from epochguard.testing import produce
from epochguard.testing.apache_kafka import ApacheKafkaCluster

pytestmark = [
    pytest.mark.spark,
    pytest.mark.timeout(240),
    pytest.mark.slow,
    pytest.mark.usefixtures("empty_pool"),
]

A, B = 0, 1
_names = itertools.count()


def reader(cluster: ApacheKafkaCluster, topic: str) -> datasource._StreamReader:
    opts = parse_options(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "kafka.metadata.max.age.ms": "500",
            "kafka.retry.backoff.ms": "50",
            "kafka.fetch.max.wait.ms": "100",
            "kafkaConsumer.pollTimeoutMs": "30000",
        },
        streaming=True,
    )
    return datasource._StreamReader(opts)


def test_truncation_refilled_past_the_checkpoint_is_caught_by_executor_and_driver(
    cluster: ApacheKafkaCluster,
) -> None:
    topic = f"spark-{os.getpid()}-{next(_names)}"
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    produce(cluster, topic, [f"a{i}" for i in range(5)])
    cluster.wait_for_partition(
        topic, 0, lambda s: s.leader == A and sorted(s.isr) == [A, B], "A leads, ISR [A, B]"
    )
    deadline = time.monotonic() + 20
    while cluster.high_watermark(topic, 0) < 5:
        assert time.monotonic() < deadline, "B did not catch up"
        time.sleep(0.05)
    first_epoch = cluster.leader_epoch(topic, 0)
    cluster.stop_broker(B)
    cluster.wait_for_isr(topic, 0, [A])
    produce(cluster, topic, ["d0", "d1", "d2"])

    # The query plans a batch to offset 8 and reads it: a0..a4, d0..d2.
    r = reader(cluster, topic)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    (part,) = r.partitions(start, end)
    r.stop()
    planned = part.range()
    assert planned.end == EpochOffset(8, first_epoch)
    table = pa.Table.from_batches(list(executor.read_range(r.opts, planned)))
    assert table.column("offset").to_pylist() == list(range(8))
    assert set(table.column("leaderEpoch").to_pylist()) == {first_epoch}

    cluster.stop_broker(A)
    cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
    cluster.start_broker(B)
    cluster.elect_leader(topic, 0, B, unclean=True)
    produce(cluster, topic, [f"b{i}" for i in range(5)])  # offsets 5..9: past 8

    # A replay of the planned batch on an executor: the records at 5.. carry a later epoch.
    with pytest.raises(SparkLogTruncationError) as info:
        list(executor.read_range(reader(cluster, topic).opts, planned))
    message = str(info.value)
    assert message.startswith(f"KAFKA_LOG_TRUNCATION: topic {topic} partition 0")
    assert "divergence at or before offset 5" in message

    # The next batch after a restart: the driver validates the checkpointed end.
    restarted = reader(cluster, topic)
    try:
        with pytest.raises(SparkLogTruncationError) as info:
            restarted.latestOffset(end, ReadAllAvailable())
    finally:
        restarted.stop()
    message = str(info.value)
    assert message.startswith(f"KAFKA_LOG_TRUNCATION: topic {topic} partition 0")
    assert "lost range [5, 8) (3 records)" in message
    assert f"divergence at 5@e{first_epoch}" in message
