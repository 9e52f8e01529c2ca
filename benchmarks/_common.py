"""Helpers every benchmark shares: the one producer (:func:`produce`), the one percentile
(:func:`percentile`), building a kafka-python-API consumer (EpochConsumer and KafkaConsumer
take the same arguments), the timed read loops, running a client in a fresh process that
prints one JSON line, and writing a result file."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: One read step: (records read, bytes of keys and values touched).
Step = Callable[[], tuple[int, int]]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0 < ``q`` <= 100) of ``values`` by the nearest-rank method:
    the smallest value with at least ``q`` % of the values at or below it (so p100 is the
    maximum and every result is one of the values); ``None`` for no values."""
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q!r} is not in (0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def produce(
    target: Any,
    topic: str,
    records: int,
    *,
    partitions: int = 1,
    batch: bytes | None = None,
    batch_records: int = 0,
    value: bytes | Callable[[int], bytes] = b"x",
    key: Callable[[int], bytes] | None = None,
    headers: Callable[[int], Sequence[tuple[str, bytes]]] | None = None,
    compression: str = "none",
    acks: int | str = 1,
    linger_ms: int = 20,
    batch_bytes: int = 1 << 20,
    rate: float | None = None,
) -> None:
    """Write ``records`` records to ``topic``, spread evenly over partitions
    ``0..partitions-1``; returns once every one is stored (or acknowledged).

    With ``batch`` (one encoded record batch of ``batch_records`` records) and an
    EmbeddedCluster as ``target``, the batch is appended straight to the partitions' logs
    (offsets are restamped on every append), ``records / partitions`` records each: the
    fast preload of the throughput benchmarks. Otherwise ``target`` (bootstrap servers, or
    a cluster with ``bootstrap_servers``) gets them through librdkafka's producer (record
    ``i`` to partition ``i % partitions``, with ``value``, ``key`` and ``headers`` of
    ``i``); ``rate`` paces them at that many records per second, a callable ``value`` being
    called just before its record is sent (a latency benchmark's send time)."""
    if records < 0 or partitions < 1:
        raise ValueError(f"records={records} and partitions={partitions}: need >= 0 and >= 1")
    if batch is not None:
        _append_batches(target, topic, records, partitions, batch, batch_records)
        return
    from confluent_kafka import Producer

    servers = target if isinstance(target, str) else target.bootstrap_servers
    producer = Producer(
        {
            "bootstrap.servers": servers,
            "acks": acks,
            "linger.ms": linger_ms,
            "batch.size": batch_bytes,
            "compression.type": compression,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    interval = 1.0 / rate if rate else 0.0
    started = time.monotonic()
    for i in range(records):
        if interval:
            delay = started + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        payload = value(i) if callable(value) else value
        record_headers: list[tuple[str, str | bytes | None]] | None = (
            None if headers is None else [*headers(i)]
        )
        while True:
            try:
                producer.produce(
                    topic,
                    value=payload,
                    key=None if key is None else key(i),
                    partition=i % partitions,
                    headers=record_headers,
                )
                break
            except BufferError:  # librdkafka's queue is full: let it send
                producer.poll(0.05)
        if interval:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records to {topic} not acknowledged")


def _append_batches(
    cluster: Any, topic: str, records: int, partitions: int, batch: bytes, batch_records: int
) -> None:
    if not hasattr(cluster, "append_raw"):
        raise TypeError(f"a prebuilt batch needs an EmbeddedCluster, not {type(cluster).__name__}")
    if batch_records < 1 or records % (partitions * batch_records):
        raise ValueError(
            f"{records} records do not fill {partitions} partition(s) with whole batches "
            f"of {batch_records}"
        )
    per_partition = records // partitions // batch_records  # batches
    chunk = 50  # batches per append: bounded memory for the joined bytes
    for p in range(partitions):
        left = per_partition
        while left > 0:
            n = min(left, chunk)
            cluster.append_raw(topic, p, batch * n)
            left -= n


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def kafka_python_api_consumer(
    consumer_class: Any, bootstrap: str, topic: str, parts: int, **settings: Any
) -> Any:
    """An ``EpochConsumer`` or kafka-python ``KafkaConsumer`` reading ``topic`` from offset 0
    (CRC checks on unless ``settings`` say otherwise), assigned partitions ``0..parts-1``."""
    from kafka.structs import TopicPartition

    c = consumer_class(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        check_crcs=True,
        **settings,
    )
    c.assign([TopicPartition(topic, p) for p in range(parts)])
    return c


def touching_step(consumer: Any) -> Step:
    """``poll()`` once and touch every record's key and value, as an application would."""

    def step() -> tuple[int, int]:
        n = touched = 0
        for recs in consumer.poll(timeout_ms=1000).values():
            n += len(recs)
            for r in recs:
                touched += len(r.key) + len(r.value)
        return n, touched

    return step


def timing(count: int, touched: int, started: float, cpu0: float) -> dict[str, Any]:
    return {
        "records": count,
        "bytes_touched": touched,
        "elapsed_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu0,
    }


def timed_loop(step: Step, total: int, limit_s: float = 600) -> dict[str, Any]:
    """Run ``step`` until ``total`` records were read; wall and CPU time from the first
    call (connecting and the first answer count)."""
    count = touched = 0
    started, cpu0 = time.perf_counter(), time.process_time()
    deadline = time.monotonic() + limit_s
    while count < total and time.monotonic() < deadline:
        n, t = step()
        count += n
        touched += t
    if count < total:
        raise RuntimeError(f"read {count} of {total}")
    return timing(count, touched, started, cpu0)


async def atimed_loop(
    step: Callable[[], Awaitable[tuple[int, int]]], total: int, limit_s: float = 600
) -> dict[str, Any]:
    """:func:`timed_loop` for an asyncio client."""
    count = touched = 0
    started, cpu0 = time.perf_counter(), time.process_time()
    deadline = time.monotonic() + limit_s
    while count < total and time.monotonic() < deadline:
        n, t = await step()
        count += n
        touched += t
    if count < total:
        raise RuntimeError(f"read {count} of {total}")
    return timing(count, touched, started, cpu0)


def run_json_client(
    module: str,
    args: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    tail: int = 1500,
) -> dict[str, Any]:
    """``python -m <module> <args>`` in a fresh process from the repository root; returns the
    JSON object on its last line of output (its stderr's tail if it fails)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-tail:])
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def compile_package(package: str | None = None) -> None:
    """Write the compiled modules of ``package`` (a directory; default: the epochguard
    package in use) into its ``__pycache__`` directories, as installing a wheel does.

    Benchmarks measure the package as users install it. A source tree under
    ``PYTHONDONTWRITEBYTECODE`` (an editable install here) has none, so every process a
    benchmark starts (Spark's planner, source runner and workers, clients in processes of
    their own) would compile each module it imports: about 0.3 CPU-s for the consumer."""
    import compileall

    if package is None:
        import epochguard

        package = os.path.dirname(os.path.abspath(epochguard.__file__))
    compileall.compile_dir(package, quiet=1)


def write_record(results: Any, name: str, started: float, result: Any, **extra: Any) -> Any:
    """Write ``<results>/<name>.json``: the result with the time and host details; returns
    the record."""
    record = {
        "benchmark": name,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 3),
        "host": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        **extra,
        "result": result,
    }
    results.mkdir(exist_ok=True)
    tmp = results / f"{name}.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(results / f"{name}.json")
    return record


def confluent_consumer(bootstrap: str, topic: str, parts: int, **settings: Any) -> Any:
    """A confluent-kafka ``Consumer`` assigned partitions ``0..parts-1`` from offset 0 (CRC
    checks and the other ``settings`` as given, librdkafka's logging off)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
            **settings,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    return c


def confluent_step(consumer: Any, poll_records: int, touch: bool) -> Callable[[], tuple[int, int]]:
    """``consume()`` once: (records, bytes of keys and values touched if ``touch``); a
    record carrying an error raises."""

    def step() -> tuple[int, int]:
        touched = 0
        msgs = consumer.consume(num_messages=poll_records, timeout=1.0)
        for m in msgs:
            if m.error():
                raise RuntimeError(str(m.error()))
            if touch:
                touched += len(m.key()) + len(m.value())
        return len(msgs), touched

    return step


class LoopTicker:
    """A 1 ms ticker task on the running event loop: ``worst_s`` is the longest the loop went
    without running it (beyond the millisecond asked), ``worst_outside_gc_s`` the same less
    the full (generation 2) collections of the garbage collector that ran meanwhile. A full
    collection walks every object of the process (its modules, classes, functions: about
    30 ms over the 55,000 objects of a consumer program here), whoever triggered it;
    ``full_collections`` and ``longest_full_s`` say how many ran and the longest."""

    def __init__(self, on_tick: Callable[[float], None] | None = None) -> None:
        #: called with ``time.perf_counter()`` at every tick
        self.on_tick = on_tick
        self.worst_s = 0.0
        self.worst_outside_gc_s = 0.0
        self.full_collections = 0
        self.longest_full_s = 0.0
        self._in_full_s = 0.0
        self._full_started = 0.0
        self._task: Any = None

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        now = time.perf_counter()
        if phase == "start":
            self._full_started = now
            return
        took = now - self._full_started
        self._in_full_s += took
        self.full_collections += 1
        self.longest_full_s = max(self.longest_full_s, took)

    async def _tick(self) -> None:
        import asyncio

        last, in_full = time.perf_counter(), self._in_full_s
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            late = now - last - 0.001
            self.worst_s = max(self.worst_s, late)
            self.worst_outside_gc_s = max(
                self.worst_outside_gc_s, late - (self._in_full_s - in_full)
            )
            last, in_full = now, self._in_full_s
            if self.on_tick is not None:
                self.on_tick(now)

    def start(self) -> None:
        import asyncio
        import gc

        gc.callbacks.append(self._on_gc)
        self._task = asyncio.create_task(self._tick())

    def stop(self) -> None:
        import gc

        self._task.cancel()
        gc.callbacks.remove(self._on_gc)

    def results(self) -> dict[str, Any]:
        return {
            "loop_block_ms": round(self.worst_s * 1000, 2),
            "loop_block_outside_gc_ms": round(self.worst_outside_gc_s * 1000, 2),
            "gc_full_collections": self.full_collections,
            "gc_full_longest_ms": round(self.longest_full_s * 1000, 2),
        }


async def aiokafka_consumer(bootstrap: str, topic: str, parts: int, cls: Any = None) -> Any:
    """A started aiokafka consumer (or ``cls``, a drop-in such as ``AIOEpochConsumer``) with
    CRC checks on, partitions ``0..parts-1`` assigned and placed at offset 0 (the caller
    stops it)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = (cls or AIOKafkaConsumer)(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        check_crcs=True,
    )
    await c.start()
    tps = [TopicPartition(topic, p) for p in range(parts)]
    c.assign(tps)
    for tp in tps:
        c.seek(tp, 0)
    return c


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` (replication factor 1) through kafka-python's admin client."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def on_one_broker(
    clusters: Sequence[str], cases: Callable[[str, str], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``cases(kind, bootstrap)``'s rows on one broker of each of ``clusters``: "embedded"
    (``python -m epochguard cluster`` in its own process) and "apache" (one KRaft broker)."""
    rows: list[dict[str, Any]] = []
    if "embedded" in clusters:
        broker = subprocess.Popen(
            [sys.executable, "-m", "epochguard", "cluster", "--brokers", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert broker.stdout is not None
            rows += cases("embedded", broker.stdout.readline().strip())
        finally:
            broker.terminate()
            broker.wait(timeout=10)
    if "apache" in clusters:
        from epochguard.testing import ApacheKafkaCluster

        with ApacheKafkaCluster(brokers=1) as cluster:
            rows += cases("apache", cluster.bootstrap_servers)
    return rows
