"""Python driver of ``TruncationProbe.java``: the stock Java KafkaConsumer as a reference client.

The probe runs as its own JVM (same kafka-clients jar as the brokers) and answers commands on
stdin with JSON lines, so a scenario can let it consume, pause it while the test stops brokers
and elects a leader uncleanly, and let it continue.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from epochguard.testing.apache_kafka import class_archive, process
from epochguard.testing.apache_kafka.jars import KafkaJars, ensure_kafka_jars, ensure_probe_classes

TERMINAL_EVENTS = frozenset(
    {"ready", "polled", "position", "seeked", "committed", "closed", "error"}
)

PROBE_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
logger.consumer.name = org.apache.kafka.clients.consumer
logger.consumer.level = INFO
"""

#: Consumer settings that keep the probe's reactions inside a test's time budget.
DEFAULT_PROPS = {
    "metadata.max.age.ms": "1000",
    "reconnect.backoff.max.ms": "500",
    "retry.backoff.max.ms": "500",
    "request.timeout.ms": "10000",
    "default.api.timeout.ms": "10000",
}


class ProbeError(RuntimeError):
    """The Java probe died, or did not answer a command in time."""


Event = dict[str, Any]


class ProbeProgram:
    """One of our probe programs as a child process: commands on stdin, JSON-line events on
    stdout, its log on stderr. An answer ends with an event whose kind is in ``terminal``;
    :meth:`_on_event` sees every event."""

    #: How failures name the program.
    label = "probe program"
    terminal: frozenset[str] = frozenset()

    def _spawn(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._stderr = open(log_path, "wb")  # noqa: SIM115 - closed in _stop()
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            preexec_fn=process._child_setup,
        )
        self._events: queue.Queue[Event | None] = queue.Queue()
        #: Every event the program reported, in order (for assertion messages and docs).
        self.history: list[Event] = []
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        for raw in stream:
            line = raw.decode("utf-8", "replace").strip()
            if line:
                try:
                    self._events.put(json.loads(line))
                except json.JSONDecodeError:
                    self._events.put({"event": "garbage", "line": line})
        self._events.put(None)

    def _on_event(self, event: Event) -> None:
        """Every event, as it arrives (subclasses keep their own records of them)."""

    def _until_terminal(self, timeout: float) -> list[Event]:
        deadline = time.monotonic() + timeout
        events: list[Event] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProbeError(f"{self.label} did not answer in {timeout:.0f} s; got {events}")
            try:
                event = self._events.get(timeout=remaining)
            except queue.Empty:
                continue
            if event is None:
                raise ProbeError(
                    f"{self.label} exited ({self._proc.wait()}); log: {self.log_text()[-3000:]}"
                )
            events.append(event)
            self.history.append(event)
            self._on_event(event)
            if event["event"] in self.terminal:
                return events

    def _send(self, line: str, timeout: float) -> list[Event]:
        stdin = self._proc.stdin
        if stdin is None or self._proc.poll() is not None:
            raise ProbeError(f"{self.label} is not running")
        stdin.write((line + "\n").encode())
        stdin.flush()
        return self._until_terminal(timeout)

    def log_text(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.log_path.read_text(errors="replace")

    def _stop(self, quit_timeout: float) -> None:
        """``quit`` (the program closes its consumer), then wait; killed if it hangs."""
        if self._proc.poll() is None:
            with contextlib.suppress(ProbeError):
                self._send("quit", quit_timeout)
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._stderr.close()

    def close(self) -> None:
        self._stop(20)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class JavaProgram(ProbeProgram):
    """One of our Java programs, compiled against the brokers' kafka-clients jar."""

    label = "Java program"

    def _launch(
        self,
        main_class: str,
        program_args: list[str],
        *,
        jars: KafkaJars | None,
        log_dir: Path,
        log_name: str,
        class_archive_dump: Path | None = None,
    ) -> None:
        self.jars = jars or ensure_kafka_jars()
        probe_jar = ensure_probe_classes(self.jars)
        archive = (
            (f"-XX:ArchiveClassesAtExit={class_archive_dump}",)
            if class_archive_dump is not None
            else class_archive.jvm_options(self.jars, "probe")
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        config = log_dir / "probe-log4j2.properties"
        config.write_text(PROBE_LOG4J2)
        self.log_path = log_dir / log_name
        args = [
            "java",
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            *archive,
            f"-Dlog4j2.configurationFile={config}",
            "-cp",
            f"{probe_jar}:{self.jars.classpath}",
            main_class,
            *program_args,
        ]
        self._spawn(args, self.log_path)


class JavaTruncationProbe(JavaProgram):
    """One Java ``KafkaConsumer`` assigned to one partition, driven step by step (a ``group.id``
    in ``props`` lets it commit and restore from the commit)."""

    label = "probe"
    terminal = TERMINAL_EVENTS

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        partition: int,
        auto_offset_reset: str,
        *,
        props: Mapping[str, str] | None = None,
        jars: KafkaJars | None = None,
        log_dir: Path,
        class_archive_dump: Path | None = None,
    ) -> None:
        """``class_archive_dump``: write the JVM's class-data-sharing archive there when it
        exits (:mod:`~epochguard.testing.apache_kafka.class_archive`)."""
        settings = {**DEFAULT_PROPS, **(props or {})}
        self._launch(
            "TruncationProbe",
            [
                bootstrap_servers,
                topic,
                str(partition),
                auto_offset_reset,
                *(f"{k}={v}" for k, v in settings.items()),
            ],
            jars=jars,
            log_dir=log_dir,
            log_name=f"probe-{topic}-{partition}-{int(time.time() * 1000)}.log",
            class_archive_dump=class_archive_dump,
        )
        self._until_terminal(60.0)

    def poll(self, max_records: int, timeout_ms: int = 10000) -> list[Event]:
        """Poll until ``max_records`` records, a truncation/out-of-range error, or the timeout."""
        return self._send(f"poll {max_records} {timeout_ms}", timeout_ms / 1000 + 30)

    def position(self) -> int:
        events = self._send("position", 30)
        last = events[-1]
        if last["event"] != "position":
            raise ProbeError(f"position failed: {last}")
        return int(last["offset"])

    def commit(self) -> tuple[int, int | None]:
        """Commit the position (needs ``group.id`` in ``props``); the committed offset and
        leader epoch as the group coordinator returns them."""
        last = self._send("commit", 30)[-1]
        if last["event"] != "committed" or last["offset"] is None:
            raise ProbeError(f"commit failed: {last}")
        return int(last["offset"]), last.get("leader_epoch")

    def seek(self, offset: int, leader_epoch: int | None = None) -> list[Event]:
        suffix = "" if leader_epoch is None else f" {leader_epoch}"
        return self._send(f"seek {offset}{suffix}", 30)

    def seek_to_beginning(self) -> list[Event]:
        return self._send("seek_to_beginning", 30)


def records(events: list[Event]) -> list[Event]:
    return [e for e in events if e["event"] == "record"]
