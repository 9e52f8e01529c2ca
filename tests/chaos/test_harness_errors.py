"""A run the harness breaks (the cluster or the runner raised) is reported apart from the
client's verdict, never as its stall; a client that raises still fails its run."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import attrs
import pytest

from epochguard.testing.chaos import Schedule, Verdict
from epochguard.testing.chaos import __main__ as chaos_command
from epochguard.testing.chaos.runner import MemberContext, run_many
from epochguard.testing.chaos.schedule import Produce, StartBroker, StopBroker
from epochguard.testing.embedded.cluster import EmbeddedCluster

pytestmark = pytest.mark.timeout(120)

RESTART = Schedule(
    7, (Produce(0, 3, 1), StopBroker(0), StartBroker(0), Produce(0, 2, 1)), partitions=1
)


def _restarts_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a stopped broker raises, as when another process took its port."""
    start_broker = EmbeddedCluster.start_broker

    def failing(self: EmbeddedCluster, broker_id: int, port: int | None = None) -> None:
        if not self.is_running(broker_id):
            raise OSError(errno.EADDRINUSE, "Address already in use")
        start_broker(self, broker_id, port)

    monkeypatch.setattr(EmbeddedCluster, "start_broker", failing)


def test_a_harness_error_is_reported_apart_not_as_a_stall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _restarts_fail(monkeypatch)
    [result] = list(run_many([RESTART], workers=1))
    assert result.harness_error is not None
    assert "Address already in use" in result.harness_error
    assert "start_broker" in result.harness_error  # the traceback, to find the cause
    assert result.verdict == Verdict()  # nothing judged, nothing counted against the client
    assert not result.ok
    assert "not judged, the harness failed" in result.describe()


class _Broken:
    """A client that raises on its first poll."""

    def __init__(self, ctx: MemberContext) -> None:
        self.ctx = ctx

    def poll_once(self) -> None:
        raise RuntimeError("the client broke")

    def close(self) -> None:
        pass


def test_a_client_that_raises_still_fails_its_run() -> None:
    [result] = list(run_many([RESTART], {"broken": _Broken}, workers=1))
    assert result.harness_error is None
    assert result.verdict.stalls == 1
    assert "the client broke" in result.verdict.problems[0]
    assert not result.ok


def test_the_chaos_command_counts_harness_errors_apart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _restarts_fail(monkeypatch)
    monkeypatch.setattr(
        chaos_command, "generate", lambda seed, **_: attrs.evolve(RESTART, seed=seed)
    )
    out = tmp_path / "totals.json"
    status = chaos_command.main(["--seeds", "2", "--workers", "2", "--json", str(out)])
    totals = json.loads(out.read_text())
    assert status == 2  # nothing failed, but not every schedule was judged
    assert totals["schedules"] == 2
    assert totals["harness_errors"] == 2
    assert totals["harness_error_seeds"] == [0, 1]
    assert totals["failed_seeds"] == []
    assert totals.get("stalls", 0) == 0
    assert "Address already in use" in capsys.readouterr().out
