"""Where a Spark query's time goes, ours and Spark's own Kafka source, on real Kafka.

One Apache Kafka broker, one ``local[2]`` session with Spark's connector (as
``spark_source``), one topic per shape of ``SPARK_PROFILE_SHAPES`` (``<value bytes>x<
partitions>``, default ``100x1,1024x1``; ``SPARK_PROFILE_ROWS_100B`` records of less than
1 KB, ``SPARK_PROFILE_ROWS_1KB`` of 1 KB or more). After a warm-up query per source,
each source reads each topic once with ``Trigger.AvailableNow`` into the ``noop`` sink,
and for each query this records:

- the CPU seconds of each process group while the query runs: the Spark JVM, the Python
  processes under it (source runner, worker daemon and its forked workers) and the Kafka
  broker (``/proc/<pid>/stat``, children included: the JVM's figure holds the Python
  source runner and planner processes it reaped when the query ended);
- the CPU seconds of each thread of the Spark JVM by name (task threads, JIT compilers, GC;
  sampled every 50 ms, so threads that end during the query count);
- with ``SPARK_PROFILE_JFR=1``, a Java Flight Recorder recording of the JVM per query
  (``jcmd JFR.start``, ``jfr print``), summed by thread, by bucket and by leaf method;
- for our source, a ``py-spy`` sampling profile of every Python process under the JVM
  (``--subprocesses``, idle samples included), summed by leaf function and by the buckets
  that matter for the executor read (waiting for a Fetch answer, decoding, building Arrow,
  handing batches to the JVM).

``py-spy`` must be installed (the ``dev`` extra has it); without it only CPU seconds are
reported. ``SPARK_PROFILE_KEEP_RAW=<dir>`` keeps py-spy's raw samples and the JFR files.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.spark_source import _TICK, _durations, _produce, cpu_by_pid, tree_pids

ROWS_100B = int(os.environ.get("SPARK_PROFILE_ROWS_100B", "1000000"))
ROWS_1KB = int(os.environ.get("SPARK_PROFILE_ROWS_1KB", "300000"))
#: The topics profiled, ``<value bytes>x<partitions>`` comma-separated:
#: ``SPARK_PROFILE_SHAPES`` (default ``100x1,1024x1``).
SHAPES = [
    (int(size), int(parts))
    for size, parts in (
        s.split("x") for s in os.environ.get("SPARK_PROFILE_SHAPES", "100x1,1024x1").split(",")
    )
]
#: ``SPARK_PROFILE_JFR=1``: a Java Flight Recorder recording of the Spark JVM per query
#: (``jcmd JFR.start``), summarised by thread, leaf method and bucket.
JFR = os.environ.get("SPARK_PROFILE_JFR") == "1"
SOURCES = ["kafka", "epochguard"]
#: More options for our source (JSON object), to compare settings: ``SPARK_PROFILE_OPTIONS``.
EXTRA_OPTIONS: dict[str, str] = json.loads(os.environ.get("SPARK_PROFILE_OPTIONS", "{}"))
_RATE = 200

#: (bucket, substrings of a frame "function (file)" that put a sample in it), first match
#: wins, checked from the leaf up.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("wait for Fetch answer (poll/pump_until idle)", ("wait (threading.py", "_wait_for_tstate")),
    ("record decoding (C/Python decoder)", ("decode_records", "decode_batch_records")),
    ("Arrow column building (_batch / columns)", ("_batch (", "_columns", "from_buffers")),
    (
        "hand-off to the JVM (Arrow IPC, socket write)",
        ("write_batch", "dump_stream", "_write_with_length", "write_int", "serializers.py"),
    ),
    ("consumer poll bookkeeping", ("fetched_records", "send_requests", "process_completions")),
    ("network read (IO thread)", ("_recv", "recv_into", "selectors.py", "_poll (")),
]


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _daemon(jvm: int) -> int:
    """The worker daemon under the JVM (it forks the processes that run ``read()``)."""
    for pid in tree_pids([jvm]):
        if "pyspark.daemon" in _cmd(pid):
            return pid
    raise RuntimeError("no pyspark.daemon process under the Spark JVM")


def _groups(jvm: int, brokers: list[int]) -> dict[str, list[int]]:
    under = tree_pids([jvm])
    python = [p for p in under if p != jvm and "python" in _cmd(p)]
    return {
        "spark_jvm": [jvm],
        "spark_python": python,
        "kafka_broker": [p for b in brokers for p in tree_pids([b])],
    }


def _summarise(raw: Path, rate: int, top: int = 12) -> dict[str, Any]:
    """py-spy's raw output (``process ...;thread (tid): name;frame;... count`` per line),
    per process and thread: seconds sampled, shares by bucket and by leaf frame."""
    threads: dict[str, dict[str, collections.Counter[str]]] = {}
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        frames = stack.split(";")
        at = next((i for i, f in enumerate(frames) if f.startswith("thread (")), None)
        if at is None or at == 0:
            continue
        process = frames[at - 1].split(":", 1)[0]
        name = f"{process} {frames[at]}"
        code = frames[at + 1 :]
        count = int(count_s)
        entry = threads.setdefault(
            name, {"leaf": collections.Counter(), "bucket": collections.Counter()}
        )
        entry["leaf"][code[-1] if code else "(no Python frame)"] += count
        for bucket, keys in BUCKETS:
            if any(k in f for f in reversed(code) for k in keys):
                entry["bucket"][bucket] += count
                break
        else:
            entry["bucket"]["other"] += count
    out = []
    for name, entry in threads.items():
        total = sum(entry["leaf"].values())
        out.append(
            {
                "thread": name,
                "sampled_s": round(total / rate, 2),
                "by_bucket": {k: round(v / total, 3) for k, v in entry["bucket"].most_common()},
                "top_leaf_frames": {
                    f: round(c / total, 3) for f, c in entry["leaf"].most_common(top)
                },
            }
        )
    out.sort(key=lambda t: -t["sampled_s"])
    return {"rate_hz": rate, "threads": out}


def _tid_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds and name of each live thread of ``pid`` (``/proc/<pid>/task``)."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


class ThreadCpu:
    """CPU seconds the threads of ``pid`` spend while the block runs, by thread name with
    its number dropped (``GC Thread#1`` and ``GC Thread#0`` add up). Sampled every
    ``interval`` so threads that start and end inside the block (a task's helper
    threads) are counted up to their last sample."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval = pid, interval
        self._first = _tid_cpu(pid)
        self._last: dict[int, tuple[str, float]] = dict(self._first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._last.update(_tid_cpu(self.pid))

    def __enter__(self) -> ThreadCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._last.update(_tid_cpu(self.pid))

    def by_name(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for tid, (name, cpu) in self._last.items():
            spent = cpu - self._first.get(tid, (name, 0.0))[1]
            key = name.rstrip("0123456789#-: ")
            out[key] = out.get(key, 0.0) + spent
        return dict(
            sorted(((k, round(v, 2)) for k, v in out.items() if v >= 0.02), key=lambda kv: -kv[1])
        )


#: (bucket, substrings of a JVM frame "class.method") for JFR samples, checked from the
#: leaf up, first match wins.
JVM_BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    (
        "Arrow IPC read (Python worker socket -> Arrow buffers)",
        (
            "org.apache.arrow.vector.ipc",
            "org.apache.arrow.vector.VectorLoader",
            "org.apache.arrow.memory",
            "PythonArrowOutput",
        ),
    ),
    (
        "Arrow columns -> rows (ArrowColumnVector, UnsafeProjection)",
        (
            "ArrowColumnVector",
            "UnsafeProjection",
            "UnsafeRowWriter",
            "ColumnarBatchRow",
            "GeneratedClass",
            "UnsafeWriter",
        ),
    ),
    ("Kafka client (Spark's source)", ("org.apache.kafka",)),
    ("Spark's Kafka source (rows from records)", ("org.apache.spark.sql.kafka010",)),
    (
        "writing to the Python worker / its socket",
        ("PythonRunner$WriterThread", "BasePythonRunner"),
    ),
    ("noop sink / task", ("NoopWriter", "DataWritingSparkTask", "WriteToDataSourceV2")),
]


def _jfr(jvm: int, action: str, path: Path | None = None) -> None:
    args = ["jcmd", str(jvm), f"JFR.{action}", "name=epochguard-profile"]
    if action == "start":
        args += ["settings=profile"]
    if path is not None:
        args += [f"filename={path}"]
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def _jfr_summary(path: Path, top: int = 15) -> dict[str, Any]:
    """Execution samples of a JFR recording by thread, by bucket and by leaf method."""
    out = subprocess.run(
        [
            "jfr",
            "print",
            "--json",
            "--events",
            "jdk.ExecutionSample,jdk.GarbageCollection",
            str(path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    ).stdout
    events = json.loads(out)["recording"]["events"]
    threads: collections.Counter[str] = collections.Counter()
    buckets: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    gc_pause_s = 0.0
    samples = 0
    for ev in events:
        values = ev["values"]
        if ev["type"] == "jdk.GarbageCollection":
            gc_pause_s += _jfr_seconds(values.get("sumOfPauses", "0 s"))
            continue
        frames = [
            f"{f['method']['type']['name']}.{f['method']['name']}"
            for f in (values.get("stackTrace") or {}).get("frames", [])
        ]
        samples += 1
        threads[(values.get("sampledThread") or {}).get("javaName", "?").rstrip("0123456789")] += 1
        leaves[frames[0] if frames else "?"] += 1
        for bucket, keys in JVM_BUCKETS:
            if any(k in f for f in frames for k in keys):
                buckets[bucket] += 1
                break
        else:
            buckets["other"] += 1
    share = lambda c: {k: round(v / samples, 3) for k, v in c.most_common(top)}  # noqa: E731
    return {
        "execution_samples": samples,
        "gc_pauses_s": round(gc_pause_s, 3),
        "by_thread": share(threads),
        "by_bucket": share(buckets),
        "top_leaf_methods": share(leaves),
    }


def _jfr_seconds(text: Any) -> float:
    if isinstance(text, (int, float)):
        return float(text)
    number, _, unit = str(text).partition(" ")
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}.get(unit.strip(), 1.0)
    try:
        return float(number) * scale
    except ValueError:
        return 0.0


def _query(spark: Any, fmt: str, servers: str, topic: str) -> Any:
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if fmt == "epochguard":
        for key, value in EXTRA_OPTIONS.items():
            reader = reader.option(key, value)
    return reader.load().writeStream.format("noop").trigger(availableNow=True).start()


def _finish(query: Any, fmt: str, topic: str) -> dict[str, Any]:
    query.awaitTermination(900)
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"{fmt} query on {topic} failed: {error}")
    progress = query.recentProgress
    query.stop()
    rows = sum(p["numInputRows"] for p in progress)
    trigger_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
    return {
        "rows": rows,
        "trigger_s": round(trigger_ms / 1000, 3),
        "rows_per_s": round(rows / (trigger_ms / 1000)) if trigger_ms else None,
        "duration_ms": _durations(progress),
    }


def _profiled(
    spark: Any, fmt: str, servers: str, topic: str, jvm: int, brokers: list[int], spy: str | None
) -> dict[str, Any]:
    before = {k: cpu_by_pid(v) for k, v in _groups(jvm, brokers).items()}
    load = os.getloadavg()[0]
    jvm_threads = ThreadCpu(jvm).__enter__()
    jfr_file = Path(tempfile.mkdtemp()) / "query.jfr"
    if JFR:
        _jfr(jvm, "start")
    started = time.monotonic()
    query = _query(spark, fmt, servers, topic)
    recorder = None
    raw = Path(tempfile.mkdtemp()) / "pyspy.txt"
    if spy is not None and fmt == "epochguard":
        # The daemon forks the workers that run read(): follow every Python process.
        recorder = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(_daemon(jvm)),
                "--subprocesses",
                "--idle",
                "--threads",
                "--rate",
                str(_RATE),
                "--format",
                "raw",
                "--output",
                str(raw),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    try:
        result = _finish(query, fmt, topic)
    finally:
        if recorder is not None:
            recorder.send_signal(2)
            _, err = recorder.communicate(timeout=60)
    result["wall_s"] = round(time.monotonic() - started, 3)
    if JFR:
        _jfr(jvm, "stop", jfr_file)
    jvm_threads.__exit__()
    result["spark_jvm_cpu_s_by_thread"] = jvm_threads.by_name()
    if JFR and jfr_file.exists():
        result["jfr"] = _jfr_summary(jfr_file)
        keep_jfr = os.environ.get("SPARK_PROFILE_KEEP_RAW")
        if keep_jfr:
            shutil.copy(jfr_file, Path(keep_jfr) / f"{fmt}-{topic}.jfr")
    shutil.rmtree(jfr_file.parent, ignore_errors=True)
    # A process that ended during the query is missed unless its parent reaped it (the
    # parent's cumulative child times keep it); Spark's workers are reused, so few end.
    cpu = {}
    for k, pids in _groups(jvm, brokers).items():
        now = cpu_by_pid(pids)
        cpu[k] = round(sum(v - before[k].get(pid, 0.0) for pid, v in now.items()), 2)
    result["cpu_s"] = cpu
    result["load_average_1m_at_start"] = round(load, 2)
    if recorder is not None:
        if raw.exists():
            result["py_spy"] = _summarise(raw, _RATE)
            keep = os.environ.get("SPARK_PROFILE_KEEP_RAW")
            if keep:
                shutil.copy(raw, Path(keep) / f"pyspy-{fmt}-{topic}.txt")
        else:
            result["py_spy_error"] = err.decode(errors="replace")[-500:]
        shutil.rmtree(raw.parent, ignore_errors=True)
    return result


def run() -> dict[str, Any]:
    from pyspark import SparkContext

    from epochguard.spark_connector import register
    from epochguard.testing.apache_kafka import ApacheKafkaCluster, ensure_kafka_jars
    from epochguard.testing.apache_kafka.spark_kafka import ensure_spark_kafka_jars
    from epochguard.testing.spark_session import local_session

    spy = shutil.which("py-spy") or shutil.which(str(Path(sys.executable).with_name("py-spy")))
    load_before = os.getloadavg()
    connector = ensure_spark_kafka_jars()
    runs = []
    with ApacheKafkaCluster(brokers=1, jars=ensure_kafka_jars()) as cluster:
        servers = cluster.bootstrap_servers
        brokers = [p.pid for p in cluster._procs.values()]
        topics = []
        for size, parts in SHAPES:
            rows = ROWS_100B if size < 1024 else ROWS_1KB
            topic = f"profile-{size}b-{parts}p"
            cluster.create_topic(topic, partitions=parts, replication_factor=1)
            _produce(servers, topic, parts, size, rows)
            topics.append((size, topic, rows))
        spark = local_session(
            "epochguard-profile",
            jars=connector.extra,
            conf={"spark.ui.showConsoleProgress": "false"},
        )
        register(spark)
        jvm = SparkContext._gateway.proc.pid
        for fmt in SOURCES:
            _finish(_query(spark, fmt, servers, topics[0][1]), fmt, topics[0][1])
        for size, topic, rows in topics:
            for fmt in SOURCES:
                result = _profiled(spark, fmt, servers, topic, jvm, brokers, spy)
                if result["rows"] != rows:
                    raise RuntimeError(f"{fmt} read {result['rows']} of {rows} rows")
                result.update(source=fmt, value_bytes=size, topic=topic)
                runs.append(result)
                print(
                    f"{size} B {fmt}: {result['rows_per_s']:,} rows/s cpu {result['cpu_s']}",
                    flush=True,
                )
        spark.stop()
    return {
        "spark_kafka_connector": connector.version,
        "py_spy": spy is not None,
        "extra_options_ours": EXTRA_OPTIONS,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
    }
