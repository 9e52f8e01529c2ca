"""Spark's own Kafka source next to ours, in one SparkSession, on real Kafka 4.x brokers.

The scenario Spark's source cannot see (issue 10): RF=2 on brokers A=0 and B=1, acks=1;
a0..a4 replicated, d0..d2 (offsets 5..7) on A only; every query reads to offset 8 and
checkpoints it; A stops, B is elected uncleanly and refilled past the checkpoint (b0..b4 at
offsets 5..9). Restarted from their checkpoints, Spark's source reads on from 8 (b3, b4)
and never reads b0..b2, while d0..d2 stay in its output although the log lost them; ours
fails with ``KAFKA_LOG_TRUNCATION:`` or, with ``onTruncation=rewind``, reads the new log
from the divergence point.

Spark's connector (spark-sql-kafka-0-10, Maven Central) comes from ``make spark-jars``;
it is passed with ``spark.jars`` as the session's JVM starts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from epochguard.spark_connector import FILTER_PUSHDOWN_CONF, register
from epochguard.testing import produce
from epochguard.testing.apache_kafka import ApacheKafkaCluster, KafkaUnavailableError
from epochguard.testing.apache_kafka.pytest_support import _unavailable
from epochguard.testing.apache_kafka.spark_kafka import ensure_spark_kafka_jars
from epochguard.testing.helpers import recreate_topic
from epochguard.testing.spark_session import finish_query, local_session

pytestmark = [pytest.mark.spark, pytest.mark.timeout(420), pytest.mark.slow]

A, B = 0, 1


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    try:
        jars = ensure_spark_kafka_jars()
    except KafkaUnavailableError as exc:
        _unavailable(str(exc))
    session = local_session(
        "epochguard-side-by-side", jars=jars.extra, conf={"spark.task.maxFailures": "1"}
    )
    register(session)
    yield session
    session.stop()


def run(spark: Any, fmt: str, servers: str, topic: str, ckpt: Path, out: Path, **opts: str) -> None:
    """An availableNow query from ``fmt`` (``kafka`` or ``epochguard``) into parquet files."""
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in opts.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .select("offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    finish_query(query, 180)


def output(spark: Any, out: Path) -> list[tuple[int, str]]:
    return sorted(
        (r["offset"], bytes(r["value"]).decode()) for r in spark.read.parquet(str(out)).collect()
    )


def test_refill_past_the_checkpoint_spark_reads_on_silently_ours_does_not(
    spark: Any, cluster: ApacheKafkaCluster, tmp_path: Path
) -> None:
    topic = f"side-{os.getpid()}"
    servers = cluster.bootstrap_servers
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    produce(cluster, topic, [f"a{i}" for i in range(5)])
    cluster.wait_for_partition(
        topic, 0, lambda s: s.leader == A and sorted(s.isr) == [A, B], "A leads, ISR [A, B]"
    )
    deadline = time.monotonic() + 20
    while cluster.high_watermark(topic, 0) < 5:
        assert time.monotonic() < deadline, "B did not catch up"
        time.sleep(0.05)
    cluster.stop_broker(B)
    cluster.wait_for_isr(topic, 0, [A])
    produce(cluster, topic, ["d0", "d1", "d2"])

    queries = {
        "spark": ("kafka", {}),
        "fail": ("epochguard", {}),
        "rewind": ("epochguard", {"onTruncation": "rewind"}),
    }
    dirs = {name: (tmp_path / f"{name}-ckpt", tmp_path / f"{name}-out") for name in queries}
    before = [(i, f"a{i}") for i in range(5)] + [(5 + i, f"d{i}") for i in range(3)]
    for name, (fmt, opts) in queries.items():
        run(spark, fmt, servers, topic, *dirs[name], **opts)
        assert output(spark, dirs[name][1]) == before, name

    cluster.stop_broker(A)
    cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
    cluster.start_broker(B)
    cluster.elect_leader(topic, 0, B, unclean=True)
    produce(cluster, topic, [f"b{i}" for i in range(5)])  # offsets 5..9: past the checkpoint 8
    surviving = [(i, f"a{i}") for i in range(5)] + [(5 + i, f"b{i}") for i in range(5)]

    # Spark's source: no error; it reads 8 and 9 only. d0..d2 stay in its output though the
    # log lost them, and b0..b2 (offsets 5..7) are never read.
    run(spark, "kafka", servers, topic, *dirs["spark"])
    spark_out = output(spark, dirs["spark"][1])
    assert spark_out == [*before, (8, "b3"), (9, "b4")]
    assert not {(5 + i, f"b{i}") for i in range(3)} & set(spark_out)

    # Ours under onTruncation=fail (the default): the restart fails, nothing more is written.
    with pytest.raises(Exception) as info:
        run(spark, "epochguard", servers, topic, *dirs["fail"])
    message = str(info.value)
    assert f"KAFKA_LOG_TRUNCATION: topic {topic} partition 0" in message
    assert "lost range [5, 8) (3 records)" in message
    assert output(spark, dirs["fail"][1]) == before

    # Ours under onTruncation=rewind: the new log from the divergence point (5) on, so the
    # output is what was read before the truncation plus exactly the surviving log after it.
    run(spark, "epochguard", servers, topic, *dirs["rewind"], onTruncation="rewind")
    rewound = output(spark, dirs["rewind"][1])
    assert sorted(set(rewound) - set(before)) == [(5 + i, f"b{i}") for i in range(5)]
    assert sorted(rewound) == sorted(before + surviving[5:])
    assert set(surviving) <= set(rewound)


def test_recreated_topic_spark_reads_on_silently_ours_does_not(
    spark: Any, cluster: ApacheKafkaCluster, tmp_path: Path
) -> None:
    """The topic is deleted and created again while the queries are stopped, and the new
    topic is filled past their checkpoint (5): Spark's source, whose offsets are bare,
    reads the new topic's offsets 5 and 6 as if nothing happened; ours sees the new topic id
    and fails, or with ``onTruncation=rewind`` reads the new topic from its start."""
    topic = f"recreated-{os.getpid()}"
    servers = cluster.bootstrap_servers
    cluster.create_topic(topic, replication_factor=1)
    produce(cluster, topic, [f"old{i}" for i in range(5)])
    queries = {
        "spark": ("kafka", {}),
        "fail": ("epochguard", {}),
        "rewind": ("epochguard", {"onTruncation": "rewind"}),
    }
    dirs = {name: (tmp_path / f"{name}-ckpt", tmp_path / f"{name}-out") for name in queries}
    before = [(i, f"old{i}") for i in range(5)]
    for name, (fmt, opts) in queries.items():
        run(spark, fmt, servers, topic, *dirs[name], **opts)
        assert output(spark, dirs[name][1]) == before, name

    recreate_topic(cluster, topic, replication_factor=1)
    produce(cluster, topic, [f"new{i}" for i in range(7)])  # offsets 0..6: past 5

    run(spark, "kafka", servers, topic, *dirs["spark"])
    assert output(spark, dirs["spark"][1]) == [*before, (5, "new5"), (6, "new6")]

    with pytest.raises(Exception) as info:
        run(spark, "epochguard", servers, topic, *dirs["fail"])
    assert f"KAFKA_LOG_TRUNCATION: topic {topic} partition 0" in str(info.value)
    assert output(spark, dirs["fail"][1]) == before

    run(spark, "epochguard", servers, topic, *dirs["rewind"], onTruncation="rewind")
    assert output(spark, dirs["rewind"][1]) == sorted(before + [(i, f"new{i}") for i in range(7)])


def spark_kafka_program(
    spark: Any, fmt: str, servers: str, topic: str, ckpt: Path, name: str
) -> tuple[Any, list[tuple[Any, ...]]]:
    """A program written for Spark's Kafka source, as its documentation shows one: only
    ``fmt`` differs between the two runs. Returns the source's schema and the rows."""
    df = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        # Spark's JSON form: partition 0 from offset 2, partition 1 from the earliest (-2).
        .option("startingOffsets", json.dumps({topic: {"0": 2, "1": -2}}))
        .option("maxOffsetsPerTrigger", "7")
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .option("kafka.fetch.max.wait.ms", "100")
        .load()
    )
    query = (
        df.selectExpr(
            "CAST(key AS STRING) AS k",
            "CAST(value AS STRING) AS v",
            "topic",
            "partition",
            "offset",
            "timestamp",
            "timestampType",
            "headers",
        )
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    progress = finish_query(query, 180)
    rows = [
        (r.k, r.v, r.topic, r.partition, r.offset, r.timestamp, r.timestampType,
         None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers])
        for r in spark.table(name).collect()
    ]  # fmt: skip
    # maxOffsetsPerTrigger held: no batch above 7 rows.
    assert max(p["numInputRows"] for p in progress) <= 7, fmt
    return df.schema, sorted(rows, key=lambda r: (r[3], r[4]))


def test_a_program_for_sparks_source_runs_unchanged_with_only_the_format_name_changed(
    spark: Any, cluster: ApacheKafkaCluster, tmp_path: Path
) -> None:
    topic = f"same-{os.getpid()}"
    cluster.create_topic(topic, partitions=2, replication_factor=1)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
    try:
        for i in range(12):
            headers = [("n", b"%d" % i)] if i % 2 else []
            producer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=i % 2, headers=headers).get(
                timeout=15
            )
    finally:
        producer.close(timeout=5)

    spark_schema, spark_rows = spark_kafka_program(
        spark, "kafka", cluster.bootstrap_servers, topic, tmp_path / "spark", "same_spark"
    )
    ours_schema, ours_rows = spark_kafka_program(
        spark, "epochguard", cluster.bootstrap_servers, topic, tmp_path / "ours", "same_ours"
    )
    # The same columns and types, plus leaderEpoch at the end.
    assert ours_schema.fields[:-1] == spark_schema.fields
    assert ours_schema.fields[-1].name == "leaderEpoch"
    # Partition 0 holds i = 0, 2, .. 10 at offsets 0..5 and starts at 2; partition 1 all.
    expected = [(0, o, f"k{2 * o}") for o in range(2, 6)] + [
        (1, o, f"k{2 * o + 1}") for o in range(6)
    ]
    assert [(r[3], r[4], r[0]) for r in spark_rows] == expected
    assert ours_rows == spark_rows


def test_filtered_batch_reads_equal_sparks_source(spark: Any, cluster: ApacheKafkaCluster) -> None:
    """Filter pushdown on real Kafka: ours narrows its reads (ListOffsets by time included)
    and returns what Spark's source, which reads everything and filters, returns."""
    topic = f"pushdown-{os.getpid()}"
    cluster.create_topic(topic, partitions=2, replication_factor=1)
    # Ten minutes ago in whole seconds: a time older than retention.ms (7 days) would have
    # the broker delete the records.
    base_s = int(time.time()) - 600
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
    try:
        for i in range(60):
            # Times out of offset order: 37 s apart modulo a minute.
            ms = (base_s + (i * 37) % 60) * 1000
            producer.send(topic, b"v%d" % i, partition=i % 2, timestamp_ms=ms).get(timeout=15)
    finally:
        producer.close(timeout=5)

    def read(fmt: str, where: str) -> Any:
        reader = (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
            .option("subscribe", topic)
        )
        if fmt == "epochguard":
            reader = reader.option("filterPushdown", "true")
        return reader.load().where(where)

    def rows(df: Any) -> list[tuple[int, int, Any, bytes]]:
        return sorted(
            (r["partition"], r["offset"], r["timestamp"], bytes(r["value"])) for r in df.collect()
        )

    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")

    def at(second: int) -> str:
        t = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(base_s + second))
        return f"TIMESTAMP '{t}'"

    cases = [
        (f"timestamp >= {at(45)}", None),
        (f"timestamp > {at(20)} AND timestamp < {at(40)}", None),
        ("partition = 1 AND offset BETWEEN 3 AND 20", 1),
        (f"partition IN (0, 5) AND timestamp >= {at(59)} AND offset < 25", 1),
        (f"timestamp >= {at(59)} AND offset > 29", 0),  # nothing: the read plans no task
    ]
    for where, ours_tasks in cases:
        ours, theirs = read("epochguard", where), read("kafka", where)
        expected = rows(theirs)
        assert rows(ours) == expected, where
        if ours_tasks is not None:
            # Spark plans one task per partition it reads; an empty read gets one empty task.
            assert ours.rdd.getNumPartitions() == max(ours_tasks, 1), where
    assert len(rows(read("kafka", "offset >= 0"))) == 60
    assert len(rows(read("epochguard", f"timestamp >= {at(45)}"))) == 15
