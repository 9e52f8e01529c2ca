"""End-to-end latency at a fixed produce rate: EpochConsumer, kafka-python, aiokafka and
confluent-kafka, with ``fetch_max_wait_ms`` at its default (500) and at 0.

Method (also written into the JSON as ``method``):

* One broker in its own process: the EmbeddedCluster (``python -m epochguard cluster``) and
  real Apache Kafka (``ApacheKafkaCluster``, KRaft, from the Maven Central jars), so the
  figures do not depend on our own broker.
* Each run has a fresh one-partition topic. The consumer is a fresh process, assigned the
  partition from offset 0; once its first poll has returned it says so, and the benchmark
  process starts producing with librdkafka's producer (``benchmarks._common.produce``:
  acks=1, linger.ms=0) at
  ``LATENCY_RATE`` records/s (default 1000) for 1 s of warm-up plus ``LATENCY_SECONDS``
  (default 8). Each 100-byte value starts with the wall-clock time just before ``send``.
* The consumer takes the wall-clock time when ``poll`` hands it a record and keeps
  ``receipt - send`` for every record sent after the warm-up; p50, p99 and the maximum
  are reported, with the consumer process's CPU seconds over the run. The producer's own
  delay is in every figure alike.
* Clients are interleaved within a case, ``LATENCY_REPEAT`` rounds (default 2); the round
  with the lowest p99 is kept. The load average is recorded: the machine is shared.

``python -m benchmarks latency``; ``LATENCY_CLUSTERS=embedded`` skips real Kafka.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import create_topic, on_one_broker, percentile, produce

RATE = int(os.environ.get("LATENCY_RATE", "1000"))
SECONDS = float(os.environ.get("LATENCY_SECONDS", "8"))
REPEAT = int(os.environ.get("LATENCY_REPEAT", "2"))
CLUSTERS = os.environ.get("LATENCY_CLUSTERS", "embedded,apache").split(",")
WARMUP_S = 1.0
VALUE_BYTES = 100
CLIENTS = ["epochguard", "kafka-python", "aiokafka", "confluent-kafka"]
#: None: the client's default (500 ms for all four).
WAITS: list[int | None] = [None, 0]
_STAMP = struct.Struct(">d")


# ---------------------------------------------------------------- consumer process


def _consumer(client: str, bootstrap: str, topic: str, wait: int | None) -> Any:
    """``(poll, close)`` for ``client``; ``poll()`` returns the values it was handed."""
    if client == "epochguard" or client == "kafka-python":
        from kafka.structs import TopicPartition

        if client == "epochguard":
            from epochguard.consumer import EpochConsumer as Consumer
        else:
            from kafka import KafkaConsumer as Consumer
        extra = {} if wait is None else {"fetch_max_wait_ms": wait}
        c = Consumer(
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **extra,
        )
        c.assign([TopicPartition(topic, 0)])

        def poll() -> list[bytes]:
            return [r.value for recs in c.poll(timeout_ms=100).values() for r in recs]

        return poll, c.close
    if client == "confluent-kafka":
        from confluent_kafka import Consumer as CConsumer
        from confluent_kafka import TopicPartition as CTopicPartition

        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": "latency",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
        if wait is not None:
            conf["fetch.wait.max.ms"] = wait
        cc = CConsumer(conf)
        cc.assign([CTopicPartition(topic, 0, 0)])

        def cpoll() -> list[bytes]:
            # poll(), not consume(n): consume waits for n records or its timeout, which at
            # this rate would hold records back for the timeout.
            m = cc.poll(0.1)
            if m is None:
                return []
            if m.error():
                raise RuntimeError(str(m.error()))
            return [m.value()]

        return cpoll, cc.close
    if client == "aiokafka":
        import asyncio

        from aiokafka import AIOKafkaConsumer, TopicPartition

        loop = asyncio.new_event_loop()
        extra = {} if wait is None else {"fetch_max_wait_ms": wait}
        tp = TopicPartition(topic, 0)

        async def start() -> Any:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                **extra,
            )
            await consumer.start()
            consumer.assign([tp])
            consumer.seek(tp, 0)
            return consumer

        ac = loop.run_until_complete(start())

        def apoll() -> list[bytes]:
            got = loop.run_until_complete(ac.getmany(timeout_ms=100))
            return [r.value for recs in got.values() for r in recs]

        def aclose() -> None:
            loop.run_until_complete(ac.stop())
            loop.close()

        return apoll, aclose
    raise ValueError(f"unknown client {client!r}")


def client_main(client: str, bootstrap: str, topic: str, wait: str, total: str) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    expected = int(total)
    poll, close = _consumer(client, bootstrap, topic, None if wait == "default" else int(wait))
    poll()
    print("ready", flush=True)
    cpu0 = time.process_time()
    latencies: list[float] = []
    measured_from: float | None = None
    seen = 0
    deadline = time.monotonic() + WARMUP_S + SECONDS + 60
    while seen < expected and time.monotonic() < deadline:
        values = poll()
        now = time.time()
        for v in values:
            sent = _STAMP.unpack_from(v)[0]
            if measured_from is None:
                measured_from = sent + WARMUP_S
            if sent >= measured_from:
                latencies.append(now - sent)
        seen += len(values)
    cpu = time.process_time() - cpu0
    close()
    print(json.dumps({"seen": seen, "latencies": latencies, "cpu_s": cpu}), flush=True)


# ---------------------------------------------------------------- benchmark process


def _produce(bootstrap: str, topic: str, count: int) -> None:
    pad = b"p" * (VALUE_BYTES - _STAMP.size)
    produce(
        bootstrap,
        topic,
        count,
        value=lambda _i: _STAMP.pack(time.time()) + pad,  # the send time, just before send
        acks=1,
        linger_ms=0,
        rate=RATE,
    )


def _run_one(
    client: str, bootstrap: str, topic: str, wait: int | None, count: int
) -> dict[str, Any]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.latency",
            client,
            bootstrap,
            topic,
            "default" if wait is None else str(wait),
            str(count),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{client} did not start")
        _produce(bootstrap, topic, count)
        out, _ = proc.communicate(timeout=WARMUP_S + SECONDS + 90)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = json.loads(out.strip().splitlines()[-1])
    lat = got["latencies"]
    if got["seen"] != count or not lat:
        return {"error": f"saw {got['seen']} of {count} records"}
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    assert p50 is not None and p99 is not None  # lat is not empty
    return {
        "records": got["seen"],
        "measured": len(lat),
        "p50_ms": round(p50 * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
        "max_ms": round(max(lat) * 1000, 2),
        "cpu_s": round(got["cpu_s"], 2),
    }


def _cases(kind: str, bootstrap: str) -> list[dict[str, Any]]:
    count = int(RATE * (WARMUP_S + SECONDS))
    rows = []
    for wait in WAITS:
        best: dict[str, dict[str, Any]] = {}
        load_before = os.getloadavg()[0]
        for round_no in range(REPEAT):
            for client in CLIENTS:
                topic = f"lat-{client}-{wait}-{round_no}".replace("None", "default")
                create_topic(bootstrap, topic)
                try:
                    got = _run_one(client, bootstrap, topic, wait, count)
                except Exception as exc:
                    got = {"error": repr(exc)}
                old = best.get(client)
                if old is None or "error" in old or got.get("p99_ms", 1e9) < old["p99_ms"]:
                    best[client] = got
        for client in CLIENTS:
            rows.append(
                {
                    "cluster": kind,
                    "client": client,
                    "fetch_max_wait_ms": 500 if wait is None else wait,
                    "rate": RATE,
                    **best[client],
                    "load_before": round(load_before, 2),
                    "load_after": round(os.getloadavg()[0], 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def run() -> dict[str, Any]:
    rows = on_one_broker(CLUSTERS, _cases)
    return {
        "method": __doc__,
        "settings": {
            "rate_per_s": RATE,
            "seconds": SECONDS,
            "warmup_s": WARMUP_S,
            "value_bytes": VALUE_BYTES,
            "repeat": REPEAT,
            "producer": "librdkafka (confluent-kafka) Producer acks=1 linger.ms=0",
            "max_rss_mib_of_benchmark": round(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
            ),
        },
        "rows": rows,
    }


if __name__ == "__main__":
    client_main(*sys.argv[1:])
