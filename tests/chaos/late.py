"""Runs that failed only by finishing late, and running them again.

A schedule's steps are timed (a step gap, a deadline for the end markers): on a loaded
machine a consumer group may still be rebalancing when the deadline passes, and the run ends
with a stall and the records after it never delivered. That says the machine was slow, not
that the consumer broke a promise, so such a run is run again on its own; the rerun must
pass. Any other failure (a record delivered twice or replaced unreported, a spurious report,
a raise breach, a loss on a partition that did reach its end, a harness error) is judged as
it stands, never run again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from epochguard.testing.chaos import RunResult, Schedule, run_schedule

_STALL = re.compile(r"stall on p(\d+): end marker not received in ")
_NEVER_DELIVERED = re.compile(r"p(\d+) offset \d+ \(.*\) of the final log was never delivered$")

#: how often a late run is run again, one at a time, before its last result stands
RERUNS = 2


def only_late(result: RunResult) -> bool:
    """Whether ``result`` failed only by a stall: end markers not received before the
    deadline, and no record missing but on a partition that stalled."""
    v = result.verdict
    if result.harness_error is not None or v.ok or not v.stalls:
        return False
    if v.silent_rereads or v.spurious_reports or v.raise_breaches:
        return False
    if v.aborted_deliveries or v.committed_losses or v.unreported_hanging or v.spurious_hanging:
        return False
    stalled = {int(m.group(1)) for p in v.problems if (m := _STALL.match(p))}
    if len(stalled) != v.stalls:
        return False  # a stall of another kind (the run raised, a partition left unread)
    for problem in v.problems:
        if _STALL.match(problem):
            continue
        lost = _NEVER_DELIVERED.match(problem)
        if lost is None or int(lost.group(1)) not in stalled:
            return False
    return True


def settled(results: Iterable[RunResult], clients: Any = None, **options: Any) -> list[RunResult]:
    """``results``, each run that failed only late replaced by a rerun of its schedule on
    its own (:func:`run_schedule` with ``clients`` and ``options``, as the first run had
    them), up to :data:`RERUNS` times."""
    out: list[RunResult] = []
    for result in results:
        for _ in range(RERUNS):
            if not only_late(result):
                break
            result = run_schedule(result.schedule, clients, **options)
        out.append(result)
    return out


def run_settled(schedule: Schedule, clients: Any = None, **options: Any) -> RunResult:
    """:func:`run_schedule`, run again on its own while it fails only late (see
    :func:`settled`). For a run that must pass; a run meant to catch a failing client is
    judged as it comes."""
    (result,) = settled([run_schedule(schedule, clients, **options)], clients, **options)
    return result
