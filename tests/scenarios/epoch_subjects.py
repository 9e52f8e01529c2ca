"""EpochConsumer as a scenario subject: several consumers, one per truncation policy, side by side.

Staging a truncation on real Kafka costs seconds, so one staged truncation is watched by many
consumers at once: each ``Subject`` wraps one ``EpochConsumer`` with one policy and records
exactly what the application received (records, reports, exceptions) and when it learnt of a
truncation. ``drive`` polls a set of subjects round-robin, and each subject reacts like a
careful application: after a ``LogTruncationError`` it keeps polling for a while (the
partition must stay stopped), then seeks to the divergence point.

What was received is written to ``build/scenarios/epochguard/<scenario>-<cluster>.json`` in
the reference clients' event format (``clients.py``), so a summary can put EpochConsumer next
to kafka-python, confluent-kafka and Java.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kafka.errors as kerrors
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer, LogTruncationError
from epochguard.offsets.errors import EpochGuardError
from epochguard.offsets.policy import TruncationDecision
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.testing import Cluster
from epochguard.testing.helpers import describe_consumer

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "build" / "scenarios" / "epochguard"

#: Which driver the subjects run: "threads" (EpochConsumer) or "asyncio" (AIOEpochConsumer
#: through :class:`LoopDriven`). ``EPOCHGUARD_SCENARIO_DRIVER=asyncio`` runs the whole
#: scenario suite on the asyncio driver; ``tests/scenarios/test_asyncio_driver.py`` runs a
#: part of it so in CI.
DRIVER = os.environ.get("EPOCHGUARD_SCENARIO_DRIVER", "threads")


class LoopDriven:
    """An ``AIOEpochConsumer`` behind EpochConsumer's blocking calls, each run on a loop of
    its own: the scenario code stays the same for both drivers."""

    def __init__(self, **config: Any) -> None:
        from epochguard import AIOEpochConsumer

        self.loop = asyncio.new_event_loop()
        self.aio = AIOEpochConsumer(**config)
        self._run(self.aio.start())

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        return self._run(self.aio.getmany(timeout_ms=timeout_ms, max_records=max_records))

    def position(self, tp: TopicPartition, timeout_ms: int | None = None) -> int:
        return int(self._run(self.aio.position_with_epoch(tp, timeout_ms)).offset)

    def position_with_epoch(self, tp: TopicPartition, timeout_ms: int | None = None) -> Any:
        return self._run(self.aio.position_with_epoch(tp, timeout_ms))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self._run(self.aio.seek_to_beginning(*tps))

    def commit(self, offsets: Any = None) -> None:
        self._run(self.aio.commit(offsets))

    def committed_with_epoch(self, tp: TopicPartition) -> Any:
        return self._run(self.aio.committed_with_epoch(tp))

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        try:
            self._run(self.aio.stop())
        finally:
            self.loop.close()

    def __getattr__(self, name: str) -> Any:
        # assign, seek, metrics, assignment and the other calls that do not wait.
        return getattr(self.aio, name)


#: (offset, value, leader epoch) of one delivered record.
Delivered = tuple[int, str, int | None]

#: policy name -> (on_truncation, auto_offset_reset). "callable" gets a handler that seeks to
#: the divergence point it is given.
POLICIES: dict[str, tuple[str, str]] = {
    "raise": ("raise", "earliest"),
    "rewind": ("rewind", "earliest"),
    "auto-earliest": ("auto", "earliest"),
    "auto-none": ("auto", "none"),
    "callable": ("callable", "earliest"),
}
#: Policies under which a truncation stops the partition until the application seeks.
RAISING = frozenset({"raise", "auto-none"})

#: How long, and for how many polls at least, a stopped partition is polled before the
#: application seeks: it must deliver nothing meanwhile.
STOP_HOLD_SECONDS = 0.5
STOP_HOLD_POLLS = 3


def records(values: Iterable[str], first_offset: int, epoch: int | None) -> list[Delivered]:
    return [(first_offset + i, v, epoch) for i, v in enumerate(values)]


def consumer_config(cluster: Cluster, **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "bootstrap_servers": cluster.all_bootstrap_servers,
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 100,
        "retry_backoff_ms": 50,
        "reconnect_backoff_ms": 50,
        "reconnect_backoff_max_ms": 500,
        "request_timeout_ms": 10000,
        "client_id": "epochguard-scenario",
    }
    cfg.update(overrides)
    return cfg


class Subject:
    """One EpochConsumer under one policy, assigned one partition, and what it received."""

    def __init__(
        self,
        cluster: Cluster,
        tp: TopicPartition,
        policy: str,
        label: str,
        group_id: str | None = None,
        start: EpochOffset | int | None = 0,
        **overrides: Any,
    ) -> None:
        on_truncation, reset = POLICIES[policy]
        self.tp = tp
        self.policy = policy
        self.label = label
        self.delivered: list[Delivered] = []
        self.reports: list[TruncationReport] = []
        self.handler_reports: list[TruncationReport] = []
        self.errors: list[Exception] = []
        #: len(delivered) when the application first learnt of a truncation or error.
        self.detected_at: int | None = None
        self.stopped_since: float | None = None
        self.stopped_polls = 0
        self.stopped_deliveries = 0
        self.position_error_while_stopped: str | None = None
        self.seeks: list[EpochOffset | str] = []
        self.phase = "before"
        self.events: dict[str, list[dict[str, Any]]] = {"before": []}
        handler: Any = on_truncation
        if on_truncation == "callable":
            handler = self._handler
        driver: Any = LoopDriven if DRIVER == "asyncio" else EpochConsumer
        self.consumer = driver(
            **consumer_config(
                cluster,
                group_id=group_id,
                auto_offset_reset=reset,
                on_truncation=handler,
                on_truncation_report=self._on_report,
                **overrides,
            )
        )
        self.consumer.assign([tp])
        if start is not None:
            # Explicit start: without a committed offset "none" would stop the partition.
            self.consumer.seek(tp, start)

    @property
    def name(self) -> str:
        return f"{self.label}/{self.policy}"

    @property
    def raising(self) -> bool:
        return self.policy in RAISING

    def _handler(self, report: TruncationReport) -> TruncationDecision | EpochOffset:
        self.handler_reports.append(report)
        return report.divergence if report.divergence is not None else TruncationDecision.RAISE

    def _on_report(self, report: TruncationReport) -> None:
        self.reports.append(report)
        if self.detected_at is None:
            self.detected_at = len(self.delivered)
        self._event({"event": "truncation_report", **report.to_dict()})

    def diagnose(self) -> str:
        """The consumer's inner state, for a failure message: why is it not moving?"""
        return describe_consumer(self.consumer)

    def _event(self, event: dict[str, Any]) -> None:
        self.events.setdefault(self.phase, []).append(event)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.events.setdefault(phase, [])

    def poll(self, timeout_ms: int = 20, max_records: int | None = None) -> int:
        """One application poll; returns how many records it delivered."""
        if self.stopped_since is not None:
            self._maybe_seek_after_stop()
        try:
            batch = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except (EpochGuardError, kerrors.KafkaError) as exc:
            self._on_error(exc)
            return 0
        got = 0
        for recs in batch.values():
            for r in recs:
                value = r.value.decode()
                self.delivered.append((r.offset, value, r.leader_epoch))
                self._event(
                    {
                        "event": "record",
                        "offset": r.offset,
                        "leader_epoch": r.leader_epoch,
                        "value": value,
                    }
                )
                got += 1
        if self.stopped_since is not None:
            self.stopped_polls += 1
            self.stopped_deliveries += got
        return got

    def _on_error(self, exc: Exception) -> None:
        self.errors.append(exc)
        if self.detected_at is None:
            self.detected_at = len(self.delivered)
        event: dict[str, Any] = {
            "event": "exception",
            "type": type(exc).__name__,
            "text": str(exc),
            "kafka_offset_out_of_range": isinstance(exc, kerrors.OffsetOutOfRangeError),
        }
        if isinstance(exc, LogTruncationError):
            event["truncations"] = {
                f"{tp.topic}-{tp.partition}": r.to_dict() for tp, r in exc.truncations.items()
            }
        self._event(event)
        self.stopped_since = time.monotonic()
        self.stopped_polls = 0

    def _maybe_seek_after_stop(self) -> None:
        assert self.stopped_since is not None
        if (
            time.monotonic() - self.stopped_since < STOP_HOLD_SECONDS
            or self.stopped_polls < STOP_HOLD_POLLS
        ):
            return
        try:
            self.consumer.position(self.tp, timeout_ms=200)
        except (EpochGuardError, kerrors.KafkaError) as exc:
            self.position_error_while_stopped = type(exc).__name__
        error = self.errors[-1]
        target: EpochOffset | None = None
        if isinstance(error, LogTruncationError):
            target = error.truncation_offsets()[self.tp]
        if target is not None:
            self.consumer.seek(self.tp, target)
            self.seeks.append(target)
            self._event({"event": "seek", **target.to_json()})
        else:
            self.consumer.seek_to_beginning(self.tp)
            self.seeks.append("beginning")
            self._event({"event": "seek", "to": "beginning"})
        self.stopped_since = None

    def read(self, count: int, timeout: float = 30.0) -> None:
        """Deliver exactly ``count`` more records (``max_records`` keeps it from overshooting)."""
        want = len(self.delivered) + count
        deadline = time.monotonic() + timeout
        while len(self.delivered) < want:
            assert time.monotonic() < deadline, (
                f"{self.name}: {len(self.delivered)} of {want} records in {timeout}s; "
                f"errors {self.errors}"
            )
            self.poll(timeout_ms=100, max_records=want - len(self.delivered))

    def idle(self, seconds: float) -> None:
        """Poll at the log end: the fetches come back empty."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll(timeout_ms=100)

    def outcome(self) -> dict[str, Any]:
        rep = self.reports[0] if self.reports else None
        return {
            "policy": self.policy,
            "reports": len(self.reports),
            "divergence": None
            if rep is None or rep.divergence is None
            else rep.divergence.to_json(),
            "lost_count": None if rep is None else rep.lost_count,
            "detected_by": None if rep is None else rep.detected_by.value,
            "errors": [type(e).__name__ for e in self.errors],
            "delivered": len(self.delivered),
        }

    def close(self) -> None:
        self.consumer.close(autocommit=False, timeout_ms=2000)


def drive(
    subjects: Iterable[Subject], done: Callable[[Subject], bool], timeout: float = 60.0
) -> None:
    """Poll every subject round-robin until ``done`` holds for all of them."""
    pending = list(subjects)
    deadline = time.monotonic() + timeout
    while pending:
        assert time.monotonic() < deadline, "not done in time: " + ", ".join(
            f"{s.name} delivered={s.delivered[-3:]} reports={s.reports} errors={s.errors} "
            f"[{s.diagnose()}]"
            for s in pending
        )
        for s in pending:
            s.poll(timeout_ms=10)
        pending = [s for s in pending if not done(s)]


def settle_quietly(subjects: Iterable[Subject], seconds: float = 0.3) -> None:
    """Poll a little longer after the expected end: nothing more may arrive (no duplicates,
    nothing old)."""
    subjects = list(subjects)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for s in subjects:
            s.poll(timeout_ms=10)


class StagedRun:
    """One staged event on one cluster and the subjects that watched it. Subclasses set
    ``subjects`` and implement ``run``; ``results`` is written even when ``run`` fails."""

    subjects: dict[Any, Subject]

    def run(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for s in self.subjects.values():
            s.close()

    def results(self) -> None:
        """Write build/scenarios/epochguard/ files (see ``write_results``)."""


R = TypeVar("R", bound=StagedRun)


def staged(run: R) -> Iterator[R]:
    """Body of a module-scoped fixture: stage once, hand out, then close and record."""
    try:
        run.run()
        yield run
    finally:
        run.close()
        run.results()


def write_results(
    scenario: str, cluster_kind: str, subjects: Iterable[Subject], extra: dict[str, Any]
) -> Path:
    """``build/scenarios/epochguard/<scenario>-<cluster>.json``: reference-client event
    format, one client entry per subject."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{scenario}-{cluster_kind}.json"
    data = {
        "client": "epochguard.EpochConsumer",
        "scenario": scenario,
        "cluster": cluster_kind,
        **extra,
        "clients": {s.name: {**s.events, "outcome": s.outcome()} for s in subjects},
    }
    out.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return out
