"""Leader changes: how long after a leader change each consumer delivers the first record
the new leader wrote (clean changes), or reports the truncation (unclean changes), and what
it asked the brokers for on the way.

Method (also written into the JSON):

* Two clusters, one after the other: an EmbeddedCluster of three brokers in this process,
  and Apache Kafka 4.3.1 (three KRaft brokers and a controller, each its own JVM,
  :class:`~epochguard.testing.apache_kafka.ApacheKafkaCluster`).
* The clients, side by side under one schedule, each in a process of its own, assigned
  partition 0 from offset 0 with their default settings (fetch waits, metadata age,
  backoffs) and a client id of their own: EpochConsumer, AIOEpochConsumer, the Java
  ``KafkaConsumer`` 4.3.1 (driven by ``TruncationProbe.java``, with Java's defaults in place
  of the probe's shorter test timeouts), kafka-python, confluent-kafka (librdkafka) and
  aiokafka. Each prints when it was handed each record and each truncation signal (wall
  clock, the clock this process reads; the Java probe stamps them in the JVM).
* Clean changes (``LEADER_CHANGES`` times, default 30): a topic of one partition on all
  three brokers. A record is written and every client has it; after 0.5 s of quiet the
  next ISR replica is made leader by a preferred election (on Apache Kafka the replica
  order is changed first, a reassignment that moves no data and keeps the leader, then
  ElectLeaders(PREFERRED) runs), and a marker record is written to the new leader as soon
  as it accepts it (Apache Kafka: a Produce with acks=all sent to the new leader and
  retried every 5 ms until it is taken, from the moment of the ElectLeaders call). A
  client's time is from the election to its receipt of the marker; ``marker_written`` is
  the same clock for the write's acknowledgement (records committed, the floor for every
  client), and a client's ``after_marker_written`` its time less that floor, change by
  change. On Apache Kafka the floor is most of the time: the new leader takes writes only
  once it has learnt of the election, and the marker is committed only once the followers
  fetch from it.
* Unclean changes (``LEADER_UNCLEAN_CHANGES``, default ``LEADER_CHANGES``): a topic of one
  partition on two brokers (min.insync.replicas 1; on Apache Kafka brokers 0 and 1, broker
  2 has no replica and is never stopped). Each change: the follower is stopped (it leaves
  the ISR), the leader alone takes 3 records and every client reads them; the leader is
  stopped, the follower started and elected uncleanly (ElectLeaders(UNCLEAN) on Apache
  Kafka, where the topic has no ``unclean.leader.election.enable``), and at once 5 new
  records are written to it, over the 3 the clients read; then the old leader is started
  (it truncates and rejoins the ISR) and the two swap roles. A client's time is from the
  election to its truncation signal: EpochConsumer and AIOEpochConsumer their
  ``on_truncation_report`` (``on_truncation`` default, ``auto``: rewind to the divergence
  and report); Java ``LogTruncationException`` (``auto.offset.reset=none``; the application
  seeks to the divergent offset); kafka-python 3 its ``LogTruncationError`` (KIP-320,
  ``auto_offset_reset="none"``; it seeks to the divergence); librdkafka an error event
  naming the truncation or an offset reset (``auto.offset.reset=error``; it restarts the
  partition at the log start, having no divergence point); aiokafka has no signal
  (``auto_offset_reset="earliest"``). A client with no signal for a change is counted
  "not detected", with where it read on. ``new_leader_written``: when the new leader took
  the 5 records (every client's floor). The time between the leader's stop and the
  election (seconds on Apache Kafka, a broker JVM starting) is outside the measure, but
  the clients spend it without a leader, retrying: their backoffs then decide how soon
  they look again.
* p50, p99 and max per client (nearest rank).
* Requests per change. On the EmbeddedCluster the brokers record every request with its
  client id and the time it arrived, for every client alike, and each change is counted
  from its start (clean: the election; unclean: the old leader's stop, before which every
  client is idle) to the client's own signal (the marker handed over; the truncation
  signal, or for a client without one the first record it read after the election): the
  requests it sent in between and the one it had in flight at the start (the long poll
  the change cuts short), divided by the changes counted. The rest of the schedule (the
  quiet before each change, the waits for the slowest client and for the ISR) costs every
  client the same idle long polls, one per 500 ms (``fetch.max.wait.ms`` and its
  equivalents, every client's default): ``idle_long_polls_per_change`` is that baseline,
  the median change's time outside the median client's window over 500 ms. A client that
  signals sooner would otherwise be charged the idle polls it sends while the schedule
  waits for the slower ones; the counts over the whole run (the quiet start and the end
  excluded, divided by the changes), idle polls included, are kept as
  ``requests_per_change_whole_run``. On Apache Kafka the brokers do not record by client,
  and only clients that count their own are counted, over the whole run: EpochConsumer
  (its metrics: Metadata, OffsetForLeaderEpoch, ListOffsets, Fetch) and librdkafka (its
  statistics, every API, one statistics interval of 1 s at each end of the window;
  librdkafka drops a broker that leaves metadata, a stopped one, and its counters start
  over when it is learnt again, so a window in which that happened is not counted); the
  others are not counted there.
* The load average is recorded before and after each cluster's sections (the machine may
  be shared). ``LEADER_CLUSTERS`` (default ``embedded,apache``) runs some of them; the
  other cluster's sections are kept from the current result file, each with its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import percentile

CHANGES = int(os.environ.get("LEADER_CHANGES", "30"))
UNCLEAN_CHANGES = int(os.environ.get("LEADER_UNCLEAN_CHANGES", str(CHANGES)))
CLUSTERS = os.environ.get("LEADER_CLUSTERS", "embedded,apache").split(",")
CLIENTS = [
    "epochguard",
    "epochguard-asyncio",
    "java",
    "kafka-python",
    "confluent-kafka",
    "aiokafka",
]
CLIENT_ID = "leader-change-"
ROOT = Path(__file__).resolve().parents[1]
#: Each client's stderr, per run (the Java probe's log goes to a temporary directory).
LOGS = ROOT / "build" / "leader_change"
#: Records the leader alone takes before an unclean election, and the new leader's after it.
LOST, NEW = 3, 5
#: How long a client may take to show a change before it counts as missed.
WAIT_S = 30.0
#: How long a broker may refuse a write (it has not learnt it leads) before the run fails.
WRITE_S = 120.0
#: A client that missed this many changes in a row is not waited for any more.
GIVE_UP_AFTER = 3
#: Every client's default long-poll wait (``fetch.max.wait.ms`` and its equivalents).
FETCH_WAIT_S = 0.5
#: Java's own defaults for what ``TruncationProbe``'s driver shortens for tests.
JAVA_DEFAULTS = {
    "metadata.max.age.ms": "300000",
    "reconnect.backoff.max.ms": "1000",
    "retry.backoff.max.ms": "1000",
    "request.timeout.ms": "30000",
    "default.api.timeout.ms": "60000",
}
API_NAMES = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    10: "FindCoordinator",
    18: "ApiVersions",
    23: "OffsetForLeaderEpoch",
    60: "DescribeCluster",
    71: "GetTelemetrySubscriptions",
    72: "PushTelemetry",
}
COUNT_MARK, END = "count-mark", "end"
#: librdkafka's statistics: brokers whose request counters started over (not a request).
RESTARTED = "statistics restarted"


# --------------------------------------------------------------------------- client side


class _Out:
    """What a client prints: one JSON object a line, flushed."""

    @staticmethod
    def line(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    def record(self, value: bytes | str, offset: int, at: float | None = None) -> None:
        text = value.decode() if isinstance(value, bytes) else value
        self.line(value=text, offset=offset, at=time.time() if at is None else at)

    def report(self, divergence: int | None, detail: str, at: float | None = None) -> None:
        self.line(
            report={"divergence": divergence, "detail": detail[:300]},
            at=time.time() if at is None else at,
        )

    def counts(self, label: str, counts: dict[str, int]) -> None:
        self.line(counts=counts, label=label)


def _epoch_counts(metrics: dict[str, Any]) -> dict[str, int]:
    return {
        "Metadata": metrics["metadata_requests"],
        "OffsetForLeaderEpoch": metrics["offset_for_leader_epoch_requests"],
        "ListOffsets": metrics["list_offsets_requests"],
        "Fetch": metrics["fetch_requests"],
        "leader hints used": metrics["leader_hints_applied"],
    }


def _epochguard(bootstrap: str, topic: str, out: _Out) -> None:
    from kafka.structs import TopicPartition

    from epochguard import EpochConsumer, LogTruncationError

    def reported(report: Any) -> None:
        out.report(report.lost_from, str(getattr(report.detected_by, "value", "")))

    c = EpochConsumer(
        bootstrap_servers=bootstrap,
        client_id=CLIENT_ID + "epochguard",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        on_truncation_report=reported,
    )
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    done = False
    while not done:
        try:
            batch = c.poll(timeout_ms=100)
        except LogTruncationError as exc:  # not under the default policy; said if it happens
            for at in exc.truncation_offsets().values():
                c.seek(tp, at) if at is not None else c.seek_to_beginning(tp)
            continue
        for records in batch.values():
            for r in records:
                out.record(r.value, r.offset)
                if r.value.decode() in (COUNT_MARK, END):
                    out.counts(r.value.decode(), _epoch_counts(c.metrics(raw=True)))
                done = done or r.value == END.encode()
    c.close()


async def _epochguard_asyncio(bootstrap: str, topic: str, out: _Out) -> None:
    from aiokafka import TopicPartition

    from epochguard import AIOEpochConsumer

    def reported(report: Any) -> None:
        out.report(report.lost_from, str(getattr(report.detected_by, "value", "")))

    c = AIOEpochConsumer(
        bootstrap_servers=bootstrap,
        client_id=CLIENT_ID + "epochguard-asyncio",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        on_truncation_report=reported,
    )
    await c.start()
    try:
        c.assign([TopicPartition(topic, 0)])
        done = False
        while not done:
            for records in (await c.getmany(timeout_ms=100)).values():
                for r in records:
                    out.record(r.value, r.offset)
                    if r.value.decode() in (COUNT_MARK, END):
                        out.counts(r.value.decode(), _epoch_counts(c.metrics(raw=True)))
                    done = done or r.value == END.encode()
    finally:
        await c.stop()


def _kafka_python(bootstrap: str, topic: str, unclean: bool, out: _Out) -> None:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=CLIENT_ID + "kafka-python",
        # "none": kafka-python 3 raises its LogTruncationError (KIP-320) on a truncation
        auto_offset_reset="none" if unclean else "earliest",
        enable_auto_commit=False,
    )
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, 0)
    done = False
    while not done:
        try:
            batch = c.poll(timeout_ms=100)
        except Exception as exc:
            divergent = getattr(exc, "divergent_offsets", None)
            if isinstance(divergent, dict):
                for part, at in divergent.items():
                    div = None if at is None else int(at.offset)
                    out.report(div, repr(exc))
                    c.seek(part, div) if div is not None else c.seek_to_beginning(part)
            elif _truncation_like(exc):
                out.report(None, repr(exc))
                c.seek_to_beginning(tp)
            else:
                time.sleep(0.05)
            continue
        for records in batch.values():
            for r in records:
                out.record(r.value, r.offset)
                done = done or r.value == END.encode()
    c.close()


def _truncation_like(exc: BaseException) -> bool:
    name = type(exc).__name__.lower()
    return "truncat" in name or "outofrange" in name or "out of range" in str(exc).lower()


class RdkafkaStats:
    """librdkafka's statistics callbacks, each summed over the brokers into one line of
    request counts. A broker's counters start over when librdkafka drops the broker (it
    left metadata: stopped) and learns it again, which makes the sums count nothing
    reliable: each line also counts, under ``RESTARTED``, the brokers seen to start over
    so far, and a window in which that number grew is not counted."""

    def __init__(self) -> None:
        self.totals: list[dict[str, int]] = []
        self._last: dict[str, dict[str, int]] = {}

    def add(self, text: str) -> None:
        total: Counter[str] = Counter()
        now: dict[str, dict[str, int]] = {}
        for name, broker in json.loads(text).get("brokers", {}).items():
            req = {k: v for k, v in broker.get("req", {}).items() if v}
            now[name] = req
            total.update(req)
        restarted = sum(
            1
            for name, before in self._last.items()
            if name not in now or any(now[name].get(k, 0) < v for k, v in before.items())
        )
        self._last = now
        total[RESTARTED] = (self.totals[-1][RESTARTED] if self.totals else 0) + restarted
        self.totals.append(dict(total))


def _confluent(bootstrap: str, topic: str, unclean: bool, out: _Out) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    stats = RdkafkaStats()
    on_stats = stats.add

    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": CLIENT_ID + "confluent-kafka",
        "group.id": "leader-change",
        "enable.auto.commit": False,
        "statistics.interval.ms": 1000,
        "stats_cb": on_stats,
        "log_level": 0,
    }
    if unclean:
        # "error": a detected truncation is an error event instead of a silent reset
        settings["auto.offset.reset"] = "error"
    c = Consumer(settings)
    c.assign([TopicPartition(topic, 0, 0)])

    def fresh_counts(label: str) -> None:
        seen = len(stats.totals)
        deadline = time.monotonic() + 3
        while len(stats.totals) == seen and time.monotonic() < deadline:
            for m in c.consume(num_messages=100, timeout=0.1):
                if not m.error():
                    out.record(m.value(), m.offset())
        if len(stats.totals) > seen:
            out.counts(label, stats.totals[-1])

    done = False
    while not done:
        for m in c.consume(num_messages=100, timeout=0.1):
            err = m.error()
            if err is not None:
                text, name = err.str(), err.name()
                if unclean and (
                    "truncat" in text.lower()
                    or name in ("_AUTO_OFFSET_RESET", "OFFSET_OUT_OF_RANGE")
                ):
                    # The divergence is only in the text ("... broker end offset is 5").
                    found = re.search(r"broker end offset is (\d+)", text)
                    div = None if found is None else int(found.group(1))
                    out.report(div, f"{name}: {text}")
                    # librdkafka stops the partition after the error and refuses a seek in
                    # that state: assigning it again restarts it.
                    start = TopicPartition(topic, 0, OFFSET_BEGINNING if div is None else div)
                    try:
                        c.seek(start)
                    except Exception:
                        c.assign([start])
                continue
            out.record(m.value(), m.offset())
            if m.value() in (COUNT_MARK.encode(), END.encode()):
                fresh_counts(m.value().decode())
            done = done or m.value() == END.encode()
    c.close()


async def _aiokafka(bootstrap: str, topic: str, out: _Out) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=CLIENT_ID + "aiokafka",
        auto_offset_reset="earliest",  # it has no truncation signal to ask for
        enable_auto_commit=False,
    )
    await c.start()
    try:
        c.assign([TopicPartition(topic, 0)])
        done = False
        while not done:
            try:
                batch = await c.getmany(timeout_ms=100)
            except Exception as exc:
                if _truncation_like(exc):
                    out.report(None, repr(exc))
                    c.seek_to_beginning(TopicPartition(topic, 0))
                continue
            for records in batch.values():
                for r in records:
                    out.record(r.value, r.offset)
                    done = done or r.value == END.encode()
    finally:
        await c.stop()


def _java(bootstrap: str, topic: str, unclean: bool, out: _Out) -> None:
    from epochguard.testing.apache_kafka.probe import JavaTruncationProbe

    key = f"{topic}-0"
    props = {**JAVA_DEFAULTS, "client.id": CLIENT_ID + "java"}
    with (
        tempfile.TemporaryDirectory(prefix="leader-change-java-") as logs,
        JavaTruncationProbe(
            bootstrap, topic, 0, "none" if unclean else "earliest", props=props, log_dir=Path(logs)
        ) as probe,
    ):
        if unclean:
            probe.seek(0)
        done = False
        while not done:
            for e in probe.poll(100_000, 1000):
                kind = e["event"]
                if kind == "record":
                    out.record(str(e["value"]), int(e["offset"]), e["at_ms"] / 1000)
                    done = done or e["value"] == END
                elif kind == "truncation":
                    div = e["divergent_offsets"].get(key)
                    offset = None if div is None else int(div["offset"])
                    out.report(offset, str(e.get("message")), e["at_ms"] / 1000)
                    if div is None:
                        probe.seek_to_beginning()
                    else:
                        probe.seek(offset, div.get("leader_epoch"))  # type: ignore[arg-type]
                elif kind == "out_of_range":
                    out.report(None, str(e.get("message")), e["at_ms"] / 1000)
                    probe.seek_to_beginning()


def client_main(client: str, bootstrap: str, topic: str, mode: str) -> None:
    logging.disable(logging.CRITICAL)
    out = _Out()
    unclean = mode == "unclean"
    out.line(ready=time.time())
    if client == "epochguard":
        _epochguard(bootstrap, topic, out)
    elif client == "epochguard-asyncio":
        asyncio.run(_epochguard_asyncio(bootstrap, topic, out))
    elif client == "kafka-python":
        _kafka_python(bootstrap, topic, unclean, out)
    elif client == "confluent-kafka":
        _confluent(bootstrap, topic, unclean, out)
    elif client == "aiokafka":
        asyncio.run(_aiokafka(bootstrap, topic, out))
    elif client == "java":
        _java(bootstrap, topic, unclean, out)
    else:
        raise SystemExit(f"unknown client {client!r}; have: {', '.join(CLIENTS)}")


# --------------------------------------------------------------------------- harness


class Fleet:
    """The client processes of one section, and everything they printed so far."""

    def __init__(
        self, names: Sequence[str], bootstrap: str, topic: str, mode: str, log_dir: Path
    ) -> None:
        self.names = list(names)
        self.events: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        self.given_up: set[str] = set()
        self._missed_in_a_row: Counter[str] = Counter()
        self._cv = threading.Condition()
        self._procs: dict[str, subprocess.Popen[str]] = {}
        for name in names:
            err = open(log_dir / f"{topic}-{name}.log", "w")  # noqa: SIM115 - the child's
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.leader_change",
                    "--client",
                    name,
                    bootstrap,
                    topic,
                    mode,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=ROOT,
            )
            err.close()
            self._procs[name] = proc
            threading.Thread(target=self._read, args=(name, proc), daemon=True).start()

    def _read(self, name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._cv:
                self.events[name].append(event)
                self._cv.notify_all()
        with self._cv:
            self.events[name].append({"exited": proc.wait()})
            self._cv.notify_all()

    def wait(
        self,
        done: Callable[[list[dict[str, Any]]], bool],
        timeout: float = WAIT_S,
        among: Iterable[str] | None = None,
    ) -> set[str]:
        """Wait until ``done(events)`` holds for every client (of ``among``) still waited
        for; the ones it does not hold for in ``timeout`` (after ``GIVE_UP_AFTER`` in a row
        a client is not waited for again)."""
        deadline = time.monotonic() + timeout
        names = self.names if among is None else [n for n in self.names if n in set(among)]
        with self._cv:
            while True:
                late = {
                    n
                    for n in names
                    if n not in self.given_up
                    and not done(self.events[n])
                    and not any("exited" in e for e in self.events[n])
                }
                if not late or time.monotonic() >= deadline:
                    break
                self._cv.wait(max(0.0, min(0.5, deadline - time.monotonic())))
        for n in names:
            self._missed_in_a_row[n] = self._missed_in_a_row[n] + 1 if n in late else 0
            if self._missed_in_a_row[n] >= GIVE_UP_AFTER:
                self.given_up.add(n)
        return late

    def wait_for_value(self, value: str, after: float = 0.0, timeout: float = WAIT_S) -> set[str]:
        return self.wait(lambda ev: first_record(ev, value, after) is not None, timeout)

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self._cv:
            return {n: list(ev) for n, ev in self.events.items()}

    def kill(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def finish(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for proc in self._procs.values():
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def first_record(events: Iterable[dict[str, Any]], value: str, after: float = 0.0) -> float | None:
    """When the client was first handed ``value`` at or after ``after``."""
    return next((e["at"] for e in events if e.get("value") == value and e["at"] >= after), None)


def first_report(events: Iterable[dict[str, Any]], after: float) -> dict[str, Any] | None:
    return next((e for e in events if "report" in e and e["at"] >= after), None)


def counts_between(events: Sequence[dict[str, Any]], start: str, end: str) -> dict[str, int]:
    """A client's own request counts at the ``end`` line less those at the ``start`` line."""
    at = {e["label"]: e["counts"] for e in events if "counts" in e}
    if start not in at or end not in at:
        return {}
    return {k: n - at[start].get(k, 0) for k, n in at[end].items() if n - at[start].get(k, 0)}


def per_change(counts: dict[str, int], changes: int) -> dict[str, float]:
    return {k: round(n / changes, 2) for k, n in sorted(counts.items())}


def window_counts(
    trace: Sequence[dict[str, Any]], client: str, windows: Sequence[tuple[float, float]]
) -> dict[str, float]:
    """A client's requests per change from the brokers' trace, each change counted from its
    start to the client's own signal: the requests it sent in between, and the one it had
    in flight at the start (the long poll the change cuts short)."""
    cid = CLIENT_ID + client
    mine = [e for e in trace if e["client"] == cid]
    total: Counter[str] = Counter()
    for start, end in windows:
        for e in mine:
            # unanswered (the broker stopped): in flight for at most its wait
            until = e.get("answered") or e["at"] + e.get("max_wait_ms", 1000) / 1000 + 0.1
            if start <= e["at"] <= end or e["at"] < start < until:
                total[API_NAMES.get(e["api"], str(e["api"]))] += 1
    return per_change(dict(total), len(windows)) if windows else {}


def idle_baseline(starts: Sequence[float], windows: Iterable[tuple[float, float]]) -> float:
    """The idle long polls of the part of a change outside the median client's window: a
    client idle at the end of the log sends one per ``FETCH_WAIT_S``, every client alike."""
    cycles = [b - a for a, b in itertools.pairwise(starts)]
    spans = [end - start for start, end in windows]
    if not cycles or not spans:
        return 0.0
    outside = (percentile(cycles, 50) or 0) - (percentile(spans, 50) or 0)
    return round(max(0.0, outside) / FETCH_WAIT_S, 2)


def _counted(
    name: str,
    counted: dict[str, Any],
    trace: Sequence[dict[str, Any]] | None,
    windows: Sequence[tuple[float, float]],
) -> dict[str, Any]:
    """The request columns of one client: from the start of each change to its own signal
    where the brokers traced the requests, else over the whole run (its own counts)."""
    whole = counted[name]["per_change"]
    if trace is None or counted[name]["counted_by"] != "brokers":
        return {
            "requests_counted_by": counted[name]["counted_by"],
            "requests_window": "whole run",
            "requests_per_change": whole,
        }
    own = window_counts(trace, name, windows)
    if whole is not None and "leader hints used" in whole:
        own["leader hints used"] = whole["leader hints used"]
    return {
        "requests_counted_by": "brokers",
        "requests_window": "change to signal",
        "requests_per_change": own,
        "changes_counted": len(windows),
        "requests_per_change_whole_run": whole,
    }


def summary(ms: Sequence[float]) -> dict[str, Any]:
    return {
        "p50_ms": None if not ms else round(percentile(ms, 50) or 0, 1),
        "p99_ms": None if not ms else round(percentile(ms, 99) or 0, 1),
        "max_ms": None if not ms else round(max(ms), 1),
        "each_ms": [round(v, 1) for v in ms],
    }


# ------------------------------------------------------------------------ the clusters


class EmbeddedStage:
    """The schedule's operations on an EmbeddedCluster."""

    name = "embedded"
    #: What the cluster raises when it refuses an election.
    refused: type[Exception] = RuntimeError

    def __init__(self, cluster: Any) -> None:
        self.c = cluster
        self.label = "EmbeddedCluster, 3 brokers in the benchmark's process"

    @property
    def bootstrap(self) -> str:
        return str(self.c.bootstrap_servers)

    def create(self, topic: str, replication_factor: int) -> list[int]:
        self.c.create_topic(topic, replication_factor=replication_factor)
        return list(self.c.replicas(topic, 0))

    def write(self, topic: str, values: list[str], broker: int | None = None) -> int:
        return int(self.c.append(topic, 0, [v.encode() for v in values]))

    def leader(self, topic: str) -> int:
        leader = self.c.leader(topic, 0)
        assert leader is not None
        return int(leader)

    def isr(self, topic: str) -> list[int]:
        return list(self.c.isr(topic, 0))

    def wait_isr(self, topic: str, brokers: list[int], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while sorted(self.c.isr(topic, 0)) != sorted(brokers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: ISR {self.c.isr(topic, 0)}, wanted {brokers}")
            time.sleep(0.01)

    def prefer(self, topic: str, broker: int) -> None:
        """Nothing to do: the EmbeddedCluster elects any ISR replica directly."""

    def elect_and_write(
        self, topic: str, broker: int, values: list[str], unclean: bool
    ) -> tuple[float, float, int]:
        t0 = time.time()
        self.c.elect_leader(topic, 0, broker, unclean=unclean)
        offset = self.write(topic, values)
        return t0, time.time(), offset

    def stop(self, broker: int) -> None:
        self.c.stop_broker(broker)

    def start(self, broker: int) -> None:
        self.c.start_broker(broker)

    def trace(self) -> list[dict[str, Any]] | None:
        """Every request the brokers decoded so far, timestamped (see ``trace_requests``)."""
        return list(self.c.request_trace())

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (client_id, api_key), n in self.c.requests_by_client().items():
            if client_id and client_id.startswith(CLIENT_ID):
                name = client_id[len(CLIENT_ID) :]
                api = API_NAMES.get(api_key, str(api_key))
                out.setdefault(name, {})[api] = n
        return out


class ApacheStage(EmbeddedStage):
    """The schedule's operations on an ApacheKafkaCluster: records written with Produce
    requests sent straight to the leader (no client's metadata in the way)."""

    name = "apache"
    RETRIABLE = {3, 5, 6, 19, 74}  # unknown partition, no leader, not leader, not enough
    # replicas, fenced epoch: the broker has not learnt its new role yet

    def __init__(self, cluster: Any) -> None:
        from epochguard.testing.apache_kafka.cluster import ElectionError

        super().__init__(cluster)
        self.refused = ElectionError
        self._stop_writing = threading.Event()
        self.label = (
            f"Apache Kafka {cluster.kafka_version}, 3 KRaft brokers and a controller, "
            "each its own JVM"
        )

    @property
    def bootstrap(self) -> str:
        return str(self.c.all_bootstrap_servers)

    def create(self, topic: str, replication_factor: int) -> list[int]:
        replicas = list(range(replication_factor))
        self.c.create_topic(topic, assignments={0: replicas}, config={"min.insync.replicas": "1"})
        self.c.wait_for_isr(topic, 0, replicas)
        return replicas

    def write(self, topic: str, values: list[str], broker: int | None = None) -> int:
        from kafka.protocol.producer import ProduceRequest, ProduceResponse

        from epochguard.testing.apache_kafka.wire import WireError, call
        from epochguard.testing.embedded.records import build_batch

        target = self.leader(topic) if broker is None else broker
        data = ProduceRequest.TopicProduceData
        request = ProduceRequest(
            version=9,
            transactional_id=None,
            acks=-1,
            timeout_ms=10000,
            topic_data=[
                data(
                    version=9,
                    name=topic,
                    partition_data=[
                        data.PartitionProduceData(
                            version=9, index=0, records=build_batch([v.encode() for v in values])
                        )
                    ],
                )
            ],
        )
        host, port = self.c.broker_address(target).rsplit(":", 1)
        deadline = time.monotonic() + WRITE_S
        while not self._stop_writing.is_set():
            error = "unreachable"
            try:
                answer = call((host, int(port)), request, ProduceResponse, 9)
                p = answer.responses[0].partition_responses[0]
                if p.error_code == 0:
                    return int(p.base_offset)
                error = f"error {p.error_code}"
                if p.error_code not in self.RETRIABLE:
                    raise RuntimeError(f"write to broker {target}: {error}")
            except WireError:
                pass
            if time.monotonic() > deadline:
                views = {b: self.c.partition_state(topic, 0, b) for b in self.c.running_broker_ids}
                raise RuntimeError(
                    f"write of {values} to broker {target}: {error} for {WRITE_S} s; "
                    f"the brokers' views: {views}"
                )
            time.sleep(0.005)
        raise RuntimeError(f"write of {values} to broker {target}: the election was refused")

    def leader(self, topic: str) -> int:
        leader = self.c.leader(topic, 0)
        assert leader is not None
        return int(leader)

    def wait_isr(self, topic: str, brokers: list[int], timeout: float = 60.0) -> None:
        self.c.wait_for_isr(topic, 0, brokers, timeout)

    def prefer(self, topic: str, broker: int) -> None:
        self.c.prefer_replica(topic, 0, broker)

    def elect_and_write(
        self, topic: str, broker: int, values: list[str], unclean: bool
    ) -> tuple[float, float, int]:
        written: list[tuple[float, int]] = []
        failed: list[BaseException] = []

        def write() -> None:
            try:
                offset = self.write(topic, values, broker)
                written.append((time.time(), offset))
            except BaseException as exc:
                failed.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        t0 = time.time()
        writer.start()
        try:
            self.c.elect_leader(topic, 0, broker, unclean=unclean)
        except self.refused:
            # The writer keeps knocking on a broker that will not lead: wait for it to give
            # up, or the marker lands later, in the middle of the next attempt.
            self._stop_writing.set()
            writer.join()
            self._stop_writing.clear()
            raise
        writer.join()
        if failed:
            raise failed[0]
        return t0, written[0][0], written[0][1]

    def stop(self, broker: int) -> None:
        self.c.stop_broker(broker)  # controlled shutdown; returns once it is fenced

    def counts(self) -> dict[str, dict[str, int]]:
        return {}  # the brokers do not count by client; clients that count their own do

    def trace(self) -> list[dict[str, Any]] | None:
        return None


# ------------------------------------------------------------------------ the sections


@contextlib.contextmanager
def _killed_on_error(fleet: Fleet) -> Iterator[None]:
    try:
        yield
    except BaseException:
        fleet.kill()
        raise


def _own_counts_by(name: str) -> str:
    return "its statistics" if name == "confluent-kafka" else "its metrics"


def _start_fleet(stage: EmbeddedStage, topic: str, mode: str, logs: Path) -> tuple[Fleet, Any]:
    """The clients, each caught up and idle; the brokers' counts at the window's start."""
    stage.write(topic, ["start"])
    fleet = Fleet(CLIENTS, stage.bootstrap, topic, mode, logs)
    late = fleet.wait_for_value("start", timeout=120)
    if late:
        raise RuntimeError(f"{mode}: clients never read the first record: {sorted(late)}")
    time.sleep(1.0)
    stage.write(topic, [COUNT_MARK])
    fleet.wait_for_value(COUNT_MARK)
    counting = ("epochguard", "epochguard-asyncio", "confluent-kafka")
    fleet.wait(lambda ev: any(e.get("label") == COUNT_MARK for e in ev), 5, among=counting)
    return fleet, stage.counts()


def _end_fleet(
    stage: EmbeddedStage, fleet: Fleet, topic: str, before: dict[str, dict[str, int]], n: int
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Every client's events, and its requests per change over the ``n`` changes: counted
    by the brokers where they can, else by the client itself, else not at all."""
    after = stage.counts()
    stage.write(topic, [END])
    fleet.finish()
    events = fleet.snapshot()
    counted: dict[str, dict[str, Any]] = {}
    for name, ev in events.items():
        own = counts_between(ev, COUNT_MARK, END)
        if name in after:
            mine, earlier = after[name], before.get(name, {})
            diff = {k: v - earlier.get(k, 0) for k, v in mine.items() if v - earlier.get(k, 0)}
            if "leader hints used" in own:
                diff["leader hints used"] = own["leader hints used"]
            counted[name] = {"counted_by": "brokers", "per_change": per_change(diff, n)}
        elif own and min(own.values()) >= 0 and not own.get(RESTARTED):
            # (librdkafka's statistics start over when a broker restarts: then not counted)
            counted[name] = {"counted_by": _own_counts_by(name), "per_change": per_change(own, n)}
        else:
            counted[name] = {"counted_by": None, "per_change": None}
    return events, counted


def clean_section(stage: EmbeddedStage, logs: Path) -> dict[str, Any]:
    topic = f"clean-{stage.name}"
    replicas = stage.create(topic, 3)
    fleet, before = _start_fleet(stage, topic, "clean", logs)
    with _killed_on_error(fleet):
        elected = _clean_changes(stage, fleet, topic, replicas)
        events, counted = _end_fleet(stage, fleet, topic, before, CHANGES)
    trace = stage.trace()
    clients: dict[str, Any] = {}
    every_window: list[tuple[float, float]] = []
    for name, ev in events.items():
        ms, after_written = [], []
        windows: list[tuple[float, float]] = []
        for i, (t0, written) in enumerate(elected):
            at = first_record(ev, f"marker-{i}", t0)
            if at is not None:
                ms.append((at - t0) * 1000)
                after_written.append((at - written) * 1000)
                windows.append((t0, at))
        every_window += windows
        clients[name] = {
            "received": len(ms),
            "missed": CHANGES - len(ms),
            **summary(ms),
            "after_marker_written": {
                k: v for k, v in summary(after_written).items() if k != "each_ms"
            },
            **_counted(name, counted, trace, windows),
        }
    out: dict[str, Any] = {
        "changes": CHANGES,
        "marker_written": summary([(w - t0) * 1000 for t0, w in elected]),
    }
    if trace is not None:
        out["idle_long_polls_per_change"] = idle_baseline([t0 for t0, _ in elected], every_window)
        starts = [{"start": t0, "t0": t0, "written": w} for t0, w in elected]
        _keep_timeline(logs / f"{topic}-timeline.json", starts, events, trace)
    return {**out, "clients": clients}


def _clean_changes(
    stage: EmbeddedStage, fleet: Fleet, topic: str, replicas: list[int]
) -> list[tuple[float, float]]:
    """The clean changes: when each election started and when its marker was written."""
    elected: list[tuple[float, float]] = []
    for i in range(CHANGES):
        _progress(f"{stage.name} clean change {i}")
        stage.write(topic, [f"before-{i}"])
        fleet.wait_for_value(f"before-{i}")
        for attempt in range(3):
            # A loaded machine can slow a follower out of the ISR for a moment: the change
            # starts with every replica in sync, and a refused election starts it again.
            stage.wait_isr(topic, replicas)
            leader = stage.leader(topic)
            target = next(
                b for b in replicas[replicas.index(leader) + 1 :] + replicas if b != leader
            )
            stage.prefer(topic, target)
            time.sleep(0.5)  # every client idle, waiting at the end of the log
            try:
                t0, written, _ = stage.elect_and_write(
                    topic, target, [f"marker-{i}"], unclean=False
                )
                break
            except stage.refused as exc:
                _progress(f"election refused ({exc!r}); again")
                if attempt == 2:
                    raise
        elected.append((t0, written))
        fleet.wait_for_value(f"marker-{i}", after=t0)
    return elected


def _what_it_did(ev: list[dict[str, Any]], t0: float, divergence: int, last_read: int) -> str:
    """Where a client without a truncation signal read on after the election."""
    first = next((e for e in ev if "value" in e and e["at"] >= t0), None)
    if first is None:
        return "nothing read"
    offset = int(first["offset"])
    if offset > last_read:
        return "read on past the lost records (new records at their offsets skipped)"
    if offset == divergence:
        return "read on at the divergence point"
    if offset < divergence:
        return "re-read from before the divergence"
    return "re-read records at the lost records' offsets"


def unclean_section(stage: EmbeddedStage, logs: Path) -> dict[str, Any]:
    topic = f"unclean-{stage.name}"
    leader, follower = stage.create(topic, 2)
    fleet, before = _start_fleet(stage, topic, "unclean", logs)
    with _killed_on_error(fleet):
        changes = _unclean_changes(stage, fleet, topic, leader, follower)
        events, counted = _end_fleet(stage, fleet, topic, before, UNCLEAN_CHANGES)
    trace = stage.trace()
    clients: dict[str, Any] = {}
    every_window: list[tuple[float, float]] = []
    for name, ev in events.items():
        ms: list[float] = []
        right_divergence = 0
        not_detected: Counter[str] = Counter()
        windows: list[tuple[float, float]] = []
        for change in changes:
            report = first_report(ev, change["t0"])
            if report is not None:
                ms.append((report["at"] - change["t0"]) * 1000)
                right_divergence += report["report"]["divergence"] == change["divergence"]
                windows.append((change["stopped"], report["at"]))
            else:
                what = _what_it_did(ev, change["t0"], change["divergence"], change["last_read"])
                not_detected[what] += 1
                read = next((e["at"] for e in ev if "value" in e and e["at"] >= change["t0"]), None)
                if read is not None:
                    windows.append((change["stopped"], read))
        every_window += windows
        clients[name] = {
            "detected": len(ms),
            "divergence_given": right_divergence,
            "not_detected": sum(not_detected.values()),
            "when_not_detected": dict(not_detected),
            **summary(ms),
            **_counted(name, counted, trace, windows),
            "example_report": next((e["report"]["detail"] for e in ev if "report" in e), None),
        }
    out: dict[str, Any] = {
        "changes": UNCLEAN_CHANGES,
        "lost_per_change": LOST,
        "new_leader_written": summary([(c["written"] - c["t0"]) * 1000 for c in changes]),
    }
    if trace is not None:
        starts = [c["stopped"] for c in changes]
        out["idle_long_polls_per_change"] = idle_baseline(starts, every_window)
        timeline = [{"start": c["stopped"], **c} for c in changes]
        _keep_timeline(logs / f"{topic}-timeline.json", timeline, events, trace)
    return {**out, "clients": clients}


def _keep_timeline(
    path: Path,
    changes: list[dict[str, Any]],
    events: dict[str, list[dict[str, Any]]],
    trace: list[dict[str, Any]],
) -> None:
    """The section's changes, every client's printed events and the brokers' request
    trace, for ``python -m benchmarks._leader_timeline`` to take apart."""
    path.write_text(json.dumps({"changes": changes, "events": events, "trace": trace}))


def _unclean_changes(
    stage: EmbeddedStage, fleet: Fleet, topic: str, leader: int, follower: int
) -> list[dict[str, Any]]:
    """The unclean changes: when each election started and what the clients had read."""
    changes: list[dict[str, Any]] = []
    for i in range(UNCLEAN_CHANGES):
        _progress(f"{stage.name} unclean change {i}: leader {leader}, follower {follower}")
        stage.prefer(topic, follower)
        stage.stop(follower)
        stage.wait_isr(topic, [leader])
        lost = [f"lost-{i}-{j}" for j in range(LOST)]
        divergence = stage.write(topic, lost)
        fleet.wait_for_value(lost[-1])
        time.sleep(0.5)  # every client idle at the end of the log
        stopped = time.time()
        stage.stop(leader)
        stage.start(follower)
        new = [f"new-{i}-{j}" for j in range(NEW)]
        t0, written, at = stage.elect_and_write(topic, follower, new, unclean=True)
        assert at == divergence, f"the new leader wrote at {at}, not at {divergence}"
        fleet.wait(
            lambda ev, t0=t0, last=new[-1]: (
                first_report(ev, t0) is not None or first_record(ev, last, t0) is not None
            )
        )
        changes.append(
            {
                "stopped": stopped,
                "t0": t0,
                "written": written,
                "divergence": divergence,
                "last_read": divergence + LOST - 1,
            }
        )
        stage.start(leader)
        stage.wait_isr(topic, [leader, follower])
        leader, follower = follower, leader
    return changes


def _progress(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _run_cluster(stage: EmbeddedStage, logs: Path) -> dict[str, Any]:
    load_before = _load()
    out: dict[str, Any] = {
        "cluster": stage.label,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_before": load_before,
    }
    out["clean"] = clean_section(stage, logs)
    out["load_avg_after_clean"] = _load()
    out["unclean"] = unclean_section(stage, logs)
    out["load_avg_after"] = _load()
    print(json.dumps({stage.name: out}), flush=True)
    return out


def run() -> dict[str, Any]:
    from epochguard.testing import EmbeddedCluster

    logging.disable(logging.CRITICAL)
    result: dict[str, Any] = {
        "method": __doc__,
        "clients": CLIENTS,
        "load_avg_before": _load(),
        "clusters": {},
    }
    logs = LOGS / time.strftime("%Y%m%dT%H%M%S")
    logs.mkdir(parents=True)
    if "embedded" in CLUSTERS:
        with EmbeddedCluster(brokers=3) as cluster:
            cluster.trace_requests()
            result["clusters"]["embedded"] = _run_cluster(EmbeddedStage(cluster), logs)
    if "apache" in CLUSTERS:
        from epochguard.testing.apache_kafka import ApacheKafkaCluster

        with ApacheKafkaCluster(brokers=3) as kafka:
            result["clusters"]["apache"] = _run_cluster(ApacheStage(kafka), logs)
    result["load_avg_after"] = _load()
    sections = {**_earlier_sections(), **result["clusters"]}
    # in a fixed order, whichever ran now: the docs' tables list the clusters in it
    result["clusters"] = {n: sections[n] for n in ("embedded", "apache") if n in sections}
    return result


def _earlier_sections() -> dict[str, Any]:
    """The sections of the clusters this run left out (``LEADER_CLUSTERS``), from the
    current result file: one file holds both clusters, each section says when it ran."""
    try:
        earlier = json.loads((ROOT / "benchmarks" / "results" / "leader_change.json").read_text())
    except (OSError, ValueError):
        return {}
    sections = earlier.get("result", {}).get("clusters", {})
    return {
        name: sections[name]
        for name in ("embedded", "apache")
        if name not in CLUSTERS and name in sections and "started_at" in sections[name]
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(*sys.argv[2:6])
    else:
        print(json.dumps(run(), indent=2))
