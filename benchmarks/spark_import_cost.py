"""What a Spark query pays before its first row: imports per Python process, and a whole
small query end to end, our source next to Spark's.

**Imports.** A query runs the source in several Python processes, each started for it:
planner processes that create the data source and pickle its stream reader (they import
the data source module only), the source runner on the driver (it also imports the
driver's Kafka client on its first call) and the executors' Python workers (the executor
read; Spark reuses them across tasks and queries). Each process is measured in a fresh
interpreter after the pyspark module that process runs anyway (not counted), the variants
alternated run by run (a slow stretch of the shared machine hits all alike); medians of
CPU and wall seconds:

- ``planner``: ``epochguard.spark_connector.datasource`` after
  ``pyspark.sql.worker.plan_data_source_read``;
- ``source_runner``: the data source and ``driver`` modules after
  ``pyspark.sql.streaming.python_streaming_source_runner``;
- ``executor``: the data source and ``executor`` modules after ``pyspark.worker``;
- ``spark_floor``: ``pyspark.sql.worker.plan_data_source_read`` itself, what every planner
  process pays whatever the source.

**A small query** (skipped with ``SPARK_IMPORT_QUERY=0``): one Apache Kafka broker, a topic
of ``SPARK_IMPORT_QUERY_ROWS`` (10) records in one partition, each source read by an
availableNow query into ``noop`` in one ``local[2]`` session, after a warm-up query per
source, ``SPARK_IMPORT_QUERY_REPS`` (5) times taking turns. Per source, medians of: the
wall time from ``start()`` to the end of the query (the first batch of a new query, end to
end), and the CPU seconds of the Spark JVM, the processes it started and reaped during the
query (a Python source's runner and planner processes), the Python workers under it and
the broker (``benchmarks/spark_source.py``'s accounting): with so few rows, the fixed cost
of a query.

**pyspark from Spark's zips.** Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the
py4j zip first on the path of every Python process it starts, so those processes import
pyspark from the zips; the source runner is a new process per query. Its own module,
``pyspark.sql.streaming.python_streaming_source_runner``, imported in a fresh interpreter
(medians, the variants alternated): from the zips as shipped (sources only: every module is
compiled at import), from copies of them compiled by ``epochguard spark-compile-zips``, and
from the installed package (its ``__pycache__``), as a process without Spark's path would.

The small query runs again in a JVM whose ``SPARK_HOME`` is the installed one with compiled
copies of its zips (``small_query_compiled_zips``): the same figures with Spark's Python
processes importing compiled pyspark modules.

``SPARK_IMPORT_RUNS`` import runs per variant (default 9).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Per process: (what that process imports anyway, not timed; what it imports for us).
VARIANTS = {
    "planner": (
        "import pyspark.sql.worker.plan_data_source_read",
        "import epochguard.spark_connector.datasource",
    ),
    "source_runner": (
        "import pyspark.sql.streaming.python_streaming_source_runner",
        "import epochguard.spark_connector.datasource, epochguard.spark_connector.driver",
    ),
    "executor": (
        "import pyspark.worker",
        "import epochguard.spark_connector.datasource, epochguard.spark_connector.executor",
    ),
    "spark_floor": ("pass", "import pyspark.sql.worker.plan_data_source_read"),
}

CHILD = """
import json, time
{prelude}
t0, c0 = time.perf_counter(), time.process_time()
{statement}
print(json.dumps({{"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}}))
"""

QUERY_ROWS = int(os.environ.get("SPARK_IMPORT_QUERY_ROWS", "10"))
QUERY_REPS = int(os.environ.get("SPARK_IMPORT_QUERY_REPS", "5"))


def _measure(prelude: str, statement: str, path: str | None = None) -> dict[str, float]:
    env = None if path is None else {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-P", "-c", CHILD.format(prelude=prelude, statement=statement)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def imports(runs: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for _ in range(runs):
        for name, (prelude, statement) in VARIANTS.items():
            samples[name].append(_measure(prelude, statement))
    return _medians(samples)


def _medians(samples: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    return {
        name: {
            "cpu_s_median": round(statistics.median(v["cpu"] for v in values), 3),
            "wall_s_median": round(statistics.median(v["wall"] for v in values), 3),
        }
        for name, values in samples.items()
    }


_RUNNER = "import pyspark.sql.streaming.python_streaming_source_runner"


def zip_imports(runs: int, compiled_home: Path) -> dict[str, Any]:
    """The source runner's module from Spark's zips as shipped, from the compiled copies in
    ``compiled_home`` (``compiled_spark_home``), and from the installed package (see the
    module's docstring)."""
    from epochguard.spark_connector.compile_zips import spark_zips

    shipped = spark_zips()
    paths = {
        "zip_as_shipped": os.pathsep.join(map(str, shipped)),
        "zip_compiled": os.pathsep.join(map(str, spark_zips(compiled_home))),
        "installed_package": None,
    }
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    for _ in range(runs):
        for name, path in paths.items():
            samples[name].append(_measure("", _RUNNER, path))
    return {**_medians(samples), "zips": [z.name for z in shipped]}


def small_query_runs(
    spark: Any,
    servers: str,
    topic: str,
    jvm: int,
    brokers: list[int],
    reps: int = QUERY_REPS,
    ready: bool = True,
) -> dict[str, Any]:
    """``reps`` availableNow queries of each source, taking turns, over ``topic`` (a few
    records in one partition, in a warm session): their medians and the runs. With
    ``ready`` (registered in the session), the ready batches too: a Python source that
    imports nothing of ours and reads no Kafka, what any Python source pays per query."""
    from benchmarks.spark_source import READY, _query

    sources = ["kafka", "epochguard", *([READY] if ready else [])]
    shape = (100, 1, QUERY_ROWS, False)
    runs: dict[str, list[dict[str, Any]]] = {fmt: [] for fmt in sources}
    for _ in range(reps):
        for fmt in sources:
            run = _query(spark, fmt, servers, topic, jvm, brokers, shape)
            if run["rows"] != QUERY_ROWS and fmt != READY:
                raise RuntimeError(f"{fmt} read {run['rows']} of {QUERY_ROWS} rows")
            runs[fmt].append(run)
    median: dict[str, Any] = {}
    for fmt, values in runs.items():
        median[fmt] = {
            "wall_s": round(statistics.median(r["wall_s"] for r in values), 3),
            "cpu_s": round(statistics.median(r["cpu_s"] for r in values), 2),
            "cpu_s_by_part": {
                k: round(statistics.median(r["cpu_s_by_part"][k] for r in values), 2)
                for k in values[0]["cpu_s_by_part"]
            },
        }
    return {"rows": QUERY_ROWS, "reps": reps, "median": median, "runs": runs}


def produce_small_topic(cluster: Any, topic: str) -> None:
    from benchmarks._common import produce

    cluster.create_topic(topic, partitions=1, replication_factor=1)
    produce(cluster.bootstrap_servers, topic, QUERY_ROWS, value=b"v" * 100)


def small_query(spark_home: Path | None = None) -> dict[str, Any]:
    """A few records read by each source in a session of its own, after a warm-up query
    per source: what a query costs before its rows do. With ``spark_home``, in a JVM
    started with that ``SPARK_HOME`` (its own, stopped at the end)."""
    from pyspark import SparkContext

    from benchmarks._ready_batches import register as register_ready
    from benchmarks.spark_source import READY, _query
    from epochguard.spark_connector import register
    from epochguard.testing.apache_kafka import ApacheKafkaCluster, ensure_kafka_jars
    from epochguard.testing.apache_kafka.spark_kafka import ensure_spark_kafka_jars
    from epochguard.testing.spark_session import _stop_jvm, local_session

    connector = ensure_spark_kafka_jars()
    home_before = os.environ.get("SPARK_HOME")
    if spark_home is not None:
        _stop_jvm()
        os.environ["SPARK_HOME"] = str(spark_home)
    with ApacheKafkaCluster(brokers=1, jars=ensure_kafka_jars()) as cluster:
        servers = cluster.bootstrap_servers
        produce_small_topic(cluster, "small")
        spark = local_session(
            "epochguard-bench-fixed",
            jars=connector.extra,
            conf={"spark.ui.showConsoleProgress": "false"},
        )
        try:
            register(spark)
            register_ready(spark)
            jvm = SparkContext._gateway.proc.pid
            brokers = [p.pid for p in cluster._procs.values()]
            shape = (100, 1, QUERY_ROWS, False)
            for fmt in ("kafka", "epochguard", READY):  # the first query in a JVM loads classes
                _query(spark, fmt, servers, "small", jvm, brokers, shape)
            out = small_query_runs(spark, servers, "small", jvm, brokers)
        finally:
            spark.stop()
            if spark_home is not None:
                _stop_jvm()
                if home_before is None:
                    os.environ.pop("SPARK_HOME", None)
                else:
                    os.environ["SPARK_HOME"] = home_before
    return {"spark_kafka_connector": connector.version, "session": "local[2]", **out}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run() -> dict[str, Any]:
    from epochguard.spark_connector.compile_zips import compiled_spark_home

    runs = int(os.environ.get("SPARK_IMPORT_RUNS", "9"))
    result: dict[str, Any] = {"runs": runs, "load_average_before": _load()}
    result["imports"] = imports(runs)
    with tempfile.TemporaryDirectory(prefix="spark-home-") as tmp:
        home = compiled_spark_home(Path(tmp) / "spark-home")
        result["pyspark_from_spark_zips"] = zip_imports(runs, home)
        if os.environ.get("SPARK_IMPORT_QUERY", "1") != "0":
            result["small_query"] = small_query()
            result["small_query_compiled_zips"] = small_query(home)
    result["load_average_after"] = _load()
    return result


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
