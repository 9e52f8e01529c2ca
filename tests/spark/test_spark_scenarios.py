"""The truncation scenarios through the Spark source, in a local[2] session, on EmbeddedCluster.

Every scenario starts the same way (a 2-broker cluster, one partition, RF=2): kept-0..9 on
both replicas, then lost-0..4 (offsets 10..14) on the leader only, read by the query, whose
checkpoint is then at 15. Then the log is truncated (an unclean election of the replica
without lost-*, or the topic deleted and re-created) and refilled, while the query is
stopped or while it runs. Under ``onTruncation=fail`` the query fails with
``KAFKA_LOG_TRUNCATION:``; under ``rewind`` its output is exactly what it had read plus the
new log from the divergence point on. Refills past the checkpoint while stopped are in
test_spark_source.py; Spark's own source in the same scenario in
tests/apache_kafka/test_apache_spark_side_by_side.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from epochguard.spark_connector import register
from epochguard.testing import EmbeddedCluster
from epochguard.testing.helpers import KEPT, LOST, stage_unreplicated_tail, unclean_refill
from epochguard.testing.spark_session import finish_query, local_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "t"
BEFORE = [(i, v) for i, v in enumerate(KEPT + LOST)]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_session("epochguard-scenarios", conf={"spark.task.maxFailures": "1"})
    register(session)
    yield session
    session.stop()


def stage(cluster: EmbeddedCluster) -> tuple[int, int]:
    """kept-* on both replicas, lost-* on the leader only; returns (leader, other)."""
    return stage_unreplicated_tail(cluster, TOPIC, KEPT, LOST)


def unclean(cluster: EmbeddedCluster, old: int, new: int, refill: list[bytes]) -> None:
    """``new`` (without lost-*) elected uncleanly, refilled; ``old`` back as its follower."""
    unclean_refill(cluster, TOPIC, old, new, refill)


def wait_in_sync(cluster: EmbeddedCluster, brokers: list[int]) -> None:
    deadline = time.monotonic() + 20
    while sorted(cluster.isr(TOPIC, 0)) != sorted(brokers):
        assert time.monotonic() < deadline, f"ISR {cluster.isr(TOPIC, 0)}, not {brokers}"
        time.sleep(0.05)


def refill_below(cluster: EmbeddedCluster, old: int, new: int) -> list[tuple[int, bytes]]:
    new_log = [b"new-%d" % i for i in range(2)]  # ends at 12, below the checkpoint 15
    unclean(cluster, old, new, new_log)
    return [(10 + i, v) for i, v in enumerate(new_log)]


def refill_past(cluster: EmbeddedCluster, old: int, new: int) -> list[tuple[int, bytes]]:
    new_log = [b"new-%d" % i for i in range(8)]  # ends at 18, past the checkpoint 15
    unclean(cluster, old, new, new_log)
    return [(10 + i, v) for i, v in enumerate(new_log)]


def two_elections(cluster: EmbeddedCluster, old: int, new: int) -> list[tuple[int, bytes]]:
    """Two unclean elections in a row, each losing records: first ``new`` leads and writes
    n1-* at 10..11 (the old leader follows it), then n1's leader loses lost2-* at 12..13
    when ``old`` is elected uncleanly again and writes n2-* at 12..16."""
    n1 = [b"n1-%d" % i for i in range(2)]
    unclean(cluster, old, new, n1)
    wait_in_sync(cluster, [old, new])
    cluster.stop_broker(old)
    cluster.append(TOPIC, 0, [b"lost2-%d" % i for i in range(2)], batch_size=1)
    n2 = [b"n2-%d" % i for i in range(5)]
    unclean(cluster, new, old, n2)
    return [(10 + i, v) for i, v in enumerate(n1 + n2)]


def recreated(cluster: EmbeddedCluster, old: int, new: int) -> list[tuple[int, bytes]]:
    cluster.start_broker(new)
    cluster.delete_topic(TOPIC)
    cluster.create_topic(TOPIC, partitions=1, replication_factor=2)
    new_log = [b"again-%d" % i for i in range(7)]
    cluster.append(TOPIC, 0, new_log, batch_size=1)
    return list(enumerate(new_log))


Scenario = Callable[[EmbeddedCluster, int, int], list[tuple[int, bytes]]]


def source(spark: Any, cluster: EmbeddedCluster, mode: str, **extra: str) -> Any:
    return (
        spark.readStream.format("epochguard")
        .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("onTruncation", mode)
        .option("kafka.metadata.max.age.ms", "500")
        .options(**extra)
        .load()
        .select("offset", "value")
    )


def run_once(spark: Any, cluster: EmbeddedCluster, mode: str, ckpt: Path, out: Path) -> None:
    query = (
        source(spark, cluster, mode)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    finish_query(query, 120)


def output(spark: Any, out: Path) -> list[tuple[int, bytes]]:
    return sorted((r["offset"], bytes(r["value"])) for r in spark.read.parquet(str(out)).collect())


def expected_message(scenario: Scenario) -> str:
    if scenario is recreated:
        return f"KAFKA_LOG_TRUNCATION: topic {TOPIC} partition 0"
    return f"KAFKA_LOG_TRUNCATION: topic {TOPIC} partition 0 ({TOPIC}-0): divergence at 10"


STOPPED = [refill_below, two_elections, recreated]


@pytest.mark.parametrize("scenario", STOPPED, ids=lambda s: s.__name__)
@pytest.mark.parametrize("mode", ["fail", "rewind"])
def test_truncation_while_stopped(
    spark: Any, cluster: EmbeddedCluster, tmp_path: Path, scenario: Scenario, mode: str
) -> None:
    old, new = stage(cluster)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    run_once(spark, cluster, mode, ckpt, out)
    assert output(spark, out) == BEFORE
    new_log = scenario(cluster, old, new)
    if mode == "fail":
        with pytest.raises(Exception) as info:
            run_once(spark, cluster, mode, ckpt, out)
        assert expected_message(scenario) in str(info.value)
        assert output(spark, out) == BEFORE
    else:
        run_once(spark, cluster, mode, ckpt, out)
        assert output(spark, out) == sorted(BEFORE + new_log)


RUNNING = [refill_below, refill_past, two_elections]
#: Where a running query's micro-batches are read: by tasks, or (``driverReadMaxOffsets``)
#: by the source's process on the driver, handed to Spark with the plan.
READERS = {"tasks": {}, "driver": {"driverReadMaxOffsets": "1000"}}


@pytest.mark.parametrize("scenario", RUNNING, ids=lambda s: s.__name__)
@pytest.mark.parametrize("mode", ["fail", "rewind"])
@pytest.mark.parametrize("read_by", list(READERS))
def test_truncation_while_running(
    spark: Any,
    cluster: EmbeddedCluster,
    tmp_path: Path,
    scenario: Scenario,
    mode: str,
    read_by: str,
) -> None:
    old, new = stage(cluster)
    name = f"running_{mode}_{scenario.__name__}_{read_by}"
    query = (
        source(spark, cluster, mode, **READERS[read_by])
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        assert output_table(spark, name) == BEFORE
        # pyspark reports no latest offset for the reader that hands records over.
        latest = query.lastProgress["sources"][0]["latestOffset"]
        assert (latest in (None, "null")) == (read_by == "driver"), latest
        new_log = scenario(cluster, old, new)
        if mode == "fail":
            with pytest.raises(Exception) as info:
                query.awaitTermination(120)
                raise AssertionError("the query went on after the truncation")
            assert expected_message(scenario) in str(info.value)
            assert output_table(spark, name) == BEFORE
        else:
            query.processAllAvailable()
            got = output_table(spark, name)
            # Between the two elections the query may have read lost2-* (then lost again):
            # each at most once, at its offset; everything else is exactly the expected log.
            lost2 = [r for r in got if r[1].startswith(b"lost2-")]
            assert len(set(lost2)) == len(lost2)
            assert set(lost2) <= {(12, b"lost2-0"), (13, b"lost2-1")}
            assert [r for r in got if r not in lost2] == sorted(BEFORE + new_log)
    finally:
        query.stop()


def output_table(spark: Any, name: str) -> list[tuple[int, bytes]]:
    return sorted((r["offset"], bytes(r["value"])) for r in spark.table(name).collect())
