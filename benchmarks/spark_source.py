"""Our Spark source next to Spark's own Kafka source, on the same topics of real Kafka.

One Apache Kafka broker (``ApacheKafkaCluster``, jars from ``make kafka-jars``) holds four
topics: 100 B and 1 KB values, 1 and 8 partitions. In one ``local[2]`` SparkSession with
Spark's connector on ``spark.jars`` (``make spark-jars``), each source reads each whole topic
with ``Trigger.AvailableNow`` into the ``noop`` sink, ``REPS`` times, the sources taking
turns. Reported per run:

- ``rows_per_s``: input rows / the query's ``triggerExecution`` time summed over its batches
  (what Spark's progress reports; JVM start and query set-up excluded);
- ``wall_s``: from ``start()`` to the end of the query;
- ``cpu_s`` / ``rows_per_cpu_s``: CPU seconds of the Spark JVM, every process under it and
  the broker while the query runs, and rows per such second (``ours_vs_spark_per_cpu``
  compares the medians: unlike rows/s, it does not depend on what else shares the cores);
- ``cpu_s_by_part``: that CPU split into the JVM's own threads, the Python processes under
  it (workers), the processes the JVM started and reaped during the query (a Python
  source's runner and planner) and the broker;
- ``peak_rss_mb``: the peak, sampled every 0.2 s while the query runs, of the resident memory
  of the Spark JVM and every process under it (the Python source runner and workers).
  The JVM keeps heap it grew for an earlier query, so this is the session's peak so far,
  not the query's own.

A third source, ``ready_batches`` (``benchmarks/_ready_batches.py``), yields the same number
of rows as ready Arrow batches without Kafka: the most a Python source reaches in the
session (``ready_vs_spark``, ``ours_vs_ready``).

A query of a few records per source (``small_query``, as ``spark_import_cost`` measures
it: what a query costs whatever it reads) runs ``REPS`` times after the warm-up; each shape
also reports rows per CPU-second beyond it (``median_rows_per_cpu_s_beyond_small_query``):
the CPU per row once the fixed cost of a query is taken out.

A warm-up query per source runs first (the first query in a JVM pays 4-9 s of class loading
and worker start). Then ``profile`` runs our executor read (``read_range``) of the 1-partition
100 B topic under cProfile in this process and lists where the time goes.

Sizes: ``SPARK_BENCH_ROWS_100B`` (default 1,000,000), ``SPARK_BENCH_ROWS_1KB`` (300,000),
``SPARK_BENCH_REPS`` (2). ``SPARK_BENCH_SHAPES`` picks the shapes (default
``100x1,100x8,1024x1,1024x8,1024x1h``): ``<value bytes>x<partitions>``, and a trailing ``h``
for records with three headers each, read with ``includeHeaders=true`` by both Kafka
sources (the ready batches, which have no headers column, are left out of those shapes).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import produce
from benchmarks.spark_import_cost import produce_small_topic, small_query_runs

ROWS_100B = int(os.environ.get("SPARK_BENCH_ROWS_100B", "1000000"))
ROWS_1KB = int(os.environ.get("SPARK_BENCH_ROWS_1KB", "300000"))
REPS = int(os.environ.get("SPARK_BENCH_REPS", "2"))


def _shapes(spec: str) -> list[tuple[int, int, int, bool]]:
    """``(value bytes, partitions, rows, headers)`` per ``<size>x<parts>[h]`` of ``spec``."""
    out = []
    for item in spec.split(","):
        item = item.strip()
        size, _, parts = item.rstrip("h").partition("x")
        rows = ROWS_100B if int(size) < 1024 else ROWS_1KB
        out.append((int(size), int(parts), rows, item.endswith("h")))
    return out


SHAPES = _shapes(os.environ.get("SPARK_BENCH_SHAPES", "100x1,100x8,1024x1,1024x8,1024x1h"))
SOURCES = ["kafka", "epochguard"]
#: Not a Kafka source: the same rows as ready Arrow batches (``benchmarks/_ready_batches.py``),
#: the most any Python source reaches in the session (``SPARK_BENCH_READY=0`` leaves it out).
READY = "ready_batches"
RUN_READY = os.environ.get("SPARK_BENCH_READY", "1") != "0"


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces: fields after its closing parenthesis.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mb(root: int) -> float:
    tree, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        total += _rss_kib(pid)
        todo.extend(tree.get(pid, []))
    return total / 1024


class PeakSampler:
    """The peak of ``tree_rss_mb(root)`` while the block runs, sampled in a thread."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root, self.interval, self.peak = root, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mb(self.root))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_mb(self.root))


def _headers(i: int) -> list[tuple[str, bytes]]:
    """Three headers per record in the headers shapes (a trace id, a name, a counter)."""
    return [("trace-id", b"%016x" % i), ("source", b"bench"), ("seq", b"%d" % i)]


def _produce(
    servers: str, topic: str, partitions: int, size: int, rows: int, headers: bool = False
) -> None:
    produce(
        servers,
        topic,
        rows,
        partitions=partitions,
        value=b"v" * size,
        key=lambda i: b"%d" % i,
        headers=_headers if headers else None,
    )


def tree_pids(roots: list[int]) -> list[int]:
    """``roots`` and every process under them."""
    tree, out, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system, reaped children included) of each of ``pids``."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        # utime, stime, cutime, cstime (fields 14-17; 12-15 after the command name)
        out[pid] = sum(int(x) for x in fields[11:15]) / _TICK
    return out


def _cpu_s(roots: list[int]) -> dict[int, float]:
    return cpu_by_pid(tree_pids(roots))


def _stat_fields(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()


def cpu_split(jvm: int, brokers: list[int]) -> dict[str, float]:
    """CPU seconds so far by where they are spent: the Spark JVM's own threads; the Python
    processes alive under it (the worker daemon and the workers running ``read()``, with
    the workers they reaped); the processes the JVM itself started and reaped (a Python
    source's runner and planner processes, which end with the query: counting them as
    JVM time, as ``cpu_by_pid`` does, overstated the JVM before); the brokers."""
    own = _stat_fields(jvm)
    python = cpu_by_pid([p for p in tree_pids([jvm]) if p != jvm])
    return {
        "spark_jvm_own": sum(int(x) for x in own[11:13]) / _TICK if own else 0.0,
        "spark_jvm_reaped_children": sum(int(x) for x in own[13:15]) / _TICK if own else 0.0,
        "python_under_jvm": sum(python.values()),
        "kafka_broker": sum(_cpu_s(brokers).values()),
    }


_TICK = os.sysconf("SC_CLK_TCK")


def settle(jvm: int, keep: set[int] | None = None, timeout: float = 10.0) -> bool:
    """Wait until the processes the JVM started for a query (its Python source runner and
    planner processes) have exited and the JVM has reaped them (a process is in ``/proc``
    until its parent reaps it), so their CPU is in the JVM's reaped-children figure of this
    query, not of the next one. ``keep``: children that may stay (alive before the query,
    such as the worker daemon); without it, wait until the set of children stops changing."""
    deadline = time.monotonic() + timeout
    last: set[int] | None = None
    while time.monotonic() < deadline:
        now = set(_children().get(jvm, []))
        if (keep is not None and now <= keep) or (keep is None and now == last):
            return True
        last = now
        time.sleep(0.1)
    return False


def _query(
    spark: Any,
    fmt: str,
    servers: str,
    topic: str,
    jvm_pid: int,
    brokers: list[int],
    shape: tuple[int, int, int, bool] = (100, 1, ROWS_100B, False),
) -> dict[str, Any]:
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", str(shape[3]).lower())
    )
    if fmt == READY:
        reader = (
            spark.readStream.format(READY)
            .option("rows", str(shape[2]))
            .option("value_bytes", str(shape[0]))
            .option("parts", str(shape[1]))
        )
    settle(jvm_pid)
    children_before = set(_children().get(jvm_pid, []))
    cpu_before = _cpu_s([jvm_pid, *brokers])
    split_before = cpu_split(jvm_pid, brokers)
    started = time.monotonic()
    with PeakSampler(jvm_pid) as mem:
        query = reader.load().writeStream.format("noop").trigger(availableNow=True).start()
        try:
            query.awaitTermination(900)
            error = query.exception()
            if error is not None:
                raise RuntimeError(f"{fmt} query on {topic} failed: {error}")
            progress = query.recentProgress
        finally:
            query.stop()
    wall = time.monotonic() - started
    settled = settle(jvm_pid, children_before)
    cpu_after = _cpu_s([jvm_pid, *brokers])
    split_after = cpu_split(jvm_pid, brokers)
    # Spark (JVM and Python workers) and the broker: the work the query cost, whatever
    # else runs on the machine (rows/s is not: other engineers' work shares the cores).
    cpu = sum(v - cpu_before.get(pid, 0.0) for pid, v in cpu_after.items())
    rows = sum(p["numInputRows"] for p in progress)
    trigger_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
    return {
        "rows": rows,
        "batches": sum(1 for p in progress if p["numInputRows"]),
        "trigger_s": round(trigger_ms / 1000, 3),
        "rows_per_s": round(rows / (trigger_ms / 1000)) if trigger_ms else None,
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(mem.peak),
        "cpu_s": round(cpu, 2),
        "rows_per_cpu_s": round(rows / cpu) if cpu else None,
        "cpu_s_by_part": {k: round(v - split_before[k], 2) for k, v in split_after.items()},
        "load_average_1m": round(os.getloadavg()[0], 2),
        # False: a process the JVM started for the query was still there 10 s after it.
        "children_reaped": settled,
        "duration_ms": _durations(progress),
    }


def _durations(progress: list[dict[str, Any]]) -> dict[str, int]:
    """Spark's ``durationMs`` parts summed over the query's batches (where a trigger's time
    goes: latestOffset, queryPlanning, addBatch = the tasks, walCommit, commitOffsets)."""
    out: dict[str, int] = {}
    for p in progress:
        for key, ms in p["durationMs"].items():
            out[key] = out.get(key, 0) + int(ms)
    return out


def profile(servers: str, topic: str, top: int = 15) -> dict[str, Any]:
    """Our executor read of one whole partition under cProfile (no Spark), where time goes."""
    from epochguard.spark_connector import datasource, executor
    from epochguard.spark_connector.options import parse_options

    opts = parse_options(
        {"kafka.bootstrap.servers": servers, "subscribe": topic, "startingOffsets": "earliest"},
        streaming=True,
    )
    reader = datasource._StreamReader(opts)
    start = reader.initialOffset()
    end = reader.latestOffset(start, _read_all())
    ranges = [p.range() for p in reader.partitions(start, end)]
    reader.stop()
    # One read first, unprofiled: imports and the connection are not what is measured.
    for rng in ranges:
        for _ in executor.read_range(opts, rng):
            pass
    prof = cProfile.Profile()
    started = time.perf_counter()
    prof.enable()
    rows = sum(b.num_rows for rng in ranges for b in executor.read_range(opts, rng))
    prof.disable()
    elapsed = time.perf_counter() - started
    stats = pstats.Stats(prof, stream=io.StringIO())
    total_tt = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    functions = []
    for (file, line, name), (_, ncalls, tt, ct, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:top]:
        functions.append(
            {
                "function": f"{Path(file).name}:{line}({name})",
                "calls": ncalls,
                "self_s": round(tt, 3),
                "cumulative_s": round(ct, 3),
                "self_share": round(tt / total_tt, 3) if total_tt else None,
            }
        )
    for consumers in executor._POOL.values():
        for c in consumers:
            c.close(autocommit=False)
    executor._POOL.clear()
    return {
        "topic": topic,
        "rows": rows,
        "seconds_under_profiler": round(elapsed, 3),
        "top_by_self_time": functions,
    }


def _read_all() -> Any:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    return ReadAllAvailable()


def run() -> dict[str, Any]:
    from pyspark import SparkContext

    from epochguard.spark_connector import register
    from epochguard.testing.apache_kafka import ApacheKafkaCluster, ensure_kafka_jars
    from epochguard.testing.apache_kafka.spark_kafka import ensure_spark_kafka_jars
    from epochguard.testing.spark_session import local_session

    load_before = os.getloadavg()
    connector = ensure_spark_kafka_jars()
    with ApacheKafkaCluster(brokers=1, jars=ensure_kafka_jars()) as cluster:
        servers = cluster.bootstrap_servers
        topics = {}
        for size, parts, rows, headers in SHAPES:
            topic = f"bench-{size}b-{parts}p" + ("-headers" if headers else "")
            cluster.create_topic(topic, partitions=parts, replication_factor=1)
            _produce(servers, topic, parts, size, rows, headers)
            topics[(size, parts, headers)] = (topic, rows)
        warmup_topic = next(iter(topics.values()))[0]
        produce_small_topic(cluster, "bench-small")
        spark = local_session(
            "epochguard-bench",
            jars=connector.extra,
            conf={"spark.ui.showConsoleProgress": "false"},
        )
        register(spark)
        sources = [*SOURCES, READY] if RUN_READY else list(SOURCES)
        if RUN_READY:
            from benchmarks._ready_batches import register as register_ready

            register_ready(spark)
        jvm_pid = SparkContext._gateway.proc.pid
        brokers = [p.pid for p in cluster._procs.values()]
        idle_mb = round(tree_rss_mb(jvm_pid))
        warmup = {
            fmt: _query(spark, fmt, servers, warmup_topic, jvm_pid, brokers) for fmt in sources
        }
        # What a query costs whatever it reads: a few records per source, taking turns.
        small = small_query_runs(
            spark, servers, "bench-small", jvm_pid, brokers, REPS, ready=RUN_READY
        )
        fixed = {f: small["median"][f]["cpu_s"] for f in SOURCES}
        runs = []
        for (size, parts, headers), (topic, rows) in topics.items():
            row: dict[str, Any] = {
                "value_bytes": size,
                "partitions": parts,
                "records": rows,
                "include_headers": headers,
            }
            shape_sources = list(SOURCES) if headers else sources
            for fmt in shape_sources:
                row[fmt] = []
            for _ in range(REPS):
                for fmt in shape_sources:
                    result = _query(
                        spark, fmt, servers, topic, jvm_pid, brokers, (size, parts, rows, headers)
                    )
                    # The ready batches repeat whole batches: a few rows more than asked.
                    if result["rows"] != rows and fmt != READY:
                        raise RuntimeError(f"{fmt} read {result['rows']} of {rows} rows")
                    row[fmt].append(result)
            best = {f: max(r["rows_per_s"] or 0 for r in row[f]) for f in SOURCES}
            row["best_rows_per_s"] = best
            row["ours_vs_spark"] = round(best["epochguard"] / best["kafka"], 2)
            per_cpu = {
                f: statistics.median(r["rows_per_cpu_s"] or 0 for r in row[f]) for f in SOURCES
            }
            row["median_rows_per_cpu_s"] = per_cpu
            row["ours_vs_spark_per_cpu"] = round(per_cpu["epochguard"] / per_cpu["kafka"], 2)
            # Per row alone: the CPU above what a query of a few records costs each source.
            beyond = {
                f: round(rows / max(statistics.median(r["cpu_s"] for r in row[f]) - fixed[f], 0.01))
                for f in SOURCES
            }
            row["median_rows_per_cpu_s_beyond_small_query"] = beyond
            row["ours_vs_spark_per_cpu_beyond_small_query"] = round(
                beyond["epochguard"] / beyond["kafka"], 2
            )
            if READY in shape_sources:
                ready = max(r["rows_per_s"] or 0 for r in row[READY])
                row["best_rows_per_s"][READY] = ready
                # The most a Python source reached here, against Spark's source and ours.
                row["ready_vs_spark"] = round(ready / best["kafka"], 2)
                row["ours_vs_ready"] = round(best["epochguard"] / ready, 2)
            row["median_cpu_s_by_part"] = {
                f: {
                    k: round(statistics.median(r["cpu_s_by_part"][k] for r in row[f]), 2)
                    for k in row[f][0]["cpu_s_by_part"]
                }
                for f in shape_sources
            }
            runs.append(row)
            print(
                f"{size} B x {parts} partitions{' with headers' if headers else ''}: "
                f"Spark {best['kafka']:,} rows/s, "
                f"ours {best['epochguard']:,} rows/s ({row['ours_vs_spark']}x); rows per "
                f"CPU-second {row['ours_vs_spark_per_cpu']}x; ready batches "
                f"{row['best_rows_per_s'].get(READY, '-')} rows/s",
                flush=True,
            )
        spark.stop()
        first_plain = next((t for (_s, _p, h), (t, _r) in topics.items() if not h), None)
        prof = profile(servers, first_plain) if first_plain else None
    return {
        "spark_kafka_connector": connector.version,
        "sources": {
            "kafka": "Spark's spark-sql-kafka-0-10",
            "epochguard": "ours",
            READY: "ready Arrow batches, no Kafka (benchmarks/_ready_batches.py)",
        },
        "session": "local[2]",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "idle_session_rss_mb": idle_mb,
        "warmup": warmup,
        "small_query": small,
        "runs": runs,
        "profile_ours": prof,
    }
