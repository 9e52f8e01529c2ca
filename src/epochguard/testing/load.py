"""Load harness: many partitions, unclean elections on a subset, and an application-side
ledger that checks every truncation was reported and nothing was lost or read twice.

Used by tests/consumer/test_load.py (small sizes, in ``make test``), tests/apache_kafka
(real Kafka) and benchmarks/load.py / benchmarks/soak.py (full sizes).

An unclean election here does not stop brokers, so the other partitions keep flowing:
``follower`` stops replicating (it leaves every ISR it is in), the leaders of the chosen
partitions take ``doomed`` records that only they hold, the consumers read them, then
``follower`` is elected uncleanly for those partitions (its log ends before the doomed
records), takes ``fresh`` records at the same offsets, and replicates again (the old leaders
truncate). Every consumer must report each of those truncations with the exact divergence
point; what the application holds at the end, with every report applied, must equal the
final log record for record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
from kafka.structs import TopicPartition

from epochguard.offsets.report import TruncationReport
from epochguard.testing.embedded.cluster import EmbeddedCluster

__all__ = [
    "Election",
    "Ledger",
    "LedgerPoller",
    "final_logs",
    "pick_unclean_subset",
    "produce_round",
    "unclean_round",
]


@attrs.frozen
class Election:
    """One staged unclean election: ``tp`` diverged at offset ``divergence`` (the first
    doomed record), after the consumer had read up to ``consumed_to`` (exclusive)."""

    tp: TopicPartition
    at: float  # time.monotonic() just after the election
    divergence: int
    consumed_to: int


@attrs.define
class Ledger:
    """What an application on policy ``rewind`` holds: per partition, the values it was
    given from offset 0 on, with each truncation report applied when it arrives (the
    records from the divergence point on are dropped, as the application would undo them).

    A record that does not continue its partition exactly (a gap: records skipped; an
    offset already held with no report first: a silent re-read) is a violation.

    ``window``: keep only about the last ``window`` values per partition (long runs); older
    ones are counted, and a report reaching below the window is a violation."""

    window: int | None = None
    held: dict[TopicPartition, list[bytes]] = attrs.field(factory=dict)
    #: offset of ``held[tp][0]``
    base: dict[TopicPartition, int] = attrs.field(factory=dict)
    #: (partition, divergence offset, records lost, time.monotonic() of the report)
    reports: list[tuple[TopicPartition, int | None, int, float]] = attrs.field(factory=list)
    violations: list[str] = attrs.field(factory=list)
    records: int = 0
    #: Consumers polled in several threads share one ledger.
    lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)

    def on_report(self, report: TruncationReport) -> None:
        with self.lock:
            self._on_report(report)

    def _on_report(self, report: TruncationReport) -> None:
        tp = TopicPartition(report.tp.topic, report.tp.partition)
        div = report.divergence.offset if report.divergence is not None else None
        self.reports.append((tp, div, report.lost_count or 0, time.monotonic()))
        held = self.held.setdefault(tp, [])
        base = self.base.get(tp, 0)
        if div is None:
            self.violations.append(f"{tp}: truncation reported without a divergence point")
            return
        if div < base:
            self.violations.append(f"{tp}: truncation at {div}, below the kept window ({base})")
            return
        del held[div - base :]

    def add(self, batch: Mapping[TopicPartition, Sequence[object]]) -> int:
        """Apply one ``poll()`` result; returns the number of records."""
        if not batch:
            return 0
        with self.lock:
            return self._add(batch)

    def _add(self, batch: Mapping[TopicPartition, Sequence[object]]) -> int:
        n = 0
        window = self.window
        for tp, records in batch.items():
            held = self.held.setdefault(tp, [])
            base = self.base.get(tp, 0)
            for r in records:
                offset: int = r.offset  # type: ignore[attr-defined]
                expected = base + len(held)
                if offset != expected:
                    kind = "gap" if offset > expected else "re-read without a report"
                    self.violations.append(
                        f"{tp}: record at {offset}, expected {expected} ({kind})"
                    )
                    if offset > expected:
                        held.extend([b""] * (offset - expected))
                    else:
                        del held[max(0, offset - base) :]
                held.append(r.value)  # type: ignore[attr-defined]
                n += 1
            if window is not None and len(held) > 2 * window:
                drop = len(held) - window
                del held[:drop]
                self.base[tp] = base + drop
        self.records += n
        return n

    def position(self, tp: TopicPartition) -> int:
        return self.base.get(tp, 0) + len(self.held.get(tp, ()))

    def mismatches(self, final: Mapping[TopicPartition, Sequence[bytes | None]]) -> list[str]:
        """Partitions whose held values differ from ``final`` (the final log's values from
        offset 0; with a window, only the kept part is compared, and the count)."""
        out = []
        for tp, values in final.items():
            held = self.held.get(tp, [])
            base = self.base.get(tp, 0)
            log = list(values[base:])
            if held != log or base + len(held) != len(values):
                first = next(
                    (i for i, (a, b) in enumerate(zip(held, log, strict=False)) if a != b),
                    min(len(held), len(log)),
                )
                out.append(
                    f"{tp}: holds {base + len(held)} records, log has {len(values)}; "
                    f"first difference at {base + first}"
                )
        return out

    def missed(self, elections: Iterable[Election]) -> list[Election]:
        """Elections with no report for their partition at their divergence point."""
        seen = {(tp, div) for tp, div, _lost, _at in self.reports}
        return [e for e in elections if (e.tp, e.divergence) not in seen]

    def latencies(self, elections: Iterable[Election]) -> list[float]:
        """Seconds from each election to the first report of it."""
        out = []
        for e in elections:
            times = [at for tp, div, _l, at in self.reports if tp == e.tp and div == e.divergence]
            if times:
                out.append(min(times) - e.at)
        return out


class LedgerPoller(threading.Thread):
    """Polls one consumer into a (shared) ledger in its own thread: a group's joins block
    until every member joins, so each member needs its own thread. ``error`` holds what
    ``poll()`` raised, if anything; :meth:`halt` stops and joins the thread."""

    def __init__(self, consumer: Any, ledger: Ledger, max_records: int = 5000) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.ledger = ledger
        self.max_records = max_records
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.ledger.add(self.consumer.poll(timeout_ms=50, max_records=self.max_records))
        except BaseException as exc:
            self.error = exc

    def halt(self, timeout: float = 30.0) -> None:
        self.stop.set()
        if self.is_alive():
            self.join(timeout)


def produce_round(
    cluster: EmbeddedCluster, topic: str, partitions: Iterable[int], count: int, tag: str
) -> dict[int, int]:
    """Append ``count`` records (one batch) to each partition; returns each new log end."""
    ends = {}
    for p in partitions:
        values = [b"%s-%d-%d" % (tag.encode(), p, i) for i in range(count)]
        ends[p] = cluster.append(topic, p, values) + count
    return ends


def pick_unclean_subset(
    cluster: EmbeddedCluster, topic: str, partitions: int, follower: int, size: int, start: int = 0
) -> list[int]:
    """``size`` partitions (from ``start`` on, wrapping) that ``follower`` replicates but
    does not lead: the ones an election of ``follower`` can truncate."""
    out: list[int] = []
    for i in range(partitions):
        p = (start + i) % partitions
        leader = cluster.leader(topic, p)
        if leader is not None and leader != follower and follower in cluster.replicas(topic, p):
            out.append(p)
            if len(out) == size:
                break
    return out


def unclean_round(
    cluster: EmbeddedCluster,
    topic: str,
    subset: Sequence[int],
    follower: int,
    wait_consumed: Callable[[Mapping[int, int]], None],
    *,
    doomed: int = 3,
    fresh: int = 5,
    tag: str = "x",
) -> list[Election]:
    """Stage one unclean election of ``follower`` on each partition of ``subset`` (see the
    module docstring). ``wait_consumed({partition: log end})`` returns once the consumers
    have read the doomed records. Returns the elections, timed just after each."""
    cluster.pause_replication(follower)
    ends: dict[int, int] = {}
    firsts: dict[int, int] = {}
    try:
        for p in subset:
            values = [b"%s-doomed-%d-%d" % (tag.encode(), p, i) for i in range(doomed)]
            firsts[p] = cluster.append(topic, p, values)
            ends[p] = firsts[p] + doomed
        wait_consumed(ends)
        elections = []
        for p in subset:
            cluster.elect_leader(topic, p, follower, unclean=True)
            elections.append(
                Election(TopicPartition(topic, p), time.monotonic(), firsts[p], ends[p])
            )
            values = [b"%s-fresh-%d-%d" % (tag.encode(), p, i) for i in range(fresh)]
            cluster.append(topic, p, values)
    finally:
        cluster.resume_replication(follower)
    return elections


def final_logs(
    cluster: EmbeddedCluster, topic: str, partitions: Iterable[int]
) -> dict[TopicPartition, list[bytes | None]]:
    """Every partition's values on its leader, indexed by offset (``None`` below the log
    start, for records that retention removed)."""
    out = {}
    for p in partitions:
        values: list[bytes | None] = []
        for offset, _key, value in cluster.read_records(topic, p):
            if offset > len(values):
                values.extend([None] * (offset - len(values)))
            values.append(value)
        out[TopicPartition(topic, p)] = values
    return out
