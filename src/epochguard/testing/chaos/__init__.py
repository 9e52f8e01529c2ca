"""Chaos schedules as data, one runner, an oracle and shrinking (docs/testing.md, "Chaos
schedules"; docs/reliability.md for the cross-client scoreboard)."""

from __future__ import annotations

from epochguard.testing.chaos.oracle import History, Verdict, judge
from epochguard.testing.chaos.runner import RunResult, run_schedule
from epochguard.testing.chaos.schedule import Schedule, generate

__all__ = ["History", "RunResult", "Schedule", "Verdict", "generate", "judge", "run_schedule"]
