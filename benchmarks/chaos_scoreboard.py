"""The cross-client chaos scoreboard: the same seeded schedules (epochguard.testing.chaos)
against EpochConsumer, kafka-python's KafkaConsumer, confluent-kafka and aiokafka on the
EmbeddedCluster, judged by the same oracle (docs/reliability.md explains the method).

``EPOCHGUARD_SCOREBOARD_SCHEDULES`` (default 100) schedules per client, seeds 0..N-1, six
at a time; the result is ``benchmarks/results/chaos_scoreboard.json``. Counts are summed over
the schedules: silent losses and silent re-reads in records, spurious reports and stalls in
events; ``schedules_failed`` counts schedules with any of them.

The real-Kafka rows (EpochConsumer and the Java reference consumer side by side on an
ApacheKafkaCluster, ``epochguard.testing.chaos.apache``) are the file's ``apache_kafka``
section: ``EPOCHGUARD_SCOREBOARD_APACHE_SCHEDULES=N`` runs N of them with the rest (default
0: the section already in the file is kept), and ``python -m benchmarks.chaos_scoreboard
--apache-only --seeds N`` (``make chaos-apache SEEDS=N``) runs only them and merges them
into the file, keeping the EmbeddedCluster rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._common import write_record
from epochguard.testing.chaos.clients import CLIENTS
from epochguard.testing.chaos.runner import run_many
from epochguard.testing.chaos.schedule import generate

SCHEDULES = int(os.environ.get("EPOCHGUARD_SCOREBOARD_SCHEDULES", "100"))
APACHE_SCHEDULES = int(os.environ.get("EPOCHGUARD_SCOREBOARD_APACHE_SCHEDULES", "0"))
WORKERS = 6
RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "chaos_scoreboard.json"


def score(client: str, schedules: int = SCHEDULES, workers: int = WORKERS) -> dict[str, Any]:
    started = time.monotonic()
    totals: Counter[str] = Counter()
    failed: list[int] = []
    harness_failed: list[int] = []
    examples: list[str] = []
    runs = run_many(
        map(generate, range(schedules)),
        {client: CLIENTS[client]},
        workers=workers,
        end_timeout=10.0,
    )
    for r in runs:
        if r.harness_error is not None:  # not judged: nothing to count for the client
            harness_failed.append(r.schedule.seed)
            continue
        v = r.verdict
        totals.update(v.counts())
        if not v.ok:
            failed.append(r.schedule.seed)
            if len(examples) < 3 and v.problems:
                examples.append(f"seed {r.schedule.seed}: {v.problems[0]}")
    return {
        "schedules": schedules,
        "schedules_failed": len(failed),
        "silent_losses": totals["silent_losses"],
        "silent_rereads": totals["silent_rereads"],
        "spurious_reports": totals["spurious_reports"],
        "stalls": totals["stalls"],
        "raise_breaches": totals["raise_breaches"],
        "records_delivered": totals["delivered"],
        "reports": totals["reports"],
        "failed_seeds": sorted(failed),
        "harness_error_seeds": sorted(harness_failed),
        "examples": examples,
        "seconds": round(time.monotonic() - started, 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def _previous() -> dict[str, Any]:
    """The scoreboard in the result file (empty if there is none)."""
    try:
        previous: dict[str, Any] = json.loads(OUT.read_text())["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return previous


def score_apache(schedules: int, first: int = 0) -> dict[str, Any]:
    """The real-Kafka section: EpochConsumer and Java on the schedules of seeds
    ``first..first+schedules-1`` (one ApacheKafkaCluster, one schedule at a time)."""
    from epochguard.testing.chaos.apache import score as apache_score

    return apache_score(range(first, first + schedules), echo=True)


def run() -> dict[str, Any]:
    result: dict[str, Any] = {
        "cluster": "EmbeddedCluster (3 brokers)",
        "seeds": f"0..{SCHEDULES - 1}",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "clients": {name: score(name) for name in CLIENTS},
    }
    if APACHE_SCHEDULES > 0:
        result["apache_kafka"] = score_apache(APACHE_SCHEDULES)
    elif "apache_kafka" in (previous := _previous()):
        result["apache_kafka"] = previous["apache_kafka"]
    return result  # python -m benchmarks writes it, with the host details


def run_apache_only(schedules: int, first: int = 0) -> dict[str, Any]:
    """Run only the real-Kafka schedules and merge them into the result file (the
    EmbeddedCluster rows stay as they are)."""
    started = time.time()
    section = score_apache(schedules, first)
    result = _previous()
    result["apache_kafka"] = section
    write_record(RESULTS, "chaos_scoreboard", started, result)
    return section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chaos_scoreboard")
    ap.add_argument("--apache-only", action="store_true", help="only the real-Kafka rows")
    ap.add_argument("--seeds", type=int, default=30, help="real-Kafka schedules (default 30)")
    ap.add_argument("--first", type=int, default=0, help="the first real-Kafka seed")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.first < 0:
        ap.error("--seeds must be >= 1 and --first >= 0")
    if args.apache_only:
        print(json.dumps(run_apache_only(args.seeds, args.first), indent=2))
    else:
        print(json.dumps(run(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
