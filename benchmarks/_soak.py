"""Soak: one EpochConsumer for a long run (``make soak DURATION=<seconds>``, default 600)
under produce load, periodic unclean elections and network faults; every truncation must be
reported at its divergence point, and its resident memory, open file descriptors and
threads must stay flat after a warm-up (not in CI).

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

The consumer reaches the brokers only through a ``FaultProxy``
(``epochguard.testing.netfault``; Metadata answers name the proxy's ports). Every
``SOAK_FAULT_EVERY_S`` seconds (default 20) one network fault, drawn from a generator seeded
with ``SOAK_SEED``, hits the link to one broker: a reset of its open connections; an answer
(a Fetch answer or any) cut at a chosen byte, then reset; 50-500 ms of latency with jitter
for 5-15 s; a 20-100 KB/s bandwidth cap for 5-15 s; a partition (nothing passes either way)
for 2-10 s; or a blackhole (new connections accepted and never answered) for 2-10 s, with
the open connections reset so the client has to reconnect into it. The cluster's own
control calls (appends, elections, retention) do not pass through the proxy.

Every ``SOAK_SAMPLE_S`` seconds (default 30) the driver reads the consumer process's
``VmRSS`` and ``Threads`` (``/proc/PID/status``) and counts its open descriptors
(``/proc/PID/fd``), with the load average. The first third of the run, at most 10 minutes,
is warm-up; from the first sample after it, the run fails if RSS grows by more than
``SOAK_RSS_GROWTH_MIB`` (default 16 MiB), open descriptors by more than ``SOAK_FD_GROWTH``
(default 8) or threads by more than ``SOAK_THREAD_GROWTH`` (default 2). It also fails
(exit status 1, ``problems`` in the JSON) if an election is not reported, a report names a
point where no election diverged, the ledger finds a gap or a re-read, the final logs
differ from what the consumer holds, or the consumer stops making progress (a wait of
5 minutes). Results: benchmarks/results/soak.json.
"""

from __future__ import annotations

import collections
import json
import os
import random
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from benchmarks._common import percentile, write_record
from benchmarks._load_common import (
    ConsumerProcess,
    load_average,
    process_resources,
    shared_positions,
    wait_for,
)

MINUTES = float(os.environ.get("SOAK_MINUTES", "10"))
#: ``make soak DURATION=3600`` sets this; ``SOAK_MINUTES`` is the older spelling.
DURATION_S = float(os.environ.get("SOAK_DURATION_S") or MINUTES * 60)
PARTITIONS = int(os.environ.get("SOAK_PARTITIONS", "100"))
RATE = int(os.environ.get("SOAK_RATE", "2000"))
ELECTION_EVERY_S = float(os.environ.get("SOAK_ELECTION_EVERY_S", "30"))
FAULT_EVERY_S = float(os.environ.get("SOAK_FAULT_EVERY_S", "20"))
SEED = int(os.environ.get("SOAK_SEED", "23"))
SUBSET = int(os.environ.get("SOAK_SUBSET", "5"))
SAMPLE_S = float(os.environ.get("SOAK_SAMPLE_S", "30"))
WINDOW = 500
BATCH = 20
VALUE = 100
FETCH = 1
RESULTS = Path(__file__).resolve().parent / "results"

FAULT_KINDS = ("reset", "cut", "latency", "bandwidth", "partition", "blackhole")


@attrs.frozen
class Bounds:
    """How much each resource may grow after the warm-up, over its value at the first
    sample after it."""

    rss_mib: float = float(os.environ.get("SOAK_RSS_GROWTH_MIB", "16"))
    fds: int = int(os.environ.get("SOAK_FD_GROWTH", "8"))
    threads: int = int(os.environ.get("SOAK_THREAD_GROWTH", "2"))


def warmup_seconds(duration_s: float) -> float:
    """The first third of the run, at most 10 minutes."""
    return min(600.0, duration_s / 3)


# ------------------------------------------------------------------------------ verdicts


def judge_resources(
    samples: Sequence[Mapping[str, Any]], warmup_s: float, bounds: Bounds
) -> tuple[dict[str, Any], list[str]]:
    """Each resource at the first sample after the warm-up, at the end, its largest value
    after the warm-up and its growth over the first; and what broke a bound."""
    after = [s for s in samples if s["second"] >= warmup_s]
    if len(after) < 2:
        return {}, [f"{len(after)} samples after the warm-up: too few to judge flatness"]
    figures: dict[str, Any] = {}
    problems = []
    for key, bound, unit in (
        ("rss_mib", bounds.rss_mib, " MiB"),
        ("fds", bounds.fds, ""),
        ("threads", bounds.threads, ""),
    ):
        base = after[0][key]
        peak = max(s[key] for s in after)
        growth = round(peak - base, 2)
        figures[key] = {
            "at_warmup_end": base,
            "end": after[-1][key],
            "max_after_warmup": peak,
            "growth": growth,
            "bound": bound,
        }
        if growth > bound:
            problems.append(
                f"{key} grew by {growth:g}{unit} after the warm-up (from {base:g}, "
                f"bound {bound:g}{unit})"
            )
    return figures, problems


def judge_truncations(
    elections: Iterable[tuple[int, int]], reports: Iterable[tuple[int, int]]
) -> tuple[dict[str, Any], list[str]]:
    """Match (partition, divergence offset) pairs: every election must be reported once at
    its divergence point, and nothing else reported."""
    want = collections.Counter(elections)
    got = collections.Counter(reports)
    missed = sorted((want - got).elements())
    unexpected = sorted((got - want).elements())
    missed_partitions = {p for p, _ in missed}
    wrong_point = [r for r in unexpected if r[0] in missed_partitions]
    figures = {
        "missed": [list(m) for m in missed],
        "wrong_point": [list(r) for r in wrong_point],
        "unexpected": [list(r) for r in unexpected],
    }
    problems = []
    if missed:
        problems.append(f"{len(missed)} truncations not reported at their divergence point")
    if wrong_point:
        problems.append(f"{len(wrong_point)} reports at the wrong point of a truncated partition")
    if len(unexpected) > len(wrong_point):
        problems.append(f"{len(unexpected) - len(wrong_point)} reports that match no election")
    return figures, problems


# ------------------------------------------------------------------------------ the load


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


def inject_fault(proxy: Any, rng: random.Random) -> tuple[str, int]:
    """One network fault on one broker's link, drawn from ``rng``; returns its kind and
    the broker."""
    kind = rng.choice(FAULT_KINDS)
    broker = rng.choice(proxy.broker_ids)
    if kind == "reset":
        proxy.reset(broker)
    elif kind == "cut":
        at_byte = rng.choice([0, 3, 8, 30, 100, 1000, 10000])
        proxy.cut_answer(broker, at_byte, api_key=rng.choice([FETCH, None]))
    elif kind == "latency":
        latency = rng.uniform(0.05, 0.5)
        proxy.set_latency(broker, latency, jitter_s=latency / 2, seconds=rng.uniform(5, 15))
    elif kind == "bandwidth":
        proxy.set_bandwidth(broker, rng.randrange(20_000, 100_000), seconds=rng.uniform(5, 15))
    elif kind == "partition":
        proxy.partition(broker, seconds=rng.uniform(2, 10))
    else:
        proxy.blackhole(broker, seconds=rng.uniform(2, 10))
        proxy.reset(broker)
    return kind, broker


def soak() -> dict[str, Any]:
    from epochguard.testing import EmbeddedCluster
    from epochguard.testing.load import final_logs, pick_unclean_subset, unclean_round
    from epochguard.testing.netfault import FaultProxy

    topic = "soak"
    seconds = DURATION_S
    warmup_s = warmup_seconds(seconds)
    bounds = Bounds()
    samples: list[dict[str, Any]] = []
    elections = []
    faults: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    result: dict[str, Any] | None = None
    load_before = load_average()
    rng = random.Random(SEED)
    with EmbeddedCluster(brokers=3) as cluster, FaultProxy() as proxy:
        cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=2)
        proxy.attach_embedded(cluster)
        positions = shared_positions(PARTITIONS)
        cfg = {
            "bootstrap_servers": proxy.bootstrap_servers,
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

        def sample(now: float) -> None:
            s = consumer.status()
            r = process_resources(consumer.proc.pid)
            samples.append(
                {
                    "second": round(now - start, 1),
                    "rss_mib": round(r["rss_kib"] / 1024, 2),
                    "fds": r["fds"],
                    "threads": r["threads"],
                    "records": s["records"],
                    "reports": s["reports"],
                    "faults": sum(faults.values()),
                    "load_average": load_average(),
                }
            )
            print(json.dumps(samples[-1]), flush=True)

        start = time.monotonic()
        try:
            producer.start()
            next_sample = start
            next_election = start + ELECTION_EVERY_S
            next_fault = start + FAULT_EVERY_S / 2
            next_retention = start + 60
            round_no = 0
            while time.monotonic() - start < seconds:
                now = time.monotonic()
                if now >= next_sample:
                    sample(now)
                    next_sample += SAMPLE_S
                if now >= next_fault:
                    kind, _broker = inject_fault(proxy, rng)
                    faults[kind] += 1
                    next_fault += FAULT_EVERY_S
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
            # The last samples and the final read happen on a healed network.
            proxy.heal()
            sample(time.monotonic())
            want = len(elections)
            wait_for(lambda: consumer.status()["reports"] >= want, "truncations reported")
            final = final_logs(cluster, topic, range(PARTITIONS))
            wait_for(
                lambda: all(positions[tp.partition] >= len(v) for tp, v in final.items()),
                "final log read",
            )
            result = consumer.finish(final)
            consumer.close()
        except (TimeoutError, RuntimeError) as exc:
            # RuntimeError: the consumer process did not answer a status request.
            problems.append(f"the consumer stopped making progress: {exc}")
        finally:
            stop.set()
            if producer.is_alive():
                producer.join()
            consumer.kill()
        proxy_stats = dict(proxy.stats)
        injected_delay_s = round(proxy.injected_delay_s, 1)
    resources, resource_problems = judge_resources(samples, warmup_s, bounds)
    problems += resource_problems
    out: dict[str, Any] = {
        "minutes": round(seconds / 60, 2),
        "partitions": PARTITIONS,
        "produce_rate_records_per_s": RATE,
        "seed": SEED,
        "fault_every_s": FAULT_EVERY_S,
        "elections": len(elections),
        "faults": sum(faults.values()),
        "faults_by_kind": {k: faults[k] for k in FAULT_KINDS},
        "fault_proxy": {"injected_delay_s": injected_delay_s, **proxy_stats},
        "warmup_minutes": round(warmup_s / 60, 2),
        "bounds": attrs.asdict(bounds),
        "resources": resources,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "load_average_1min_range": [
            min((s["load_average"][0] for s in samples), default=None),
            max((s["load_average"][0] for s in samples), default=None),
        ],
    }
    if result is not None:
        reports = {(part, div): at for part, div, _n, at in result["reports"]}
        latencies = [
            reports[(e.tp.partition, e.divergence)] - e.at
            for e in elections
            if (e.tp.partition, e.divergence) in reports
        ]
        truncations, truncation_problems = judge_truncations(
            [(e.tp.partition, e.divergence) for e in elections],
            [(part, div) for part, div, _n, _at in result["reports"]],
        )
        problems += truncation_problems
        if result["violation_count"]:
            problems.append(f"{result['violation_count']} ledger violations (gap or re-read)")
        if result["mismatches"]:
            problems.append(f"final logs differ on {len(result['mismatches'])} partitions")
        out.update(
            {
                "records_consumed": result["records"],
                "reports": len(result["reports"]),
                "missed_truncations": len(truncations["missed"]),
                "truncations": truncations,
                "detection_latency_s": {
                    "p50": _r(percentile(latencies, 50)),
                    "p99": _r(percentile(latencies, 99)),
                    "max": _r(max(latencies) if latencies else None),
                },
                "violations": result["violation_count"],
                "first_violations": result["violations"],
                "mismatched_partitions": result["mismatches"],
            }
        )
    out["passed"] = not problems
    out["problems"] = problems
    out["samples"] = samples
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def main() -> int:
    started = time.time()
    result = soak()
    write_record(RESULTS, "soak", started, result, method=__doc__)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2, default=repr))
    if not result["passed"]:
        print(f"soak failed: {'; '.join(result['problems'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
