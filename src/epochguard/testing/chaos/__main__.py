"""``python -m epochguard.testing.chaos``: run many seeded schedules and print the figures.

``--seeds N --first K`` runs the schedules of seeds K..K+N-1 (split a large run over processes
with disjoint ``--first``); every failure is printed with its replay code (``--shrink`` also
shrinks it). A run the harness broke (the cluster or the runner raised, not the client) is
not judged: it is counted apart (``harness_errors``, ``harness_error_seeds``) and printed with
its traceback, never as a client's stall. Exit status 1 when any schedule failed, else 2
when any run was not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Any

from epochguard.testing.chaos.clients import CLIENTS
from epochguard.testing.chaos.runner import ChaosClientError, run_many, run_schedule
from epochguard.testing.chaos.schedule import generate
from epochguard.testing.chaos.shrink import shrink

#: A progress line (totals so far) every this many schedules.
PROGRESS_EVERY = 250


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m epochguard.testing.chaos")
    ap.add_argument("--seeds", type=int, default=100, help="how many schedules (default 100)")
    ap.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--workers", type=int, default=6, help="runs at a time (default 6)")
    ap.add_argument("--client", choices=sorted(CLIENTS), default="epochguard")
    ap.add_argument("--clean", action="store_true", help="no unclean elections")
    ap.add_argument(
        "--group-recreate",
        action="store_true",
        help="consumer groups see topic re-creation too (other seeds, other schedules)",
    )
    ap.add_argument(
        "--network",
        action="store_true",
        help="mix network faults (latency, bandwidth, cuts, blackholes, resets, partitions) in",
    )
    ap.add_argument(
        "--transactions",
        action="store_true",
        help="transactional producers (commit, abort, left open) and read_committed consumers;"
        " the oracle also judges aborted deliveries, committed losses and hanging transactions",
    )
    ap.add_argument(
        "--trail",
        action="store_true",
        help="record every tracker's inputs and outputs; a stall's report shows its partition's",
    )
    ap.add_argument(
        "--raft",
        action="store_true",
        help="brokers with Raft-term epochs (EmbeddedCluster(epochs='raft'), Redpanda's rules)",
    )
    ap.add_argument("--shrink", action="store_true", help="shrink every failure")
    ap.add_argument("--json", help="write the totals (and failing seeds) to this file")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.first < 0 or args.workers < 1:
        ap.error("--seeds and --workers must be >= 1, --first >= 0")
    factory = CLIENTS[args.client]
    epochs = "raft" if args.raft else "kafka"
    if args.trail:
        from epochguard.testing.chaos import trail

        trail.install()
    started = time.monotonic()
    totals: Counter[str] = Counter()
    failed: list[int] = []
    #: runs the harness broke, not judged
    harness_failed: list[int] = []
    #: failed only with records whose transaction was decided again (Verdict.only_decided_again)
    decided_again: list[int] = []
    seeds = range(args.first, args.first + args.seeds)
    schedules = (
        generate(
            s,
            unclean=not args.clean,
            group_recreate=args.group_recreate,
            network=args.network,
            transactions=args.transactions,
        )
        for s in seeds
    )
    interrupted = False
    try:
        for r in run_many(schedules, {args.client: factory}, workers=args.workers, epochs=epochs):
            _count(r, totals, failed, harness_failed, args, factory, epochs)
            if r.verdict.only_decided_again:
                decided_again.append(r.schedule.seed)
            if totals["schedules"] % PROGRESS_EVERY == 0:
                # A long run says how far it got: stopped early, it still has figures.
                progress = {"progress": dict(totals), "failed_seeds": failed}
                print(json.dumps(progress | {"harness_error_seeds": harness_failed}), flush=True)
    except KeyboardInterrupt:
        interrupted = True
    summary = {
        "client": args.client,
        "first": args.first,
        "seeds": args.seeds,
        "clean": args.clean,
        "group_recreate": args.group_recreate,
        "network": args.network,
        "epochs": epochs,
        **({"transactions": True} if args.transactions else {}),
        **dict(totals),
        "harness_errors": len(harness_failed),
        "failed_seeds": sorted(failed),
        "harness_error_seeds": sorted(harness_failed),
        **({"failed_only_decided_again": sorted(decided_again)} if args.transactions else {}),
        "interrupted": interrupted,
        "seconds": round(time.monotonic() - started, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 1 if failed else 2 if harness_failed else 0


def _count(
    r: Any,
    totals: Counter[str],
    failed: list[int],
    harness_failed: list[int],
    args: Any,
    factory: Any,
    epochs: str,
) -> None:
    totals.update(schedules=1)
    if r.harness_error is not None:
        harness_failed.append(r.schedule.seed)
        print(r.describe(), flush=True)
        return
    v = r.verdict
    totals.update(v.counts())
    if not v.ok:
        failed.append(r.schedule.seed)
        print(r.describe(), flush=True)
        if epochs != "kafka":
            print(f"  (replay with run_schedule(..., epochs={epochs!r}))", flush=True)
        if args.shrink:

            def fails(s: Any) -> bool:
                try:
                    return not run_schedule(s, {args.client: factory}, epochs=epochs).verdict.ok
                except ChaosClientError:
                    return True  # the client raised: a failure of its own
                except Exception:
                    return False  # the harness broke: nothing judged

            small, runs = shrink(r.schedule, fails)
            print(f"shrunk in {runs} runs:\n{small.to_code()}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
