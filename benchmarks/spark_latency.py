"""The latency of a running Structured Streaming query: our source and Spark's Kafka source.

Method (also written into the JSON as ``method``):

* One Apache Kafka 4.3.1 broker (``ApacheKafkaCluster``, ``make kafka-jars``) and one
  ``local[2]`` SparkSession with Spark's connector on ``spark.jars`` (``make spark-jars``).
* A run: a fresh one-partition topic; a query of one source on it (``startingOffsets``
  latest, the default trigger, so a micro-batch starts as soon as the last one ends and
  there is new data) into ``foreachBatch``, whose function collects the batch's values
  and takes the wall-clock time once they are in the driver: the record's arrival at the
  sink. Once the query has run its first (empty) batch, librdkafka's producer
  (``benchmarks._common.produce``, acks=1, linger.ms=0) sends one record, waited for at
  the sink (the first micro-batch with rows starts a Python worker and the first
  connections), then ``SPARK_LATENCY_WARMUP`` (default 25) and ``SPARK_LATENCY_RECORDS``
  (default 150) records at ``SPARK_LATENCY_RATE`` records/s (default 5), each 100-byte
  value starting with the wall-clock time just before it is sent and its index. Latency:
  arrival at the sink minus send time, for every record after the warm-up. The producer
  and the sink run in this process: one clock.
* A third source, ``paced_stamps`` (``benchmarks/_paced_stamps.py``), is a Python streaming
  source without Kafka: its records exist from their scheduled time on (the same warm-up,
  first record and rate), so its latency is what Spark's Python Data Source API costs any
  Python source, the floor for ours.
* A fourth, ``epochguard_driver_read``, is ours with ``driverReadMaxOffsets`` (10000):
  micro-batches this small are read by the source's process on the driver and handed to
  Spark with the plan, with no Python worker task.
* Runs alternate between the sources, ``SPARK_LATENCY_ROUNDS`` rounds (default 3), each
  round starting with the next source: every source gets the same share of whatever else
  the shared machine runs. p50, p90, p99 and the maximum are over the records of all
  rounds (nearest rank), and per run.
* Per micro-batch that read records, Spark's ``StreamingQueryProgress.durationMs``
  (``latestOffset``, ``queryPlanning``, ``getBatch``, ``walCommit``, ``addBatch`` (the
  tasks and the sink), ``commitOffsets``, ``triggerExecution``) as p50 and p90 over the
  batches, and where a record's time goes: from its send to the start of the trigger that
  read it (``sent_to_trigger_ms``), and from there to the sink (``trigger_to_sink_ms``).
* Checkpoints go to ``/dev/shm`` where it exists (a tmpfs): Spark writes two checkpoint
  files per micro-batch, and a disk shared with other work would add its waits to both.
* CPU while the query runs at that rate (the warm-up and the measured records), per
  second of wall time, split as in ``benchmarks/spark_source.py``: the Spark JVM's own
  threads, the Python processes under it (the source runner, planner processes and
  workers), the processes it reaped meanwhile, and the broker. Between micro-batches a
  query asks its source for new data every ``spark.sql.streaming.pollingDelay`` (10 ms):
  at a few records per second this is mostly the cost of that asking. The JVM runs
  nothing else meanwhile; the broker's figure includes its own idle work.
* The load average (1 minute) before and after every run: other work shares the 2 cores.

``python -m benchmarks spark_latency``. ``SPARK_LATENCY_SOURCES`` (default
``kafka,epochguard,paced_stamps``) picks the sources; ``SPARK_LATENCY_OPTIONS`` (a JSON
object) adds options to our source's.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from benchmarks._common import percentile, produce

RATE = float(os.environ.get("SPARK_LATENCY_RATE", "5"))
RECORDS = int(os.environ.get("SPARK_LATENCY_RECORDS", "150"))
WARMUP = int(os.environ.get("SPARK_LATENCY_WARMUP", "25"))
ROUNDS = int(os.environ.get("SPARK_LATENCY_ROUNDS", "3"))
#: Not a Kafka source: stamped records on the same schedule without I/O
#: (``benchmarks/_paced_stamps.py``), what any Python streaming source pays.
PACED = "paced_stamps"
#: Ours reading small micro-batches on the driver (``driverReadMaxOffsets``).
DRIVER_READ = "epochguard_driver_read"
DRIVER_READ_OPTIONS = {"driverReadMaxOffsets": "10000"}
SOURCES = os.environ.get("SPARK_LATENCY_SOURCES", f"kafka,epochguard,{DRIVER_READ},{PACED}").split(
    ","
)
#: More options for our source (a JSON object), to compare settings.
EXTRA_OPTIONS: dict[str, str] = json.loads(os.environ.get("SPARK_LATENCY_OPTIONS", "{}"))
VALUE_BYTES = 100
#: Parts of ``durationMs`` reported per micro-batch, in the order Spark spends them.
DURATIONS = (
    "latestOffset",
    "queryPlanning",
    "getBatch",
    "walCommit",
    "addBatch",
    "commitOffsets",
    "triggerExecution",
)
_STAMP = struct.Struct(">dI")
#: Checkpoints in memory where there is a tmpfs: Spark writes two checkpoint files per
#: micro-batch (``walCommit``, ``commitOffsets``), and a disk shared with other work adds
#: its waits to both sources alike.
_CHECKPOINTS = "/dev/shm" if os.path.isdir("/dev/shm") else None


def stamp(index: int, sent: float) -> bytes:
    """A record value: the send time and the record's index, padded to ``VALUE_BYTES``."""
    return _STAMP.pack(sent, index).ljust(VALUE_BYTES, b".")


def unstamp(value: bytes) -> tuple[int, float]:
    """``(index, send time)`` of a value made by :func:`stamp`."""
    sent, index = _STAMP.unpack_from(value)
    return index, sent


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p90, p99 and the maximum of ``values`` (nearest rank)."""
    return {
        "p50_ms": percentile(values, 50),
        "p90_ms": percentile(values, 90),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values) if values else None,
    }


def _trigger_start(progress: Mapping[str, Any]) -> float:
    """The progress report's ``timestamp`` (when the trigger started) as epoch seconds."""
    text = str(progress["timestamp"]).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def summarise(
    arrivals: Iterable[tuple[int, float, Sequence[bytes]]],
    progress: Sequence[Mapping[str, Any]],
    warmup: int,
    records: int,
) -> dict[str, Any]:
    """One run's figures from what the sink saw and the query's progress reports.

    ``arrivals``: ``(batch id, arrival time, values)`` per ``foreachBatch`` call. Every
    record ``0..warmup+records-1`` must have arrived exactly once; the figures are over
    ``warmup..warmup+records-1``. ``latencies_ms`` (by record index) and ``batches`` (the
    ``durationMs`` of each micro-batch that read records) are kept for pooling runs."""
    trigger_at = {int(p["batchId"]): _trigger_start(p) for p in progress}
    latency: dict[int, float] = {}
    waited: list[float] = []
    ran: list[float] = []
    seen: dict[int, int] = {}
    for batch_id, arrived, values in arrivals:
        for value in values:
            index, sent = unstamp(value)
            seen[index] = seen.get(index, 0) + 1
            if not warmup <= index < warmup + records:
                continue
            latency[index] = _ms(arrived - sent)
            started = trigger_at.get(batch_id)
            if started is not None:
                waited.append(_ms(started - sent))
                ran.append(_ms(arrived - started))
    missing = [i for i in range(warmup + records) if i not in seen]
    twice = sorted(i for i, n in seen.items() if n > 1)
    if missing or twice:
        raise RuntimeError(f"records missing at the sink: {missing[:10]}; twice: {twice[:10]}")
    # Micro-batches of the measured records only: the warm-up's first batches pay for
    # class loading and the first connections.
    measured = {b for b, _t, values in arrivals if any(unstamp(v)[0] >= warmup for v in values)}
    batches = [
        {k: int(v) for k, v in p["durationMs"].items() if k in DURATIONS}
        for p in progress
        if p.get("numInputRows") and int(p["batchId"]) in measured
    ]
    latencies = [latency[i] for i in sorted(latency)]
    return {
        "records": len(latencies),
        **spread(latencies),
        "sent_to_trigger_ms": spread(waited),
        "trigger_to_sink_ms": spread(ran),
        "batches_with_rows": len(batches),
        "batch_duration_ms": batch_spread(batches),
        "latencies_ms": latencies,
        "batches": batches,
    }


def cpu_rate(
    before: Mapping[str, float], after: Mapping[str, float], span_s: float
) -> dict[str, float]:
    """CPU seconds per second of ``span_s`` by part, and their ``total``."""
    parts = {k: round((after[k] - before[k]) / span_s, 3) for k in before}
    return {**parts, "total": round(sum(parts.values()), 3)}


def batch_spread(batches: Sequence[Mapping[str, int]]) -> dict[str, dict[str, Any]]:
    """p50, p90 and the maximum of each part of ``durationMs`` over ``batches``."""
    out = {}
    for key in DURATIONS:
        vals = [float(b[key]) for b in batches if key in b]
        if vals:
            out[key] = {
                "p50_ms": percentile(vals, 50),
                "p90_ms": percentile(vals, 90),
                "max_ms": max(vals),
            }
    return out


class _KafkaFeed:
    """Records for a Kafka source: one topic per run, sent by librdkafka's producer."""

    def __init__(self, cluster: Any, topic: str) -> None:
        self.cluster, self.topic = cluster, topic
        cluster.create_topic(topic, partitions=1, replication_factor=1)

    def options(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.cluster.bootstrap_servers,
            "subscribe": self.topic,
            "startingOffsets": "latest",
        }

    def first(self) -> None:
        produce(self.cluster, self.topic, 1, value=lambda i: stamp(0, time.time()), linger_ms=0)

    def steady(self, count: int) -> None:
        produce(
            self.cluster,
            self.topic,
            count,
            value=lambda i: stamp(i + 1, time.time()),
            linger_ms=0,
            rate=RATE,
        )


class _PacedFeed:
    """Records for ``paced_stamps`` (``benchmarks/_paced_stamps.py``): no Kafka, they exist
    from their scheduled time on, and that time is their send time."""

    def __init__(self, clock: str, total: int) -> None:
        self.clock, self.total = clock, total

    def options(self) -> dict[str, str]:
        return {
            "clock": self.clock,
            "rate": str(RATE),
            "count": str(self.total),
            "bytes": str(VALUE_BYTES),
        }

    def first(self) -> None:
        from benchmarks._paced_stamps import write_clock

        self._first = time.time()
        write_clock(self.clock, self._first)

    def steady(self, count: int) -> None:
        from benchmarks._paced_stamps import write_clock

        steady = time.time()
        write_clock(self.clock, self._first, steady)
        time.sleep(max(0.0, steady + (count - 1) / RATE - time.time()))


def _one_run(
    spark: Any,
    fmt: str,
    feed: _KafkaFeed | _PacedFeed,
    checkpoint: str,
    cpu: Callable[[], dict[str, float]],
    timeout_s: float = 120,
) -> dict[str, Any]:
    arrivals: list[tuple[int, float, list[bytes]]] = []
    first, seen = threading.Event(), threading.Event()
    total = 1 + WARMUP + RECORDS

    def sink(df: Any, batch_id: int) -> None:
        values = [bytes(r.value) for r in df.select("value").collect()]
        arrivals.append((batch_id, time.time(), values))
        count = sum(len(v) for _b, _t, v in arrivals)
        if count:
            first.set()
        if count >= total:
            seen.set()

    load_before = os.getloadavg()[0]
    reader = spark.readStream.format("epochguard" if fmt == DRIVER_READ else fmt)
    reader = reader.options(**feed.options())
    if fmt in ("epochguard", DRIVER_READ):
        reader = reader.options(**EXTRA_OPTIONS)
    if fmt == DRIVER_READ:
        reader = reader.options(**DRIVER_READ_OPTIONS)
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        # startingOffsets=latest: records sent before the first batch are not read.
        deadline = time.monotonic() + timeout_s
        while query.lastProgress is None:
            if query.exception() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{fmt}: no first batch: {query.exception()}")
            time.sleep(0.05)
        # Record 0 alone first, waited for at the sink: the first micro-batch with rows
        # pays for starting a Python worker and the first connections.
        feed.first()
        if not first.wait(timeout_s):
            raise RuntimeError(f"{fmt}: record 0 did not reach the sink: {query.exception()}")
        cpu_before, cpu_from = cpu(), time.monotonic()
        feed.steady(total - 1)
        if not seen.wait(timeout_s):
            raise RuntimeError(f"{fmt}: {sum(len(v) for *_, v in arrivals)} of {total} records")
        cpu_after, cpu_span = cpu(), time.monotonic() - cpu_from
        progress = list(query.recentProgress)
    finally:
        query.stop()
    out = summarise(arrivals, progress, 1 + WARMUP, RECORDS)
    out["cpu_s_per_s"] = cpu_rate(cpu_before, cpu_after, cpu_span)
    out["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return out


def _median_cpu(runs: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
    """The median of each part over ``runs``."""
    return {k: percentile([r[k] for r in runs], 50) for k in (runs[0] if runs else {})}


def run() -> dict[str, Any]:
    from epochguard.spark_connector import register
    from epochguard.testing.apache_kafka import ApacheKafkaCluster, ensure_kafka_jars
    from epochguard.testing.apache_kafka.spark_kafka import ensure_spark_kafka_jars
    from epochguard.testing.spark_session import local_session

    load_before = os.getloadavg()
    connector = ensure_spark_kafka_jars()
    runs: dict[str, list[dict[str, Any]]] = {fmt: [] for fmt in SOURCES}
    with (
        ApacheKafkaCluster(brokers=1, jars=ensure_kafka_jars()) as cluster,
        tempfile.TemporaryDirectory(prefix="spark-latency-", dir=_CHECKPOINTS) as tmp,
    ):
        spark = local_session(
            "epochguard-bench-latency",
            jars=connector.extra,
            conf={
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.streaming.numRecentProgressUpdates": str(10 * (WARMUP + RECORDS)),
            },
        )
        register(spark)
        from pyspark import SparkContext

        from benchmarks.spark_source import cpu_split

        jvm = SparkContext._gateway.proc.pid
        brokers = [p.pid for p in cluster._procs.values()]

        def cpu() -> dict[str, float]:
            return cpu_split(jvm, brokers)

        if PACED in SOURCES:
            from benchmarks._paced_stamps import register as register_paced

            register_paced(spark)
        try:
            for rnd in range(ROUNDS):
                # Each round starts with another source: none always runs first or last.
                for fmt in SOURCES[rnd % len(SOURCES) :] + SOURCES[: rnd % len(SOURCES)]:
                    name = f"latency-{fmt}-{rnd}"
                    feed = (
                        _PacedFeed(f"{tmp}/{name}.clock", 1 + WARMUP + RECORDS)
                        if fmt == PACED
                        else _KafkaFeed(cluster, name)
                    )
                    result = _one_run(spark, fmt, feed, f"{tmp}/{name}", cpu)
                    result["round"] = rnd
                    runs[fmt].append(result)
                    print(
                        f"{fmt} round {rnd}: p50 {result['p50_ms']} ms, p90 {result['p90_ms']} "
                        f"ms, p99 {result['p99_ms']} ms (load {result['load_average_1m']})",
                        flush=True,
                    )
        finally:
            spark.stop()
    sources = {}
    for fmt in SOURCES:
        batches = [b for r in runs[fmt] for b in r.pop("batches")]
        sources[fmt] = {
            "records": sum(r["records"] for r in runs[fmt]),
            **spread([v for r in runs[fmt] for v in r["latencies_ms"]]),
            "batch_duration_ms": batch_spread(batches),
            "cpu_s_per_s": _median_cpu([r["cpu_s_per_s"] for r in runs[fmt]]),
            "runs": runs[fmt],
        }
    return {
        "method": __doc__,
        "settings": {
            "rate_per_s": RATE,
            "records": RECORDS,
            "warmup_records": WARMUP,
            "rounds": ROUNDS,
            "value_bytes": VALUE_BYTES,
            "epochguard_options": EXTRA_OPTIONS,
        },
        "source_names": {
            "kafka": "Spark's spark-sql-kafka-0-10",
            "epochguard": "ours",
            DRIVER_READ: f"ours with {DRIVER_READ_OPTIONS}",
            PACED: "stamped records on the same schedule, no Kafka (benchmarks/_paced_stamps.py)",
        },
        "spark_kafka_connector": connector.version,
        "session": "local[2]",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "sources": sources,
    }
