"""The PySpark data source: driver planning and executor reads on EpochConsumer.

Spark runs the driver methods (``initialOffset``, ``latestOffset``, ``partitions``, ...) on
one long-lived reader instance and ``read()`` on another, pickled to the executors, so
everything ``read()`` needs travels in the :class:`EpochRangePartition` (start and planned
end as positions with epochs) and Kafka clients are created lazily on each side. Decisions
(options, offsets, planning) are the sans-IO modules'; this module only does the I/O,
through EpochConsumer's public API.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import queue
import threading
import time
from collections.abc import (
    Callable,
    Collection,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, NoReturn, ParamSpec, TypeVar

import pyarrow as pa
from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from kafka.structs import TopicPartition
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
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from epochguard._log import get_logger
from epochguard.consumer import (
    EpochConsumer,
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)
from epochguard.consumer.client import FATAL_CONNECTION_ERRORS
from epochguard.consumer.columns import RecordColumns, header_type
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport, records_count
from epochguard.spark_connector.errors import (
    OffsetsJsonError,
    SourceOptionError,
    SparkDataLossError,
    SparkLogTruncationError,
    SparkMissingTopicError,
    SparkUnreachableError,
)
from epochguard.spark_connector.offsets import EARLIEST, LATEST, SourceOffset
from epochguard.spark_connector.options import (
    Assign,
    EarliestOffsets,
    GlobalTimestamp,
    LatestOffsets,
    OffsetLimit,
    PartitionTimestamps,
    SourceOptions,
    Strategy,
    Subscribe,
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

__all__ = [
    "ARROW_SCHEMA",
    "EpochGuardDataSource",
    "EpochRangePartition",
    "read_range",
    "spark_schema",
]

log = get_logger("epochguard.spark_connector")

_BASE_COLUMNS = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
_HEADERS_COLUMN = "headers array<struct<key: string, value: binary>>"

_BASE_FIELDS = [
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
]
ARROW_SCHEMA = pa.schema([*_BASE_FIELDS, ("leaderEpoch", pa.int32())])
_ARROW_SCHEMA_HEADERS = pa.schema(
    [*_BASE_FIELDS, ("headers", header_type()), ("leaderEpoch", pa.int32())]
)

#: Rows per Arrow batch yielded by ``read()``, or fewer rows once their keys and values
#: reach ``_BATCH_BYTES``.
_BATCH_ROWS = 8192
_BATCH_BYTES = 4 * 1024 * 1024
#: Seconds between log-end checks while a read makes no progress below its planned end.
_END_CHECK_INTERVAL = 1.0


def spark_schema(include_headers: bool) -> str:
    """Spark's Kafka source schema (headers with ``includeHeaders``) plus ``leaderEpoch``."""
    cols = _BASE_COLUMNS + (f", {_HEADERS_COLUMN}" if include_headers else "")
    return cols + ", leaderEpoch int"


def truncation_message(report: TruncationReport, where: str) -> str:
    """The text after ``KAFKA_LOG_TRUNCATION:``: partition, divergence, lost range."""
    tp = f"{report.topic}-{report.partition}"
    if report.divergence is None:
        lost = f"divergence unknown, lost range [?, {report.lost_to})"
    else:
        lost = (
            f"divergence at {report.divergence}, lost range "
            f"[{report.lost_from}, {report.lost_to}) ({records_count(report.lost_count)})"
        )
    return f"topic {report.topic} partition {report.partition} ({tp}): {lost}; {where}"


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


#: What a consumer that cannot reach its cluster raises while bootstrapping.
_UNREACHABLE = (KafkaConnectionError, KafkaTimeoutError, *FATAL_CONNECTION_ERRORS)


def _connect(kw: Mapping[str, Any]) -> EpochConsumer:
    """A new EpochConsumer; a cluster it cannot reach is a :class:`SparkUnreachableError`
    with the bootstrap failure's own words (refused, timed out, authentication)."""
    try:
        return EpochConsumer(**kw)
    except _UNREACHABLE as exc:
        reason = exc.args[0] if len(exc.args) == 1 else str(exc)
        raise SparkUnreachableError(str(reason)) from exc


def _data_loss(tp: TopicPartition, detail: str) -> str:
    # Spark's wording for failOnDataLoss=true.
    return (
        f"Some data may have been lost because they are not available in Kafka any more; "
        f"either the data was aged out by Kafka or the topic may have been deleted before all "
        f"the data in the topic was processed. {tp.topic}-{tp.partition}: {detail}. If you "
        f"don't want your streaming query to fail on such cases, set the source option "
        f'"failOnDataLoss" to "false".'
    )


# ---------------------------------------------------------------- the driver side


class _Driver:
    """The driver's Kafka client: partitions, start/end positions, validation."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._consumer: EpochConsumer | None = None
        # The last listing of the partitions read, and when it was made (monotonic).
        self._listed: tuple[float, list[TopicPartition]] | None = None

    @property
    def consumer(self) -> EpochConsumer:
        if self._consumer is None:
            kw = self.opts.consumer_kwargs()
            # The driver only lists offsets: keep the fetches it may send small.
            kw.setdefault("max_partition_fetch_bytes", 1024)
            self._consumer = _connect(kw)
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None

    def partitions(self) -> list[TopicPartition]:
        """The partitions the query reads, listed again from fresh metadata, except within
        ``retry_backoff_ms`` of the last listing: the consumer does not ask for metadata
        more often than that, so a second listing right after the first (Spark calls
        ``prepareForTriggerAvailableNow`` and then ``initialOffset``, each listing) waited
        out the backoff: 93 ms of every availableNow query in its progress."""
        strategy: Strategy = self.opts.strategy
        if isinstance(strategy, Assign):
            return sorted(strategy.partitions)
        c = self.consumer
        now = time.monotonic()
        if self._listed is not None and now - self._listed[0] < c.config["retry_backoff_ms"] / 1000:
            return list(self._listed[1])
        topics = (
            strategy.topics
            if isinstance(strategy, Subscribe)
            else sorted(t for t in c.topics() if strategy.matches(t))
        )
        out: list[TopicPartition] = []
        missing: list[str] = []
        for topic in topics:
            parts = c.partitions_for_topic(topic)
            if not parts:
                missing.append(topic)
                continue
            out.extend(TopicPartition(topic, p) for p in sorted(parts))
        if missing and isinstance(strategy, Subscribe):
            if self.opts.fail_on_missing_topic:
                raise SparkMissingTopicError(missing)
            for topic in missing:
                # At each listing (about once per batch) while it is missing: a query
                # reading nothing should say why.
                log.warning(
                    "kafka_missing_topic",
                    topic=topic,
                    reason="subscribed topic does not exist; read once it is created "
                    "(failOnMissingTopic=true fails the query instead)",
                )
        self._listed = (time.monotonic(), out)
        return list(out)

    def _assign(self, tps: Sequence[TopicPartition]) -> None:
        c = self.consumer
        if c.assignment() != set(tps):
            # Partitions assigned already keep their state, and a lookup in flight with it.
            c.assign(list(tps))

    def _request_positions(self, tps: Sequence[TopicPartition], end: bool) -> None:
        """Ask for the log end (or start) of assigned ``tps`` without waiting: the lookups
        go out with whatever the consumer sends next."""
        if not tps:
            return
        c = self.consumer
        # The driver reads no records. Unpaused, a partition at its log end has a Fetch
        # long-polling for fetch.max.wait.ms, and the broker answers the next lookup on that
        # connection only after it: latestOffset took 0.5 or 1.0 s in Spark's progress.
        c.pause(*tps)
        if end:
            c.seek_to_end(*tps)
        else:
            c.seek_to_beginning(*tps)

    def _positions(
        self,
        tps: Sequence[TopicPartition],
        end: bool,
        requested: Collection[TopicPartition] = (),
    ) -> dict[TopicPartition, EpochOffset]:
        """The log end (or start) of ``tps``; those in ``requested`` were asked for already
        (:meth:`_request_positions`) and are not asked again."""
        if not tps:
            return {}
        self._assign(tps)
        self._request_positions([tp for tp in tps if tp not in requested], end)
        timeout = self.opts.poll_timeout_ms
        return {tp: self.consumer.position_with_epoch(tp, timeout_ms=timeout) for tp in tps}

    def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, EpochOffset]:
        """Log end offsets, each with the leader's epoch (bounds every record before it)."""
        return self._positions(tps, end=True)

    def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, EpochOffset]:
        return self._positions(tps, end=False)

    def latest_listed(self) -> dict[TopicPartition, EpochOffset]:
        """:meth:`latest` of the partitions :meth:`partitions` lists, in one round trip
        where the partitions are those of the last listing: their lookups go out with the
        listing's Metadata request, not after its answer. A partition the listing finds
        new is looked up after it."""
        known = [] if self._listed is None else self._listed[1]
        if known and not isinstance(self.opts.strategy, Assign):
            self._assign(known)
            self._request_positions(known, end=True)
        return self._positions(self.partitions(), end=True, requested=known)

    def resolve(
        self, limit: OffsetLimit, tps: Sequence[TopicPartition], prefix: str = "starting"
    ) -> dict[TopicPartition, EpochOffset]:
        """Starting or ending (``prefix``) positions for ``tps`` from an option's limit.

        Specific offsets: a partition the JSON does not name starts at the earliest offset
        (as a partition Spark's source discovers later does)."""
        if isinstance(limit, EarliestOffsets):
            return self.earliest(tps)
        if isinstance(limit, LatestOffsets):
            return self.latest(tps)
        if isinstance(limit, GlobalTimestamp | PartitionTimestamps):
            return self._by_timestamp(limit, tps, prefix)
        given = limit.as_dict()
        out: dict[TopicPartition, EpochOffset] = {}
        want_earliest = [tp for tp in tps if given.get(tp, EARLIEST) == EARLIEST]
        want_latest = [tp for tp in tps if given.get(tp) == LATEST]
        out.update(self.earliest(want_earliest))
        out.update(self.latest(want_latest))
        for tp in tps:
            pos = given.get(tp)
            if isinstance(pos, EpochOffset):
                out[tp] = pos
        return out

    def _by_timestamp(
        self,
        limit: GlobalTimestamp | PartitionTimestamps,
        tps: Sequence[TopicPartition],
        prefix: str,
    ) -> dict[TopicPartition, EpochOffset]:
        """The first offset at or after each timestamp, with the epoch of the record there
        (an upper bound for the record before it). No such record: the latest offset, or for
        a start with ``startingOffsetsByTimestampStrategy=error``, an error."""
        if isinstance(limit, GlobalTimestamp):
            option = f"{prefix}Timestamp"
            stamps = dict.fromkeys(tps, limit.timestamp)
        else:
            option = f"{prefix}OffsetsByTimestamp"
            stamps = limit.as_dict()
            missing = sorted(set(tps) - set(stamps))
            if missing:
                names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in missing)
                raise SourceOptionError(option, f"gives no timestamp for partitions {names}")
            stamps = {tp: stamps[tp] for tp in tps}
        out, no_match = self._at_times(stamps)
        if no_match and prefix == "starting" and self.opts.no_match_strategy == "error":
            names = ", ".join(f"{tp.topic}-{tp.partition}@{stamps[tp]}" for tp in no_match)
            raise SourceOptionError(
                option,
                f"no record at or after the timestamp in {names} (set "
                "startingOffsetsByTimestampStrategy=latest to start at the latest offset)",
            )
        out.update(self.latest(no_match))
        return out

    def first_at_time(
        self, timestamp_ms: int, tps: Sequence[TopicPartition]
    ) -> dict[TopicPartition, EpochOffset]:
        """The first offset at or after ``timestamp_ms`` in each of ``tps``, with the epoch
        of the record there, as :meth:`resolve` finds a starting timestamp; where no record
        is that late, the log end (nothing before it is)."""
        out, no_match = self._at_times(dict.fromkeys(tps, timestamp_ms))
        out.update(self.latest(no_match))
        return out

    def _at_times(
        self, stamps: Mapping[TopicPartition, int]
    ) -> tuple[dict[TopicPartition, EpochOffset], list[TopicPartition]]:
        """ListOffsets by time: per partition the first offset whose record is at or after
        its timestamp (ms), with that record's epoch (an upper bound for the record before
        it), and the partitions with no such record."""
        if not stamps:
            return {}, []
        found = self.consumer.offsets_for_times(dict(stamps), timeout_ms=self.opts.poll_timeout_ms)
        out: dict[TopicPartition, EpochOffset] = {}
        no_match: list[TopicPartition] = []
        for tp in stamps:
            hit = found.get(tp)
            if hit is None:
                no_match.append(tp)
            else:
                epoch = hit.leader_epoch if hit.leader_epoch is not None else -1
                out[tp] = EpochOffset(hit.offset, epoch if hit.offset > 0 else None)
        return out, no_match

    def validate(
        self,
        positions: Mapping[TopicPartition, EpochOffset],
        where: str,
        log_ends: Mapping[TopicPartition, EpochOffset] | None = None,
    ) -> dict[TopicPartition, EpochOffset]:
        """Check positions with OffsetForLeaderEpoch. A truncation fails (``fail``) or, with
        ``rewind`` and a known divergence point, is logged and that point returned, per
        partition; records removed by retention follow ``failOnDataLoss``.

        ``log_ends``: log end positions just looked up (:meth:`latest`). A position in the
        epoch of the leader that answered, at or before its log end, in the same topic, is
        valid without asking: a leader never truncates its log during its epoch, and
        OffsetForLeaderEpoch for that epoch would answer with its log end."""
        ends = log_ends or {}
        with_epochs = {
            tp: p
            for tp, p in positions.items()
            if p.leader_epoch is not None and not _in_leader_epoch(p, ends.get(tp))
        }
        if not with_epochs:
            return {}
        results = self.consumer.validate_offsets(with_epochs, timeout_ms=self.opts.poll_timeout_ms)
        rewinds: dict[TopicPartition, EpochOffset] = {}
        for tp, res in sorted(results.items()):
            if res.valid:
                continue
            report = res.report
            if report is not None:
                if self.opts.on_truncation == "rewind" and report.divergence is not None:
                    log.warning(
                        "kafka_log_truncation", action="rewind", where=where, **report.to_dict()
                    )
                    rewinds[tp] = report.divergence
                    continue
                raise SparkLogTruncationError(truncation_message(report, where))
            detail = f"position {res.position} cannot be read ({res.error}); {where}"
            if self.opts.fail_on_data_loss:
                raise SparkDataLossError(_data_loss(tp, detail))
            # The executor skips what retention removed.
            log.warning("kafka_data_loss", topic=tp.topic, partition=tp.partition, reason=detail)
        return rewinds


def _in_leader_epoch(position: EpochOffset, log_end: EpochOffset | None) -> bool:
    """Whether ``position`` is in the epoch of the leader whose log end is ``log_end`` (the
    leader's epoch, as ListOffsets for the latest offset gives it), at or before that end."""
    return (
        log_end is not None
        and log_end.leader_epoch is not None
        and position.leader_epoch == log_end.leader_epoch
        and position.topic_id == log_end.topic_id
        and position.offset <= log_end.offset
    )


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
            TopicPartition(self.topic, self.partition),
            EpochOffset.from_json(self.start),
            EpochOffset.from_json(self.end),
        )


def _plan(
    opts: SourceOptions,
    start: Mapping[TopicPartition, EpochOffset],
    end: Mapping[TopicPartition, EpochOffset],
    bounds: ReadBounds | None = None,
    first_at_time: Mapping[TopicPartition, EpochOffset] | None = None,
) -> list[EpochRangePartition]:
    """Tasks reading ``start`` to ``end`` per partition; a batch read's pushed filters
    (``bounds``, ``first_at_time`` from :meth:`_Driver.first_at_time`) cut each range
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
                raise SparkDataLossError(_data_loss(tp, detail))
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


# Executors: one EpochConsumer per configuration and per concurrent task, reused by the
# tasks that run in this worker process one after the other.
_POOL: dict[tuple[tuple[str, str], ...], list[EpochConsumer]] = {}
_POOL_LOCK = threading.Lock()


def _pool_key(kw: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in kw.items()))


#: ``max_partition_fetch_bytes`` of executor reads unless ``kafka.max.partition.fetch.bytes``
#: is given. A task reads one partition with one fetch in flight, so its rate is a fetch's
#: size per round trip: measured in a Spark query (docs/spark.md), 8 MiB instead of Kafka's
#: 1 MiB took 100 B x 1 partition from 0.21 M to 0.50 M rows/s.
EXECUTOR_FETCH_BYTES = 8 * 1024 * 1024


#: ``fetch_max_wait_ms`` of executor reads unless ``kafka.fetch.max.wait.ms`` is given. A
#: task reads records that existed when its batch was planned, so a Fetch only long-polls
#: once the range is read: the consumer's prefetch past the planned end. That Fetch stays
#: in flight into the next task of the worker, which reuses the consumer, and the broker
#: answers that task's first request on the connection only after it.
EXECUTOR_FETCH_WAIT_MS = 20


def _executor_kwargs(opts: SourceOptions) -> dict[str, Any]:
    kw = opts.consumer_kwargs()
    kw["max_poll_records"] = _BATCH_ROWS
    kw.setdefault("max_partition_fetch_bytes", EXECUTOR_FETCH_BYTES)
    kw.setdefault("fetch_max_wait_ms", EXECUTOR_FETCH_WAIT_MS)
    # The C decoder fills the Arrow buffers of every column, headers included when asked:
    # no Python object per record or field (docs/spark.md, "Profile").
    kw["record_format"] = "columns"
    if opts.include_headers:
        kw["column_headers"] = True
    return kw


_TS = _BASE_FIELDS[5][1]


def _column_batch(tp: TopicPartition, pieces: list[RecordColumns]) -> pa.RecordBatch:
    """One Arrow batch from column buffers: the buffers of a single piece are used as they
    are; several pieces (polls joined) are concatenated, one copy. The headers column
    (``includeHeaders``) comes from the buffers too: a record without headers is a null
    list, as in Spark's source."""
    parts = [p.to_arrow() for p in pieces]
    if len(parts) == 1:
        cols = parts[0]
    else:
        cols = {name: pa.concat_arrays([p[name] for p in parts]) for name in parts[0]}
    n = len(cols["offset"])
    arrays = [
        cols["key"],
        cols["value"],
        pa.repeat(pa.scalar(tp.topic, pa.string()), n),
        pa.repeat(pa.scalar(tp.partition, pa.int32()), n),
        cols["offset"],
        cols["timestamp"].cast(_TS),
        cols["timestampType"],
    ]
    if "headers" in cols:
        arrays.append(cols["headers"])
        schema = _ARROW_SCHEMA_HEADERS
    else:
        schema = ARROW_SCHEMA
    arrays.append(cols["leaderEpoch"])
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_range(opts: SourceOptions, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Read ``rng`` exactly, as Arrow batches, checking the epochs the records carry."""
    if rng.size <= 0:
        return
    kw = _executor_kwargs(opts)
    key = _pool_key(kw)
    with _POOL_LOCK:
        free = _POOL.get(key)
        consumer = free.pop() if free else None
    if consumer is None:
        consumer = _connect(kw)
    done = False
    try:
        reads = _read_with(consumer, opts, rng)
        polls: Iterator[RecordColumns] = reads
        if rng.size > _BATCH_ROWS:
            # More than one Arrow batch: fetch ahead of the hand-off on a thread of its own.
            # A smaller range is handed over in one batch at its end, so a thread would only
            # add its start and two hand-offs (a micro-batch of a running query).
            polls = _fetch_ahead(reads, f"{rng.tp.topic}-{rng.tp.partition}")
        yield from _coalesced(rng.tp, polls)
        done = True
    finally:
        if done:
            with _POOL_LOCK:
                _POOL.setdefault(key, []).append(consumer)
        else:
            # State unknown after an error or an abandoned read: never reuse it.
            consumer.close(autocommit=False)


#: Polls read ahead of the Arrow batches being handed to Spark (each at most one fetch of
#: ``max_partition_fetch_bytes``): bounds the memory a task holds.
_AHEAD = 2
_END = object()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _fetch_ahead(polls: Generator[RecordColumns, None, None], name: str) -> Iterator[RecordColumns]:
    """``polls`` run on a thread of their own, up to ``_AHEAD`` pieces ahead.

    The profile (docs/spark.md) showed the executor's one thread alternating between
    waiting for the next Fetch answer and handing the previous batch to the JVM. Here the
    consumer is polled (fetch answers applied, the next fetch sent, records decoded and
    their epochs checked, all inside ``_read_with``) while this thread builds and hands
    over batches. The consumer is only touched by the reading thread until it ends; an
    error there is raised here, in order, after the pieces read before it."""
    out: queue.Queue[Any] = queue.Queue(maxsize=_AHEAD)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for piece in polls:
                if not put(piece):
                    return
        except BaseException as exc:  # handed to the consuming thread, raised there
            put(_Failed(exc))
            return
        finally:
            polls.close()
        put(_END)

    reader = threading.Thread(target=run, name=f"epochguard-read-{name}", daemon=True)
    reader.start()
    try:
        while True:
            item = out.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        # Abandoned early (Spark stopped reading) or failed: stop the reader before the
        # caller decides whether the consumer can be reused.
        stop.set()
        reader.join()


def _coalesced(tp: TopicPartition, polls: Iterator[RecordColumns]) -> Iterator[pa.RecordBatch]:
    """Arrow batches of at least ``_BATCH_ROWS`` records (but the last), from the polls.

    A poll returns at most one fetch's worth per partition (about 1,000 records of 1 KB at
    the default 1 MiB): Spark pays per batch it takes from the Python worker, so small
    polls are joined before they cross.
    """
    pieces: list[RecordColumns] = []
    rows = size = 0
    for piece in polls:
        pieces.append(piece)
        rows += len(piece)
        size += piece.data_bytes()
        # Joining copies the data once: large values cross on their own.
        if rows >= _BATCH_ROWS or size >= _BATCH_BYTES:
            yield _column_batch(tp, pieces)
            pieces, rows, size = [], 0, 0
    if pieces:
        yield _column_batch(tp, pieces)


def _epoch_after_plan(
    tp: TopicPartition, offset: int, epoch: int, planned: int, end: int, where: str
) -> SparkLogTruncationError:
    return SparkLogTruncationError(
        f"topic {tp.topic} partition {tp.partition} ({tp.topic}-{tp.partition}): "
        f"divergence at or before offset {offset}: the record there has "
        f"leader epoch {epoch}, later than epoch {planned} "
        f"planned for this range, so the log was truncated and rewritten after "
        f"the batch was planned; lost range [{offset}, {end}) at most; {where}"
    )


def _piece(
    tp: TopicPartition,
    polled: Mapping[TopicPartition, RecordColumns],
    end: int,
    planned_epoch: int | None,
    where: str,
) -> RecordColumns | None:
    """``tp``'s part of one poll, cut at the planned end, its epochs checked against the
    plan: a record with a later epoch than planned means the log was rewritten."""
    cols = polled.get(tp)
    if not cols:
        return None
    if cols.offset_at(len(cols) - 1) >= end:
        cols = cols[: cols.rows_before(end)]
    if not cols:
        return None
    if planned_epoch is not None:
        for first, _last, epoch in cols.epoch_runs():
            if epoch > planned_epoch:
                offset = cols.offset_at(first)
                raise _epoch_after_plan(tp, offset, epoch, planned_epoch, end, where)
    return cols


#: What a read that skipped validating its start takes as a reason to validate it now:
#: each may come from a log truncated below the start since the range was planned.
_START_TROUBLE = (
    LogTruncationError,
    SparkLogTruncationError,
    OffsetOutOfRangeError,
    NoOffsetForPartitionError,
)


def _read_with(
    consumer: EpochConsumer, opts: SourceOptions, rng: OffsetRange
) -> Generator[RecordColumns, None, None]:
    tp, end = rng.tp, rng.end.offset
    planned_epoch = rng.end.leader_epoch
    where = f"while reading planned range [{rng.start}, {rng.end}) on an executor"
    consumer.assign([tp])
    # A range planned in one leader epoch starts where the driver found the log intact in
    # that epoch: it is fetched from at once (the topic id still checked), without an
    # OffsetForLeaderEpoch round trip. What changed since planning shows in the records
    # (an epoch later than planned), a fetch out of range or a log ending before the plan;
    # if any does before a record is handed over, the start is validated as any other
    # position, so the error is the one validation gives. Other ranges validate first.
    checked = not _in_leader_epoch(rng.start, rng.end)
    consumer.seek(
        tp, rng.start if checked else EpochOffset(rng.start.offset, topic_id=rng.start.topic_id)
    )
    handed_over = False
    position = rng.start.offset
    timeout = opts.poll_timeout_ms / 1000
    last_progress = time.monotonic()
    next_end_check = last_progress + _END_CHECK_INTERVAL
    while position < end:
        try:
            try:
                polled = consumer.poll_columns(timeout_ms=200)
                now_at = consumer.position(tp)
                piece = _piece(tp, polled, end, planned_epoch, where)
            except _START_TROUBLE:
                if checked or handed_over:
                    raise
                consumer.seek(tp, rng.start)  # validated before fetching
                checked, position = True, rng.start.offset
                continue
        except LogTruncationError as exc:
            report = exc.truncations.get(tp) or exc.report
            raise SparkLogTruncationError(truncation_message(report, where)) from exc
        except (OffsetOutOfRangeError, NoOffsetForPartitionError) as exc:
            if opts.fail_on_data_loss:
                raise SparkDataLossError(_data_loss(tp, f"{exc}; {where}")) from exc
            # failOnDataLoss=false, as Spark: skip what retention removed, read the rest.
            earliest = consumer.beginning_offsets([tp])[tp]
            log.warning(
                "kafka_data_loss",
                topic=tp.topic,
                partition=tp.partition,
                position=position,
                log_start=earliest,
                planned_end=end,
                reason=str(exc),
            )
            if earliest >= end or earliest <= position:
                return
            consumer.seek(tp, earliest)
            position = earliest
            continue
        if piece is not None:
            handed_over = True
            yield piece
        now = time.monotonic()
        if now_at > position:
            position, last_progress = now_at, now
        elif now >= next_end_check:
            # Stuck below the planned end: has the log lost the offsets we were promised?
            next_end_check = now + _END_CHECK_INTERVAL
            log_end = consumer.end_offsets([tp])[tp]
            if log_end <= position and not (checked or handed_over):
                consumer.seek(tp, rng.start)
                checked, position = True, rng.start.offset
                continue
            if log_end <= position:
                raise SparkLogTruncationError(
                    f"topic {tp.topic} partition {tp.partition} ({tp.topic}-{tp.partition}): "
                    f"divergence at or before offset {log_end}: the log now ends at "
                    f"{log_end}, before the planned end {end}; lost range [{log_end}, {end}) "
                    f"at most; {where}"
                )
            if now - last_progress > timeout:
                raise TimeoutError(
                    f"{tp.topic}-{tp.partition}: no progress for {opts.poll_timeout_ms} ms at "
                    f"offset {position} before the planned end {end} "
                    "(kafkaConsumer.pollTimeoutMs)"
                )


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
        driver = _Driver(self.opts)
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
            yield from read_range(self.opts, partition.range())


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
        self._driver: _Driver | None = None
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
    def driver(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self.opts)
        return self._driver

    def _load(self, offset: Mapping[str, Any], what: str) -> dict[TopicPartition, EpochOffset]:
        off = SourceOffset.from_json(offset)
        check_checkpoint(off, self.opts.strategy, what)
        return off.as_dict()

    @_user_facing_errors
    def initialOffset(self) -> dict[str, Any]:
        """Resolved once per reader: Spark asks twice for a query's first batch, for its
        plan and again for its start, and with ``latest`` or a timestamp two lookups could
        differ. Spark's own source also writes them to its checkpoint (``sources/0``), so a
        restart that replays the first batch starts where it was planned; a Python source
        is not given the checkpoint's location, so a restart before the first batch has
        committed resolves them again (docs/spark.md, "Status")."""
        if self._initial is None:
            tps = self.driver.partitions()
            self._initial = SourceOffset(self.driver.resolve(self.opts.starting, tps)).to_json()
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
        new = [tp for tp in stop if tp not in begin]
        if new:
            begin = {**self.driver.earliest(new), **begin}
        return _plan(self.opts, begin, stop)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, EpochRangePartition)
        with _user_facing():
            yield from read_range(self.opts, partition.range())

    @_user_facing_errors
    def commit(self, end: dict[str, Any]) -> None:
        """With ``commitToGroup``: the finished batch's end positions, epochs included, to
        the consumer group, so ``kafka-consumer-groups`` and lag tools see the query."""
        if not self.opts.commit_to_group:
            return
        if self._committer is None:
            kw = self.opts.consumer_kwargs()
            kw["group_id"] = self.opts.group_id
            self._committer = _connect(kw)
        self._committer.commit(self._load(end, "the committed batch's end offset"))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        if self._committer is not None:
            self._committer.close(autocommit=False)
            self._committer = None


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
            return _StreamReader(self._options(streaming=True))
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
