"""The cross-client chaos scoreboard: the same seeded schedules (epochguard.testing.chaos)
against EpochConsumer, kafka-python's KafkaConsumer, confluent-kafka and aiokafka on the
EmbeddedCluster, judged by the same oracle (docs/reliability.md explains the method).

``EPOCHGUARD_SCOREBOARD_SCHEDULES`` (default 100) schedules per client, seeds 0..N-1, six
at a time; the result also goes to ``benchmarks/results/chaos.json``. Counts are summed over
the schedules: silent losses and silent re-reads in records, spurious reports and stalls in
events; ``schedules_failed`` counts schedules with any of them.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from epochguard.testing.chaos.clients import CLIENTS
from epochguard.testing.chaos.runner import run_many
from epochguard.testing.chaos.schedule import generate

SCHEDULES = int(os.environ.get("EPOCHGUARD_SCOREBOARD_SCHEDULES", "100"))
WORKERS = 6


def score(client: str, schedules: int = SCHEDULES, workers: int = WORKERS) -> dict[str, Any]:
    started = time.monotonic()
    totals: Counter[str] = Counter()
    failed: list[int] = []
    examples: list[str] = []
    runs = run_many(
        map(generate, range(schedules)),
        {client: CLIENTS[client]},
        workers=workers,
        end_timeout=10.0,
    )
    for r in runs:
        v = r.verdict
        totals.update(
            silent_losses=v.silent_losses,
            silent_rereads=v.silent_rereads,
            spurious_reports=v.spurious_reports,
            stalls=v.stalls,
            raise_breaches=v.raise_breaches,
            delivered=v.delivered,
            reports=v.reports,
        )
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
        "examples": examples,
        "seconds": round(time.monotonic() - started, 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def run() -> dict[str, Any]:
    result = {
        "cluster": "EmbeddedCluster (3 brokers)",
        "seeds": f"0..{SCHEDULES - 1}",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "clients": {name: score(name) for name in CLIENTS},
    }
    # The scoreboard's own file (docs/reliability.md reads it), besides the runner's
    # chaos_scoreboard.json with the host details.
    out = Path(__file__).resolve().parent / "results" / "chaos.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
