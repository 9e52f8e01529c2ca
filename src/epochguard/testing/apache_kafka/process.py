"""JVM child processes that cannot outlive the test run.

Three layers, because a test run can end in three ways:
- normal end or an exception: ``ApacheKafkaCluster.close`` stops every node;
- interpreter exit without close (a crashed fixture, ``sys.exit``): an ``atexit`` hook kills
  every JVM still registered;
- the Python process is killed (``kill -9``, a CI timeout): on Linux each JVM is started with
  ``PR_SET_PDEATHSIG = SIGKILL``, so the kernel kills it when its parent goes away; elsewhere a
  ``sh`` watchdog polls the parent pid and kills the JVM's process group.
Linux sends the death signal when the *thread* that forked the child exits, not the process:
every JVM is therefore forked by one spawner thread that lives as long as the interpreter, so
a broker started (or restarted) from a short-lived worker thread keeps running.
Each JVM leads its own process group so a Ctrl-C in the terminal reaches only pytest, whose
fixtures then stop the brokers in order instead of every JVM dying at once.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from epochguard._log import get_logger

log = get_logger("epochguard.testing.apache_kafka")

_PR_SET_PDEATHSIG = 1
_live: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def _child_setup() -> None:
    os.setpgid(0, 0)
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl; then nobody would signal us.
        if os.getppid() == 1:
            os._exit(1)


class _Spawner:
    """One daemon thread that forks every child, started on first use and never ended.

    The death signal follows the forking thread, so it must be a thread that lives until
    the process ends; a daemon thread does (it is frozen, not ended, at interpreter exit,
    after the ``atexit`` hook has killed the children)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], concurrent.futures.Future[Any]]
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def run(self, fork: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        if threading.current_thread() is self._thread:
            return fork()
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="epochguard-jvm-spawner", daemon=True
                )
                self._thread.start()
        done: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        self._jobs.put((fork, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            fork, done = self._jobs.get()
            try:
                done.set_result(fork())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)


_SPAWNER = _Spawner()


def spawn(args: Sequence[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``args`` with stdout and stderr appended to ``log_path``; register it for cleanup.

    Safe from any thread: the fork happens on the long-lived spawner thread."""
    proc = _SPAWNER.run(lambda: _fork(args, log_path, cwd))
    with _lock:
        _live[proc.pid] = proc
    if _LIBC is None:
        _start_watchdog(proc.pid)
    return proc


def _fork(args: Sequence[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            preexec_fn=_child_setup,
            close_fds=True,
        )
    return proc


def _start_watchdog(pgid: int) -> None:
    script = f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; kill -KILL -{pgid}"
    subprocess.Popen(
        ["sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes], timeout: float, kill: bool = False) -> int:
    """SIGTERM (or SIGKILL) the process group, wait, escalate to SIGKILL after ``timeout``."""
    sig = signal.SIGKILL if kill else signal.SIGTERM
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("jvm_stop_timeout", pid=proc.pid, timeout_s=timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    with _lock:
        _live.pop(proc.pid, None)
    return proc.returncode


def live_pids() -> list[int]:
    with _lock:
        return [pid for pid, proc in _live.items() if proc.poll() is None]


@atexit.register
def _kill_all() -> None:
    with _lock:
        procs = list(_live.values())
        _live.clear()
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
