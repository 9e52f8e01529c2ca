"""Filter pushdown without Spark: the sans-IO bounds, Spark's filters as comparisons, and
the ranges a batch reader plans on an EmbeddedCluster.

The property: what the narrowed ranges hold, with the filters pushdown hands back applied
after (as Spark applies them), is exactly what the whole planned range holds with every
filter applied, for any log whose timestamps go back and forth.
"""

from __future__ import annotations

import datetime
import operator
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from epochguard.offsets import EpochOffset
from epochguard.spark_connector import datasource
from epochguard.spark_connector.errors import SourceOptionError
from epochguard.spark_connector.options import parse_options
from epochguard.spark_connector.pushdown import Comparison, ReadBounds, push
from epochguard.testing import EmbeddedCluster
from tests.examples import scaled

UTC = datetime.UTC


def micros(ms: int) -> int:
    return ms * 1000


# ---------------------------------------------------------------- the bounds, sans-IO


def test_partition_and_offset_comparisons_are_exact_and_intersect() -> None:
    comps = [
        Comparison("partition", "in", (0, 2, 5)),
        Comparison("partition", "=", 2),
        Comparison("offset", ">=", 10),
        Comparison("offset", ">", 11),
        Comparison("offset", "<=", 30),
        Comparison("offset", "<", 40),
    ]
    bounds, left = push(comps)
    assert bounds == ReadBounds(partitions=frozenset({2}), offset_from=12, offset_until=31)
    assert left == []


def test_offset_in_narrows_to_its_span_and_goes_back_to_spark() -> None:
    bounds, left = push([Comparison("offset", "in", (7, 3, 9))])
    assert (bounds.offset_from, bounds.offset_until) == (3, 10)
    assert left == [0]
    bounds, left = push([Comparison("offset", "in", (4, 4))])
    assert (bounds.offset_from, bounds.offset_until, left) == (4, 5, [])


@pytest.mark.parametrize(
    ("op", "value_us", "from_ms"),
    [
        (">=", micros(1500), 1500),
        (">=", micros(1500) + 1, 1501),  # no whole millisecond at 1500.001
        (">", micros(1500), 1501),
        (">", micros(1500) - 1, 1500),
        ("=", micros(1500) + 999, 1501),
    ],
)
def test_timestamp_lower_bounds_in_whole_milliseconds(op: Any, value_us: int, from_ms: int) -> None:
    bounds, left = push([Comparison("timestamp", op, value_us)])
    assert bounds.timestamp_from_ms == from_ms
    assert left == [0]  # a later offset may hold an earlier time: Spark filters


def test_what_cannot_narrow_goes_back_to_spark_untouched() -> None:
    comps: list[Comparison | None] = [
        None,
        Comparison("timestamp", "<", micros(5000)),
        Comparison("timestamp", "<=", micros(5000)),
        Comparison("timestamp", ">=", 0),  # at or before the epoch: nothing to skip
        Comparison("partition", ">", 1),
        Comparison("offset", "in", ()),
    ]
    bounds, left = push(comps)
    assert bounds == ReadBounds()
    assert left == list(range(len(comps)))


def test_empty_bounds() -> None:
    assert push([Comparison("offset", "<", 0)])[0].empty
    assert push([Comparison("offset", ">", 9), Comparison("offset", "<", 10)])[0].empty
    assert push([Comparison("partition", "=", 1), Comparison("partition", "=", 2)])[0].empty
    assert not push([Comparison("offset", ">", 9), Comparison("offset", "<", 11)])[0].empty


def test_narrow_keeps_the_planned_positions_where_it_can() -> None:
    start, end = EpochOffset(5, 2, topic_id="x"), EpochOffset(50, 4, topic_id="x")
    assert ReadBounds().narrow(start, end) == (start, end)
    cut = ReadBounds(offset_from=10, offset_until=20).narrow(start, end)
    # Moved ends take the planned end's epoch: it bounds every record before it.
    assert cut == (EpochOffset(10, 4, topic_id="x"), EpochOffset(20, 4, topic_id="x"))
    found = EpochOffset(30, 3)
    bounds = ReadBounds(timestamp_from_ms=1, offset_from=10)
    assert bounds.narrow(start, end, found) == (found, end)  # the epoch of the record found
    assert ReadBounds(offset_from=60).narrow(start, end) is None
    assert ReadBounds(offset_until=5).narrow(start, end) is None
    assert bounds.narrow(start, end, EpochOffset(50, 4)) is None  # nothing that late


# ---------------------------------------------------------------- the property

_OPS: dict[str, Callable[[int, int], bool]] = {
    "=": operator.eq,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}

Row = tuple[int, int, int]  # partition, offset, timestamp in ms


def holds(c: Comparison, row: Row) -> bool:
    partition, offset, ts_ms = row
    field = {"partition": partition, "offset": offset, "timestamp": micros(ts_ms)}[c.column]
    if c.op == "in":
        assert isinstance(c.value, tuple)
        return field in c.value
    assert isinstance(c.value, int)
    return _OPS[c.op](field, c.value)


def _values(column: str) -> st.SearchStrategy[int]:
    if column == "partition":
        return st.integers(-1, 3)
    if column == "offset":
        return st.integers(-2, 45)
    # Around the log's few times (1000..1004 ms, so that many records share one), whole
    # milliseconds and not; and near 0.
    near = st.builds(
        lambda ms, us: micros(ms) + us, st.integers(999, 1005), st.sampled_from([0, 0, 1, 999])
    )
    return near | st.integers(-2000, 2000)


@st.composite
def comparisons(draw: st.DrawFn) -> Comparison:
    column = draw(st.sampled_from(["partition", "offset", "timestamp"]))
    op = draw(st.sampled_from(["=", "in", ">", ">=", "<", "<="]))
    if op == "in":
        return Comparison(column, op, tuple(draw(st.lists(_values(column), max_size=4))))
    return Comparison(column, op, draw(_values(column)))


@st.composite
def logs(draw: st.DrawFn) -> dict[int, list[tuple[int, int]]]:
    """Per partition, (offset, ms) of its records: times out of order, offsets with gaps
    (compaction, transaction markers), a log start above 0."""
    out: dict[int, list[tuple[int, int]]] = {}
    for p in range(draw(st.integers(1, 3))):
        offset = draw(st.integers(0, 5))
        records = []
        for _ in range(draw(st.integers(0, 30))):
            records.append((offset, draw(st.integers(1000, 1004))))
            offset += draw(st.sampled_from([1, 1, 1, 2]))
        out[p] = records
    return out


def first_at_or_after(records: Sequence[tuple[int, int]], ms: int, log_end: int) -> int:
    """ListOffsets by time: the first offset whose record is at or after ``ms``."""
    return next((o for o, t in records if t >= ms), log_end)


@settings(max_examples=scaled(1000), deadline=None)
@given(log=logs(), comps=st.lists(comparisons(), max_size=5), data=st.data())
def test_narrowed_ranges_plus_spark_filters_equal_the_filtered_whole(
    log: dict[int, list[tuple[int, int]]], comps: list[Comparison], data: st.DataObject
) -> None:
    bounds, left = push(comps)
    expected: set[Row] = set()
    got: set[Row] = set()
    for p, records in log.items():
        log_start = records[0][0] if records else 0
        log_end = records[-1][0] + 1 if records else log_start
        s = data.draw(st.integers(log_start, log_end))
        e = data.draw(st.integers(s, log_end))
        planned = [(p, o, t) for o, t in records if s <= o < e]
        expected |= {r for r in planned if all(holds(c, r) for c in comps)}
        if not bounds.allows_partition(p):
            continue
        first = None
        if bounds.timestamp_from_ms is not None:
            at = first_at_or_after(records, bounds.timestamp_from_ms, log_end)
            first = EpochOffset(at, 0)
        cut = bounds.narrow(EpochOffset(s, 0), EpochOffset(e, 0), first)
        if cut is None:
            continue
        lo, hi = cut[0].offset, cut[1].offset
        assert s <= lo < hi <= e
        got |= {r for r in planned if lo <= r[1] < hi and all(holds(comps[i], r) for i in left)}
    assert got == expected


# ---------------------------------------------------------------- Spark's filters

_T = datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
_T_US = (_T - datetime.datetime(1970, 1, 1, tzinfo=UTC)) // datetime.timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (EqualTo(("partition",), 3), Comparison("partition", "=", 3)),
        (EqualNullSafe(("partition",), 3), Comparison("partition", "=", 3)),
        (In(("partition",), (1, 2)), Comparison("partition", "in", (1, 2))),
        (GreaterThan(("offset",), 7), Comparison("offset", ">", 7)),
        (GreaterThanOrEqual(("offset",), 7), Comparison("offset", ">=", 7)),
        (LessThan(("offset",), 7), Comparison("offset", "<", 7)),
        (LessThanOrEqual(("offset",), 7), Comparison("offset", "<=", 7)),
        (GreaterThanOrEqual(("timestamp",), _T), Comparison("timestamp", ">=", _T_US)),
        (
            GreaterThan(
                ("timestamp",), _T.astimezone(datetime.timezone(datetime.timedelta(hours=5)))
            ),
            Comparison("timestamp", ">", _T_US),
        ),
        # Not one the source narrows by: Spark applies it.
        (GreaterThan(("timestamp",), _T.replace(tzinfo=None)), None),
        (EqualTo(("partition",), True), None),
        (EqualTo(("partition",), None), None),
        (EqualTo(("offset",), 1.5), None),
        (In(("partition",), (1, "2")), None),
        (EqualTo(("value",), b"x"), None),
        (EqualTo(("headers", "key"), "k"), None),
        (IsNotNull(("offset",)), None),
        (Not(EqualTo(("partition",), 1)), None),
        (StringStartsWith(("topic",), "a"), None),
    ],
)
def test_spark_filters_as_comparisons(f: Filter, expected: Comparison | None) -> None:
    assert datasource.comparison(f) == expected


def test_the_filter_pushdown_option() -> None:
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    assert not parse_options(base, streaming=False).filter_pushdown
    assert parse_options({**base, "FILTERPUSHDOWN": "True"}, streaming=False).filter_pushdown
    with pytest.raises(SourceOptionError) as info:
        parse_options({**base, "filterPushdown": "yes please"}, streaming=False)
    assert info.value.option == "filterPushdown"


# ---------------------------------------------------------------- planning on a cluster


def batch_reader(cluster: EmbeddedCluster, **extra: str) -> datasource._BatchReader:
    """The reader Spark gets from ``spark.read.format("epochguard")`` with these options
    (``filterPushdown=true`` unless they say otherwise)."""
    options = {
        "kafka.bootstrap.servers": cluster.bootstrap_servers,
        "subscribe": "t",
        "filterPushdown": "true",
        **extra,
    }
    made = datasource.EpochGuardDataSource(options).reader(None)  # type: ignore[arg-type]
    assert isinstance(made, datasource._BatchReader)
    return made


def planned(
    reader: datasource._BatchReader, filters: Sequence[Filter]
) -> tuple[list[tuple[int, int, int | None, int, int | None]], list[Filter]]:
    """(partition, start, its epoch, end, its epoch) of each planned task, and the filters
    handed back to Spark."""
    left = list(reader.pushFilters(list(filters)))
    ranges = []
    for p in reader.partitions():
        assert isinstance(p, datasource.EpochRangePartition)
        r = p.range()
        ranges.append(
            (r.tp.partition, r.start.offset, r.start.leader_epoch, r.end.offset, r.end.leader_epoch)
        )
    return ranges, left


def spans(ranges: list[tuple[int, int, int | None, int, int | None]]) -> list[tuple[int, int, int]]:
    return [(p, s, e) for p, s, _, e, _ in ranges]


def ms_datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=UTC)


@pytest.fixture
def stamped(cluster: EmbeddedCluster) -> EmbeddedCluster:
    """t-0: 20 records at 1000..1019 ms, but offsets 10..14 back at 1002 ms, and a new
    leader epoch from offset 15; t-1: 5 records at 1000 ms."""
    cluster.create_topic("t", partitions=2, replication_factor=1)
    for i in range(10):
        cluster.append("t", 0, [b"a%d" % i], timestamp_ms=1000 + i)
    cluster.append("t", 0, [b"late%d" % i for i in range(5)], timestamp_ms=1002)
    leader = cluster.leader("t", 0)
    assert leader is not None
    cluster.elect_leader("t", 0, leader)
    for i in range(15, 20):
        cluster.append("t", 0, [b"a%d" % i], timestamp_ms=1000 + i)
    cluster.append("t", 1, [b"b"] * 5, timestamp_ms=1000)
    return cluster


def test_partition_and_offset_filters_plan_only_what_they_leave(stamped: EmbeddedCluster) -> None:
    reader = batch_reader(stamped)
    filters = [
        EqualTo(("partition",), 0),
        GreaterThanOrEqual(("offset",), 3),
        LessThan(("offset",), 17),
    ]
    ranges, left = planned(reader, filters)
    assert left == []
    # Moved ends carry the planned end's epoch (1: the leader's after the election).
    assert ranges == [(0, 3, 1, 17, 1)]


def test_timestamp_lower_bound_starts_at_the_record_found_with_its_epoch(
    stamped: EmbeddedCluster,
) -> None:
    reader = batch_reader(stamped)
    f = GreaterThanOrEqual(("timestamp",), ms_datetime(1016))
    ranges, left = planned(reader, [f])
    assert left == [f]
    # t-0: offset 16, appended in epoch 1; t-1 has nothing that late.
    assert ranges == [(0, 16, 1, 20, 1)]
    # 1003 ms: offset 3 (epoch 0), although 10..14 are earlier (1002 ms): Spark drops those.
    ranges, _ = planned(batch_reader(stamped), [GreaterThan(("timestamp",), ms_datetime(1002))])
    assert ranges == [(0, 3, 0, 20, 1)]


@pytest.mark.parametrize(
    "filters",
    [
        [EqualTo(("partition",), 7)],  # not a partition of the topic
        [In(("partition",), (-1, 9))],
        [GreaterThanOrEqual(("offset",), 20)],  # at the log end
        [GreaterThan(("offset",), 1000)],
        [LessThan(("offset",), 0)],
        [GreaterThan(("offset",), 5), LessThan(("offset",), 6)],
        [GreaterThan(("timestamp",), ms_datetime(1019))],  # after every record
    ],
)
def test_filters_that_leave_nothing_plan_no_task(
    stamped: EmbeddedCluster, filters: list[Filter]
) -> None:
    reader = batch_reader(stamped)
    ranges, _ = planned(reader, filters)
    assert ranges == []
    # What Spark then asks for: one InputPartition(None), which reads nothing.
    assert list(reader.read(datasource.InputPartition(None))) == []


def test_bounds_before_the_log_change_nothing(stamped: EmbeddedCluster) -> None:
    filters = [
        GreaterThanOrEqual(("offset",), -5),
        LessThan(("offset",), 10**12),
        GreaterThanOrEqual(("timestamp",), ms_datetime(5)),
    ]
    ranges, _ = planned(batch_reader(stamped), filters)
    assert spans(ranges) == [(0, 0, 20), (1, 0, 5)]


def test_pushed_bounds_intersect_the_planned_offsets(stamped: EmbeddedCluster) -> None:
    reader = batch_reader(
        stamped,
        startingOffsets='{"t": {"0": 4, "1": 1}}',
        endingOffsets='{"t": {"0": 12, "1": 3}}',
    )
    ranges, _ = planned(reader, [GreaterThan(("offset",), 1), LessThanOrEqual(("offset",), 14)])
    assert spans(ranges) == [(0, 4, 12), (1, 2, 3)]


def test_without_filter_pushdown_the_reader_takes_no_filters(stamped: EmbeddedCluster) -> None:
    options = {"kafka.bootstrap.servers": stamped.bootstrap_servers, "subscribe": "t"}
    default = datasource.EpochGuardDataSource(options).reader(None)  # type: ignore[arg-type]
    # Not even the method: Spark refuses a reader with one while its switch is off.
    assert type(default) is datasource._BatchReader
    assert type(default).pushFilters is datasource.DataSourceReader.pushFilters
    reader = batch_reader(stamped, filterPushdown="false")
    assert type(reader) is datasource._BatchReader
    filters: list[Filter] = [EqualTo(("partition",), 0)]
    assert list(reader.pushFilters(filters)) == filters
    ranges, _ = planned(reader, [])
    assert spans(ranges) == [(0, 0, 20), (1, 0, 5)]
