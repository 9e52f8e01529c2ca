"""``driverReadMaxOffsets`` without Spark: small micro-batches read by the source's own
process on the driver and handed to Spark with the plan, larger ones left to tasks.

Spark's source runner calls ``partitions`` and then ``getCache`` on the reader for each
batch it plans; calling them directly stages a batch deterministically.
"""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper
from pyspark.sql.streaming.datasource import ReadAllAvailable

from epochguard.spark_connector import datasource, executor
from epochguard.spark_connector.errors import SourceOptionError, SparkLogTruncationError
from epochguard.spark_connector.options import parse_options
from epochguard.testing import EmbeddedCluster
from epochguard.testing.helpers import stage_unreplicated_tail, unclean_refill

pytestmark = pytest.mark.usefixtures("empty_pool")


def options(cluster: EmbeddedCluster, **extra: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": cluster.bootstrap_servers,
        "subscribe": "t",
        "startingOffsets": "earliest",
        "kafka.metadata.max.age.ms": "300",
        "kafka.retry.backoff.ms": "20",
        **extra,
    }


def reader(cluster: EmbeddedCluster, **extra: str) -> Any:
    source = datasource.EpochGuardDataSource(options(cluster, **extra))
    return source.streamReader(None)  # type: ignore[arg-type]


def rows(batches: Any) -> list[tuple[int, int, bytes, int]]:
    out: list[tuple[int, int, bytes, int]] = []
    for batch in batches:
        d = batch.to_pydict()
        out += zip(d["partition"], d["offset"], d["value"], d["leaderEpoch"], strict=True)
    return out


def two_partitions(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"a%d" % i for i in range(6)], batch_size=2)
    cluster.append("t", 1, [b"b%d" % i for i in range(3)])


def test_a_small_batch_is_read_here_and_handed_over_with_one_partition(
    cluster: EmbeddedCluster,
) -> None:
    two_partitions(cluster)
    r = reader(cluster, driverReadMaxOffsets="9")
    plain = reader(cluster)
    try:
        # pyspark's runner hands records over for its own wrapper class only.
        assert isinstance(r, _SimpleStreamReaderWrapper)
        assert not isinstance(plain, _SimpleStreamReaderWrapper)
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        (part,) = r.partitions(start, end)
        assert isinstance(part, datasource.EpochRangesPartition)
        handed = rows(r.getCache(start, end))
        expected = rows(b for p in plain.partitions(start, end) for b in plain.read(p))
        assert handed == expected
        assert sorted(handed) == [(0, i, b"a%d" % i, 0) for i in range(6)] + [
            (1, i, b"b%d" % i, 0) for i in range(3)
        ]
        # Not handed over (Spark found no records): a task reads the one partition, and
        # a reader that only got the options on an executor reads the same.
        on_executor = pickle.loads(pickle.dumps(r))
        assert rows(on_executor.read(part)) == expected
        # Only the batch just planned is handed over, once.
        assert r.getCache(start, end) is None
    finally:
        r.stop()
        plain.stop()


def test_a_batch_above_the_limit_is_left_to_tasks(cluster: EmbeddedCluster) -> None:
    two_partitions(cluster)
    r = reader(cluster, driverReadMaxOffsets="8")
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        parts = r.partitions(start, end)
        assert [type(p) for p in parts] == [datasource.EpochRangePartition] * 2
        assert r.getCache(start, end) is None
    finally:
        r.stop()


def test_a_batch_reaching_the_byte_bound_goes_to_a_task(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_partitions(cluster)
    monkeypatch.setattr(datasource, "DRIVER_READ_MAX_BYTES", 1)
    r = reader(cluster, driverReadMaxOffsets="100")
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        (part,) = r.partitions(start, end)
        assert r.getCache(start, end) is None
        assert len(rows(r.read(part))) == 9
    finally:
        r.stop()


def test_a_truncation_after_planning_is_named_as_read_on_the_driver(
    cluster: EmbeddedCluster,
) -> None:
    old, new = stage_unreplicated_tail(cluster, "t")  # 0..9 on both, 10..14 on the leader
    r = reader(cluster, driverReadMaxOffsets="100")
    try:
        start = r.initialOffset()
        first = r.latestOffset(start, ReadAllAvailable())
        r.partitions(start, first)
        assert len(rows(r.getCache(start, first))) == 15
        # Planned [15, 18) in epoch 0 after 3 more records, then the log is rewritten.
        cluster.append("t", 0, [b"more"] * 3)
        planned = r.latestOffset(first, ReadAllAvailable())
        r.partitions(first, planned)
        unclean_refill(cluster, "t", old, new, [b"new-%d" % i for i in range(12)])
        with pytest.raises(SparkLogTruncationError) as info:
            r.getCache(first, planned)
    finally:
        r.stop()
    message = str(info.value)
    assert message.startswith("KAFKA_LOG_TRUNCATION: topic t partition 0 (t-0): divergence at")
    assert "on the driver" in message


def test_the_option_is_for_streams_and_counts_records() -> None:
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    assert parse_options(base, streaming=True).driver_read_max_offsets == 0
    assert (
        parse_options(
            {**base, "driverReadMaxOffsets": "500"}, streaming=True
        ).driver_read_max_offsets
        == 500
    )
    with pytest.raises(SourceOptionError, match=r"driverReadMaxOffsets.*streaming queries only"):
        parse_options({**base, "driverReadMaxOffsets": "500"}, streaming=False)
    with pytest.raises(SourceOptionError, match=r"driverReadMaxOffsets.*must be >= 0"):
        parse_options({**base, "driverReadMaxOffsets": "-1"}, streaming=True)


def test_handed_over_batches_are_arrow_with_the_source_schema(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, driverReadMaxOffsets="10")
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        r.partitions(start, end)
        batches = list(r.getCache(start, end))
    finally:
        r.stop()
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert batches[0].schema == executor.ARROW_SCHEMA


def test_pyspark_s_runner_hands_the_records_over(cluster: EmbeddedCluster) -> None:
    """The contract with pyspark's source runner (its ``partitions_func``, run here as Spark
    runs it): one partition, then the records as Arrow, for a small batch; the partitions
    alone, with no records, for a large one."""
    import io
    import json

    from pyspark.serializers import read_int, write_with_length
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.streaming import python_streaming_source_runner as runner

    two_partitions(cluster)
    source = datasource.EpochGuardDataSource(options(cluster, driverReadMaxOffsets="9"))
    schema = from_arrow_schema(executor.ARROW_SCHEMA)
    r = source.streamReader(schema)

    def plan(start: Any, end: Any) -> tuple[int, int]:
        infile, outfile = io.BytesIO(), io.BytesIO()
        write_with_length(json.dumps(start).encode(), infile)
        write_with_length(json.dumps(end).encode(), infile)
        infile.seek(0)
        runner.partitions_func(r, source, schema, 1000, infile, outfile)
        outfile.seek(0)
        count = read_int(outfile)
        for _ in range(count):
            outfile.read(read_int(outfile))
        return count, read_int(outfile)

    try:
        # Read limits and availableNow stay: the runner takes both from this reader.
        flags = io.BytesIO()
        runner.check_support_func(r, flags)
        flags.seek(0)
        assert read_int(flags) == (
            runner.SUPPORTS_ADMISSION_CONTROL | runner.SUPPORTS_TRIGGER_AVAILABLE_NOW
        )
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        assert plan(start, end) == (1, runner.NON_EMPTY_PYARROW_RECORD_BATCHES)
        cluster.append("t", 0, [b"c"] * 20)
        cluster.append("t", 1, [b"d"])
        later = r.latestOffset(end, ReadAllAvailable())
        assert plan(end, later) == (2, runner.PREFETCHED_RECORDS_NOT_FOUND)
    finally:
        r.stop()
