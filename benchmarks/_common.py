"""Helpers the throughput benchmarks share (matrix.py, consumer_throughput.py, lean_fetch.py):
building a kafka-python-API consumer (EpochConsumer and KafkaConsumer take the same
arguments), the timed read loops, and running a client in a fresh process that prints one
JSON line."""

from __future__ import annotations

import json
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


async def aiokafka_consumer(bootstrap: str, topic: str, parts: int) -> Any:
    """A started aiokafka consumer with CRC checks on, partitions ``0..parts-1`` assigned
    and placed at offset 0 (the caller stops it)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(
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
