"""Chaos schedules on brokers with Raft-term epochs (``EmbeddedCluster(epochs="raft")``,
Redpanda's rules), judged by the same oracle.

The first 30 schedules of the CI set (seeds 0..29) and the seeds that once failed there,
each on its own Raft-term cluster: a
``StopBroker`` is a power cut that loses unflushed acks=1 records, and an unclean ``Elect``
(refused by Raft) becomes the Raft way to lose records: every running replica but the
lagging one loses power. Topic re-creation is not staged (Fetch v11 names topics: the
consumer guide's Fetch-by-name limit). Larger runs: ``make chaos CHAOS_ARGS=--raft
SEEDS=N``; figures in docs/reliability.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest

from epochguard.testing.chaos import RunResult, generate, run_schedule
from epochguard.testing.chaos.runner import run_many
from epochguard.testing.chaos.shrink import shrink

from .late import settled

pytestmark = [pytest.mark.independent, pytest.mark.slow, pytest.mark.timeout(300)]

WORKERS = 6
#: Seeds whose schedules once failed on Raft-term brokers (docs/reliability.md, "On Raft-term
#: brokers"); each also has a regression test of its cause.
REGRESSIONS = (189, 201, 333, 739, 888)
SEEDS = (*range(30), *REGRESSIONS)


def _fail_with_replay(results: Iterable[RunResult]) -> None:
    bad = sorted((r for r in results if not r.ok), key=lambda r: r.schedule.seed)
    if not bad:
        return
    first = bad[0]
    small, runs = shrink(
        first.schedule,
        lambda s: not run_schedule(s, epochs="raft").verdict.ok,
        max_runs=40,
    )
    pytest.fail(
        f"{len(bad)} schedule(s) failed on Raft-term brokers (seeds "
        f"{[r.schedule.seed for r in bad]}); the first:\n{first.describe()}\n"
        f"shrunk in {runs} runs to {len(small.steps)} steps, replay with "
        f"run_schedule(..., epochs='raft'):\n{small.to_code()}",
        pytrace=False,
    )


def _skipped_terms(result: RunResult) -> bool:
    """Whether a leader's log held records of two terms with an unused number between."""
    for snapshot in result.history.snapshots:
        for log in snapshot.values():
            if log is None:
                continue
            epochs = sorted({epoch for epoch, _value in log.records.values()})
            if any(b - a > 1 for a, b in itertools.pairwise(epochs)):
                return True
    return False


def test_chaos_schedules_on_raft_term_brokers() -> None:
    results = settled(run_many(map(generate, SEEDS), workers=WORKERS, epochs="raft"), epochs="raft")
    assert len(results) == len(SEEDS)
    _fail_with_replay(results)
    assert all(r.verdict.delivered > 0 for r in results)
    # The set stages the Raft shapes, not only passes: records lost with a majority's power,
    # reported, and logs whose terms skip numbers.
    assert sum("lost power" in line for r in results for line in r.step_log) >= 5
    assert sum(r.verdict.reports for r in results) >= 5
    assert sum(_skipped_terms(r) for r in results) >= 5


def test_the_adapter_logs_a_polls_records_before_the_report_its_position_lookup_brings() -> None:
    """Raft chaos seed 189: ``poll()`` returned records, and the position lookup right after
    it finished a validation that reported them lost. The adapter logged the report before
    the records (they looked re-read without a report) and committed past the divergence."""
    from collections import namedtuple

    from kafka.structs import TopicPartition

    from epochguard.offsets.position import EpochOffset
    from epochguard.offsets.report import DetectedBy, TruncationReport
    from epochguard.testing.chaos.clients import (
        _EpochConsumerClient,
        _HangingAborts,
        _KafkaPythonLike,
    )
    from epochguard.testing.chaos.oracle import Committed, Delivered, Reported
    from epochguard.testing.chaos.runner import MemberContext

    tp = TopicPartition("t", 0)
    Record = namedtuple("Record", "offset value leader_epoch")
    events: list[object] = []
    commits: list[dict[TopicPartition, EpochOffset]] = []
    adapter = object.__new__(_EpochConsumerClient)

    class Consumer:
        def poll(self, timeout_ms: int) -> dict[TopicPartition, list[Record]]:
            return {tp: [Record(0, b"old-0", 1), Record(1, b"old-1", 1)]}

        def position_with_epoch(self, tp_: TopicPartition, timeout_ms: int) -> EpochOffset:
            lost = TruncationReport(
                tp, EpochOffset(2, 1), EpochOffset(0, None), DetectedBy.METADATA, 5, None
            )
            adapter._report(lost)  # the callback, run by the validation this lookup finished
            return EpochOffset(0, None)

        def commit(self, offsets: dict[TopicPartition, EpochOffset]) -> None:
            commits.append(offsets)

    ctx = MemberContext("", "t", 1, "rewind", 0, "g", None, False, events.append)
    _KafkaPythonLike.__init__(adapter, ctx)
    adapter.positions, adapter.unannounced, adapter.store = {}, set(), None
    adapter.hanging = _HangingAborts(ctx)
    adapter.consumer = Consumer()
    adapter._announce = lambda: None  # type: ignore[method-assign]
    adapter.poll_once()
    kinds = [type(e) for e in events]
    assert kinds == [Delivered, Delivered, Reported, Committed], kinds
    assert commits == [{tp: EpochOffset(0, None)}]  # the divergence, not past it
