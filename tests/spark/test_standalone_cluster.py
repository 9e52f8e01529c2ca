"""A real (standalone) Spark cluster: a master and a worker from the pyspark package's
``spark-class``, executors in their own JVM and Python processes, a streaming query on it.

The module's own SparkSession exists only inside the test (another module's local[2]
session must be stopped first: one SparkContext per process).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from epochguard.spark_connector import register
from epochguard.testing import EmbeddedCluster
from epochguard.testing.spark_session import finish_query

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def wait_for_log(log: Path, pattern: str, process: subprocess.Popen[bytes], what: str) -> str:
    """The first match of ``pattern`` in the process's log, once it is written there."""
    deadline = time.monotonic() + 90
    while True:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found is not None:
            return found.group(1)
        assert process.poll() is None, f"{what} exited with {process.returncode}"
        assert time.monotonic() < deadline, f"{what} did not log {pattern!r} in {log}"
        time.sleep(0.2)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="module")
def master_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_WORKER_DIR": str(tmp_path_factory.mktemp("worker")),
    }
    logs = tmp_path_factory.mktemp("logs")
    # Port 0 everywhere: each process binds a port the system picks and logs it (a port
    # chosen free beforehand can be taken by another process before the JVM binds it).
    master = subprocess.Popen(
        [
            str(SPARK_CLASS),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            "0",
        ],
        env=env,
        stdout=(logs / "master.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    worker: subprocess.Popen[bytes] | None = None
    try:
        url = wait_for_log(
            logs / "master.log",
            r"Starting Spark master at (spark://127\.0\.0\.1:\d+)",
            master,
            "the Spark master",
        )
        worker = subprocess.Popen(
            [
                str(SPARK_CLASS),
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                "2",
                "--memory",
                "1g",
                url,
            ],
            env=env,
            stdout=(logs / "worker.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        wait_for_log(
            logs / "worker.log",
            r"(Successfully registered with master)",
            worker,
            "the Spark worker",
        )
        yield url
    finally:
        if worker is not None:
            stop(worker)
        stop(master)


def test_streaming_query_on_a_standalone_cluster(master_url: str, tmp_path: Path) -> None:
    existing = SparkSession.getActiveSession()
    if existing is not None:
        existing.stop()
    with pytest.MonkeyPatch.context() as mp, EmbeddedCluster(brokers=1) as cluster:
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        spark = (
            SparkSession.builder.master(master_url)
            .appName("epochguard-standalone")
            .config("spark.ui.enabled", "false")
            .config("spark.executor.memory", "512m")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        try:
            assert spark.sparkContext.master == master_url
            register(spark)
            cluster.create_topic("s", partitions=2, replication_factor=1)
            cluster.append("s", 0, [b"a%d" % i for i in range(30)], batch_size=5)
            cluster.append("s", 1, [b"b%d" % i for i in range(20)], batch_size=5)
            query = (
                spark.readStream.format("epochguard")
                .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
                .option("subscribe", "s")
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "20")
                .load()
                .writeStream.format("parquet")
                .option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(availableNow=True)
                .start()
            )
            finish_query(query, 180)
            got = sorted(
                (r["partition"], r["offset"], bytes(r["value"]))
                for r in spark.read.parquet(str(tmp_path / "out")).collect()
            )
            # The driver plus one executor JVM of the worker (local mode has only the driver).
            block_managers = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        finally:
            spark.stop()
    expected = sorted(
        [(0, i, b"a%d" % i) for i in range(30)] + [(1, i, b"b%d" % i) for i in range(20)]
    )
    assert got == expected
    assert block_managers == 2
