"""Chaos schedules on brokers with Raft-term epochs (``EmbeddedCluster(epochs="raft")``,
Redpanda's rules), judged by the same oracle.

The first 30 schedules of the CI set (seeds 0..29), each on its own Raft-term cluster: a
``StopBroker`` is a power cut that loses unflushed acks=1 records, and an unclean ``Elect``
(refused by Raft) becomes the Raft way to lose records: every running replica but the
lagging one loses power. Topic re-creation is not staged (Fetch v11 names topics: the
consumer guide's Fetch-by-name limit). Larger runs: ``make chaos CHAOS_ARGS=--raft
SEEDS=N``; figures in docs/reliability.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest

from epochguard.testing.chaos import RunResult, generate, run_schedule
from epochguard.testing.chaos.runner import run_many
from epochguard.testing.chaos.shrink import shrink

pytestmark = [pytest.mark.independent, pytest.mark.slow, pytest.mark.timeout(300)]

WORKERS = 6
SEEDS = range(30)


def _fail_with_replay(results: Iterable[RunResult]) -> None:
    bad = sorted((r for r in results if not r.verdict.ok), key=lambda r: r.schedule.seed)
    if not bad:
        return
    first = bad[0]
    small, runs = shrink(
        first.schedule,
        lambda s: not run_schedule(s, epochs="raft").verdict.ok,
        max_runs=40,
    )
    pytest.fail(
        f"{len(bad)} schedule(s) failed on Raft-term brokers (seeds "
        f"{[r.schedule.seed for r in bad]}); the first:\n{first.describe()}\n"
        f"shrunk in {runs} runs to {len(small.steps)} steps, replay with "
        f"run_schedule(..., epochs='raft'):\n{small.to_code()}",
        pytrace=False,
    )


def _skipped_terms(result: RunResult) -> bool:
    """Whether a leader's log held records of two terms with an unused number between."""
    for snapshot in result.history.snapshots:
        for log in snapshot.values():
            if log is None:
                continue
            epochs = sorted({epoch for epoch, _value in log.records.values()})
            if any(b - a > 1 for a, b in itertools.pairwise(epochs)):
                return True
    return False


def test_chaos_schedules_on_raft_term_brokers() -> None:
    results = list(run_many(map(generate, SEEDS), workers=WORKERS, epochs="raft"))
    assert len(results) == len(SEEDS)
    _fail_with_replay(results)
    assert all(r.verdict.delivered > 0 for r in results)
    # The set stages the Raft shapes, not only passes: records lost with a majority's power,
    # reported, and logs whose terms skip numbers.
    assert sum("lost power" in line for r in results for line in r.step_log) >= 5
    assert sum(r.verdict.reports for r in results) >= 5
    assert sum(_skipped_terms(r) for r in results) >= 5
