"""A Spark Structured Streaming query on the ``epochguard`` source.

By default: an EmbeddedCluster, a query that reads 15 orders (availableNow, a checkpoint,
parquet output), then, while the query is stopped, an unclean election that loses orders
10..14 and refills the log past them. The restarted query fails with
``KAFKA_LOG_TRUNCATION`` naming the lost offsets, where Spark's own Kafka source would
silently read on. With ``--bootstrap-servers`` it reads ``--topic`` to the end once and
prints the row count per leader epoch.

    python examples/spark_stream.py
    python examples/spark_stream.py --bootstrap-servers host:9092 --topic orders

Needs the ``spark`` extra (pyspark >= 4.2, pyarrow) and Java 17.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Staging, cluster_or_none, parser, quiet

from epochguard.spark_connector import LOG_TRUNCATION_CODE, register


def session() -> Any:
    # Workers must run this interpreter (it has pyarrow and epochguard).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("epochguard-example")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    # The restart's failure is expected here and printed as one line: Spark's own log of
    # it (an ERROR with the JVM's stack trace) would bury that line.
    spark.sparkContext.setLogLevel("FATAL")
    register(spark)
    return spark


def run_once(spark: Any, bootstrap: str, topic: str, checkpoint: Path, out: Path) -> None:
    """Read everything available into parquet files, then stop (Trigger.AvailableNow)."""
    query = (
        spark.readStream.format("epochguard")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
        error = query.exception()
        if error is not None:
            raise error
    finally:
        query.stop()


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    quiet()
    spark = session()
    with tempfile.TemporaryDirectory() as tmp, cluster_or_none(args.bootstrap_servers) as cluster:
        checkpoint, out = Path(tmp) / "checkpoint", Path(tmp) / "out"
        if cluster is None:
            run_once(spark, args.bootstrap_servers, args.topic, checkpoint, out)
            for row in spark.read.parquet(str(out)).groupBy("leaderEpoch").count().collect():
                print(f"leader epoch {row['leaderEpoch']}: {row['count']} records")
            return 0
        staging = Staging(cluster, args.topic)
        staging.replicated(10)
        staging.leader_only(10, 5)
        run_once(spark, cluster.bootstrap_servers, args.topic, checkpoint, out)
        print(f"first run: {spark.read.parquet(str(out)).count()} orders")
        # While the query is stopped: orders 10..14 are lost, 8 refunds take offsets 10..17.
        staging.unclean_election(8)
        try:
            run_once(spark, cluster.bootstrap_servers, args.topic, checkpoint, out)
        except Exception as exc:
            text = str(exc)
            # The first line: Spark's prefix, then ours from the code on.
            first = text.splitlines()[0] if text else ""
            ours = (
                first[first.find(LOG_TRUNCATION_CODE) :] if LOG_TRUNCATION_CODE in first else first
            )
            print(f"restart failed as it should: {ours.strip()[:300]}")
            return 0 if "lost range [10, 15)" in text else 1
        print("restart read on over the truncation: this must not happen")
        return 1


if __name__ == "__main__":
    sys.exit(main())
