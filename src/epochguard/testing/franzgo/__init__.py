"""franz-go as a reference client: a small Go program (``probe/main.go``, franz-go's kgo
client on one partition) built from the Go module proxy into the cache, and its Python driver.

``python -m epochguard.testing.franzgo`` (what ``make go-probe`` runs) builds it ahead of the
tests. The binary lands in ``$EPOCHGUARD_KAFKA_CACHE`` (or ``~/.cache/epochguard``) under
``franzgo-probe/<digest of the sources>/``, renamed into place only once ``go build`` finished,
so an interrupted build is redone, never half used. ``go.mod`` and ``go.sum`` pin franz-go.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from epochguard._log import get_logger
from epochguard.testing.apache_kafka.jars import _locked, cache_root, real_kafka_required
from epochguard.testing.apache_kafka.probe import Event, ProbeError, ProbeProgram

log = get_logger("epochguard.testing.franzgo")

#: The probe's sources, all hashed into the cache key.
SOURCES = ("main.go", "go.mod", "go.sum")
BINARY = "franzgo-probe"
REQUIRE_ENV = "EPOCHGUARD_REQUIRE_GO"
TERMINAL_EVENTS = frozenset({"ready", "polled", "committed", "closed", "error"})


class GoProbeUnavailableError(RuntimeError):
    """Go is missing, or ``go build`` could not build the franz-go probe."""


def go_probe_required() -> bool:
    """In CI the franz-go tests must fail, not skip, when Go is missing (the same switch as
    real Kafka's, or ``EPOCHGUARD_REQUIRE_GO=1``)."""
    return os.environ.get(REQUIRE_ENV) == "1" or real_kafka_required()


def go_missing() -> bool:
    return shutil.which("go") is None


def _sources() -> dict[str, bytes]:
    probe = resources.files(__package__).joinpath("probe")
    return {name: probe.joinpath(name).read_bytes() for name in SOURCES}


def ensure_go_probe(root: Path | None = None) -> Path:
    """The built probe binary, running ``go build`` first when this source is not built."""
    sources = _sources()
    digest = hashlib.sha256(b"\0".join(sources[n] for n in SOURCES)).hexdigest()[:16]
    home = (root or cache_root()) / "franzgo-probe"
    out = home / digest
    if (out / BINARY).is_file():
        return out / BINARY
    if go_missing():
        raise GoProbeUnavailableError("cannot build the franz-go probe: go not found")
    with _locked(home):
        if not (out / BINARY).is_file():
            _build(sources, out)
    return out / BINARY


def _build(sources: dict[str, bytes], out: Path) -> None:
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "src").mkdir(parents=True)
    for name, data in sources.items():
        (staging / "src" / name).write_bytes(data)
    started = time.monotonic()
    proc = subprocess.run(
        ["go", "build", "-o", str(staging / BINARY), "."],
        cwd=staging / "src",
        env={**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise GoProbeUnavailableError(
            f"go build failed for the franz-go probe:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    log.info("franzgo_probe_built", path=str(out / BINARY), seconds=time.monotonic() - started)


class FranzGoProbe(ProbeProgram):
    """One franz-go ``kgo.Client`` consuming one partition (``kgo.NoResetOffset``), driven
    step by step: from ``start``, or (``start="committed"``) from ``group``'s commit with its
    leader epoch."""

    label = "franz-go probe"
    terminal = TERMINAL_EVENTS

    def __init__(
        self,
        binary: Path,
        bootstrap_servers: str,
        topic: str,
        partition: int = 0,
        *,
        start: int | str = 0,
        group: str | None = None,
        log_dir: Path,
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(binary),
            f"-bootstrap={bootstrap_servers}",
            f"-topic={topic}",
            f"-partition={partition}",
            f"-start={start}",
        ]
        if group:
            args.append(f"-group={group}")
        self._spawn(args, log_dir / f"franzgo-{topic}-{partition}-{int(time.time() * 1000)}.log")
        ready = self._until_terminal(30.0)[-1]
        if ready["event"] != "ready":
            self.close()
            raise ProbeError(f"franz-go probe did not start: {ready}")

    def poll(self, max_records: int, timeout_ms: int = 10000) -> list[Event]:
        """Poll until ``max_records`` records or the timeout; errors are reported, not fatal."""
        return self._send(f"poll {max_records} {timeout_ms}", timeout_ms / 1000 + 30)

    def commit(self) -> tuple[int, int | None]:
        """Commit the position (one past the last record, with its epoch); what the group then
        holds, as OffsetFetch answers it."""
        last = self._send("commit", 30)[-1]
        if last["event"] != "committed":
            raise ProbeError(f"commit failed: {last}")
        epoch = last["leader_epoch"]
        return int(last["offset"]), None if epoch < 0 else int(epoch)


def main(argv: list[str] | None = None) -> int:
    """Build the probe ahead of the tests; see ``make go-probe``."""
    del argv
    if go_missing():
        message = "the franz-go reference client needs go, which is not installed"
        if go_probe_required():
            print(f"error: {message}", file=sys.stderr)
            return 1
        print(f"skipping the franz-go probe: {message}", file=sys.stderr)
        return 0
    started = time.monotonic()
    try:
        binary = ensure_go_probe()
    except GoProbeUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"franz-go probe in {binary} ({time.monotonic() - started:.1f} s)")
    return 0
