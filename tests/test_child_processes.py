"""Children started through ``epochguard.testing.apache_kafka.process`` (the brokers' JVMs)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from epochguard.testing.apache_kafka import process


def test_a_child_spawned_from_a_short_lived_thread_outlives_the_thread(tmp_path: Path) -> None:
    # Linux sends PR_SET_PDEATHSIG when the forking *thread* exits: without one long-lived
    # spawner thread this child got SIGKILL (return code -9) as soon as the worker ended.
    spawned: list[subprocess.Popen[bytes]] = []
    worker = threading.Thread(
        target=lambda: spawned.append(process.spawn(["sleep", "60"], tmp_path / "out", tmp_path))
    )
    worker.start()
    worker.join(10)
    (child,) = spawned
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(1.0)
        assert child.pid in process.live_pids()
    finally:
        assert process.stop(child, 5) == -15


def test_spawn_errors_reach_the_calling_thread(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        process.spawn([str(tmp_path / "no-such-program")], tmp_path / "out", tmp_path)
