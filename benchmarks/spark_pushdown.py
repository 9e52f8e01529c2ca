"""Filter pushdown on a timestamp-bounded batch read: bytes fetched and time, with and without.

An EmbeddedCluster holds ``SPARK_PUSHDOWN_ROWS`` records (default 1,000,000) of 100 B over
``SPARK_PUSHDOWN_PARTITIONS`` partitions (2), appended in batches of 1,000 whose times rise
10 ms a batch, except every 50th batch, which is late: its records carry a time 2 s older
than its neighbours' (so times are not in offset order and Spark must still filter). The
query is the last 10 % by time::

    spark.read.format(...).load().where("timestamp >= <time of the batch at 90 %>")

written to the ``noop`` sink. Three readers take turns, ``SPARK_PUSHDOWN_REPS`` times (3),
after one warm-up query each:

- ``epochguard``: with ``filterPushdown=true`` (and Spark's
  ``spark.sql.python.filterPushdown.enabled``): each partition's range starts at the first
  offset at or after the time (ListOffsets by time);
- ``epochguard_no_pushdown``: the same source without it (the default): reads every record,
  Spark filters;
- ``kafka``: Spark's own Kafka source (``make spark-jars``), which pushes no filter.

Per query: ``fetched_bytes``, what the brokers served to consumers while it ran (the
EmbeddedCluster's ``consumer_fetch_bytes()``: record batches as fetched, driver and
executors), and ``wall_s``, from the action's call to its return (planning included). The
rows each reader returns are counted (and their offsets summed) in a separate query and
must agree.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

ROWS = int(os.environ.get("SPARK_PUSHDOWN_ROWS", "1000000"))
PARTITIONS = int(os.environ.get("SPARK_PUSHDOWN_PARTITIONS", "2"))
REPS = int(os.environ.get("SPARK_PUSHDOWN_REPS", "3"))
VALUE = b"v" * 100
BATCH_RECORDS = 1000
BATCH_STEP_MS = 10
LATE_EVERY = 50
LATE_BY_MS = 2000
TAIL = 0.10
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TOPIC = "pushdown-bench"
READERS = ("epochguard", "epochguard_no_pushdown", "kafka")


def _fill(cluster: Any) -> int:
    """Append the records; returns the number of batches per partition."""
    from epochguard.testing.embedded.records import build_batch

    batches = ROWS // PARTITIONS // BATCH_RECORDS
    if batches * PARTITIONS * BATCH_RECORDS != ROWS:
        raise ValueError(f"{ROWS} rows do not fill {PARTITIONS} partitions with batches of 1000")
    values = [VALUE] * BATCH_RECORDS
    for k in range(batches):
        late = k % LATE_EVERY == LATE_EVERY - 1
        ms = BASE_MS + k * BATCH_STEP_MS - (LATE_BY_MS if late else 0)
        batch = build_batch(values, timestamp_ms=ms)
        for p in range(PARTITIONS):
            cluster.append_raw(TOPIC, p, batch)
    return batches


def _reader(spark: Any, fmt: str, servers: str) -> Any:
    source = "kafka" if fmt == "kafka" else "epochguard"
    r = (
        spark.read.format(source)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
    )
    if fmt == "epochguard":
        r = r.option("filterPushdown", "true")
    return r.load()


def _query(spark: Any, cluster: Any, fmt: str, where: str) -> dict[str, Any]:
    df = _reader(spark, fmt, cluster.bootstrap_servers).where(where)
    before = sum(cluster.consumer_fetch_bytes().values())
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    wall = time.perf_counter() - started
    fetched = sum(cluster.consumer_fetch_bytes().values()) - before
    return {"wall_s": round(wall, 3), "fetched_bytes": fetched}


def _selected(spark: Any, cluster: Any, fmt: str, where: str) -> dict[str, int]:
    df = _reader(spark, fmt, cluster.bootstrap_servers).where(where)
    row = df.selectExpr("count(*) AS n", "sum(offset) AS s").collect()[0]
    return {"rows": int(row["n"]), "offset_sum": int(row["s"] or 0)}


def run() -> dict[str, Any]:
    from epochguard.spark_connector import register
    from epochguard.testing import EmbeddedCluster
    from epochguard.testing.apache_kafka.spark_kafka import ensure_spark_kafka_jars
    from epochguard.testing.spark_session import local_session

    load_before = os.getloadavg()
    connector = ensure_spark_kafka_jars()
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1)
        fill_started = time.perf_counter()
        batches = _fill(cluster)
        fill_s = time.perf_counter() - fill_started
        from_ms = BASE_MS + round(batches * (1 - TAIL)) * BATCH_STEP_MS
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(from_ms / 1000))
        where = f"timestamp >= TIMESTAMP '{when}.{from_ms % 1000:03d}'"
        spark = local_session(
            "epochguard-pushdown-bench",
            jars=connector.extra,
            conf={
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.python.filterPushdown.enabled": "true",
            },
        )
        register(spark)
        selected = {fmt: _selected(spark, cluster, fmt, where) for fmt in READERS}
        if len({tuple(s.values()) for s in selected.values()}) != 1:
            raise RuntimeError(f"the readers disagree on the rows: {selected}")
        for fmt in READERS:
            _query(spark, cluster, fmt, where)  # warm-up
        runs: dict[str, list[dict[str, Any]]] = {fmt: [] for fmt in READERS}
        for _ in range(REPS):
            for fmt in READERS:
                runs[fmt].append(_query(spark, cluster, fmt, where))
        spark.stop()
    median = {
        fmt: {
            "wall_s": round(statistics.median(r["wall_s"] for r in rs), 3),
            "fetched_bytes": round(statistics.median(r["fetched_bytes"] for r in rs)),
        }
        for fmt, rs in runs.items()
    }
    base = median["epochguard_no_pushdown"]
    out = {
        "method": (
            f"timestamp-bounded batch read (last {TAIL:.0%} by time) into noop; EmbeddedCluster, "
            f"bytes served to consumers per query; {REPS} runs per reader taking turns after a "
            "warm-up each; medians"
        ),
        "records": ROWS,
        "value_bytes": len(VALUE),
        "partitions": PARTITIONS,
        "where": where,
        "rows_selected": selected["epochguard"]["rows"],
        "selected": selected,
        "fill_s": round(fill_s, 1),
        "spark_kafka_connector": connector.version,
        "session": "local[2]",
        "runs": runs,
        "median": median,
        "fetched_vs_no_pushdown": round(
            median["epochguard"]["fetched_bytes"] / base["fetched_bytes"], 4
        ),
        "time_vs_no_pushdown": round(median["epochguard"]["wall_s"] / base["wall_s"], 3),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    for fmt in READERS:
        m = median[fmt]
        print(f"{fmt}: {m['fetched_bytes'] / 1e6:.1f} MB fetched, {m['wall_s']:.2f} s")
    return out
