"""How fast one confluent-kafka consumer reads stored batches from the EmbeddedCluster.

Preloads ``RECORDS`` 100-byte records (batches of ``BATCH`` records, appended directly on
the leader and replicated), then times a librdkafka consumer reading all of them from
offset 0, ``ROUNDS`` times (fresh consumer each time); reports the best and the median
round, since other work on the machine slows single rounds. Target: at least 1M records/s
on a 2-core machine. ``cluster_cpu_share`` is the
fraction of the consuming time the cluster's loop thread was on a CPU: far below 1, the
client is the limit. The consumer's queue settings keep librdkafka from pausing its
fetches (its default ``queued.min.messages`` of 100k and ``fetch.queue.backoff.ms`` of 1 s
would cap any broker at a few hundred thousand records/s here).
"""

from __future__ import annotations

import os
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from benchmarks._common import produce
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.records import build_batch

RECORDS = int(os.environ.get("EMBEDDED_FETCH_RECORDS", "2000000"))
BATCH = 1000
VALUE_SIZE = 100
ROUNDS = int(os.environ.get("EMBEDDED_FETCH_ROUNDS", "3"))


def preload(cluster: EmbeddedCluster, topic: str) -> float:
    batch = build_batch([b"x" * VALUE_SIZE] * BATCH)
    started = time.perf_counter()
    produce(cluster, topic, RECORDS - RECORDS % BATCH, batch=batch, batch_records=BATCH)
    return time.perf_counter() - started


def consume(cluster: EmbeddedCluster, topic: str) -> tuple[int, int, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "bench",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 52428800,
            "max.partition.fetch.bytes": 4194304,
            "queued.max.messages.kbytes": 262144,
            "queued.min.messages": 1000000,
            "fetch.queue.backoff.ms": 10,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    count = 0
    total_bytes = 0
    started = 0.0
    deadline = time.monotonic() + 120
    try:
        while count < RECORDS and time.monotonic() < deadline:
            msgs = consumer.consume(num_messages=10000, timeout=1.0)
            if msgs and not started:
                started = time.perf_counter()
            if msgs:
                errors = [m for m in msgs if m.error()]
                if errors:
                    raise RuntimeError(str(errors[0].error()))
                # Record sizes are checked on a sample to keep the client loop lean.
                last = msgs[-1]
                if len(last.value()) != VALUE_SIZE or last.offset() != count + len(msgs) - 1:
                    raise RuntimeError(f"unexpected record at offset {last.offset()}")
                total_bytes += VALUE_SIZE * len(msgs)
            count += len(msgs)
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    return count, total_bytes, elapsed


def run() -> dict[str, Any]:
    runs = []
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic("bench", partitions=1, replication_factor=3)
        preload_s = preload(cluster, "bench")
        assert cluster.high_watermark("bench", 0) == RECORDS
        for _ in range(ROUNDS):
            # CPU time of the cluster's loop thread: how much of the run the cluster needed.
            cpu_before = cluster.call(time.thread_time)
            process_before = time.process_time()
            count, total_bytes, elapsed = consume(cluster, "bench")
            if count < RECORDS:
                raise RuntimeError(f"consumed only {count} of {RECORDS} records")
            runs.append(
                {
                    "consume_s": round(elapsed, 3),
                    "records_per_s": round(count / elapsed),
                    "mb_per_s": round(total_bytes / elapsed / 1e6, 1),
                    "cluster_cpu_s": round(cluster.call(time.thread_time) - cpu_before, 3),
                    "process_cpu_s": round(time.process_time() - process_before, 3),
                }
            )
    best = max(runs, key=lambda r: r["records_per_s"])
    return {
        "records": RECORDS,
        "value_bytes": VALUE_SIZE,
        "preload_s": round(preload_s, 3),
        "records_per_s": best["records_per_s"],
        "records_per_s_median": sorted(r["records_per_s"] for r in runs)[len(runs) // 2],
        "cluster_cpu_share": round(best["cluster_cpu_s"] / best["consume_s"], 3),
        # Load-independent: records per CPU-second spent by the client (process minus cluster).
        "records_per_client_cpu_s": round(
            RECORDS / max(1e-9, best["process_cpu_s"] - best["cluster_cpu_s"])
        ),
        "records_per_cluster_cpu_s": round(RECORDS / max(1e-9, best["cluster_cpu_s"])),
        "runs": runs,
        "target_records_per_s": 1_000_000,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    print(run())
