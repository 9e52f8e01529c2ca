"""A local SparkSession for tests, examples and benchmarks, optionally with extra jars.

Extra jars (``spark.jars``, e.g. Spark's own Kafka source) reach the driver's class loader only
when they are given as the JVM starts: PySpark passes the session's settings to
``spark-submit`` only when it launches the JVM, and a later session in the same Python
process reuses that JVM. So when jars are asked for and a JVM launched without them is
running, it is shut down first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epochguard._log import get_logger

log = get_logger("epochguard.testing.spark_session")

_JARS_OF_RUNNING_JVM: tuple[str, ...] | None = None


def _stop_jvm() -> None:
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        active.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        # The gateway JVM exits when its stdin closes (PythonGatewayServer).
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None


def local_session(
    app_name: str,
    *,
    master: str = "local[2]",
    jars: Sequence[Path] = (),
    conf: dict[str, str] | None = None,
) -> Any:
    """A ``SparkSession`` whose workers run this interpreter, bound to the loopback address.

    Workers must run this interpreter (it has pyarrow and the package) and the hostname may
    resolve to an address that is not reachable from here, so both are set for the process.
    """
    global _JARS_OF_RUNNING_JVM
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    wanted = tuple(str(j) for j in jars)
    if SparkContext._gateway is not None and wanted and wanted != _JARS_OF_RUNNING_JVM:
        log.info("spark_jvm_restart", reason="extra jars", jars=list(wanted))
        _stop_jvm()
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if wanted:
        builder = builder.config("spark.jars", ",".join(wanted))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    launched = SparkContext._gateway is None
    session = builder.getOrCreate()
    if launched:
        _JARS_OF_RUNNING_JVM = wanted
    return session


def finish_query(query: Any, timeout_s: float) -> list[dict[str, Any]]:
    """Wait (bounded) for a streaming query that ends by itself (``availableNow``), raise
    its error if it failed, and stop it; returns its progress reports."""
    try:
        query.awaitTermination(timeout_s)
        error = query.exception()
        if error is not None:
            raise error
        return list(query.recentProgress)
    finally:
        query.stop()
