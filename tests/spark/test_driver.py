"""The driver side without Spark: the stream reader's offsets, limits and validation.

Spark calls these methods on one long-lived reader; calling them directly stages what
happens between two batches (or while the query is stopped) deterministically.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka.structs import TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from epochguard.consumer import EpochConsumer
from epochguard.offsets import EpochOffset
from epochguard.spark_connector import datasource
from epochguard.spark_connector.errors import (
    OffsetsJsonError,
    SparkLogTruncationError,
)
from epochguard.spark_connector.options import parse_options
from epochguard.testing import EmbeddedCluster
from epochguard.testing.helpers import recreate_topic


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=2) as c:
        yield c


def reader(cluster: EmbeddedCluster, **extra: str) -> datasource._StreamReader:
    opts = parse_options(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": "t",
            "startingOffsets": "earliest",
            "kafka.metadata.max.age.ms": "300",
            "kafka.retry.backoff.ms": "20",
            **extra,
        },
        streaming=True,
    )
    return datasource._StreamReader(opts)


def offsets(off: dict[str, Any]) -> dict[int, tuple[int, int | None]]:
    return {int(p): (v["offset"], v["leader_epoch"]) for p, v in off["t"].items()}


def test_max_offsets_per_trigger_plans_positions_with_epochs(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"x"] * 30)
    cluster.append("t", 1, [b"y"] * 10)
    r = reader(cluster, maxOffsetsPerTrigger="8")
    try:
        start = r.initialOffset()
        assert offsets(start) == {0: (0, None), 1: (0, None)}
        assert isinstance(r.getDefaultReadLimit(), ReadMaxRows)
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert offsets(end) == {0: (6, 0), 1: (2, 0)}  # 8 shared 30:10
        assert offsets(r.reportLatestOffset() or {}) == {0: (30, 0), 1: (10, 0)}
        parts = r.partitions(start, end)
        planned = [
            (p.partition, EpochOffset.from_json(p.start), EpochOffset.from_json(p.end))
            for p in parts
        ]
        assert planned == [
            (0, EpochOffset(0), EpochOffset(6, 0)),
            (1, EpochOffset(0), EpochOffset(2, 0)),
        ]
        rest = r.latestOffset(end, ReadAllAvailable())
        assert offsets(rest) == {0: (30, 0), 1: (10, 0)}
    finally:
        r.stop()


def test_truncation_while_stopped_fails_latest_offset(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=2)
    old = cluster.leader("t", 0)
    assert old is not None
    new = next(b for b in cluster.replicas("t", 0) if b != old)
    cluster.append("t", 0, [b"kept"] * 10, batch_size=1)
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"lost"] * 5, batch_size=1)
    r = reader(cluster)
    first = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    r.stop()
    assert offsets(first) == {0: (15, 0)}
    cluster.stop_broker(old)
    cluster.start_broker(new)
    cluster.elect_leader("t", 0, new, unclean=True)
    cluster.append("t", 0, [b"new"] * 8, batch_size=1)  # refilled past the checkpoint
    cluster.start_broker(old)
    restarted = reader(cluster)  # a new run of the query: only the checkpoint survives
    try:
        with pytest.raises(SparkLogTruncationError) as info:
            restarted.latestOffset(first, ReadAllAvailable())
    finally:
        restarted.stop()
    message = str(info.value)
    assert message.startswith("KAFKA_LOG_TRUNCATION: topic t partition 0 (t-0)")
    assert "lost range [10, 15) (5 records)" in message
    assert "on the driver" in message


def test_recreated_topic_is_a_truncation(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"old"] * 6)
    r = reader(cluster)
    checkpoint = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    r.stop()
    recreate_topic(cluster, "t", replication_factor=1)
    cluster.append("t", 0, [b"new"] * 9)  # past the checkpointed offset 6
    again = reader(cluster)
    try:
        with pytest.raises(SparkLogTruncationError) as info:
            again.latestOffset(checkpoint, ReadAllAvailable())
    finally:
        again.stop()
    assert "KAFKA_LOG_TRUNCATION: topic t partition 0" in str(info.value)


def test_checkpoint_of_other_topics_is_refused(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    r = reader(cluster)
    try:
        with pytest.raises(OffsetsJsonError) as info:
            r.latestOffset({"other": {"0": {"offset": 3, "leader_epoch": 0}}}, ReadAllAvailable())
        assert "topics ['other']" in str(info.value)
        with pytest.raises(OffsetsJsonError, match="t-0: offset -4 is negative"):
            r.partitions({"t": {"0": -4}}, {"t": {"0": 5}})
    finally:
        r.stop()


def test_min_offsets_per_trigger_holds_a_small_batch_back(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    try:
        start = r.initialOffset()
        first = r.latestOffset(start, r.getDefaultReadLimit())
        assert offsets(first) == {0: (3, 0)}  # the first batch is never held back
        cluster.append("t", 0, [b"x"] * 4)
        held = r.latestOffset(first, r.getDefaultReadLimit())
        assert held == first  # 4 < 5 waiting, an hour not passed: no batch
        cluster.append("t", 0, [b"x"])
        assert offsets(r.latestOffset(first, r.getDefaultReadLimit())) == {0: (8, 0)}
    finally:
        r.stop()


def test_available_now_reads_its_snapshot_whatever_min_offsets_says(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    try:
        start = r.initialOffset()
        first = r.latestOffset(start, r.getDefaultReadLimit())  # sets the last trigger time
        cluster.append("t", 0, [b"x"] * 2)
        r.prepareForTriggerAvailableNow()
        cluster.append("t", 0, [b"x"] * 4)  # after the snapshot: not for this run
        end = r.latestOffset(first, r.getDefaultReadLimit())
        assert offsets(end) == {0: (5, 0)}  # 2 < 5 waiting, but availableNow must finish
    finally:
        r.stop()


def test_commit_to_group_commits_end_positions_with_epochs(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"x"] * 7)
    leader = cluster.leader("t", 1)
    assert leader is not None
    cluster.elect_leader("t", 1, leader)  # partition 1 in epoch 1
    cluster.append("t", 1, [b"y"] * 3)
    r = reader(cluster, commitToGroup="true", **{"kafka.group.id": "spark-lag"})
    try:
        end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        r.commit(end)
    finally:
        r.stop()
    check = EpochConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id="spark-lag")
    try:
        committed = {p: check.committed(TopicPartition("t", p)) for p in (0, 1)}
    finally:
        check.close(autocommit=False)
    assert committed == {0: EpochOffset(7, 0), 1: EpochOffset(3, 1)}
