"""``EpochConsumer``: kafka-python's ``KafkaConsumer`` API, truncation-safe.

The threaded driver of the consumer engine (:mod:`epochguard.consumer.engine`): its calls
block the application's thread, connections are served by kafka-python's IO thread, and the
group heartbeats on a thread of their own. Everything the consumer decides is the engine's;
this class holds the public API, runs the engine's steps
(:func:`~epochguard.consumer.effects.run_blocking`) and owns what only threads have
(``commit_async``'s worker, the record iterator).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import MappingProxyType, TracebackType
from typing import Any, Literal, Self, cast, overload

import attrs
import kafka.errors as kerrors
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.future import Future as KafkaFuture
from kafka.structs import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)

from epochguard._log import get_logger
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.columns import RecordColumns
from epochguard.consumer.config import DEFAULT_CONFIG, build_config
from epochguard.consumer.effects import Step, run_blocking, spawn_thread
from epochguard.consumer.engine import (
    ConsumerEngine,
    IterCursor,
    ValidationResult,
    as_offsets_and_metadata,
    make_policy,
)
from epochguard.consumer.errors import ConsumerClosedError
from epochguard.consumer.inline import CallerThreadIO
from epochguard.consumer.records import ConsumerRecord, log_decoder_once
from epochguard.offsets.hanging import HangingTransaction
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.reopened import ReopenedTransaction
from epochguard.offsets.report import TruncationReport

__all__ = ["EpochConsumer", "ValidationResult"]

log = get_logger("epochguard.consumer")


class EpochConsumer:
    """A Kafka consumer that detects log truncation (KIP-320) instead of hiding it.

    Constructor takes kafka-python ``KafkaConsumer``'s keyword names (``bootstrap_servers``,
    ``group_id``, ``auto_offset_reset``, ...) plus ``on_truncation`` (``"auto"``,
    ``"raise"``, ``"rewind"`` or a callable), ``on_truncation_report`` (a callback receiving
    each :class:`TruncationReport`) and ``offset_store`` (an ``OffsetStore`` used instead
    of group commits). See the consumer guide (``docs/guides/consumer.md``).
    """

    #: Every configuration key and its default: kafka-python's ``KafkaConsumer.DEFAULT_CONFIG``
    #: keys plus the epochguard additions (``docs/reference/configuration.md``).
    DEFAULT_CONFIG: Mapping[str, Any] = MappingProxyType(DEFAULT_CONFIG)

    def __init__(self, *topics: str, **configs: Any) -> None:
        cfg = build_config(configs)
        policy = make_policy(cfg)
        self.config = cfg
        log_decoder_once()
        self._client = BrokerClient(cfg, io_thread=cfg["io_thread"])
        # Without the IO thread, the threads that wait in the consumer serve the connections.
        self._io = None if cfg["io_thread"] else CallerThreadIO(self._client)
        spawn = spawn_thread if self._io is None else self._io.spawn
        self._engine = ConsumerEngine(cfg, policy, self._client, spawn)
        self._engine.reads_only_in_effects = self._io is not None
        self._engine.before_commit = self._finish_async_commits
        self._engine.on_poll_round = self._run_commit_callbacks
        self._engine.iterator_reset = self._forget_iterator
        self._iterator: Iterator[ConsumerRecord] | None = None
        # commit_async: one worker keeps commits in the order they were made; callbacks run
        # on the application thread (in poll, commit or close), in that order too.
        self._commit_worker: ThreadPoolExecutor | None = None
        self._async_commits: deque[_AsyncCommit] = deque()
        try:
            self._run(self._client.bootstrap_step(cfg["bootstrap_timeout_ms"]))
        except Exception:
            self._close_client(1.0)
            raise
        if topics:
            self.subscribe(topics=list(topics))

    def _run(self, step: Step[Any]) -> Any:
        if self._io is not None:
            return self._io.run(step)
        return run_blocking(step)

    def _close_client(self, timeout_s: float) -> None:
        if self._io is None:
            self._client.close(timeout_s)
            return
        self._io.run(self._client.close_step(timeout_s))
        self._io.close()

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manually assign partitions (no group management)."""
        self._engine.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._engine.assignment()

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Subscribe to topics (or a regex ``pattern``): with a ``group_id`` through group
        management; without one, as kafka-python, every partition of those topics is
        assigned to this consumer (following metadata, no commits to a group)."""
        if listener is not None and not isinstance(listener, ConsumerRebalanceListener):
            raise TypeError("listener must be a kafka ConsumerRebalanceListener")
        self._engine.subscribe(topics, pattern, listener)

    def subscription(self) -> set[str] | None:
        return self._engine.subscription()

    def unsubscribe(self) -> None:
        """Drop the subscription and the assignment. As in kafka-python 3.0, positions are
        committed first (if auto commit) and the rebalance listener is not called."""
        self._run(self._engine.unsubscribe())

    # ------------------------------------------------------------------ polling

    def poll(
        self, timeout_ms: int = 0, max_records: int | None = None, update_offsets: bool = True
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Fetch records: ``{TopicPartition: [ConsumerRecord, ...]}``.

        Raises :class:`LogTruncationError` (policy ``"raise"``) once per detected truncation;
        those partitions stay stopped until :meth:`seek`, the others keep flowing.
        """
        self._engine._ensure_open()
        if not update_offsets:
            raise NotImplementedError("update_offsets=False is not supported")
        return cast(
            dict[TopicPartition, list[ConsumerRecord]],
            self._run(self._engine.poll(timeout_ms, max_records)),
        )

    def poll_columns(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, RecordColumns]:
        """:meth:`poll` for a consumer created with ``record_format="columns"``: each
        partition's records as one :class:`~epochguard.consumer.columns.RecordColumns`
        (column buffers, ``to_arrow()`` without copying). Positions, epochs and
        truncation checks are exactly :meth:`poll`'s."""
        return cast(
            dict[TopicPartition, RecordColumns],
            self._run(self._engine.poll(timeout_ms, max_records, columns=True)),
        )

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> ConsumerRecord:
        if self._engine.closed:
            raise StopIteration("the EpochConsumer is closed")
        if self._iterator is None:
            self._iterator = self._message_generator()
        try:
            return next(self._iterator)
        except BaseException:
            # A generator that raised is finished: keeping it would end the next ``for``
            # loop at once (after a LogTruncationError, say). The next call starts afresh.
            self._iterator = None
            raise

    def _forget_iterator(self) -> None:
        self._iterator = None

    def _message_generator(self) -> Iterator[ConsumerRecord]:
        engine = self._engine
        timeout = self.config["consumer_timeout_ms"]
        last = time.monotonic()
        while True:
            engine.iter_capture = {}
            try:
                batch = self.poll(timeout_ms=200)
            finally:
                before, engine.iter_capture = engine.iter_capture, None
            if batch:
                cursor = IterCursor(list(batch.items()), before or {})
                engine.iter_cursor = cursor
                for k, (_tp, records) in enumerate(cursor.items):
                    cursor.k = k
                    for i, record in enumerate(records):
                        cursor.i = i
                        yield record
                engine.iter_cursor = None
                # As kafka-python, consumer_timeout_ms counts from when the application asks
                # for the next record, not from the batch's arrival (its processing time).
                last = time.monotonic()
            elif (time.monotonic() - last) * 1000 >= timeout:
                return

    # ------------------------------------------------------------------ positions

    def seek(
        self, partition: TopicPartition, offset: int | EpochOffset | OffsetAndMetadata
    ) -> None:
        """Move the position. With an epoch (``EpochOffset`` or ``OffsetAndMetadata`` with a
        ``leader_epoch``) the position is validated before fetching from it."""
        self._engine.seek(partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._engine.seek_to_beginning(*partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._engine.seek_to_end(*partitions)

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record to be returned (waits for a validated position).

        Raises ``UnknownTopicOrPartitionError`` as soon as metadata says the partition does
        not exist, and ``KafkaTimeoutError`` if no position is known within ``timeout_ms``
        (default ``request_timeout_ms``)."""
        position: EpochOffset = self._run(self._engine.position_with_epoch(partition, timeout_ms))
        return position.offset

    def position_with_epoch(
        self, partition: TopicPartition, timeout_ms: int | None = None
    ) -> EpochOffset:
        """Like :meth:`position`, with the leader epoch of the record before it."""
        return cast(EpochOffset, self._run(self._engine.position_with_epoch(partition, timeout_ms)))

    def highwater(self, partition: TopicPartition) -> int | None:
        """The high watermark from the last fetch answer for ``partition`` (``None`` before
        the first one), as kafka-python: compare with :meth:`position` for the lag."""
        return self._engine.highwater(partition)

    @overload
    def committed(
        self,
        partition: TopicPartition,
        metadata: Literal[False] = False,
        timeout_ms: int | None = None,
    ) -> int | None: ...

    @overload
    def committed(
        self, partition: TopicPartition, metadata: Literal[True], timeout_ms: int | None = None
    ) -> OffsetAndMetadata | None: ...

    @overload
    def committed(
        self, partition: TopicPartition, metadata: bool = False, timeout_ms: int | None = None
    ) -> int | OffsetAndMetadata | None: ...

    def committed(
        self, partition: TopicPartition, metadata: bool = False, timeout_ms: int | None = None
    ) -> int | OffsetAndMetadata | None:
        """The last committed offset (an int, like :meth:`position`), or ``None``.

        With ``metadata=True``: kafka's ``OffsetAndMetadata(offset, metadata, leader_epoch)``
        with the stored metadata string and the committed leader epoch (-1 if none). For the
        position as an :class:`EpochOffset` use :meth:`committed_with_epoch`."""
        got = self._run(self._engine.committed(partition, timeout_ms))
        if got is None:
            return None
        pos, meta = got
        if metadata:
            return OffsetAndMetadata(pos.offset, meta, pos.wire_epoch)
        return cast(int, pos.offset)

    def committed_with_epoch(
        self, partition: TopicPartition, timeout_ms: int | None = None
    ) -> EpochOffset | None:
        """Like :meth:`committed`, as the :class:`EpochOffset` a restart resumes from (what
        :meth:`seek` accepts), or ``None`` if nothing was committed."""
        got = self._run(self._engine.committed(partition, timeout_ms))
        return None if got is None else cast(EpochOffset, got[0])

    def commit(
        self, offsets: Mapping[TopicPartition, Any] | None = None, timeout_ms: int | None = None
    ) -> None:
        """Commit positions (default: the current ones) with their leader epochs.

        Commits made earlier with :meth:`commit_async` complete first (their callbacks run
        before this returns), so a synchronous commit is never overtaken by an older one.
        ``timeout_ms`` (default ``request_timeout_ms``) bounds the whole call."""
        self._run(self._engine.commit(offsets, timeout_ms))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, Any] | None = None,
        callback: Callable[[Any, Any], Any] | None = None,
    ) -> KafkaFuture:
        """Commit without waiting for the coordinator's answer.

        The positions (default: the current ones, with their epochs) are taken now. Returns
        kafka-python's ``kafka.future.Future``: it succeeds with ``None`` (as kafka-python's)
        or fails with the commit's error; ``add_callback``/``add_errback`` run on the thread
        that completes it. ``callback(offsets, exception_or_None)`` (default:
        ``default_offset_commit_callback``) runs on the caller's thread during a later
        :meth:`poll`, :meth:`commit` or :meth:`close`. Commits complete in call order; a
        failed one is not retried (a later commit supersedes it), as in kafka-python and Java.
        """
        self._engine._ensure_open()
        norm = self._engine.normalise_offsets(offsets)
        done = self.config["default_offset_commit_callback"] if callback is None else callback
        committed = as_offsets_and_metadata(norm)
        result = KafkaFuture()
        future: Future[None]
        if self._engine.store is not None or not norm:
            # Offset stores are local (and SQLite connections belong to their thread).
            future = Future()
            try:
                if norm and self._engine.store is not None:
                    self._engine.store.save({tp: pos for tp, (pos, _m) in norm.items()})
            except Exception as exc:
                future.set_exception(exc)
                result.failure(exc)
            else:
                future.set_result(None)
                result.success(None)
        else:
            if self._engine.group is None:
                raise kerrors.IllegalStateError(
                    "commit_async() needs a group_id or an offset_store"
                )
            group, deadline = (
                self._engine.group,
                time.monotonic() + self._engine.request_timeout_s(),
            )

            def send() -> None:
                try:
                    self._run(group.commit(norm, deadline))
                except Exception as exc:
                    result.failure(exc)
                    raise
                result.success(None)

            if self._commit_worker is None:
                self._commit_worker = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="epochguard-commit"
                )
            future = self._commit_worker.submit(send)
        self._async_commits.append(_AsyncCommit(future, result, committed, done))
        return result

    def _run_commit_callbacks(self) -> None:
        """Callbacks of finished async commits, oldest first, stopping at an unfinished one."""
        while self._async_commits and self._async_commits[0].future.done():
            pending = self._async_commits.popleft()
            error = pending.future.exception()
            if error is not None:
                log.warning(
                    "commit_async_failed",
                    error=repr(error),
                    offsets={str(tp): o.offset for tp, o in pending.offsets.items()},
                )
            if pending.callback is not None:
                pending.callback(pending.offsets, error)

    def _finish_async_commits(self, deadline: float) -> None:
        """Wait (until ``deadline``) for every async commit made so far; run the callbacks."""
        for pending in list(self._async_commits):
            try:
                pending.future.exception(max(0.0, deadline - time.monotonic()))
            except FutureTimeoutError:
                break
        self._run_commit_callbacks()

    # ------------------------------------------------------------------ pause/resume

    def pause(self, *partitions: TopicPartition) -> None:
        self._engine.pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._engine.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return self._engine.paused()

    # ------------------------------------------------------------------ offsets lookup

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        return cast(
            dict[TopicPartition, int],
            self._run(self._engine.beginning_offsets(partitions, timeout_ms)),
        )

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        return cast(
            dict[TopicPartition, int], self._run(self._engine.end_offsets(partitions, timeout_ms))
        )

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Earliest offset with timestamp >= the given one, with its leader epoch (kafka's
        ``OffsetAndTimestamp(offset, timestamp, leader_epoch)``); ``None`` if none."""
        return cast(
            dict[TopicPartition, OffsetAndTimestamp | None],
            self._run(self._engine.offsets_for_times(timestamps, timeout_ms)),
        )

    def validate_offsets(
        self, offsets: Mapping[TopicPartition, EpochOffset], timeout_ms: int | None = None
    ) -> dict[TopicPartition, ValidationResult]:
        """Check positions kept outside Kafka against the leaders' logs, without assigning
        anything: one :class:`ValidationResult` per partition."""
        return cast(
            dict[TopicPartition, ValidationResult],
            self._run(self._engine.validate_offsets(offsets, timeout_ms)),
        )

    # ------------------------------------------------------------------ metadata

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition ids; ``set()`` if the topic does not exist (kafka-python)."""
        return cast(set[int], self._run(self._engine.partitions_for_topic(topic)))

    def topics(self) -> set[str]:
        return cast(set[str], self._run(self._engine.topics()))

    def metrics(self, raw: bool = False) -> dict[str, Any] | None:
        """Counters, shaped as kafka-python's: ``{group: {name: value}}``; ``None`` when
        ``metrics_enabled=False``.

        Groups: ``consumer-fetch-manager-metrics`` and ``consumer-coordinator-metrics`` with
        kafka-style names for what both clients count, ``epochguard-metrics`` with every
        epochguard counter (truncations, records lost, validations, partitions awaiting a
        seek, ...). ``raw=True`` returns the epochguard counters as one flat
        ``{name: value}`` dict (kafka-python returns its internal metric objects there)."""
        return self._engine.metrics(raw)

    def bootstrap_connected(self) -> bool:
        """kafka-python 3.0's meaning: a bootstrap is in progress. ``EpochConsumer``
        bootstraps in its constructor, so this is ``False`` unless :meth:`bootstrap` with
        ``refresh=True`` is running on another thread."""
        fut = getattr(self._client.manager, "_bootstrap_future", None)
        return fut is not None and not fut.is_done

    def bootstrap(self, timeout_ms: int | None = None, refresh: bool = False) -> None:
        """Block until cluster metadata is bootstrapped (done by the constructor already);
        ``refresh=True`` bootstraps again. ``timeout_ms`` defaults to
        ``bootstrap_timeout_ms``; raises ``KafkaTimeoutError`` when it passes."""
        self._engine._ensure_open()
        if refresh:
            timeout = self.config["bootstrap_timeout_ms"] if timeout_ms is None else timeout_ms
            self._run(self._client.bootstrap_step(timeout))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """A snapshot of the group membership (kafka's ``ConsumerGroupMetadata``), e.g. for
        ``KafkaProducer.send_offsets_to_transaction``; ``group_id=None`` without a group."""
        return self._engine.group_metadata()

    def truncation_reports(self) -> list[TruncationReport]:
        """Every truncation report seen so far (oldest first)."""
        return self._engine.truncation_reports()

    def hanging_transactions(self) -> list[HangingTransaction]:
        """Every hanging transaction reported so far (read_committed only; oldest first)."""
        return self._engine.hanging_transactions()

    def reopened_transactions(self) -> list[ReopenedTransaction]:
        """Every transaction reported reopened by a truncation, or decided again otherwise
        than this consumer read it (read_committed only; oldest first)."""
        return self._engine.reopened_transactions()

    # ------------------------------------------------------------------ closing

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        """Commit (if auto commit), leave the group and close connections. Bounded by
        ``timeout_ms`` (default ``close_timeout_ms``) even when every broker is down."""
        engine = self._engine
        if engine.closed:
            return
        engine.closed = True
        timeout = (self.config["close_timeout_ms"] if timeout_ms is None else timeout_ms) / 1000
        deadline = time.monotonic() + timeout
        try:
            self._finish_async_commits(time.monotonic() + timeout / 2)
        except Exception as exc:
            log.warning("close_commit_callback_failed", error=repr(exc))
        if self._commit_worker is not None:
            # A commit still waiting for its coordinator fails when the client closes.
            self._commit_worker.shutdown(wait=False, cancel_futures=True)
        for pending in self._async_commits:
            if pending.future.cancelled() and not pending.result.is_done:
                pending.result.failure(ConsumerClosedError("closed before the commit was sent"))
        self._run(engine.close(autocommit, deadline))
        self._close_client(max(0.2, deadline - time.monotonic()))
        engine.close_deserializers()
        log.debug("consumer_closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        # As kafka-python: a ``with`` block left by an exception does not commit, since the
        # record being processed may not be done.
        self.close(autocommit=exc_type is None)


@attrs.frozen
class _AsyncCommit:
    future: Future[None]
    result: KafkaFuture
    offsets: dict[TopicPartition, OffsetAndMetadata]
    callback: Callable[[Any, Any], Any] | None
