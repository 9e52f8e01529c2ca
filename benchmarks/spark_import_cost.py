"""The import each Python process of a Spark query pays before it does any work.

A query runs the source in several Python processes (the source runner, the planner workers
that create the data source and plan a batch read, the executors' workers), and each one
imports the source module. This measures that import in fresh interpreters, alternating
the variants run by run (the machine is shared: a slow stretch hits every variant alike),
and reports the median CPU and wall seconds of each:

- ``source``: ``import epochguard.spark_connector.datasource``, as Spark's workers do;
- ``source_kafka_init_first``: the same after ``import kafka`` (kafka-python's package
  ``__init__``, which imports its admin client, producer and consumer), as the import was
  before the package ``__init__`` was deferred;
- ``spark_floor``: ``pyspark.sql.datasource`` and ``pyarrow`` alone, what any Python
  source pays.

``SPARK_IMPORT_RUNS`` runs per variant (default 9).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

VARIANTS = {
    "source": "import epochguard.spark_connector.datasource",
    "source_kafka_init_first": "import kafka; import epochguard.spark_connector.datasource",
    "spark_floor": "import pyspark.sql.datasource, pyarrow",
}

CHILD = """
import json, time
t0, c0 = time.perf_counter(), time.process_time()
{statement}
print(json.dumps({{"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}}))
"""


def _measure(statement: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-P", "-c", CHILD.format(statement=statement)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def run() -> dict[str, Any]:
    runs = int(os.environ.get("SPARK_IMPORT_RUNS", "9"))
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for _ in range(runs):
        for name, statement in VARIANTS.items():
            samples[name].append(_measure(statement))
    result: dict[str, Any] = {"runs": runs, "load_average": list(os.getloadavg())}
    for name, values in samples.items():
        result[name] = {
            "cpu_s_median": round(statistics.median(v["cpu"] for v in values), 3),
            "wall_s_median": round(statistics.median(v["wall"] for v in values), 3),
        }
    ours = result["source"]["cpu_s_median"]
    before = result["source_kafka_init_first"]["cpu_s_median"]
    result["cpu_saved_per_process_s"] = round(before - ours, 3)
    result["cpu_above_spark_floor_s"] = round(ours - result["spark_floor"]["cpu_s_median"], 3)
    return result


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
