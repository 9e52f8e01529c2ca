"""The executor side without Spark: read_range on an EmbeddedCluster, truncations included.

Spark only calls ``read()`` with a partition; these tests call what it calls, so the
truncation that happens between planning (the driver) and reading (an executor) can be
staged deterministically.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pyarrow as pa
import pytest
from kafka.structs import TopicPartition

from epochguard.offsets import EpochOffset
from epochguard.spark_connector import datasource, executor
from epochguard.spark_connector import driver as driver_side
from epochguard.spark_connector.errors import SparkDataLossError, SparkLogTruncationError
from epochguard.spark_connector.options import SourceOptions, parse_options
from epochguard.spark_connector.planning import OffsetRange
from epochguard.testing import EmbeddedCluster
from epochguard.testing.helpers import recreate_topic, stage_unreplicated_tail, unclean_refill

TP = TopicPartition("t", 0)

pytestmark = pytest.mark.usefixtures("empty_pool")


def options(cluster: EmbeddedCluster, **extra: str) -> SourceOptions:
    return parse_options(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": "t",
            "kafka.metadata.max.age.ms": "300",
            "kafka.retry.backoff.ms": "20",
            "kafka.fetch.max.wait.ms": "100",
            **extra,
        },
        streaming=True,
    )


def staged(cluster: EmbeddedCluster) -> tuple[int, int]:
    """10 records on both replicas, then 5 (offsets 10..14, epoch 0) on the leader only."""
    return stage_unreplicated_tail(cluster, "t")


def unclean(cluster: EmbeddedCluster, old: int, new: int, fresh: int) -> None:
    unclean_refill(cluster, "t", old, new, [b"new-%d" % i for i in range(fresh)])


def read_all(opts: SourceOptions, rng: OffsetRange) -> pa.Table:
    batches = list(executor.read_range(opts, rng))
    return pa.Table.from_batches(batches) if batches else pa.table({})


def test_reads_exactly_the_range_in_arrow_batches(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append(
        "t", 0, [(b"k%d" % i, b"v%d" % i) for i in range(40)], batch_size=6, timestamp_ms=1234
    )
    monkeypatch.setattr(executor, "_BATCH_ROWS", 7)
    opts = options(cluster)
    batches = list(executor.read_range(opts, OffsetRange(TP, EpochOffset(3), EpochOffset(31, 0))))
    assert all(b.schema == executor.ARROW_SCHEMA for b in batches)
    assert [b.num_rows for b in batches] == [7, 7, 7, 7]
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(3, 31))
    assert table.column("value").to_pylist() == [b"v%d" % i for i in range(3, 31)]
    assert table.column("key").to_pylist() == [b"k%d" % i for i in range(3, 31)]
    assert set(table.column("topic").to_pylist()) == {"t"}
    assert set(table.column("partition").to_pylist()) == {0}
    assert set(table.column("leaderEpoch").to_pylist()) == {0}
    assert {t.timestamp() for t in table.column("timestamp").to_pylist()} == {1.234}
    assert set(table.column("timestampType").to_pylist()) == {0}


def test_headers_are_null_for_records_without_headers_as_in_sparks_source(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [(b"k0", b"v0", [("h", b"x"), ("n", None)]), (b"k1", b"v1", [])])
    opts = options(cluster, includeHeaders="true")
    table = read_all(opts, OffsetRange(TP, EpochOffset(0), EpochOffset(2, 0)))
    assert table.column("headers").to_pylist() == [
        [{"key": "h", "value": b"x"}, {"key": "n", "value": None}],
        None,
    ]
    assert table.column("value").to_pylist() == [b"v0", b"v1"]


def test_executor_fetch_settings_default_to_large_fetches_and_short_waits() -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    kw = executor._executor_kwargs(parse_options(base, streaming=True))
    assert kw["max_partition_fetch_bytes"] == executor.EXECUTOR_FETCH_BYTES == 8 << 20
    assert kw["fetch_max_wait_ms"] == executor.EXECUTOR_FETCH_WAIT_MS == 20
    assert kw["record_format"] == "columns"
    given = {
        **base,
        "kafka.max.partition.fetch.bytes": "1048576",
        "kafka.fetch.max.wait.ms": "500",
        "includeHeaders": "true",
    }
    kw = executor._executor_kwargs(parse_options(given, streaming=True))
    assert (kw["max_partition_fetch_bytes"], kw["fetch_max_wait_ms"]) == (1048576, 500)
    assert (kw["record_format"], kw["column_headers"]) == ("columns", True)


def test_consumers_are_reused_per_configuration(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 5)
    opts = options(cluster)
    read_all(opts, OffsetRange(TP, EpochOffset(0), EpochOffset(2, 0)))
    (pooled,) = [c for cs in executor._POOL.values() for c in cs]
    assert read_all(opts, OffsetRange(TP, EpochOffset(2), EpochOffset(5, 0))).num_rows == 3
    assert [c for cs in executor._POOL.values() for c in cs] == [pooled]
    # includeHeaders decodes the headers into the column buffers too: a consumer of its
    # own, reused in turn; the one without headers stays pooled.
    other = options(cluster, includeHeaders="true")
    read_all(other, OffsetRange(TP, EpochOffset(0), EpochOffset(1, 0)))
    pool = [c for cs in executor._POOL.values() for c in cs]
    assert len(pool) == 2 and pooled in pool
    (with_headers,) = [c for c in pool if c is not pooled]
    assert with_headers.config["record_format"] == pooled.config["record_format"] == "columns"
    assert (with_headers.config["column_headers"], pooled.config["column_headers"]) == (True, False)
    read_all(other, OffsetRange(TP, EpochOffset(1), EpochOffset(2, 0)))
    assert sorted(map(id, (c for cs in executor._POOL.values() for c in cs))) == sorted(
        map(id, pool)
    )


def test_truncation_between_planning_and_reading_is_caught_by_epochs(
    cluster: EmbeddedCluster,
) -> None:
    old, new = staged(cluster)
    # The driver planned [5, 15) while epoch 0 led; then an unclean election and a refill
    # past 15 under epoch 1, before the executor reads.
    planned = OffsetRange(TP, EpochOffset(5, 0), EpochOffset(15, 0))
    unclean(cluster, old, new, fresh=8)
    with pytest.raises(SparkLogTruncationError) as info:
        read_all(options(cluster), planned)
    message = str(info.value)
    assert message.startswith("KAFKA_LOG_TRUNCATION: topic t partition 0 (t-0)")
    assert "divergence at or before offset 10" in message
    assert "lost range [10, 15) at most" in message
    assert not executor._POOL.get(
        executor._pool_key(executor._executor_kwargs(options(cluster)))
    ), "a consumer that failed is not reused"


def test_truncation_below_the_planned_end_without_refill(cluster: EmbeddedCluster) -> None:
    old, new = staged(cluster)
    planned = OffsetRange(TP, EpochOffset(5, 0), EpochOffset(15, 0))
    unclean(cluster, old, new, fresh=0)
    with pytest.raises(SparkLogTruncationError) as info:
        read_all(options(cluster), planned)
    assert "the log now ends at 10, before the planned end 15" in str(info.value)
    assert "lost range [10, 15) at most" in str(info.value)


def test_start_position_gone_is_caught_before_fetching(cluster: EmbeddedCluster) -> None:
    old, new = staged(cluster)
    # A replay after a restart: the range starts at 12 (read under epoch 0 up to 12).
    planned = OffsetRange(TP, EpochOffset(12, 0), EpochOffset(15, 0))
    unclean(cluster, old, new, fresh=8)
    with pytest.raises(SparkLogTruncationError) as info:
        read_all(options(cluster), planned)
    message = str(info.value)
    assert message.startswith("KAFKA_LOG_TRUNCATION: topic t partition 0 (t-0)")
    assert "divergence at 10@e0" in message or "divergence at 10@e" in message
    assert "lost range [10, 12) (2 records)" in message


def test_stream_reader_pickles_only_its_options(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    reader = datasource._StreamReader(options(cluster, startingOffsets="earliest"))
    initial = reader.initialOffset()
    position = initial["t"]["0"]
    assert (position["offset"], position["leader_epoch"]) == (0, None)
    assert len(position["topic_id"]) == 36  # the topic's incarnation travels with it
    assert reader._driver is not None and reader._driver._consumer is not None
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.opts == reader.opts
    assert clone._driver is None
    reader.stop()


def test_records_removed_by_retention_follow_fail_on_data_loss(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"%d" % i for i in range(10)], batch_size=1)
    cluster.delete_records("t", 0, 5)  # retention: 0..4 are gone
    planned = OffsetRange(TP, EpochOffset(2, 0), EpochOffset(8, 0))
    with pytest.raises(SparkDataLossError) as info:
        read_all(options(cluster), planned)
    message = str(info.value)
    assert message.startswith("Some data may have been lost because they are not available")
    assert 'set the source option "failOnDataLoss" to "false"' in message
    assert "t-0" in message
    table = read_all(options(cluster, failOnDataLoss="false"), planned)
    assert table.column("offset").to_pylist() == [5, 6, 7]
    gone = OffsetRange(TP, EpochOffset(0, 0), EpochOffset(4, 0))
    assert read_all(options(cluster, failOnDataLoss="false"), gone).num_rows == 0


def test_truncation_message_says_record_or_records() -> None:
    from epochguard.offsets.report import DetectedBy, TruncationReport

    def message(consumed_to: int) -> str:
        report = TruncationReport(
            TopicPartition("t", 0),
            EpochOffset(consumed_to, 1),
            EpochOffset(10, 1),
            DetectedBy.DIVERGING_EPOCH,
            2,
        )
        return driver_side.truncation_message(report, "in the batch")

    assert "lost range [10, 11) (1 record);" in message(11)
    assert "lost range [10, 12) (2 records);" in message(12)


OFFSET_FOR_LEADER_EPOCH = 23


def validations(cluster: EmbeddedCluster) -> int:
    return sum(
        n for (key, _v), n in cluster.requests_seen().items() if key == OFFSET_FOR_LEADER_EPOCH
    )


def test_a_range_planned_in_one_epoch_is_fetched_without_validating_its_start(
    cluster: EmbeddedCluster,
) -> None:
    """The driver found the start valid in the epoch it planned the end in: the task
    fetches at once. A range whose start has an older epoch is validated first."""
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"%d" % i for i in range(10)], batch_size=2)
    before = validations(cluster)
    same = OffsetRange(TP, EpochOffset(4, 0), EpochOffset(10, 0))
    assert read_all(options(cluster), same).column("offset").to_pylist() == list(range(4, 10))
    assert validations(cluster) == before
    leader = cluster.leader("t", 0)
    assert leader is not None
    cluster.elect_leader("t", 0, leader)  # the same broker again, in epoch 1
    cluster.append("t", 0, [b"later"] * 2)
    older = OffsetRange(TP, EpochOffset(6, 0), EpochOffset(12, 1))
    assert read_all(options(cluster), older).column("offset").to_pylist() == list(range(6, 12))
    assert validations(cluster) > before


def test_a_recreated_topic_is_caught_on_a_range_planned_in_one_epoch(
    cluster: EmbeddedCluster,
) -> None:
    # The new topic's records carry epoch 0 like the planned range's: only the topic id
    # tells the logs apart, and the fetch that skips validation still checks it.
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"old"] * 6)
    driver = driver_side.Driver(options(cluster))
    try:
        (end,) = driver.latest([TP]).values()
    finally:
        driver.close()
    assert end.topic_id is not None
    planned = OffsetRange(TP, EpochOffset(2, 0, topic_id=end.topic_id), end)
    recreate_topic(cluster, "t", replication_factor=1)
    cluster.append("t", 0, [b"new"] * 9)
    with pytest.raises(SparkLogTruncationError) as info:
        read_all(options(cluster), planned)
    assert str(info.value) == (
        "KAFKA_LOG_TRUNCATION: topic t partition 0 (t-0): divergence at 0@e?, lost range "
        "[0, 2) (2 records); while reading planned range [2@e0, 6@e0) on an executor"
    )


def test_a_range_of_one_arrow_batch_is_read_without_a_reading_thread(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A micro-batch of a running query is small: it is handed over in one Arrow batch at
    its end, so it is read on the calling thread. A range of several batches fetches ahead
    on a thread of its own. Both give the same rows; an abandoned read is never reused."""
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"v%d" % i for i in range(30)], batch_size=4)
    ahead: list[str] = []
    fetch_ahead = executor._fetch_ahead

    def counted(polls: Iterator[object], name: str) -> Iterator[object]:
        ahead.append(name)
        return fetch_ahead(polls, name)  # type: ignore[arg-type]

    monkeypatch.setattr(executor, "_fetch_ahead", counted)
    monkeypatch.setattr(executor, "_BATCH_ROWS", 10)
    opts = options(cluster)
    small = read_all(opts, OffsetRange(TP, EpochOffset(2), EpochOffset(12, 0)))
    assert ahead == []
    large = read_all(opts, OffsetRange(TP, EpochOffset(2), EpochOffset(30, 0)))
    assert ahead == ["t-0"]
    assert small.column("value").to_pylist() == [b"v%d" % i for i in range(2, 12)]
    assert large.column("value").to_pylist() == [b"v%d" % i for i in range(2, 30)]
    key = executor._pool_key(executor._executor_kwargs(opts))
    pooled = len(executor._POOL[key])
    unfinished = executor.read_range(opts, OffsetRange(TP, EpochOffset(0), EpochOffset(5, 0)))
    assert next(unfinished).num_rows == 5
    unfinished.close()  # Spark stopped reading before the end
    assert len(executor._POOL[key]) == pooled - 1
