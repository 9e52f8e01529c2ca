"""The source in a Spark Connect session: ``SparkSession.builder.remote("local[2]")`` starts a
local Spark Connect server, the client registers the source and runs a streaming query
through gRPC, and the server's Python workers read the EmbeddedCluster.

The client runs in its own process: a Connect server needs a SparkContext started with the
Connect plugin, and this process may already hold another module's JVM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from epochguard.testing import EmbeddedCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CLIENT = r"""
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSession
from epochguard.spark_connector import register

servers, topic, ckpt = sys.argv[1:4]
spark = (
    SparkSession.builder.remote("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
assert isinstance(spark, ConnectSession), type(spark)
register(spark)
query = (
    spark.readStream.format("epochguard")
    .option("kafka.bootstrap.servers", servers)
    .option("subscribe", topic)
    .option("startingOffsets", "earliest")
    .load()
    .writeStream.format("memory")
    .queryName("connect_out")
    .option("checkpointLocation", ckpt)
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination(120)
error = query.exception()
rows = [
    [r["partition"], r["offset"], bytes(r["value"]).decode(), r["leaderEpoch"], r["topic"]]
    for r in spark.table("connect_out").collect()
]
# A misspelt option in a batch read, and in a stream (which fails the query).
bad = None
try:
    spark.read.format("epochguard").option("subscribe", topic).option(
        "kafka.bootstrap.servers", servers
    ).option("startingOfsets", "earliest").load().collect()
except Exception as exc:
    bad = str(exc)
bad_stream = None
try:
    spark.readStream.format("epochguard").option("subscribe", topic).option(
        "kafka.bootstrap.servers", servers
    ).option("startingOfsets", "earliest").load().writeStream.format(
        "noop"
    ).start().awaitTermination()
except Exception as exc:
    bad_stream = str(exc)
error = None if error is None else str(error)
result = {"error": error, "rows": rows, "bad": bad, "bad_stream": bad_stream}
print("RESULT " + json.dumps(result))
spark.stop()
"""


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=1) as c:
        yield c


def test_streaming_query_through_spark_connect(cluster: EmbeddedCluster, tmp_path: str) -> None:
    cluster.create_topic("conn", partitions=2, replication_factor=1)
    cluster.append("conn", 0, [b"a%d" % i for i in range(6)])
    cluster.append("conn", 1, [b"b%d" % i for i in range(4)])
    leader = cluster.leader("conn", 1)
    assert leader is not None
    epoch_before = cluster.leader_epoch("conn", 1)
    cluster.elect_leader("conn", 1, leader)  # a later epoch for the last record
    cluster.append("conn", 1, [b"b4"])
    epoch_0 = cluster.leader_epoch("conn", 0)
    epoch_1 = cluster.leader_epoch("conn", 1)
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CLIENT, cluster.bootstrap_servers, "conn", f"{tmp_path}/ckpt"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["error"] is None
    assert epoch_1 > epoch_before
    expected = (
        [[0, i, f"a{i}", epoch_0, "conn"] for i in range(6)]
        + [[1, i, f"b{i}", epoch_before, "conn"] for i in range(4)]
        + [[1, 4, "b4", epoch_1, "conn"]]
    )
    assert sorted(result["rows"]) == sorted(expected)
    # Errors reach the client with their condition, but the Connect server (pyspark 4.3.0)
    # abbreviates their text in the middle, cutting the source's message out of both
    # (docs/spark.md, "Spark Connect"); the classic session's tests check that text.
    assert result["bad"] is not None
    assert result["bad"].startswith("[PYTHON_DATA_SOURCE_ERROR] Failed to initialize")
    assert result["bad_stream"] is not None
    assert result["bad_stream"].startswith("[STREAM_FAILED]")
