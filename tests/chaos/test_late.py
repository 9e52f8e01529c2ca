"""Which failed runs count as late (run again) and which stand."""

from __future__ import annotations

from typing import Any

import pytest

from epochguard.testing.chaos import RunResult, Schedule
from epochguard.testing.chaos.oracle import History, Verdict
from epochguard.testing.chaos.schedule import Produce

from . import late
from .late import only_late, settled

STALL_P0 = "stall on p0: end marker not received in 15.0 s"
LOST_P0 = "p0 offset 4 (b'1:4') of the final log was never delivered"
LOST_P1 = "p1 offset 2 (b'1:2') of the final log was never delivered"


def _result(harness_error: str | None = None, **verdict: object) -> RunResult:
    return RunResult(
        schedule=Schedule(1, (Produce(0, 5, 1),), partitions=2),
        client="epochguard",
        history=History((), (), {}),
        verdict=Verdict(**verdict),  # type: ignore[arg-type]
        seconds=1.0,
        step_log=(),
        harness_error=harness_error,
    )


def test_a_stall_with_losses_on_the_stalled_partition_is_late() -> None:
    assert only_late(_result(stalls=1, silent_losses=1, problems=(STALL_P0, LOST_P0)))
    assert only_late(_result(stalls=1, problems=(STALL_P0,)))


@pytest.mark.parametrize(
    "verdict",
    [
        {},  # passed
        {"silent_losses": 1, "problems": (LOST_P0,)},  # lost, never stalled
        {"stalls": 1, "silent_losses": 2, "problems": (STALL_P0, LOST_P0, LOST_P1)},
        {"stalls": 1, "silent_rereads": 1, "problems": (STALL_P0, "p0 offset 3: again")},
        {"stalls": 1, "spurious_reports": 1, "problems": (STALL_P0, "spurious")},
        {"stalls": 1, "raise_breaches": 1, "problems": (STALL_P0, "breach")},
        {"stalls": 1, "problems": ("stall on p-1: the run raised OSError()",)},
        {"stalls": 1, "committed_losses": 1, "problems": (STALL_P0, "p0 offset 4: holds")},
    ],
)
def test_every_other_failure_stands(verdict: dict[str, Any]) -> None:
    assert not only_late(_result(**verdict))


def test_a_harness_error_is_not_late() -> None:
    assert not only_late(_result("Traceback", stalls=1, problems=(STALL_P0,)))


def test_a_late_run_runs_again_until_it_passes_or_the_reruns_are_used_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stalled = _result(stalls=1, problems=(STALL_P0,))
    passed = _result(delivered=6)
    outcomes = [stalled, passed]
    monkeypatch.setattr(late, "run_schedule", lambda *a, **k: outcomes.pop(0))
    assert settled([stalled]) == [passed]

    reruns = 0

    def always_late(*args: object, **kwargs: object) -> RunResult:
        nonlocal reruns
        reruns += 1
        return stalled

    monkeypatch.setattr(late, "run_schedule", always_late)
    assert settled([stalled, passed]) == [stalled, passed]
    assert reruns == late.RERUNS
