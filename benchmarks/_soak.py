"""Soak: one EpochConsumer for ``SOAK_MINUTES`` (default 10) under produce load and periodic
unclean elections; its resident memory must level off (``make soak``, not in CI).

Method: an EmbeddedCluster of 3 brokers (``SOAK_PARTITIONS`` partitions, replication factor
2) runs in this process, with a producer thread appending ``SOAK_RATE`` records/s of 100 B
(batches of 20 to random partitions) and, every ``SOAK_ELECTION_EVERY_S`` seconds, a round
of unclean elections on ``SOAK_SUBSET`` partitions (``epochguard.testing.load``; production
pauses during a round, so the divergence points are exact). Every minute the log start of
each partition moves up to 1,500 records below what the consumer read (retention), so the
brokers' memory stays bounded too. The consumer runs in its own process with policy
``rewind`` and a ``Ledger`` that keeps the last 500 values per partition: no gap, no re-read
without a report, every truncation reported at its divergence point, and at the end what it
holds equals the final log.

Resident memory (``VmRSS`` of the consumer process) is sampled every minute. The first
``max(2, SOAK_MINUTES // 3)`` minutes are warm-up. After it, the run fails if RSS grows by
more than ``SOAK_RSS_GROWTH_MIB`` (default 16 MiB) over its value at the end of the
warm-up. Results: benchmarks/results/soak.json.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import percentile, write_record
from benchmarks._load_common import (
    ConsumerProcess,
    load_average,
    shared_positions,
    wait_for,
)

MINUTES = float(os.environ.get("SOAK_MINUTES", "10"))
PARTITIONS = int(os.environ.get("SOAK_PARTITIONS", "100"))
RATE = int(os.environ.get("SOAK_RATE", "2000"))
ELECTION_EVERY_S = float(os.environ.get("SOAK_ELECTION_EVERY_S", "30"))
SUBSET = int(os.environ.get("SOAK_SUBSET", "5"))
RSS_GROWTH_MIB = float(os.environ.get("SOAK_RSS_GROWTH_MIB", "16"))
SAMPLE_S = float(os.environ.get("SOAK_SAMPLE_S", "60"))
WINDOW = 500
BATCH = 20
VALUE = 100
RESULTS = Path(__file__).resolve().parent / "results"


def _producer(cluster: Any, topic: str, lock: threading.Lock, stop: threading.Event) -> None:
    from epochguard.testing.embedded.records import build_batch

    rng = random.Random(11)
    interval = BATCH / RATE
    n = 0
    next_at = time.monotonic()
    while not stop.is_set():
        p = rng.randrange(PARTITIONS)
        batch = build_batch([b"%08d" % (n + i) + b"v" * (VALUE - 8) for i in range(BATCH)])
        with lock:
            cluster.append_raw(topic, p, batch)
        n += BATCH
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)


def soak() -> dict[str, Any]:
    from epochguard.testing import EmbeddedCluster
    from epochguard.testing.load import final_logs, pick_unclean_subset, unclean_round

    topic = "soak"
    seconds = MINUTES * 60
    warmup_s = max(2.0, MINUTES // 3) * 60 if MINUTES >= 3 else seconds / 3
    samples: list[dict[str, Any]] = []
    elections = []
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=2)
        positions = shared_positions(PARTITIONS)
        cfg = {
            "bootstrap_servers": cluster.bootstrap_servers,
            "auto_offset_reset": "earliest",
            "enable_auto_commit": False,
            "on_truncation": "rewind",
            "metadata_max_age_ms": 5000,
            "request_timeout_ms": 20000,
        }
        consumer = ConsumerProcess(cfg, topic, positions, list(range(PARTITIONS)), WINDOW)
        lock = threading.Lock()
        stop = threading.Event()
        producer = threading.Thread(target=_producer, args=(cluster, topic, lock, stop))
        try:
            start = time.monotonic()
            producer.start()
            next_sample = start
            next_election = start + ELECTION_EVERY_S
            next_retention = start + 60
            round_no = 0
            while time.monotonic() - start < seconds:
                now = time.monotonic()
                if now >= next_sample:
                    s = consumer.status()
                    samples.append(
                        {
                            "minute": round((now - start) / 60, 2),
                            "rss_mib": round(s["rss_kib"] / 1024, 2),
                            "records": s["records"],
                            "reports": s["reports"],
                            "load_average": load_average(),
                        }
                    )
                    print(json.dumps(samples[-1]), flush=True)
                    next_sample += SAMPLE_S
                if now >= next_election:
                    follower = cluster.broker_ids[round_no % len(cluster.broker_ids)]
                    with lock:
                        chosen = pick_unclean_subset(
                            cluster, topic, PARTITIONS, follower, SUBSET, start=round_no * 13
                        )

                        def consumed(ends: Any) -> None:
                            wait_for(
                                lambda: all(positions[p] >= e for p, e in ends.items()),
                                "doomed read",
                            )

                        elections += unclean_round(
                            cluster, topic, chosen, follower, consumed, tag=f"r{round_no}"
                        )
                    round_no += 1
                    next_election += ELECTION_EVERY_S
                if now >= next_retention:
                    with lock:
                        for p in range(PARTITIONS):
                            keep_from = positions[p] - 3 * WINDOW
                            if keep_from > 0:
                                cluster.delete_records(topic, p, keep_from)
                    next_retention += 60
                time.sleep(0.05)
            stop.set()
            producer.join()
            want = len(elections)
            wait_for(lambda: consumer.status()["reports"] >= want, "truncations reported")
            final = final_logs(cluster, topic, range(PARTITIONS))
            wait_for(
                lambda: all(positions[tp.partition] >= len(v) for tp, v in final.items()),
                "final log read",
            )
            last = consumer.status()
            result = consumer.finish(final)
            consumer.close()
        finally:
            stop.set()
            if producer.is_alive():
                producer.join()
            consumer.kill()
    reports = {(part, div): at for part, div, _n, at in result["reports"]}
    latencies = [
        reports[(e.tp.partition, e.divergence)] - e.at
        for e in elections
        if (e.tp.partition, e.divergence) in reports
    ]
    after = [s for s in samples if s["minute"] * 60 >= warmup_s]
    base = after[0]["rss_mib"] if after else None
    growth = max(s["rss_mib"] for s in after) - base if after and base is not None else None
    out: dict[str, Any] = {
        "minutes": MINUTES,
        "partitions": PARTITIONS,
        "produce_rate_records_per_s": RATE,
        "records_consumed": result["records"],
        "elections": len(elections),
        "missed_truncations": len(elections) - len(latencies),
        "reports": len(result["reports"]),
        "detection_latency_s": {
            "p50": _r(percentile(latencies, 50)),
            "p99": _r(percentile(latencies, 99)),
            "max": _r(max(latencies) if latencies else None),
        },
        "violations": result["violation_count"],
        "mismatched_partitions": result["mismatches"],
        "warmup_minutes": round(warmup_s / 60, 2),
        "rss_bound_mib": RSS_GROWTH_MIB,
        "rss_at_warmup_end_mib": base,
        "rss_growth_after_warmup_mib": None if growth is None else round(growth, 2),
        "final_rss_mib": round(last["rss_kib"] / 1024, 2),
        "peak_rss_mib": round(last["hwm_kib"] / 1024, 2),
        "samples": samples,
        "load_average_end": load_average(),
    }
    problems = []
    if out["missed_truncations"] or out["violations"] or out["mismatched_partitions"]:
        problems.append("data lost, re-read or a truncation missed")
    if out["reports"] != len(elections):
        problems.append("reports that match no election")
    if growth is None or growth > RSS_GROWTH_MIB:
        problems.append(f"RSS grew {growth} MiB after warm-up (bound {RSS_GROWTH_MIB} MiB)")
    out["passed"] = not problems
    out["problems"] = problems
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def main() -> int:
    started = time.time()
    result = soak()
    write_record(RESULTS, "soak", started, result, method=__doc__)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if not result["passed"]:
        print(f"soak failed: {'; '.join(result['problems'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
