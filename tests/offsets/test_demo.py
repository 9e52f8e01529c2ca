from __future__ import annotations

import subprocess
import sys

import pytest

from epochguard.__main__ import main


@pytest.mark.timeout(60)
def test_demo_runs_and_reports_the_divergence() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "epochguard", "demo", "--sans-io"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "TRUNCATION DETECTED" in out
    assert "divergence offset 7 (epoch 1)" in out
    assert '"lost_count": 3' in out
    assert "pay-7, pay-8, pay-9" in out
    assert "every record in the new log was delivered: yes" in out


def test_demo_entry_point_returns_success(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--sans-io"]) == 0
    assert "decision: rewind -> new position 7@e1" in capsys.readouterr().out
