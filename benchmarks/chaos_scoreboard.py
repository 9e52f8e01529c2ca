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

With network faults (the fault proxy between every client and every broker, the schedules'
``NetFault`` steps): ``--apache-only --network --seeds N`` (``make chaos-apache SEEDS=N
CHAOS_ARGS=--network``) runs N real-Kafka schedules of ``generate_apache(seed,
network=True)`` with every client side by side (EpochConsumer, Java, kafka-python,
confluent-kafka, aiokafka) into the ``apache_kafka_network`` section, and ``--network-only
--schedules N --first K`` runs the EmbeddedCluster schedules of ``generate(seed,
network=True)``, seeds K..K+N-1, for EpochConsumer and the reference clients, one client at
a time, into the ``network`` section. Either keeps the rest of the file.
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
#: The clients of the EmbeddedCluster network rows (the asyncio driver shares the engine).
NETWORK_CLIENTS = ("epochguard", "kafka-python", "confluent-kafka", "aiokafka")
RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "chaos_scoreboard.json"


def score(
    client: str,
    schedules: int = SCHEDULES,
    workers: int = WORKERS,
    *,
    first: int = 0,
    network: bool = False,
) -> dict[str, Any]:
    started = time.monotonic()
    totals: Counter[str] = Counter()
    failed: list[int] = []
    harness_failed: list[int] = []
    examples: list[str] = []
    runs = run_many(
        (generate(seed, network=network) for seed in range(first, first + schedules)),
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
    """The scoreboard in the result file (empty if there is none); each section without a
    ``started_at`` of its own gets the file's, so that it keeps its day when merged."""
    try:
        record = json.loads(OUT.read_text())
        previous: dict[str, Any] = record["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    for section in previous.values():
        if isinstance(section, dict) and "cluster" in section and "started_at" in record:
            section.setdefault("started_at", record["started_at"])
    return previous


def score_apache(schedules: int, first: int = 0, network: bool = False) -> dict[str, Any]:
    """The real-Kafka section: EpochConsumer and Java on the schedules of seeds
    ``first..first+schedules-1`` (one ApacheKafkaCluster, one schedule at a time); with
    ``network``, every client through the fault proxy on the network schedules."""
    from epochguard.testing.chaos.apache import ALL_APPS
    from epochguard.testing.chaos.apache import score as apache_score

    if network:
        return apache_score(range(first, first + schedules), echo=True, network=True, apps=ALL_APPS)
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
    previous = _previous()
    for kept in ("apache_kafka", "apache_kafka_network", "network"):
        if kept not in result and kept in previous:
            result[kept] = previous[kept]
    return result  # python -m benchmarks writes it, with the host details


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def run_apache_only(schedules: int, first: int = 0, network: bool = False) -> dict[str, Any]:
    """Run only the real-Kafka schedules and merge them into the result file (the
    EmbeddedCluster rows stay as they are): the ``apache_kafka`` section, or with
    ``network`` the ``apache_kafka_network`` one."""
    started = time.time()
    section = score_apache(schedules, first, network)
    if network:
        section["started_at"] = _utc(started)
        _merge_section("apache_kafka_network", section, started)
        return section
    result = _previous()
    result["apache_kafka"] = section
    write_record(RESULTS, "chaos_scoreboard", started, result)
    return section


def _merge_section(name: str, section: dict[str, Any], started: float) -> None:
    """Put ``section`` into the result file, the rest of the record as it was (its date is
    the other rows' date; the section carries its own ``started_at``)."""
    try:
        record: dict[str, Any] = json.loads(OUT.read_text())
        record["result"][name] = section
    except (OSError, ValueError, KeyError, TypeError):
        write_record(RESULTS, "chaos_scoreboard", started, {name: section})
        return
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(OUT)


def run_network_only(schedules: int, first: int, workers: int) -> dict[str, Any]:
    """The EmbeddedCluster network rows (:data:`NETWORK_CLIENTS`, one client at a time on
    the same seeds), merged into the result file as its ``network`` section."""
    started = time.time()
    section: dict[str, Any] = {
        "cluster": "EmbeddedCluster (3 brokers; every client through the fault proxy)",
        "generator": "generate(seed, network=True)",
        "seeds": f"{first}..{first + schedules - 1}",
        "workers": workers,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "clients": {},
    }
    for name in NETWORK_CLIENTS:
        section["clients"][name] = score(name, schedules, workers, first=first, network=True)
        print(json.dumps({name: section["clients"][name]}), flush=True)
    section["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    section["started_at"] = _utc(started)
    _merge_section("network", section, started)
    return section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chaos_scoreboard")
    ap.add_argument("--apache-only", action="store_true", help="only the real-Kafka rows")
    ap.add_argument("--seeds", type=int, default=30, help="real-Kafka schedules (default 30)")
    ap.add_argument("--first", type=int, default=0, help="the first seed")
    ap.add_argument(
        "--network",
        action="store_true",
        help="with --apache-only: the network schedules, every client through the fault proxy",
    )
    ap.add_argument(
        "--network-only",
        action="store_true",
        help="only the EmbeddedCluster network rows (--schedules of them from --first)",
    )
    ap.add_argument("--schedules", type=int, default=100, help="with --network-only")
    ap.add_argument("--workers", type=int, default=WORKERS, help="with --network-only")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.first < 0 or args.schedules < 1 or args.workers < 1:
        ap.error("--seeds, --schedules and --workers must be >= 1 and --first >= 0")
    if args.network and not args.apache_only:
        ap.error("--network goes with --apache-only (--network-only: the EmbeddedCluster rows)")
    if args.network_only:
        section = run_network_only(args.schedules, args.first, args.workers)
        print(json.dumps(section, indent=2))
    elif args.apache_only:
        print(json.dumps(run_apache_only(args.seeds, args.first, args.network), indent=2))
    else:
        print(json.dumps(run(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
