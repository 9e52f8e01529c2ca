"""Shrinking a failing schedule: fewer partitions, fewer members, fewer steps, while it still
fails (a delta-debugging pass over the steps: chunks of halves, quarters, ... single steps)."""

from __future__ import annotations

from collections.abc import Callable

from epochguard.testing.chaos.schedule import Join, Leave, Schedule, Step

__all__ = ["shrink"]


def _fewer_partitions(s: Schedule) -> Schedule | None:
    if s.partitions <= 1:
        return None
    n = s.partitions - 1
    steps = tuple(x for x in s.steps if getattr(x, "partition", 0) < n)
    return s.replace(partitions=n, steps=steps)


def _fewer_members(s: Schedule) -> Schedule | None:
    if s.members <= 1:
        return None
    n = s.members - 1
    steps: tuple[Step, ...] = s.steps
    if n == 1:  # a single consumer assigns its partitions: no group to join or leave
        steps = tuple(x for x in steps if not isinstance(x, Join | Leave))
    return s.replace(members=n, steps=steps)


def shrink(
    schedule: Schedule, fails: Callable[[Schedule], bool], max_runs: int = 80
) -> tuple[Schedule, int]:
    """The smallest schedule found that still ``fails``, and how many runs it took.

    ``fails`` runs a candidate (a real run: a failure that needs timing luck may not
    reproduce, so the result is a schedule that failed, never one that merely might)."""
    runs = 0
    best = schedule

    def attempt(candidate: Schedule | None) -> bool:
        nonlocal runs, best
        if candidate is None or runs >= max_runs:
            return False
        runs += 1
        if fails(candidate):
            best = candidate
            return True
        return False

    while attempt(_fewer_partitions(best)):
        pass
    while attempt(_fewer_members(best)):
        pass
    chunk = max(1, len(best.steps) // 2)
    while runs < max_runs and best.steps:
        i = 0
        removed = False
        while i < len(best.steps) and runs < max_runs:
            candidate = best.replace(steps=best.steps[:i] + best.steps[i + chunk :])
            if attempt(candidate):
                removed = True  # the same i now names the next chunk
            else:
                i += chunk
        if chunk == 1 and not removed:
            break
        if not removed:
            chunk = max(1, chunk // 2)
    return best, runs
