"""Listening ports for the test clusters, reserved across processes.

A stopped broker starts again on the port it had. A port in the ephemeral range can be taken
meanwhile as the local end of some client's connection, and the restart then fails with
"address already in use"; ports below that range are never handed out that way. Several
processes start clusters at once (parallel test workers, chaos workers, other users of the
machine), so a port is also reserved by an exclusive lock on one file per port in the
temporary folder, which the kernel releases when its holder exits, however it exits.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

_LOCK_DIR = Path(tempfile.gettempdir()) / "epochguard-ports"
_LOWEST = 10_000

#: Ports this process holds (one lock file descriptor each, -1 where no lock file could be made).
_HELD: dict[int, int] = {}
_HELD_LOCK = threading.Lock()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _lock_file(port: int) -> int | None:
    """The locked file of ``port``; None if another process holds it; -1 without file locks."""
    try:
        import fcntl  # POSIX only; elsewhere only this process's reservations are known
    except ImportError:
        return -1
    try:
        _LOCK_DIR.mkdir(exist_ok=True)
        fd = os.open(_LOCK_DIR / str(port), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def reserve(port: int) -> bool:
    """Reserve ``port`` for this process, unless this or another process holds it."""
    with _HELD_LOCK:
        if port in _HELD:
            return False
        fd = _lock_file(port)
        if fd is None:
            return False
        _HELD[port] = fd
        return True


def release(ports: Iterable[int]) -> None:
    with _HELD_LOCK:
        for port in ports:
            fd = _HELD.pop(port, None)
            if fd is not None and fd >= 0:
                os.close(fd)


def candidates() -> Iterable[int]:
    """Random ports below the ephemeral range (none when that range starts too low)."""
    low = _ephemeral_low()
    if low <= _LOWEST + 100:
        return
    rng = random.Random()
    for _ in range(200):
        yield rng.randrange(_LOWEST, low)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_free(count: int) -> list[int]:
    """``count`` reserved ports that nothing listens on now (release them with ``release``).

    For servers started by another process (a JVM) on the ports afterwards."""
    ports: list[int] = []
    for port in candidates():
        if len(ports) == count:
            return ports
        if reserve(port):
            if _bindable(port):
                ports.append(port)
            else:
                release([port])
    if len(ports) == count:
        return ports
    # No room below the ephemeral range: ports the kernel picks, unreserved.
    release(ports)
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
