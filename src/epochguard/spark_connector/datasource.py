"""The PySpark data source: the classes Spark creates, pickles and calls.

Spark runs the driver methods (``initialOffset``, ``latestOffset``, ``partitions``, ...) on
one long-lived reader instance and ``read()`` on another, pickled to the executors, so
everything ``read()`` needs travels in the :class:`EpochRangePartition` (start and planned
end as positions with epochs) and Kafka clients are created lazily on each side. Decisions
(options, offsets, planning) are the sans-IO modules'; the I/O, through EpochConsumer's
public API, is in :mod:`~epochguard.spark_connector.driver` and
:mod:`~epochguard.spark_connector.executor`, imported on their first call: Spark's planner
processes import this module only to create the source and pickle its readers.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

# pyspark's source runner hands a stream reader's records to the JVM together with the
# batch's plan only when the reader is its own wrapper of simple readers (the runner's
# partitions_func tests the class, then calls getCache): _DriverReadingStreamReader is one.
from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from epochguard._log import get_logger
from epochguard._topic_partition import topic_partition
from epochguard.offsets.position import EpochOffset
from epochguard.spark_connector.errors import (
    OffsetsJsonError,
    SourceOptionError,
    SparkDataLossError,
    SparkLogTruncationError,
    SparkMissingTopicError,
    SparkUnreachableError,
    data_loss_message,
)
from epochguard.spark_connector.initial_offsets import (
    load_initial_offsets,
    store_initial_offsets,
)
from epochguard.spark_connector.offsets import SourceOffset
from epochguard.spark_connector.options import (
    SourceOptions,
    check_checkpoint,
    parse_options,
)
from epochguard.spark_connector.planning import (
    MinOffsetsGate,
    OffsetRange,
    plan_end_offsets,
    split_ranges,
)
from epochguard.spark_connector.pushdown import COLUMNS, Comparison, Op, ReadBounds, push

if TYPE_CHECKING:
    import pyarrow as pa
    from kafka.structs import TopicPartition
    from pyspark.sql.types import StructType

    from epochguard.consumer import EpochConsumer
    from epochguard.spark_connector.driver import Driver

__all__ = [
    "EpochGuardDataSource",
    "EpochRangePartition",
    "spark_schema",
]

log = get_logger("epochguard.spark_connector")

_BASE_COLUMNS = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_HEADERS_COLUMN = "headers array<struct<key: string, value: binary>>"


def spark_schema(include_headers: bool) -> str:
    """Spark's Kafka source schema (headers with ``includeHeaders``) plus ``leaderEpoch``."""
    cols = _BASE_COLUMNS + (f", {_HEADERS_COLUMN}" if include_headers else "")
    return cols + ", leaderEpoch int"


#: Errors whose message is all a user needs: the option at fault, or a stable code first.
_USER_ERRORS: tuple[type[BaseException], ...] = (
    SourceOptionError,
    OffsetsJsonError,
    SparkLogTruncationError,
    SparkDataLossError,
    SparkUnreachableError,
    SparkMissingTopicError,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def _user_facing() -> Iterator[None]:
    """Let one of ``_USER_ERRORS`` reach the user as the first line of Spark's exception.

    Spark's Python worker exits with the exception it formats, by default as a traceback
    whose "Traceback (most recent call last):" becomes the first line the user reads, with
    the message at the bottom. pyspark reads ``SPARK_HIDE_TRACEBACK`` when it formats (the
    variable behind ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``) and prints
    the exception's class and message only; the worker exits right after, so nothing else
    it runs sees the variable."""
    try:
        yield
    except _USER_ERRORS:
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        raise


def _user_facing_errors(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A method Spark calls, run under :func:`_user_facing`."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _user_facing():
            return method(*args, **kwargs)

    return wrapper


def _new_driver(opts: SourceOptions) -> Driver:
    # Imported here: a planner process that only creates the source or pickles its
    # readers needs none of the consumer (docs/guides/spark.md, "Cost per query").
    from epochguard.spark_connector.driver import Driver

    return Driver(opts)


def _read_range(
    opts: SourceOptions, rng: OffsetRange, reader: str = "an executor"
) -> Generator[pa.RecordBatch, None, None]:
    from epochguard.spark_connector.executor import read_range

    return read_range(opts, rng, reader)


def _offsets_of(positions: Mapping[TopicPartition, EpochOffset]) -> dict[TopicPartition, int]:
    return {tp: p.offset for tp, p in positions.items()}


# ---------------------------------------------------------------- partitions and read()


class EpochRangePartition(InputPartition):
    """One task: ``topic``-``partition`` from ``start`` to ``end`` (positions as JSON)."""

    def __init__(self, rng: OffsetRange) -> None:
        self.topic = rng.tp.topic
        self.partition = rng.tp.partition
        self.start = rng.start.to_json_str()
        self.end = rng.end.to_json_str()
        super().__init__((self.topic, self.partition, self.start, self.end))

    def range(self) -> OffsetRange:
        return OffsetRange(
            topic_partition(self.topic, self.partition),
            EpochOffset.from_json(self.start),
            EpochOffset.from_json(self.end),
        )


class EpochRangesPartition(InputPartition):
    """One task reading several ranges in turn: a micro-batch planned to be read on the
    driver (Spark takes records handed over with the plan for a single partition only),
    read by a task when they were not handed over."""

    def __init__(self, parts: Sequence[EpochRangePartition]) -> None:
        self.parts = list(parts)
        super().__init__(tuple(p.value for p in self.parts))


def _plan(
    opts: SourceOptions,
    start: Mapping[TopicPartition, EpochOffset],
    end: Mapping[TopicPartition, EpochOffset],
    bounds: ReadBounds | None = None,
    first_at_time: Mapping[TopicPartition, EpochOffset] | None = None,
) -> list[EpochRangePartition]:
    """Tasks reading ``start`` to ``end`` per partition; a batch read's pushed filters
    (``bounds``, ``first_at_time`` from :meth:`Driver.first_at_time`) cut each range
    first, after the checks that the whole planned range gets."""
    firsts = first_at_time or {}
    ranges = []
    for tp, e in sorted(end.items()):
        s = start.get(tp)
        if s is None:
            continue
        if e.offset < s.offset:
            detail = f"end offset {e.offset} is before start offset {s.offset}"
            if opts.on_truncation == "rewind" and s.leader_epoch is not None:
                continue  # both ends rewound: nothing of this batch is left to read
            if opts.fail_on_data_loss:
                raise SparkDataLossError(data_loss_message(tp, detail))
            log.warning("kafka_data_loss", topic=tp.topic, partition=tp.partition, reason=detail)
            continue
        if bounds is not None:
            cut = bounds.narrow(s, e, firsts.get(tp))
            if cut is None:
                continue
            s, e = cut
        ranges.append(OffsetRange(tp, s, e))
    pieces = split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)
    return [EpochRangePartition(r) for r in pieces]


# ---------------------------------------------------------------- the readers


#: Spark's comparison filters and the operator each is. ``EqualNullSafe`` is ``=`` here:
#: the columns the source narrows by are never null.
_FILTER_OPS: dict[type[Filter], Op] = {
    EqualTo: "=",
    EqualNullSafe: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
    In: "in",
}
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _filter_value(column: str, value: object) -> int | None:
    """A literal as :class:`Comparison` takes it: an int for ``partition``/``offset``,
    microseconds since the epoch for ``timestamp`` (Spark gives a time-zone-aware
    datetime); None for anything else (Spark applies that filter itself)."""
    if column == "timestamp":
        if not isinstance(value, datetime.datetime) or value.tzinfo is None:
            return None
        return (value - _EPOCH) // datetime.timedelta(microseconds=1)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def comparison(f: Filter) -> Comparison | None:
    """``f`` as a :class:`Comparison` on ``partition``, ``offset`` or ``timestamp``, or
    None when it is not one the source can narrow a read by."""
    op = _FILTER_OPS.get(type(f))
    attribute: tuple[str, ...] = getattr(f, "attribute", ())
    if op is None or len(attribute) != 1:
        return None
    column = COLUMNS.get(attribute[0])
    if column is None:
        return None
    raw = getattr(f, "value", None)
    value: int | tuple[int, ...]
    if op == "in":
        if not isinstance(raw, tuple | list):
            return None
        items = [_filter_value(column, v) for v in raw]
        if not items or any(v is None for v in items):
            return None
        value = tuple(v for v in items if v is not None)
    else:
        single = _filter_value(column, raw)
        if single is None:
            return None
        value = single
    return Comparison(column, op, value)


class _BatchReader(DataSourceReader):
    """A batch read, every filter left to Spark (``filterPushdown=false``, the default)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.bounds = ReadBounds()

    @_user_facing_errors
    def partitions(self) -> Sequence[InputPartition]:
        bounds = self.bounds
        driver = _new_driver(self.opts)
        try:
            tps = [tp for tp in driver.partitions() if bounds.allows_partition(tp.partition)]
            start = driver.resolve(self.opts.starting, tps)
            end = driver.resolve(self.opts.ending, tps, "ending")
            start.update(driver.validate(start, "validating the starting offsets of a batch read"))
            # A specified end offset without an epoch gets the latest epoch as its bound.
            latest = driver.latest([tp for tp, e in end.items() if e.leader_epoch is None])
            for tp, lat in latest.items():
                if end[tp].offset > lat.offset:
                    raise SourceOptionError(
                        "endingOffsets",
                        f"ending offset {end[tp].offset} of {tp.topic}-{tp.partition} is past "
                        f"the end of its log ({lat.offset})",
                    )
                end[tp] = EpochOffset(end[tp].offset, lat.leader_epoch, topic_id=lat.topic_id)
            firsts: dict[TopicPartition, EpochOffset] = {}
            if bounds.timestamp_from_ms is not None and not bounds.empty:
                # Looked up after the ends: a partition with no record that late up to its
                # log end now has none before its planned end either.
                reading = [
                    tp for tp, e in end.items() if tp in start and e.offset > start[tp].offset
                ]
                firsts = driver.first_at_time(bounds.timestamp_from_ms, reading)
        finally:
            driver.close()
        return _plan(self.opts, start, end, bounds, firsts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, EpochRangePartition):
            # Spark reads one InputPartition(None) when a batch read plans no task.
            return
        with _user_facing():
            yield from _read_range(self.opts, partition.range())


class _FilteringBatchReader(_BatchReader):
    """A batch read that narrows its ranges by the filters Spark pushes
    (:mod:`~epochguard.spark_connector.pushdown`; ``filterPushdown=true``).

    A separate class: Spark fails every read of a reader that overrides ``pushFilters``
    while ``spark.sql.python.filterPushdown.enabled`` is off, so only a query that asks
    for pushdown gets one."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        # No I/O here: Spark may call this again on a new reader when it replays the
        # planning, and the answer must be the same.
        self.bounds, left = push([comparison(f) for f in filters])
        return [filters[i] for i in left]


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._driver: Driver | None = None
        self._gate: MinOffsetsGate | None = None
        if opts.min_offsets_per_trigger is not None:
            self._gate = MinOffsetsGate(
                opts.min_offsets_per_trigger,
                opts.max_trigger_delay_ms,
                lambda: time.time() * 1000,
            )
        self._available_now: dict[TopicPartition, EpochOffset] | None = None
        self._latest: dict[TopicPartition, EpochOffset] | None = None
        self._committer: EpochConsumer | None = None
        self._initial: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get only the options: driver clients and state stay on the driver.
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        _StreamReader.__init__(self, state["opts"])

    @property
    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = _new_driver(self.opts)
        return self._driver

    def _load(self, offset: Mapping[str, Any], what: str) -> dict[TopicPartition, EpochOffset]:
        off = SourceOffset.from_json(offset)
        check_checkpoint(off, self.opts.strategy, what)
        return off.as_dict()

    @_user_facing_errors
    def initialOffset(self) -> dict[str, Any]:
        """Resolved once per reader: Spark asks twice for a query's first batch, for its
        plan and again for its start, and with ``latest`` or a timestamp two lookups could
        differ. Spark asks again whenever the query starts with no committed batch, and a
        Python source is not told where the checkpoint is: with ``initialOffsetsPath``, the
        first start writes what it resolved there and every later start reads it back, as
        Spark's own source keeps its initial offsets in ``checkpoint/sources/0``."""
        if self._initial is None:
            path = self.opts.initial_offsets_path
            stored = None if path is None else load_initial_offsets(path)
            if stored is not None:
                self._initial = SourceOffset(
                    self._load(stored, f"the initial offsets in {path!r}")
                ).to_json()
                log.info("initial_offsets_read", path=path)
            else:
                tps = self.driver.partitions()
                resolved = SourceOffset(self.driver.resolve(self.opts.starting, tps)).to_json()
                if path is not None:
                    store_initial_offsets(path, resolved)
                    log.info("initial_offsets_stored", path=path)
                self._initial = resolved
        return self._initial

    @_user_facing_errors
    def getDefaultReadLimit(self) -> ReadLimit:
        # No composite limit in PySpark: with both options, the minimum is applied in
        # latestOffset through the gate.
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    @_user_facing_errors
    def prepareForTriggerAvailableNow(self) -> None:
        # The start first, then the snapshot (as Spark's source): Spark calls this before
        # initialOffset, and a "latest" start resolved after the snapshot would lie past
        # the snapshot's end when records arrive in between.
        self.initialOffset()
        self._available_now = self.driver.latest(self.driver.partitions())

    @_user_facing_errors
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = self._load(start, "the batch's start offset (from the checkpoint)")
        if self._available_now is not None:
            latest = self._available_now
            log_ends = None  # a snapshot: its epochs may be past
        else:
            latest = log_ends = self.driver.latest_listed()
        rewinds = self.driver.validate(
            begin, "validating the batch's start on the driver", log_ends=log_ends
        )
        # rewind: this batch reads from the divergence point (partitions() does the same).
        begin.update(rewinds)
        self._latest = latest
        new = [tp for tp in latest if tp not in begin]
        first = self.driver.earliest(new)
        starts = {**first, **begin}
        ends = plan_end_offsets(
            _offsets_of(starts),
            _offsets_of(latest),
            read_all=isinstance(limit, ReadAllAvailable),
            max_rows=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
            # availableNow must end once the snapshot is read: never wait for more records.
            gate=None if self._available_now is not None else self._gate,
        )
        out: dict[TopicPartition, EpochOffset] = {}
        for tp, offset in ends.items():
            lat = latest[tp]
            if offset == lat.offset:
                out[tp] = lat
            elif tp in begin and offset == begin[tp].offset:
                out[tp] = begin[tp]
            else:
                # The latest epoch bounds the epoch of every record before the latest offset.
                out[tp] = EpochOffset(offset, lat.leader_epoch, topic_id=lat.topic_id)
        # Partitions gone from the topic keep their position (Spark reports them lost).
        for tp, pos in begin.items():
            out.setdefault(tp, pos)
        return SourceOffset(out).to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else SourceOffset(self._latest).to_json()

    @_user_facing_errors
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = self._load(start, "the batch's start offset")
        stop = self._load(end, "the batch's end offset")
        if self.opts.on_truncation == "rewind":
            # Also on a replay after a restart, when latestOffset is not called: start at
            # the divergence point, and end there if the planned end was truncated too.
            begin.update(self.driver.validate(begin, "rewinding the batch's start"))
            for tp, pos in self.driver.validate(stop, "checking the batch's planned end").items():
                if pos.offset < stop[tp].offset:
                    stop[tp] = pos
        else:
            behind = {
                tp: begin[tp]
                for tp, e in stop.items()
                if tp in begin and e.offset < begin[tp].offset
            }
            if behind:
                # A log that now ends before the batch's start was truncated between
                # latestOffset's check of the start and its look at the log end (retention
                # never moves the end back): name it as the truncation it is.
                self.driver.validate(behind, "planning a batch whose end is before its start")
        if start == self._initial and self._latest is None:
            self._check_first_batch_replay(begin, stop)
        new = [tp for tp in stop if tp not in begin]
        if new:
            begin = {**self.driver.earliest(new), **begin}
        return _plan(self.opts, begin, stop)

    def _check_first_batch_replay(
        self, start: Mapping[TopicPartition, EpochOffset], end: Mapping[TopicPartition, EpochOffset]
    ) -> None:
        """Spark replays a first batch that did not commit from the initial offsets it asks
        for again (``latestOffset`` not called: a restart). Resolved again without
        ``initialOffsetsPath``, a ``latest`` start may lie past the batch's planned end:
        the batch's records cannot be found, and the error says why and what to set,
        rather than reading as records lost to retention."""
        if self.opts.initial_offsets_path is not None:
            return
        past = sorted(
            (tp, s.offset, end[tp].offset)
            for tp, s in start.items()
            if tp in end and end[tp].offset < s.offset
        )
        if past:
            where = ", ".join(
                f"{tp.topic}-{tp.partition} at {s} (planned end {e})" for tp, s, e in past
            )
            raise SourceOptionError(
                "initialOffsetsPath",
                "the query restarted before its first batch committed, and its starting "
                f"offsets, resolved again, lie past that batch's planned end: {where}; the "
                "first start's offsets are not known, so the batch cannot be replayed. Set "
                "initialOffsetsPath (a file in the query's checkpoint directory) so a "
                "restart starts where the first start did; this checkpoint can only go on "
                "from a new checkpoint location",
            )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        parts = partition.parts if isinstance(partition, EpochRangesPartition) else [partition]
        with _user_facing():
            for part in parts:
                assert isinstance(part, EpochRangePartition)
                yield from _read_range(self.opts, part.range())

    @_user_facing_errors
    def commit(self, end: dict[str, Any]) -> None:
        """With ``commitToGroup``: the finished batch's end positions, epochs included, to
        the consumer group, so ``kafka-consumer-groups`` and lag tools see the query."""
        if not self.opts.commit_to_group:
            return
        if self._committer is None:
            kw = self.opts.consumer_kwargs()
            kw["group_id"] = self.opts.group_id
            from epochguard.spark_connector.driver import connect

            self._committer = connect(kw)
        self._committer.commit(self._load(end, "the committed batch's end offset"))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        if self._committer is not None:
            self._committer.close(autocommit=False)
            self._committer = None


#: A micro-batch read on the driver that reaches this many bytes goes to a task instead:
#: the driver holds what it read until Spark has taken it.
DRIVER_READ_MAX_BYTES = 16 * 1024 * 1024


class _DriverReadingStreamReader(_StreamReader, _SimpleStreamReaderWrapper):
    """``driverReadMaxOffsets``: a micro-batch of at most that many records is read here, in
    the query's source process on the driver, and handed to Spark with the batch's plan, so
    no task starts a Python worker for it (Spark keeps the records in its block manager and
    a JVM task reads them from there). Larger batches, and one that reaches
    :data:`DRIVER_READ_MAX_BYTES`, are read by tasks as without the option. Every check is
    the executors' (:func:`~epochguard.spark_connector.executor.read_range`).

    pyspark's runner treats its wrapper class as a simple reader in two more ways: it takes
    ``prepareForTriggerAvailableNow`` from ``simple_reader`` (this reader), and it reports
    no latest offset in the query's progress."""

    def __init__(self, opts: SourceOptions) -> None:
        _StreamReader.__init__(self, opts)
        # The runner calls only prepareForTriggerAvailableNow on it, which this has.
        self.simple_reader = self  # type: ignore[assignment]
        self._planned: tuple[dict[str, Any], dict[str, Any], list[EpochRangePartition]] | None
        self._planned = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        _DriverReadingStreamReader.__init__(self, state["opts"])

    @_user_facing_errors
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        parts = _StreamReader.partitions(self, start, end)
        self._planned = None
        ranges = [p for p in parts if isinstance(p, EpochRangePartition)]
        rows = sum(p.range().size for p in ranges)
        if not ranges or len(ranges) < len(parts) or rows > self.opts.driver_read_max_offsets:
            return parts
        self._planned = (start, end, ranges)
        return [EpochRangesPartition(ranges)]

    @_user_facing_errors
    def getCache(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Any] | None:
        """The records of the batch :meth:`partitions` just planned to read here, or None
        (Spark then runs the planned task)."""
        planned, self._planned = self._planned, None
        if planned is None or planned[0] != start or planned[1] != end:
            return None
        batches: list[pa.RecordBatch] = []
        size = 0
        for part in planned[2]:
            with contextlib.closing(_read_range(self.opts, part.range(), "the driver")) as reads:
                for batch in reads:
                    size += batch.nbytes
                    if size >= DRIVER_READ_MAX_BYTES:
                        log.info(
                            "driver_read_handed_to_task",
                            planned_records=sum(p.range().size for p in planned[2]),
                            bytes_read=size,
                        )
                        return None
                    batches.append(batch)
        return iter(batches)


class EpochGuardDataSource(DataSource):
    """``format("epochguard")``: Kafka with epoch-checked offsets (docs/guides/spark.md)."""

    @classmethod
    def name(cls) -> str:
        return "epochguard"

    def _options(self, streaming: bool) -> SourceOptions:
        return parse_options(dict(self.options), streaming=streaming)

    def _check_options(self) -> None:
        """``load()`` calls ``schema()`` (unless the query gives a schema): an option error
        is raised there, before any query runs. Whether the query streams is not known
        yet, so only an error in both kinds of query is raised here; one that concerns a
        single kind is raised when its reader is made."""
        options = dict(self.options)
        try:
            parse_options(options, streaming=False)
        except (SourceOptionError, OffsetsJsonError) as batch_error:
            try:
                parse_options(options, streaming=True)
            except (SourceOptionError, OffsetsJsonError) as stream_error:
                if str(stream_error) == str(batch_error):
                    raise
            return

    @_user_facing_errors
    def schema(self) -> str:
        self._check_options()
        include = any(
            k.lower() == "includeheaders" and str(v).strip().lower() == "true"
            for k, v in self.options.items()
        )
        return spark_schema(include)

    @_user_facing_errors
    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._options(streaming=False)
        return _FilteringBatchReader(opts) if opts.filter_pushdown else _BatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            opts = self._options(streaming=True)
            if opts.driver_read_max_offsets:
                return _DriverReadingStreamReader(opts)
            return _StreamReader(opts)
        except (SourceOptionError, OffsetsJsonError):
            return _InvalidStreamReader(dict(self.options))


class _InvalidStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream whose options do not parse: Spark's first call raises their error.

    ``streamReader()`` itself must not raise: Spark's source runner calls ``stop()`` on the
    reader in a ``finally`` around it, and the error it would raise there (``UnboundLocal
    Error: cannot access local variable 'reader'``) would follow ours. The options travel
    as given and are parsed again to raise (an error object need not pickle)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    @_user_facing_errors
    def _fail(self) -> NoReturn:
        parse_options(self.options, streaming=True)
        raise AssertionError("the options parsed on the second try")

    def initialOffset(self) -> dict[str, Any]:
        self._fail()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._fail()

    def prepareForTriggerAvailableNow(self) -> None:
        self._fail()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._fail()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._fail()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        self._fail()

    def commit(self, end: dict[str, Any]) -> None:
        self._fail()

    def stop(self) -> None:
        pass
