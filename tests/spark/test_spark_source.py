"""The data source in a real local[2] SparkSession against an EmbeddedCluster.

One SparkSession for the module (starting one costs 5-12 s); each test uses its own topics.
"""

from __future__ import annotations

import importlib
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.structs import TopicPartition
from pyspark.sql import SparkSession

from epochguard.consumer import EpochConsumer
from epochguard.spark_connector import register
from epochguard.testing import EmbeddedCluster

# Each test uses its own topics: one cluster (and one SparkSession) for the module.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.shared_cluster]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with pytest.MonkeyPatch.context() as mp:
        # Workers must run this interpreter (pyarrow, the package); the hostname may
        # resolve to an address that is not reachable from here.
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        mp.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        session = (
            SparkSession.builder.master("local[2]")
            .appName("epochguard-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.task.maxFailures", "1")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        register(session)
        yield session
        session.stop()


def kafka_log(cluster: EmbeddedCluster, topic: str, partitions: int) -> list[tuple[Any, ...]]:
    """(partition, offset, key, value, leader_epoch) of every record, read back."""
    consumer = EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        out: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + 20
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read the topic back"
            for recs in consumer.poll(timeout_ms=200).values():
                out += [(r.partition, r.offset, r.key, r.value, r.leader_epoch) for r in recs]
        return sorted(out)
    finally:
        consumer.close(autocommit=False)


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (r["partition"], r["offset"], r["key"], r["value"], r["leaderEpoch"]) for r in df.collect()
    )


def source(spark: SparkSession, cluster: EmbeddedCluster, topic: str, stream: bool) -> Any:
    reader = spark.readStream if stream else spark.read
    return (
        reader.format("epochguard")
        .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
        .option("subscribe", topic)
    )


def test_batch_read_equals_what_was_produced(spark: SparkSession, cluster: EmbeddedCluster) -> None:
    cluster.create_topic("batch", partitions=2, replication_factor=1)
    cluster.append("batch", 0, [(b"k%d" % i, b"v%d" % i) for i in range(30)], batch_size=7)
    cluster.append("batch", 1, [b"w%d" % i for i in range(12)])
    leader = cluster.leader("batch", 1)
    assert leader is not None
    cluster.elect_leader("batch", 1, leader)  # a later epoch for the records after this
    cluster.append("batch", 1, [(None, b"after", [("h", b"x")])])
    produced = kafka_log(cluster, "batch", 2)
    assert len(produced) == 43
    df = source(spark, cluster, "batch", stream=False).option("minPartitions", "5").load()
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "leaderEpoch",
    ]
    # Spark returns binary as bytearray, which compares equal to bytes.
    assert rows(df) == produced
    assert len({e for p, _, _, _, e in produced if p == 1}) == 2  # leaderEpoch is per record
    assert {r["topic"] for r in df.select("topic").collect()} == {"batch"}
    headers = source(spark, cluster, "batch", stream=False).option("includeHeaders", "true")
    last = headers.load().where("partition = 1 and value = 'after'").collect()
    assert [(h["key"], bytes(h["value"])) for h in last[0]["headers"]] == [("h", b"x")]


def test_batch_read_with_ending_offsets(spark: SparkSession, cluster: EmbeddedCluster) -> None:
    cluster.create_topic("ends", partitions=1, replication_factor=1)
    cluster.append("ends", 0, [b"%d" % i for i in range(20)], batch_size=3)
    df = (
        source(spark, cluster, "ends", stream=False)
        .option("startingOffsets", '{"ends": {"0": 5}}')
        .option("endingOffsets", '{"ends": {"0": 12}}')
        .load()
    )
    assert sorted(r["offset"] for r in df.collect()) == list(range(5, 12))


def failure(spark: SparkSession, stream: bool, **options: str) -> str:
    """The message of what a batch read, or an availableNow stream, with ``options`` raises."""
    reader = (spark.readStream if stream else spark.read).format("epochguard")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as info:
        if stream:
            query = reader.load().writeStream.format("noop").trigger(availableNow=True).start()
            try:
                query.awaitTermination(120)
            finally:
                query.stop()
        else:
            reader.load().collect()
    return str(info.value)


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()  # nothing listens there: every connection is refused
    return port


@pytest.mark.parametrize("stream", [False, True], ids=["batch", "stream"])
@pytest.mark.parametrize("case", ["option", "unreachable", "missing_topic"])
def test_errors_reach_the_user_on_the_first_line(
    spark: SparkSession, cluster: EmbeddedCluster, case: str, stream: bool
) -> None:
    topic = f"errs-{case}-{stream}"
    cluster.create_topic(topic, partitions=1, replication_factor=1)
    options = {"kafka.bootstrap.servers": cluster.bootstrap_servers, "subscribe": topic}
    if case == "option":
        options["maxOffsetPerTrigger"] = "5"
        # Spark hands the options over lower-cased.
        expected = (
            "SourceOptionError: option 'maxoffsetpertrigger': unknown option for the "
            "epochguard source (did you mean 'maxOffsetsPerTrigger'?)"
        )
    elif case == "unreachable":
        servers = f"127.0.0.1:{closed_port()},127.0.0.1:{closed_port()}"
        options["kafka.bootstrap.servers"] = servers
        expected = (
            f"SparkUnreachableError: KAFKA_UNREACHABLE: cannot connect to {servers}: every "
            "bootstrap server refused the connection"
        )
    else:
        options.update(subscribe=f"{topic},no-such-topic", failOnMissingTopic="true")
        expected = (
            "SparkMissingTopicError: KAFKA_MISSING_TOPIC: subscribed topic no-such-topic "
            "does not exist (failOnMissingTopic=true)"
        )
    message = failure(spark, stream, **options)
    assert expected in message.splitlines()[0], message
    # Nothing after it from pyspark: no Python traceback, no error of its own.
    assert "Traceback" not in message and "UnboundLocalError" not in message, message


def test_a_missing_topic_is_read_once_it_exists(
    spark: SparkSession, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    df = source(spark, cluster, "later", stream=True).option("startingOffsets", "earliest")
    query = (
        df.load()
        .writeStream.format("memory")
        .queryName("later_out")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        # A trigger has run and found nothing to read (there is no batch without records).
        while query.lastProgress is None:
            assert time.monotonic() < deadline and query.exception() is None
            time.sleep(0.2)
        assert spark.table("later_out").count() == 0
        cluster.create_topic("later", partitions=1, replication_factor=1)
        cluster.append("later", 0, [b"a", b"b", b"c"])
        while spark.table("later_out").count() < 3:
            assert time.monotonic() < deadline and query.exception() is None
            time.sleep(0.2)
        assert sorted(bytes(r["value"]) for r in spark.table("later_out").collect()) == [
            b"a",
            b"b",
            b"c",
        ]
    finally:
        query.stop()


def run_stream(
    spark: SparkSession,
    cluster: EmbeddedCluster,
    topic: str,
    checkpoint: Path,
    sink: str | Path,
    **options: str,
) -> None:
    """An availableNow query to the end of the topic, into a memory table (``sink`` is a
    name) or parquet files (``sink`` is a path: that sink recovers from a checkpoint)."""
    df = source(spark, cluster, topic, stream=True)
    for k, v in options.items():
        df = df.option(k, v)
    writer = df.load().writeStream.option("checkpointLocation", str(checkpoint))
    if isinstance(sink, Path):
        writer = writer.format("parquet").option("path", str(sink))
    else:
        writer = writer.format("memory").queryName(sink)
    query = writer.trigger(availableNow=True).start()
    try:
        query.awaitTermination(120)
        error = query.exception()
        if error is not None:
            raise error
    finally:
        query.stop()


def test_stream_available_now_into_memory(
    spark: SparkSession, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    cluster.create_topic("stream", partitions=2, replication_factor=1)
    cluster.append("stream", 0, [b"a%d" % i for i in range(25)], batch_size=4)
    cluster.append("stream", 1, [b"b%d" % i for i in range(10)])
    checkpoint = tmp_path / "ckpt"
    run_stream(
        spark,
        cluster,
        "stream",
        checkpoint,
        "first",
        startingOffsets="earliest",
        maxOffsetsPerTrigger="10",
    )
    assert rows(spark.table("first")) == kafka_log(cluster, "stream", 2)
    batches = sorted(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    assert len(batches) >= 4  # 35 records, at most 10 (+1 per partition) a batch
    # The offsets Spark checkpointed are ours: positions with epochs.
    assert '"leader_epoch": 0' in batches[-1].read_text()


def test_restart_from_checkpoint_without_gaps_or_duplicates(
    spark: SparkSession, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    cluster.create_topic("restart", partitions=2, replication_factor=1)
    cluster.append("restart", 0, [b"a%d" % i for i in range(25)], batch_size=4)
    cluster.append("restart", 1, [b"b%d" % i for i in range(10)])
    checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
    run_stream(spark, cluster, "restart", checkpoint, out, startingOffsets="earliest")
    first = rows(spark.read.parquet(str(out)))
    assert first == kafka_log(cluster, "restart", 2)
    cluster.append("restart", 0, [b"c%d" % i for i in range(6)])
    cluster.append("restart", 1, [b"d%d" % i for i in range(3)])
    run_stream(spark, cluster, "restart", checkpoint, out, startingOffsets="earliest")
    both = rows(spark.read.parquet(str(out)))
    assert both == kafka_log(cluster, "restart", 2)  # no duplicates, no gaps
    assert len(both) == len(first) + 9


def test_truncation_while_stopped_fails_the_restart(spark: SparkSession, tmp_path: Path) -> None:
    with EmbeddedCluster(brokers=2) as cluster:
        cluster.create_topic("trunc", partitions=1, replication_factor=2)
        old = cluster.leader("trunc", 0)
        assert old is not None
        new = next(b for b in cluster.replicas("trunc", 0) if b != old)
        cluster.append("trunc", 0, [b"kept-%d" % i for i in range(10)], batch_size=1)
        cluster.stop_broker(new)  # the next records live on the old leader only
        cluster.append("trunc", 0, [b"lost-%d" % i for i in range(5)], batch_size=1)
        checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
        run_stream(spark, cluster, "trunc", checkpoint, out, startingOffsets="earliest")
        assert len(spark.read.parquet(str(out)).collect()) == 15
        # While the query is stopped: unclean election, the new leader refills past 15.
        cluster.stop_broker(old)
        cluster.start_broker(new)
        cluster.elect_leader("trunc", 0, new, unclean=True)
        cluster.append("trunc", 0, [b"new-%d" % i for i in range(8)], batch_size=1)
        cluster.start_broker(old)
        with pytest.raises(Exception) as info:
            run_stream(spark, cluster, "trunc", checkpoint, out)
        message = str(info.value)
        first = message.splitlines()[0]
        assert "KAFKA_LOG_TRUNCATION: topic trunc partition 0" in first, message
        assert "Traceback" not in message, message
        assert "divergence at 10" in message
        assert "lost range [10, 15)" in message
        # Nothing of the new log was written under the old one's offsets.
        assert len(spark.read.parquet(str(out)).collect()) == 15


def test_processing_time_trigger_starts_at_latest_and_reads_what_comes(
    spark: SparkSession, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    cluster.create_topic("live", partitions=2, replication_factor=1)
    cluster.append("live", 0, [b"before-%d" % i for i in range(5)])
    query = (
        source(spark, cluster, "live", stream=True)  # startingOffsets: latest by default
        .load()
        .writeStream.format("memory")
        .queryName("live")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        assert spark.table("live").count() == 0
        cluster.append("live", 0, [b"a-%d" % i for i in range(4)])
        cluster.append("live", 1, [b"b-%d" % i for i in range(3)])
        query.processAllAvailable()
        got = rows(spark.table("live"))
        new = [r for r in kafka_log(cluster, "live", 2) if not r[3].startswith(b"before")]
        assert got == new
        assert len(got) == 7
    finally:
        query.stop()


def test_example_fails_the_restart_after_a_truncation(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    module = importlib.import_module("spark_stream")
    try:
        assert module.main([]) == 0  # getOrCreate: it runs on this module's session
    finally:
        sys.modules.pop("spark_stream", None)
    out = capsys.readouterr().out
    assert "first run: 15 orders" in out
    assert "restart failed as it should: " in out
    assert "KAFKA_LOG_TRUNCATION: topic orders partition 0" in out


def test_rewind_after_truncation_while_stopped(spark: SparkSession, tmp_path: Path) -> None:
    with EmbeddedCluster(brokers=2) as cluster:
        cluster.create_topic("rew", partitions=1, replication_factor=2)
        old = cluster.leader("rew", 0)
        assert old is not None
        new = next(b for b in cluster.replicas("rew", 0) if b != old)
        cluster.append("rew", 0, [b"kept-%d" % i for i in range(10)], batch_size=1)
        cluster.stop_broker(new)
        cluster.append("rew", 0, [b"lost-%d" % i for i in range(5)], batch_size=1)
        checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
        opts = {"startingOffsets": "earliest", "onTruncation": "rewind"}
        run_stream(spark, cluster, "rew", checkpoint, out, **opts)
        cluster.stop_broker(old)
        cluster.start_broker(new)
        cluster.elect_leader("rew", 0, new, unclean=True)
        cluster.append("rew", 0, [b"new-%d" % i for i in range(8)], batch_size=1)
        cluster.start_broker(old)
        run_stream(spark, cluster, "rew", checkpoint, out, **opts)
        got = sorted(
            (r["offset"], bytes(r["value"])) for r in spark.read.parquet(str(out)).collect()
        )
    # What was read before the truncation, then the new log from the divergence point on.
    expected = (
        [(i, b"kept-%d" % i) for i in range(10)]
        + [(10 + i, b"lost-%d" % i) for i in range(5)]
        + [(10 + i, b"new-%d" % i) for i in range(8)]
    )
    assert got == sorted(expected)


def stream_latest_then_restart(
    spark: SparkSession, cluster: EmbeddedCluster, topic: str, checkpoint: Path, **options: str
) -> tuple[list[bytes], str | None]:
    """A stream that starts at ``latest`` and stops before its first batch commits, records
    produced while it is stopped, and a restart from its checkpoint (availableNow): the
    values the restart reads and its failure, if any."""
    cluster.create_topic(topic, partitions=2, replication_factor=1)
    cluster.append(topic, 0, [b"before-%d" % i for i in range(5)])
    df = source(spark, cluster, topic, stream=True)
    for k, v in options.items():
        df = df.option(k, v)

    def fail(batch: Any, batch_id: int) -> None:
        raise RuntimeError(f"batch {batch_id} is not committed")

    first = (
        df.load()
        .writeStream.foreachBatch(fail)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        # A trigger has resolved the start (a batch 0, if Spark ran one, failed).
        while first.lastProgress is None and first.exception() is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        first.stop()
    assert not (checkpoint / "commits" / "0").exists()
    cluster.append(topic, 0, [b"after-a%d" % i for i in range(4)])
    cluster.append(topic, 1, [b"after-b%d" % i for i in range(3)])
    seen: list[bytes] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend(bytes(r["value"]) for r in batch.collect())

    again = (
        df.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        try:
            again.awaitTermination(120)
        except Exception as exc:  # the restart failed: what it says is the result
            error: Exception | None = exc
        else:
            error = None
    finally:
        again.stop()
    return sorted(seen), None if error is None else str(error)


AFTER = sorted([b"after-a%d" % i for i in range(4)] + [b"after-b%d" % i for i in range(3)])


def test_a_latest_start_survives_a_restart_before_the_first_commit(
    spark: SparkSession, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "ckpt"
    seen, error = stream_latest_then_restart(
        spark,
        cluster,
        "late-kept",
        checkpoint,
        initialOffsetsPath=str(checkpoint / "epochguard-initial-offsets.json"),
    )
    assert error is None
    assert seen == AFTER  # nothing skipped, nothing from before the first start


def test_without_initial_offsets_path_a_restart_before_the_first_commit_cannot_go_on(
    spark: SparkSession, cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    # The limit the option exists for: Spark ran an empty first batch (offsets/0) that did
    # not commit, asks the restarted source for its initial offsets again and tells it
    # nothing of the checkpoint, so "latest" is resolved anew, past that batch's end.
    checkpoint = tmp_path / "ckpt"
    seen, error = stream_latest_then_restart(spark, cluster, "late-lost", checkpoint)
    assert [p.name for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()] == ["0"]
    assert seen == [] and error is not None
    first = error.splitlines()[0]
    assert "option 'initialOffsetsPath': the query restarted before its first batch" in first
    assert "late-lost-0 at 9 (planned end 5)" in first, error
    assert "Traceback" not in error, error
