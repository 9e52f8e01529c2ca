"""The executors' side of the Spark source: ``read()`` of one planned range, as Arrow batches
filled from the C decoder's column buffers, on a pooled EpochConsumer.

Imported on the first ``read()`` in a Python worker, which then keeps it (and its pooled
consumers) for the tasks it runs after.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from typing import Any

import pyarrow as pa
from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.consumer import (
    EpochConsumer,
    LogTruncationError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)
from epochguard.consumer.columns import RecordColumns, header_type
from epochguard.offsets.position import EpochOffset
from epochguard.spark_connector.driver import connect, in_leader_epoch, truncation_message
from epochguard.spark_connector.errors import (
    SparkDataLossError,
    SparkLogTruncationError,
    data_loss_message,
)
from epochguard.spark_connector.options import SourceOptions
from epochguard.spark_connector.planning import OffsetRange

__all__ = ["ARROW_SCHEMA", "EXECUTOR_FETCH_BYTES", "EXECUTOR_FETCH_WAIT_MS", "read_range"]

log = get_logger("epochguard.spark_connector")

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


def read_range(
    opts: SourceOptions, rng: OffsetRange, reader: str = "an executor"
) -> Generator[pa.RecordBatch, None, None]:
    """Read ``rng`` exactly, as Arrow batches, checking the epochs the records carry
    (``reader``: where, for error messages)."""
    if rng.size <= 0:
        return
    kw = _executor_kwargs(opts)
    key = _pool_key(kw)
    with _POOL_LOCK:
        free = _POOL.get(key)
        consumer = free.pop() if free else None
    if consumer is None:
        consumer = connect(kw)
    done = False
    try:
        reads = _read_with(consumer, opts, rng, reader)
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
    consumer: EpochConsumer, opts: SourceOptions, rng: OffsetRange, reader: str
) -> Generator[RecordColumns, None, None]:
    tp, end = rng.tp, rng.end.offset
    planned_epoch = rng.end.leader_epoch
    where = f"while reading planned range [{rng.start}, {rng.end}) on {reader}"
    consumer.assign([tp])
    # A range planned in one leader epoch starts where the driver found the log intact in
    # that epoch: it is fetched from at once (the topic id still checked), without an
    # OffsetForLeaderEpoch round trip. What changed since planning shows in the records
    # (an epoch later than planned), a fetch out of range or a log ending before the plan;
    # if any does before a record is handed over, the start is validated as any other
    # position, so the error is the one validation gives. Other ranges validate first.
    checked = not in_leader_epoch(rng.start, rng.end)
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
                raise SparkDataLossError(data_loss_message(tp, f"{exc}; {where}")) from exc
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
