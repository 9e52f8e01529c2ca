"""The source in a Spark Connect session: a local Spark Connect server (a ``local[2]``
SparkContext with the Connect plugin), a client that registers the source and runs queries
through gRPC, and the server's Python workers reading the EmbeddedCluster.

The module starts one server for all its tests, in its own process (a Connect server needs
a SparkContext started with the Connect plugin, and this process may already hold another
module's JVM), on a port the system picks: a fixed port (Spark's 15002) is taken when
another run's server still holds it. Each client program runs in its own process too and
gets its own server-side session.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import IO, Any

import pytest

from epochguard.testing import EmbeddedCluster
from epochguard.testing.helpers import stage_unreplicated_tail, unclean_refill

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

CLIENT = r"""
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSession
from epochguard.spark_connector import register

remote, servers, topic, ckpt = sys.argv[1:5]
spark = (
    SparkSession.builder.remote(remote)
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


def failure(stream, **options):
    # What the client raises for a batch read or a stream with these options.
    reader = spark.readStream if stream else spark.read
    reader = reader.format("epochguard").option("kafka.bootstrap.servers", servers)
    for key, value in options.items():
        reader = reader.option(key, value)
    try:
        if stream:
            q = reader.load().writeStream.format("noop").trigger(availableNow=True).start()
            q.awaitTermination(120)
        else:
            reader.load().collect()
    except Exception as exc:
        return str(exc)
    return None


# A misspelt option, an unreachable cluster and a missing topic, in batch reads and streams.
refused = {"kafka.bootstrap.servers": sys.argv[5]}
bad = failure(False, subscribe=topic, startingOfsets="earliest")
bad_stream = failure(True, subscribe=topic, startingOfsets="earliest")
unreachable = failure(False, subscribe=topic, **refused)
unreachable_stream = failure(True, subscribe=topic, **refused)
missing = failure(False, subscribe="no-such-topic", failOnMissingTopic="true")
missing_stream = failure(True, subscribe="no-such-topic", failOnMissingTopic="true")
error = None if error is None else str(error)
result = {
    "error": error,
    "rows": rows,
    "bad": bad,
    "bad_stream": bad_stream,
    "unreachable": unreachable,
    "unreachable_stream": unreachable_stream,
    "missing": missing,
    "missing_stream": missing_stream,
}
print("RESULT " + json.dumps(result))
spark.stop()
"""


SERVER = r"""
import sys
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

# What SparkSession.builder.remote("local[2]") sets up in its own process, on port 0: the
# system picks a free port, and the server says which one it bound.
conf = SparkConf().setMaster("local[2]").setAll([
    ("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin"),
    ("spark.sql.artifact.isolation.enabled", "true"),
    ("spark.sql.artifact.isolation.alwaysApplyClassloader", "true"),
    ("spark.connect.grpc.binding.address", "127.0.0.1"),
    ("spark.connect.grpc.binding.port", "0"),
    ("spark.ui.enabled", "false"),
])
spark = SparkSession(SparkContext.getOrCreate(conf))
service = getattr(spark._jvm, "org.apache.spark.sql.connect.service.SparkConnectService$")
print("PORT %d" % getattr(service, "MODULE$").localPort(), flush=True)
sys.stdin.read()  # until the test module closes it
spark.stop()
"""


def _spark_env() -> dict[str, str]:
    return dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One local Spark Connect server for the module's tests; yields its ``sc://`` URL."""
    log_path = tmp_path_factory.mktemp("connect") / "server.log"
    with open(log_path, "w+") as log:
        server = subprocess.Popen(
            [sys.executable, "-P", "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=_spark_env(),
        )
        try:
            yield f"sc://127.0.0.1:{_bound_port(server, log)}"
        finally:
            assert server.stdin is not None
            server.stdin.close()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _bound_port(server: subprocess.Popen[str], log: IO[str]) -> int:
    assert server.stdout is not None
    for line in server.stdout:  # the JVM's own output goes to the log
        if line.startswith("PORT "):
            return int(line.split()[1])
    server.wait()
    log.seek(0)
    raise AssertionError(f"the Connect server exited ({server.returncode}):\n{log.read()[-6000:]}")


def run_client(code: str, *args: str) -> dict[str, Any]:
    """Runs a Connect client program (its own process) and returns the JSON it printed after
    ``RESULT``."""
    env = _spark_env()
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=540,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def test_streaming_query_through_spark_connect(
    connect_server: str, cluster: EmbeddedCluster, tmp_path: str
) -> None:
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
    result = run_client(
        CLIENT,
        connect_server,
        cluster.bootstrap_servers,
        "conn",
        f"{tmp_path}/ckpt",
        f"127.0.0.1:{closed_port()}",
    )
    assert result["error"] is None
    assert epoch_1 > epoch_before
    expected = (
        [[0, i, f"a{i}", epoch_0, "conn"] for i in range(6)]
        + [[1, i, f"b{i}", epoch_before, "conn"] for i in range(4)]
        + [[1, 4, "b4", epoch_1, "conn"]]
    )
    assert sorted(result["rows"]) == sorted(expected)
    # Errors reach the client with the source's message on the first line, and no other
    # Python error after it. The message names the option as Spark hands it over,
    # lower-cased; load() raises it, before any query starts.
    option_error = (
        "SourceOptionError: option 'startingofsets': unknown option for the epochguard source"
        " (did you mean 'startingOffsets'?)"
    )
    first_lines = {
        "bad": option_error,
        "bad_stream": option_error,
        "unreachable": "SparkUnreachableError: KAFKA_UNREACHABLE: cannot connect to 127.0.0.1:",
        "missing": "KAFKA_MISSING_TOPIC: subscribed topic no-such-topic does not exist",
    }
    first_lines["unreachable_stream"] = first_lines["unreachable"]
    first_lines["missing_stream"] = first_lines["missing"]
    for case, text in first_lines.items():
        message = result[case]
        assert message is not None, case
        assert text in message.splitlines()[0], (case, message)
        assert "Traceback" not in message and "UnboundLocalError" not in message, message
    assert "refused the connection" in result["unreachable"]
    assert result["bad"].startswith("[PYTHON_DATA_SOURCE_ERROR]")
    assert result["missing_stream"].startswith("[STREAM_FAILED]")


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()  # nothing listens there: every connection is refused
    return port


TRUNCATION_CLIENT = r"""
import json, sys
from pyspark.sql import SparkSession
from epochguard.spark_connector import register

remote, servers, ckpt, out, phase = sys.argv[1:6]
spark = SparkSession.builder.remote(remote).getOrCreate()
register(spark)
query = (
    spark.readStream.format("epochguard")
    .option("kafka.bootstrap.servers", servers)
    .option("subscribe", "t")
    .option("startingOffsets", "earliest")
    .load()
    .writeStream.format("parquet")
    .option("path", out)
    .option("checkpointLocation", ckpt)
    .trigger(availableNow=True)
    .start()
)
result = {"phase": phase}
try:
    query.awaitTermination(120)
    result["raised"] = None
except Exception as exc:
    result["raised"] = str(exc)
    result["condition"] = exc.getCondition()
    result["parameter"] = exc.getMessageParameters().get("message")
error = query.exception()
result["exception"] = None if error is None else str(error)
print("RESULT " + json.dumps(result))
spark.stop()
"""


#: Spark's error when a Python process it started did not connect back within its (fixed) 10 s.
SPARK_WORKER_TIMEOUT = "Python worker failed to connect back"


def test_truncation_message_reaches_the_connect_client(connect_server: str, tmp_path: str) -> None:
    """A query restarted after an unclean election fails with ``KAFKA_LOG_TRUNCATION:``, and a
    Connect client sees that text in what ``awaitTermination()`` raises, in its ``message``
    parameter and in ``query.exception()``."""

    def run(servers: str, phase: str) -> dict[str, Any]:
        ckpt, out = f"{tmp_path}/ckpt", f"{tmp_path}/out"
        return run_client(TRUNCATION_CLIENT, connect_server, servers, ckpt, out, phase)

    with EmbeddedCluster(brokers=2) as cluster:
        old, new = stage_unreplicated_tail(cluster, "t")  # offsets 10..14 on `old` only
        first = run(cluster.bootstrap_servers, "first")
        assert first["raised"] is None and first["exception"] is None
        unclean_refill(cluster, "t", old, new, [b"new-0", b"new-1"])
        second = run(cluster.bootstrap_servers, "second")
        if SPARK_WORKER_TIMEOUT in (second["raised"] or ""):
            # Spark gives a Python process it starts 10 s to connect back; a CI machine busy
            # with other work can starve one. The failed query committed nothing: run it again.
            second = run(cluster.bootstrap_servers, "second")
    expected = "KAFKA_LOG_TRUNCATION: topic t partition 0 (t-0): divergence at 10"
    raised, exception, parameter = second["raised"], second["exception"], second["parameter"]
    assert raised is not None and exception is not None and parameter is not None
    assert raised.startswith("[STREAM_FAILED]")
    assert second["condition"] == "STREAM_FAILED"
    assert expected in raised.splitlines()[0]
    assert "Traceback" not in raised
    assert expected in parameter
    assert expected in exception
