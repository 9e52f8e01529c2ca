"""Batch planning: Spark's rateLimit, delayBatch and KafkaOffsetRangeCalculator arithmetic."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from epochguard.offsets import EpochOffset
from epochguard.spark_connector.planning import (
    MinOffsetsGate,
    OffsetRange,
    plan_end_offsets,
    rate_limit,
    split_ranges,
)

A0, A1, A2, B0 = (
    TopicPartition("a", 0),
    TopicPartition("a", 1),
    TopicPartition("a", 2),
    TopicPartition("b", 0),
)


# ---------------------------------------------------------------- rate_limit


def test_rate_limit_shares_by_backlog() -> None:
    # backlogs 100, 300, 0: 40 records split 10 / 30, the idle partition stays at latest
    out = rate_limit(40, {A0: 0, A1: 100, A2: 7}, {A0: 100, A1: 400, A2: 7})
    assert out == {A0: 10, A1: 130, A2: 7}


def test_rate_limit_never_starves_a_small_partition() -> None:
    # 10 * 1/1001 < 1 rounds up to one record; the big one floors 9.99 to 9
    out = rate_limit(10, {A0: 0, A1: 0}, {A0: 1, A1: 1000})
    assert out == {A0: 1, A1: 9}


def test_rate_limit_new_partition_starts_at_its_earliest() -> None:
    out = rate_limit(10, {A0: 0}, {A0: 10, A1: 20}, earliest_of_new={A1: 10})
    assert out == {A0: 5, A1: 15}


def test_rate_limit_with_nothing_to_read_returns_latest() -> None:
    assert rate_limit(5, {A0: 3}, {A0: 3, A1: 9}) == {A0: 3, A1: 9}


def test_rate_limit_rejects_a_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        rate_limit(0, {A0: 0}, {A0: 1})


tp_strategy = st.sampled_from([A0, A1, A2, B0])
backlogs = st.dictionaries(
    tp_strategy, st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1
)


@given(st.integers(1, 10**7), backlogs)
def test_rate_limit_properties(limit: int, spans: dict[TopicPartition, tuple[int, int]]) -> None:
    start = {tp: s for tp, (s, _) in spans.items()}
    latest = {tp: s + n for tp, (s, n) in spans.items()}
    out = rate_limit(limit, start, latest)
    assert set(out) == set(latest)
    for tp, end in out.items():
        assert start[tp] <= end <= latest[tp]  # never back, never past the latest offset
        if latest[tp] > start[tp]:
            assert end > start[tp]  # a partition with a backlog always moves
    taken = sum(out[tp] - start[tp] for tp in out)
    backlog = sum(latest[tp] - start[tp] for tp in out)
    total = float(backlog)
    bumped = sum(
        1 for tp in out if latest[tp] > start[tp] and limit * ((latest[tp] - start[tp]) / total) < 1
    )
    # At most the limit, plus one per partition whose share was rounded up from below one.
    assert taken <= limit + bumped
    if limit >= backlog:
        assert out == latest


# ---------------------------------------------------------------- the min-offsets gate


class Clock:
    def __init__(self, now: float = 10_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_gate_first_batch_is_never_delayed() -> None:
    gate = MinOffsetsGate(min_rows=100, max_delay_ms=60_000, clock=Clock())
    assert not gate.should_delay({A0: 0}, {A0: 1})


# (time advanced since last trigger ms, records waiting, delayed?)
GATE_TABLE = [
    (0, 0, True),
    (1000, 99, True),
    (1000, 100, False),  # enough records: trigger
    (59_999, 5, True),
    (60_000, 5, False),  # the delay has passed: trigger with what there is
    (60_000, 0, False),
]


@pytest.mark.parametrize(("elapsed", "waiting", "delayed"), GATE_TABLE)
def test_gate_table(elapsed: int, waiting: int, delayed: bool) -> None:
    clock = Clock()
    gate = MinOffsetsGate(min_rows=100, max_delay_ms=60_000, clock=clock)
    assert not gate.should_delay({A0: 0}, {A0: 0})  # the first batch sets the trigger time
    clock.now += elapsed
    assert gate.should_delay({A0: 50, A1: 0}, {A0: 50 + waiting, A1: 0}) is delayed
    # A batch that ran resets the delay; one held back does not.
    assert gate.last_trigger_ms == (clock.now - elapsed if delayed else clock.now)


def test_plan_end_offsets_priorities() -> None:
    clock = Clock()
    start, latest = {A0: 0, A1: 0}, {A0: 10, A1: 30}
    gate = MinOffsetsGate(min_rows=1000, max_delay_ms=60_000, clock=clock)
    assert plan_end_offsets(start, latest, read_all=False, gate=gate) == latest  # first batch
    # held back: the end is the start (Spark then runs no batch)
    assert plan_end_offsets(start, latest, read_all=False, max_rows=8, gate=gate) == start
    # ReadAllAvailable wins over both limits
    assert plan_end_offsets(start, latest, read_all=True, max_rows=8, gate=gate) == latest
    clock.now += 60_000
    assert plan_end_offsets(start, latest, read_all=False, max_rows=8, gate=gate) == {
        A0: 2,
        A1: 6,
    }
    assert plan_end_offsets(start, latest, read_all=False) == latest


# ---------------------------------------------------------------- split_ranges


def rng(tp: TopicPartition, start: int, end: int, epoch: int | None = 4) -> OffsetRange:
    return OffsetRange(tp, EpochOffset(start, 2), EpochOffset(end, epoch))


def bounds(ranges: list[OffsetRange]) -> list[tuple[str, int, int]]:
    return [(f"{r.tp.topic}-{r.tp.partition}", r.start.offset, r.end.offset) for r in ranges]


def test_no_split_without_options_and_empty_ranges_dropped() -> None:
    out = split_ranges([rng(A0, 1, 2), rng(A1, 5, 5), rng(B0, 1, 3)])
    assert bounds(out) == [("a-0", 1, 2), ("b-0", 1, 3)]


def test_min_partitions_one_partition_into_four() -> None:
    assert bounds(split_ranges([rng(A0, 1, 17)], min_partitions=4)) == [
        ("a-0", 1, 5),
        ("a-0", 5, 9),
        ("a-0", 9, 13),
        ("a-0", 13, 17),
    ]


def test_min_partitions_inexact_multiple_puts_the_remainder_last() -> None:
    assert bounds(split_ranges([rng(A0, 1, 11)], min_partitions=3)) == [
        ("a-0", 1, 4),
        ("a-0", 4, 7),
        ("a-0", 7, 11),
    ]


def test_min_partitions_skewed_small_range_stays_whole() -> None:
    # Spark's suite: the small range gets one part and the rest is split over the big one.
    out = split_ranges([rng(A0, 1, 5), rng(A1, 1, 21)], min_partitions=3)
    assert bounds(out) == [("a-0", 1, 5), ("a-1", 1, 11), ("a-1", 11, 21)]


def test_enough_partitions_no_split() -> None:
    out = split_ranges([rng(A0, 1, 100), rng(A1, 1, 2)], min_partitions=2)
    assert bounds(out) == [("a-0", 1, 100), ("a-1", 1, 2)]


def test_max_records_per_partition() -> None:
    out = split_ranges([rng(A0, 0, 10), rng(A1, 0, 3)], max_records_per_partition=4)
    assert bounds(out) == [("a-0", 0, 3), ("a-0", 3, 6), ("a-0", 6, 10), ("a-1", 0, 3)]


def test_pieces_carry_positions() -> None:
    out = split_ranges([rng(A0, 0, 10, epoch=7)], min_partitions=2)
    assert out[0].start == EpochOffset(0, 2)  # the checkpointed start, as planned
    # inner boundary: the end's epoch bounds every record before it
    assert out[0].end == EpochOffset(5, 7) and out[1].start == EpochOffset(5, 7)
    assert out[1].end == EpochOffset(10, 7)


def test_bad_split_arguments() -> None:
    with pytest.raises(ValueError, match="min_partitions"):
        split_ranges([], min_partitions=0)
    with pytest.raises(ValueError, match="max_records_per_partition"):
        split_ranges([], max_records_per_partition=0)
    with pytest.raises(ValueError, match="before its start"):
        rng(A0, 5, 4)


range_lists = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 5000), st.none() | st.integers(0, 50)),
    min_size=1,
    max_size=4,
).map(
    lambda spans: [
        OffsetRange(TopicPartition("t", i), EpochOffset(s, None), EpochOffset(s + n, e))
        for i, (s, n, e) in enumerate(spans)
    ]
)


@given(range_lists, st.none() | st.integers(1, 64), st.none() | st.integers(1, 3000))
def test_split_covers_each_range_exactly(
    ranges: list[OffsetRange], min_parts: int | None, max_records: int | None
) -> None:
    out = split_ranges(ranges, min_partitions=min_parts, max_records_per_partition=max_records)
    for r in ranges:
        pieces = [p for p in out if p.tp == r.tp]
        if r.size == 0:
            assert pieces == []
            continue
        # consecutive, no gap, no overlap, from the planned start to the planned end
        assert pieces[0].start == r.start
        assert pieces[-1].end == r.end
        for a, b in itertools.pairwise(pieces):
            assert a.end.offset == b.start.offset
        assert all(p.size > 0 for p in pieces)
        assert sum(p.size for p in pieces) == r.size
        assert all(p.end.leader_epoch == r.end.leader_epoch for p in pieces)
        if max_records is not None and min_parts is None:
            assert all(p.size <= max_records for p in pieces)
    nonempty = [r for r in ranges if r.size > 0]
    assert len(out) >= len(nonempty)
    if max_records is not None:
        assert all(p.size <= max_records for p in out)


@given(st.integers(1, 10**6), st.integers(1, 64))
def test_one_range_splits_into_min_partitions_when_big_enough(size: int, parts: int) -> None:
    assume(size >= parts)
    out = split_ranges([OffsetRange(A0, EpochOffset(0), EpochOffset(size))], min_partitions=parts)
    assert len(out) == parts
    assert max(p.size for p in out) - min(p.size for p in out) <= 1
