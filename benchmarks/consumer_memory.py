"""Consumer memory while the application lags: bounded by the fetch size settings, not by
how much data waits in the topic.

One EmbeddedCluster (in this process) holds topics of 1 KB records, 4 partitions, of two
sizes (``SIZES_MB``). Each client reads a whole topic in its own subprocess with the same
fetch limits (``fetch_max_bytes`` 1 MiB, ``max_partition_fetch_bytes`` 256 KiB, 100
records per poll) and a slow application (it sleeps after every poll). Reported per client
and topic size: the peak resident memory during consumption above the resident memory
just before it (Linux ``VmHWM`` after resetting it through ``/proc/self/clear_refs``), so C
allocations (librdkafka) count too. If a client buffered ahead without bound, its peak
would grow with the topic; a bounded client's stays flat.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import (
    confluent_consumer,
    confluent_step,
    kafka_python_api_consumer,
    produce,
    status_kib,
)
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.records import build_batch

SIZES_MB = [int(x) for x in os.environ.get("CONSUMER_MEMORY_SIZES_MB", "16,64").split(",")]
PARTITIONS = 4
VALUE = 1024
BATCH = 100
FETCH_MAX_BYTES = 1 << 20
PARTITION_FETCH_BYTES = 256 << 10
POLL_RECORDS = 100
APP_SLEEP_S = 0.0005
CLIENTS = ["epochguard", "kafka-python", "confluent-kafka"]


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS


# ---------------------------------------------------------------------- client side


def _kafka_python_api(consumer_class: Any, bootstrap: str, topic: str) -> tuple[Any, Any]:
    """EpochConsumer and kafka-python's KafkaConsumer: the same API and config names."""
    c = kafka_python_api_consumer(
        consumer_class,
        bootstrap,
        topic,
        PARTITIONS,
        fetch_max_bytes=FETCH_MAX_BYTES,
        max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
    )
    return (
        lambda: sum(len(v) for v in c.poll(timeout_ms=1000, max_records=POLL_RECORDS).values())
    ), c.close


def _epochguard(bootstrap: str, topic: str) -> tuple[Any, Any]:
    from epochguard.consumer import EpochConsumer

    return _kafka_python_api(EpochConsumer, bootstrap, topic)


def _kafka_python(bootstrap: str, topic: str) -> tuple[Any, Any]:
    from kafka import KafkaConsumer

    return _kafka_python_api(KafkaConsumer, bootstrap, topic)


def _confluent(bootstrap: str, topic: str) -> tuple[Any, Any]:
    # librdkafka's own prefetch queue (queued.max.messages.kbytes, 64 MiB by default) is
    # its documented memory bound; the fetch sizes are set like the others'.
    settings = {
        "group.id": "bench-mem",
        "fetch.max.bytes": FETCH_MAX_BYTES,
        "max.partition.fetch.bytes": PARTITION_FETCH_BYTES,
    }
    c = confluent_consumer(bootstrap, topic, PARTITIONS, **settings)
    step = confluent_step(c, POLL_RECORDS, touch=False)
    return (lambda: step()[0]), c.close


CONSUMERS = {
    "epochguard": _epochguard,
    "kafka-python": _kafka_python,
    "confluent-kafka": _confluent,
}


def client_main(argv: list[str]) -> None:
    client, bootstrap, topic, total = argv
    import logging

    # The benchmark's own output is its JSON line: no library or client logs at all.
    logging.disable(logging.CRITICAL)
    step, close = CONSUMERS[client](bootstrap, topic)
    try:
        baseline = status_kib("VmRSS")
        _reset_peak()
        count = 0
        deadline = time.monotonic() + 300
        while count < int(total) and time.monotonic() < deadline:
            count += step()
            time.sleep(APP_SLEEP_S)
        if count < int(total):
            raise RuntimeError(f"read {count} of {total}")
        peak = status_kib("VmHWM")
    finally:
        close()
    print(json.dumps({"baseline_kib": baseline, "peak_kib": peak}))


# ---------------------------------------------------------------------- harness


def _run_client(client: str, bootstrap: str, topic: str, total: int) -> dict[str, int]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.consumer_memory",
            "--client",
            client,
            bootstrap,
            topic,
            str(total),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{client} failed: {proc.stderr[-2000:]}")
    out: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def run() -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with EmbeddedCluster(brokers=1) as cluster:
        batch = build_batch([b"m" * VALUE] * BATCH)
        for size_mb in SIZES_MB:
            total = size_mb * 1024 * 1024 // VALUE
            total -= total % (PARTITIONS * BATCH)
            topic = f"mem-{size_mb}"
            cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=1)
            produce(cluster, topic, total, partitions=PARTITIONS, batch=batch, batch_records=BATCH)
            for client in CLIENTS:
                try:
                    got = _run_client(client, cluster.bootstrap_servers, topic, total)
                except Exception as exc:
                    rows.append({"client": client, "topic_mb": size_mb, "error": repr(exc)})
                    continue
                rows.append(
                    {
                        "client": client,
                        "topic_mb": size_mb,
                        "records": total,
                        "peak_above_baseline_mib": round(
                            (got["peak_kib"] - got["baseline_kib"]) / 1024, 1
                        ),
                        "baseline_mib": round(got["baseline_kib"] / 1024, 1),
                    }
                )
    by_client: dict[str, dict[int, float]] = {}
    for r in rows:
        if "error" not in r:
            by_client.setdefault(r["client"], {})[r["topic_mb"]] = r["peak_above_baseline_mib"]
    growth = {c: round(v[max(v)] - v[min(v)], 1) for c, v in by_client.items() if len(v) > 1}
    return {
        "fetch_max_bytes": FETCH_MAX_BYTES,
        "max_partition_fetch_bytes": PARTITION_FETCH_BYTES,
        "partitions": PARTITIONS,
        "value_bytes": VALUE,
        "rows": rows,
        "peak_growth_mib_from_smallest_to_largest_topic": growth,
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
    else:
        print(json.dumps(run(), indent=1))
