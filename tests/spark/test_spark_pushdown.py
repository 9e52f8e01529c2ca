"""Filter pushdown in a real local[2] SparkSession against an EmbeddedCluster.

Every filtered read (``filterPushdown=true``, in a session with Spark's switch on) is
compared with the unfiltered read of the same topic filtered here, in Python: pushdown may
only change what is fetched, never the rows.
"""

from __future__ import annotations

import datetime
import operator
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from epochguard.spark_connector import FILTER_PUSHDOWN_CONF, register
from epochguard.testing import EmbeddedCluster
from epochguard.testing.spark_session import local_session
from tests.examples import scaled

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.shared_cluster]

UTC = datetime.UTC
#: Record times: BASE_MS + 0..39 ms, out of order within each partition.
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TOPIC = "pd"
PARTITIONS = 3


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session(
        "epochguard-pushdown-tests",
        conf={"spark.task.maxFailures": "1", FILTER_PUSHDOWN_CONF: "true"},
    )
    register(session)
    yield session
    session.stop()


Row = tuple[int, int, int, bytes]  # partition, offset, timestamp (ms), value


@pytest.fixture(scope="module")
def produced(module_cluster: EmbeddedCluster) -> list[Row]:
    """Three partitions of 40, 25 and 0 records whose times go back and forth, with a new
    leader epoch in the middle of partition 0."""
    c = module_cluster
    c.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1)
    out: list[Row] = []
    for p, count in enumerate([40, 25, 0]):
        for i in range(count):
            if p == 0 and i == 20:
                leader = c.leader(TOPIC, 0)
                assert leader is not None
                c.elect_leader(TOPIC, 0, leader)
            ms = BASE_MS + (i * 17 + p * 5) % 40
            value = b"p%d-%d" % (p, i)
            c.append(TOPIC, p, [value], timestamp_ms=ms)
            out.append((p, i, ms, value))
    return out


def load(spark: SparkSession, cluster: EmbeddedCluster, **options: str) -> Any:
    reader = (
        spark.read.format("epochguard")
        .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
        .option("subscribe", TOPIC)
        .option("filterPushdown", "true")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def collected(df: Any) -> list[Row]:
    cols = df.selectExpr("partition", "offset", "unix_millis(timestamp) AS ms", "value")
    return sorted((r["partition"], r["offset"], r["ms"], bytes(r["value"])) for r in cols.collect())


def sql_time(us: int) -> str:
    t = datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(microseconds=us)
    return f"TIMESTAMP '{t.strftime('%Y-%m-%d %H:%M:%S.%f')}'"


# A condition: its SQL and the same test on a produced row.
Cond = tuple[str, Any]

_CMP: dict[str, Callable[[int, int], bool]] = {
    "=": operator.eq,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


@st.composite
def conditions(draw: st.DrawFn) -> Cond:
    kind = draw(st.sampled_from(["partition", "offset", "timestamp", "between", "in", "other"]))
    if kind == "other":  # not pushed: Spark alone applies it
        n = draw(st.integers(0, 30))
        return f"value <> 'p0-{n}'", lambda r: r[3] != b"p0-%d" % n
    if kind == "in":
        column = draw(st.sampled_from(["partition", "offset"]))
        values = draw(
            st.lists(st.integers(-1, 42 if column == "offset" else 3), min_size=1, max_size=4)
        )
        index = 0 if column == "partition" else 1
        sql = f"{column} IN ({', '.join(map(str, values))})"
        return sql, lambda r: r[index] in values
    if kind == "between":
        lo, hi = sorted(draw(st.lists(st.integers(-2, 45), min_size=2, max_size=2)))
        return f"offset BETWEEN {lo} AND {hi}", lambda r: lo <= r[1] <= hi
    op = draw(st.sampled_from(sorted(_CMP)))
    test = _CMP[op]
    if kind == "timestamp":
        # Whole milliseconds and not, around and outside the records' times.
        us = draw(st.integers((BASE_MS - 3) * 1000, (BASE_MS + 43) * 1000))
        return f"timestamp {op} {sql_time(us)}", lambda r: test(r[2] * 1000, us)
    value = draw(st.integers(-1, 42 if kind == "offset" else 3))
    index = 0 if kind == "partition" else 1
    return f"{kind} {op} {value}", lambda r: test(r[index], value)


@settings(max_examples=scaled(12), deadline=None)
@given(conds=st.lists(conditions(), min_size=1, max_size=4))
def test_filtered_reads_equal_the_unfiltered_read_filtered(
    spark: SparkSession, module_cluster: EmbeddedCluster, produced: list[Row], conds: list[Cond]
) -> None:
    where = " AND ".join(sql for sql, _ in conds)
    expected = sorted(r for r in produced if all(test(r) for _, test in conds))
    assert collected(load(spark, module_cluster).where(where)) == expected, where


def test_the_unfiltered_read_is_what_was_produced(
    spark: SparkSession, module_cluster: EmbeddedCluster, produced: list[Row]
) -> None:
    assert collected(load(spark, module_cluster)) == sorted(produced)


def test_pushed_filters_plan_fewer_tasks_and_spark_still_filters_times(
    spark: SparkSession, module_cluster: EmbeddedCluster, produced: list[Row]
) -> None:
    df = load(spark, module_cluster, maxRecordsPerPartition="5")
    assert df.rdd.getNumPartitions() == 8 + 5
    one = df.where("partition = 1 AND offset >= 5 AND offset < 15")
    assert one.rdd.getNumPartitions() == 2
    assert collected(one) == [r for r in sorted(produced) if r[0] == 1 and 5 <= r[1] < 15]
    late = df.where(f"timestamp >= {sql_time((BASE_MS + 30) * 1000)}")
    plan = late._jdf.queryExecution().executedPlan().toString()
    # The time bound narrows the read but goes back to Spark: times are not in order.
    assert "Filter" in plan and "timestamp" in plan, plan
    assert collected(late) == sorted(r for r in produced if r[2] >= BASE_MS + 30)
    nothing = df.where("partition = 7")
    assert collected(nothing) == []


def test_a_session_with_sparks_switch_off(
    spark: SparkSession, module_cluster: EmbeddedCluster, produced: list[Row]
) -> None:
    spark.conf.set(FILTER_PUSHDOWN_CONF, "false")
    try:
        with pytest.raises(Exception, match="DATA_SOURCE_PUSHDOWN_DISABLED"):
            load(spark, module_cluster).where("partition = 0").collect()
        rows = collected(load(spark, module_cluster, filterPushdown="false").where("partition = 0"))
        assert rows == sorted(r for r in produced if r[0] == 0)
    finally:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")


def test_spark_keeps_the_pushed_plan_for_later_queries_of_the_dataframe(
    spark: SparkSession, module_cluster: EmbeddedCluster, produced: list[Row]
) -> None:
    """Why pushdown is off by default: pyspark 4.3.0 keeps a batch read's plan (its tasks)
    on the DataFrame's source, and a query whose filters reach the source plans again, but
    one with none keeps the last plan: after ``where("partition = 0")``, ``count()`` on the
    same DataFrame reads partition 0 only. When this fails, Spark plans each query afresh
    and the default can change."""
    df = load(spark, module_cluster)
    zero = collected(df.where("partition = 0"))
    assert zero == sorted(r for r in produced if r[0] == 0)
    assert collected(df) == zero  # not every row: the pushed plan was kept
    assert len(collected(load(spark, module_cluster))) == len(produced)


def test_streams_take_no_filters(
    spark: SparkSession, module_cluster: EmbeddedCluster, produced: list[Row], tmp_path: Any
) -> None:
    df = (
        spark.readStream.format("epochguard")
        .option("kafka.bootstrap.servers", module_cluster.bootstrap_servers)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .where("partition = 0 AND offset >= 30")
    )
    query = (
        df.writeStream.format("memory")
        .queryName("pushdown_stream")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    rows = collected(spark.table("pushdown_stream"))
    assert rows == sorted(r for r in produced if r[0] == 0 and r[1] >= 30)


def test_a_read_that_plans_no_task_returns_no_rows(
    spark: SparkSession, module_cluster: EmbeddedCluster
) -> None:
    # Spark reads one InputPartition(None) when a batch read plans no task.
    module_cluster.create_topic("pd-empty", partitions=1, replication_factor=1)
    for pushdown in ("false", "true"):
        df = load(spark, module_cluster, subscribe="pd-empty", filterPushdown=pushdown)
        assert collected(df) == []
