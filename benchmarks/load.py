"""Load: one EpochConsumer on 1,000 partitions and a group of 8 on 256 partitions, through
unclean elections on a subset (issues 11 and 12).

Method: an EmbeddedCluster of 3 brokers (replication factor 2) runs in this process and
stages everything; each consumer runs in its own process (spawned), so its resident memory
is its own. Consumers use policy ``rewind`` and keep a ``Ledger``
(``epochguard.testing.load``): every truncation must be reported at its divergence point,
and what each holds at the end must equal the final log record for record; a run that
breaks either fails the benchmark.

Per scenario:
1. The consumers start (the group waits for its assignment), then ``PRELOAD`` records of
   100 B per partition are appended (batches of ``PRELOAD``). Throughput: records over the
   span from the first record delivered to the last (all consumers together).
2. Idle for ``IDLE_S`` with every partition caught up: Fetch request bytes per second
   received by the brokers (size prefix included), with and without fetch sessions.
3. ``ROUNDS`` rounds of unclean elections on ``SUBSET`` partitions each (a broker stops
   replicating, its partitions' leaders take 3 records only they hold, the consumers read
   them, the broker is elected uncleanly and takes 5 new records at those offsets).
   Detection latency: from each election to the consumer's report of it.
4. RSS: each consumer process's ``VmRSS`` and peak ``VmHWM`` at the end.

The machine is shared: the load average is recorded with each scenario.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks._common import percentile, produce
from benchmarks._load_common import (
    ConsumerProcess,
    load_average,
    shared_positions,
    wait_for,
)

PARTITIONS = int(os.environ.get("LOAD_PARTITIONS", "1000"))
PRELOAD = int(os.environ.get("LOAD_PRELOAD", "100"))
ROUNDS = int(os.environ.get("LOAD_ROUNDS", "3"))
SUBSET = int(os.environ.get("LOAD_SUBSET", "30"))
GROUP_PARTITIONS = int(os.environ.get("LOAD_GROUP_PARTITIONS", "256"))
GROUP_SIZE = int(os.environ.get("LOAD_GROUP_SIZE", "8"))
GROUP_PRELOAD = int(os.environ.get("LOAD_GROUP_PRELOAD", "200"))
GROUP_SUBSET = int(os.environ.get("LOAD_GROUP_SUBSET", "16"))
IDLE_S = float(os.environ.get("LOAD_IDLE_S", "5"))
VALUE = 100
FETCH = 1


def _config(bootstrap: str, sessions: bool, group: str | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "on_truncation": "rewind",
        "enable_incremental_fetch_sessions": sessions,
        "check_crcs": True,
        "metadata_max_age_ms": 5000,
        "request_timeout_ms": 20000,
    }
    if group is not None:
        cfg.update(
            group_id=group,
            session_timeout_ms=60000,
            heartbeat_interval_ms=1000,
            max_poll_interval_ms=300000,
        )
    return cfg


def scenario(
    partitions: int,
    consumers: int,
    sessions: bool,
    preload: int,
    rounds: int,
    subset: int,
) -> dict[str, Any]:
    from epochguard.testing import EmbeddedCluster
    from epochguard.testing.embedded.records import build_batch
    from epochguard.testing.load import final_logs, pick_unclean_subset, unclean_round

    topic = "load"
    load_before = load_average()
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic(topic, partitions=partitions, replication_factor=2)
        positions = shared_positions(partitions)
        group = None if consumers == 1 else f"load-{partitions}"
        cfg = _config(cluster.bootstrap_servers, sessions, group)
        procs = [
            ConsumerProcess(
                cfg, topic, positions, assign=list(range(partitions)) if group is None else None
            )
            for _ in range(consumers)
        ]
        try:

            def assignment() -> list[tuple[int, ...]]:
                return [tuple(p.status()["assigned"]) for p in procs]

            def settled() -> bool:
                # Every partition with exactly one member, and still so a while later: no
                # rebalance in progress (members joined one by one, each a new generation).
                first = assignment()
                flat = [p for a in first for p in a]
                if sorted(flat) != list(range(partitions)) or min(map(len, first)) == 0:
                    return False
                time.sleep(3)
                return assignment() == first

            wait_for(settled, "assignment", timeout=180)
            rebalances_before = [p.status()["metrics"].get("rebalances", 0) for p in procs]
            batch = build_batch([b"v" * VALUE] * preload)
            produce(
                cluster,
                topic,
                preload * partitions,
                partitions=partitions,
                batch=batch,
                batch_records=preload,
            )
            wait_for(
                lambda: all(positions[p] >= preload for p in range(partitions)),
                "preload read",
            )
            statuses = [p.status() for p in procs]
            first = min(s["first_at"] for s in statuses)
            last = max(s["last_at"] for s in statuses)
            total = partitions * preload
            throughput = total / (last - first) if last > first else None

            before = cluster.request_bytes().get(FETCH, 0)
            counts_before = sum(n for (k, _v), n in cluster.requests_seen().items() if k == FETCH)
            time.sleep(IDLE_S)
            idle_bytes = cluster.request_bytes().get(FETCH, 0) - before
            idle_requests = (
                sum(n for (k, _v), n in cluster.requests_seen().items() if k == FETCH)
                - counts_before
            )

            elections = []
            for r in range(rounds):
                follower = cluster.broker_ids[r % len(cluster.broker_ids)]
                chosen = pick_unclean_subset(
                    cluster, topic, partitions, follower, subset, start=r * subset * 7
                )

                def consumed(ends: Any) -> None:
                    wait_for(lambda: all(positions[p] >= e for p, e in ends.items()), "doomed read")

                elections += unclean_round(cluster, topic, chosen, follower, consumed, tag=f"r{r}")
                want = len(elections)
                wait_for(
                    lambda want=want: sum(p.status()["reports"] for p in procs) >= want,
                    "truncations reported",
                )
            final = final_logs(cluster, topic, range(partitions))
            wait_for(
                lambda: all(positions[tp.partition] >= len(values) for tp, values in final.items()),
                "final log read",
            )
            statuses = [p.status() for p in procs]
            results = [p.finish(final) for p in procs]
            for p in procs:
                p.close()
        finally:
            for p in procs:
                p.kill()
    reports = {(part, div): at for r in results for part, div, _n, at in r["reports"]}
    latencies = [
        reports[(e.tp.partition, e.divergence)] - e.at
        for e in elections
        if (e.tp.partition, e.divergence) in reports
    ]
    missed = len(elections) - len(latencies)
    violations = sum(r["violation_count"] for r in results)
    violation_samples = [v for r in results for v in r["violations"]][:10]
    mismatches = [m for r in results for m in r["mismatches"]]
    out = {
        "partitions": partitions,
        "consumers": consumers,
        "fetch_sessions": sessions,
        "records": total,
        "value_bytes": VALUE,
        "throughput_records_per_s": None if throughput is None else round(throughput),
        "idle_fetch_request_bytes_per_s": round(idle_bytes / IDLE_S),
        "idle_fetch_requests_per_s": round(idle_requests / IDLE_S, 1),
        "elections": len(elections),
        "missed_truncations": missed,
        "reports": sum(len(r["reports"]) for r in results),
        "detection_latency_s": {
            "p50": _r(percentile(latencies, 50)),
            "p99": _r(percentile(latencies, 99)),
            "max": _r(max(latencies) if latencies else None),
            "mean": _r(statistics.fmean(latencies) if latencies else None),
        },
        "violations": violations,
        "violation_samples": violation_samples,
        "mismatched_partitions": mismatches,
        "rebalances_after_start": [
            s["metrics"].get("rebalances", 0) - b
            for s, b in zip(statuses, rebalances_before, strict=True)
        ],
        "rss_mib": [round(s["rss_kib"] / 1024, 1) for s in statuses],
        "peak_rss_mib": [round(s["hwm_kib"] / 1024, 1) for s in statuses],
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    if missed or violations or mismatches or out["reports"] != len(elections):
        raise AssertionError(f"load run lost or misreported data: {out}")
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def run() -> dict[str, Any]:
    return {
        "method": __doc__.split("Per scenario:")[0].strip() if __doc__ else "",
        "single_sessions": scenario(PARTITIONS, 1, True, PRELOAD, ROUNDS, SUBSET),
        "single_no_sessions": scenario(PARTITIONS, 1, False, PRELOAD, 0, 0),
        "group": scenario(GROUP_PARTITIONS, GROUP_SIZE, True, GROUP_PRELOAD, ROUNDS, GROUP_SUBSET),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
