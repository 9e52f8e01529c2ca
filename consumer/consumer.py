"""``EpochConsumer``: kafka-python's ``KafkaConsumer`` API, truncation-safe.

Every position carries the leader epoch of the record before it. Positions are validated
with the partition leader (Fetch v12 ``DivergingEpoch`` or OffsetForLeaderEpoch) whenever
the leader or its epoch changes, a fetch is fenced, or a position is restored (committed
offsets, an offset store, ``seek`` with an epoch). The decisions are made by
:class:`epochguard.offsets.state.PartitionTracker`; this class is the I/O driver.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import TracebackType
from typing import Any, Self

import attrs
import kafka.errors as kerrors
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition

from epochguard._log import get_logger
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.config import build_config
from epochguard.consumer.errors import (
    ConsumerClosedError,
    ConsumerConfigError,
    LogTruncationError,
    as_consumer_error,
)
from epochguard.consumer.fetcher import Fetcher
from epochguard.consumer.group import GroupCoordinator
from epochguard.consumer.records import ConsumerRecord, as_deserializer, log_decoder_once
from epochguard.offsets.errors import EpochGuardError, InvalidPolicyError
from epochguard.offsets.events import Event, NoValidOffset, TruncationDetected
from epochguard.offsets.policy import OffsetPolicy, RetryBackoff
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.offsets.state import PartitionState, PartitionTracker

__all__ = ["EpochConsumer", "ValidationResult"]

log = get_logger("epochguard.consumer")

_STOPPED = (PartitionState.TRUNCATED, PartitionState.NO_VALID_OFFSET)


@attrs.frozen
class ValidationResult:
    """The answer of :meth:`EpochConsumer.validate_offsets` for one partition.

    ``valid``: the position exists in the leader's log as it was read. Otherwise
    ``report`` says what was truncated (``report.divergence`` is where to resume), or
    ``error`` names why no judgement was possible (e.g. the position is below the log start).
    """

    tp: TopicPartition
    position: EpochOffset
    valid: bool
    report: TruncationReport | None = None
    error: str | None = None
    #: The position to resume from: ``position`` if valid, else the divergence point.
    safe_position: EpochOffset | None = None


class EpochConsumer:
    """A Kafka consumer that detects log truncation (KIP-320) instead of hiding it.

    Constructor takes kafka-python ``KafkaConsumer``'s keyword names (``bootstrap_servers``,
    ``group_id``, ``auto_offset_reset``, ...) plus ``on_truncation`` (``"auto"``,
    ``"raise"``, ``"rewind"`` or a callable), ``on_truncation_report`` (a callback receiving
    each :class:`TruncationReport`) and ``offset_store`` (an ``OffsetStore`` used instead
    of group commits). See ``docs/consumer.md``.
    """

    def __init__(self, *topics: str, **configs: Any) -> None:
        cfg = build_config(configs)
        try:
            self._policy = OffsetPolicy(
                auto_offset_reset=cfg["auto_offset_reset"],
                on_truncation=cfg["on_truncation"],
                retry_backoff=RetryBackoff(
                    initial=cfg["retry_backoff_ms"] / 1000,
                    maximum=max(cfg["retry_backoff_ms"], 1000) / 1000,
                ),
            )
        except InvalidPolicyError as exc:
            raise ConsumerConfigError("on_truncation", str(exc)) from exc
        self.config = cfg
        self._closed = False
        log_decoder_once()
        self._client = BrokerClient(cfg)
        self._fetcher = Fetcher(
            self._client,
            cfg,
            self._policy,
            as_deserializer(cfg["key_deserializer"]),
            as_deserializer(cfg["value_deserializer"]),
            self._on_event,
        )
        self._store = cfg["offset_store"]
        self._group: GroupCoordinator | None = (
            GroupCoordinator(self._client, cfg) if cfg["group_id"] is not None else None
        )
        self._assigned: list[TopicPartition] = []
        self._manual = False
        self._subscription: set[str] | None = None
        self._pattern: re.Pattern[str] | None = None
        self._listener: ConsumerRebalanceListener | None = None
        self._paused: set[TopicPartition] = set()
        self._pending_truncations: dict[TopicPartition, TruncationReport] = {}
        self._pending_errors: dict[TopicPartition, EpochGuardError] = {}
        self._restored: set[TopicPartition] = set()
        self._next_auto_commit = time.monotonic() + cfg["auto_commit_interval_ms"] / 1000
        self._iterator: Iterator[ConsumerRecord] | None = None
        self._report_callback: Callable[[TruncationReport], Any] | None = cfg[
            "on_truncation_report"
        ]
        self._truncation_reports: list[TruncationReport] = []
        # commit_async: one worker keeps commits in the order they were made; callbacks run
        # on the application's thread (in poll, commit or close), in that order too.
        self._commit_worker: ThreadPoolExecutor | None = None
        self._async_commits: deque[_AsyncCommit] = deque()
        try:
            self._client.bootstrap(cfg["bootstrap_timeout_ms"])
        except Exception:
            self._client.close(1.0)
            raise
        if topics:
            self.subscribe(topics=list(topics))

    # ------------------------------------------------------------------ helpers

    def _ensure_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("the EpochConsumer is closed")

    def _timeout(self) -> float:
        return float(self.config["request_timeout_ms"]) / 1000

    def _on_event(self, event: Event) -> None:
        if isinstance(event, TruncationDetected):
            report = event.report
            self._truncation_reports.append(report)
            log.warning("truncation_detected", **event.to_dict())
            if event.decision == "raise":
                self._pending_truncations[report.tp] = report
            if self._report_callback is not None:
                self._report_callback(report)
            return
        if isinstance(event, NoValidOffset):
            tracker = self._fetcher.trackers.get(event.tp)
            if tracker is not None and tracker.error is not None:
                self._pending_errors[event.tp] = tracker.error
            log.warning(event.name, **event.to_dict())
            return
        name = getattr(event, "name", "tracker_event")
        to_dict = getattr(event, "to_dict", None)
        log.debug(name, **(to_dict() if to_dict is not None else {}))

    def _tracker(self, tp: TopicPartition) -> PartitionTracker:
        tracker = self._fetcher.trackers.get(tp)
        if tracker is None:
            raise kerrors.IllegalStateError(f"partition {tp} is not assigned to this consumer")
        return tracker

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manually assign partitions (no group management)."""
        self._ensure_open()
        if self._subscription is not None:
            raise kerrors.IllegalStateError("assign() after subscribe(): call unsubscribe()")
        parts = list(dict.fromkeys(partitions))
        self._manual = True
        self._set_assignment(parts)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def _set_assignment(self, parts: list[TopicPartition]) -> None:
        for tp in list(self._fetcher.trackers):
            if tp not in parts:
                self._fetcher.remove_partition(tp)
                self._paused.discard(tp)
                self._pending_truncations.pop(tp, None)
                self._pending_errors.pop(tp, None)
                self._restored.discard(tp)
        for tp in parts:
            self._fetcher.add_partition(tp)
        self._assigned = parts

    def _restore_positions(self, deadline: float) -> None:
        """Give every new partition its starting position: committed offset (with epoch,
        validated before the first fetch), the offset store's, or the reset policy."""
        todo = [tp for tp in self._assigned if tp not in self._restored]
        if not todo:
            return
        stored: Mapping[TopicPartition, EpochOffset | None]
        source = "committed"
        if self._store is not None:
            stored = self._store.load()
            source = "offset_store"
        elif self._group is not None:
            try:
                stored = self._group.fetch_committed(todo, deadline)
            except kerrors.KafkaError as exc:
                # No coordinator answer in time: stay without a position, try next poll().
                log.debug(
                    "committed_offsets_unavailable", group=self._group.group_id, error=repr(exc)
                )
                return
        else:
            stored = {}
        for tp in todo:
            tracker = self._fetcher.trackers[tp]
            if tracker.state is PartitionState.INITIALIZING:
                tracker.restore(stored.get(tp), source=source)
                self._fetcher.after_input(tp)
            self._restored.add(tp)

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Subscribe to topics (or a regex ``pattern``) with group management."""
        self._ensure_open()
        if self._manual:
            raise kerrors.IllegalStateError("subscribe() after assign(): call unsubscribe()")
        if self._group is None:
            raise ConsumerConfigError("group_id", "subscribe() needs a group_id")
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        if (not topic_list) == (pattern is None):
            raise kerrors.IllegalStateError("subscribe() needs topics or a pattern, not both")
        if listener is not None and not isinstance(listener, ConsumerRebalanceListener):
            raise TypeError("listener must be a kafka ConsumerRebalanceListener")
        self._listener = listener
        if pattern is not None:
            self._pattern = re.compile(pattern)
            self._subscription = set()
            self._fetcher.want_all_topics(True)
        else:
            self._pattern = None
            self._subscription = set(topic_list)
            self._fetcher.metadata_topics.update(topic_list)
            self._fetcher.request_metadata()
        self._group.rejoin_needed = True

    def subscription(self) -> set[str] | None:
        return None if self._subscription is None else set(self._subscription)

    def unsubscribe(self) -> None:
        self._ensure_open()
        if self._group is not None and self._subscription is not None:
            self._revoke(commit=self.config["enable_auto_commit"])
            self._group.leave("unsubscribed")
        self._subscription = None
        self._pattern = None
        self._manual = False
        self._fetcher.want_all_topics(False)
        self._set_assignment([])

    def _update_pattern(self) -> None:
        if self._pattern is None or self._fetcher.all_topics is None:
            return
        matched = {t for t in self._fetcher.all_topics if self._pattern.match(t)}
        if matched != self._subscription:
            self._subscription = matched
            self._fetcher.metadata_topics.update(matched)
            if self._group is not None:
                self._group.rejoin_needed = True

    def _revoke(self, commit: bool) -> None:
        if not self._assigned:
            return
        if commit:
            try:
                self.commit()
            except kerrors.KafkaError as exc:
                log.warning("commit_on_revoke_failed", error=repr(exc))
        if self._listener is not None:
            self._listener.on_partitions_revoked(set(self._assigned))
        self._set_assignment([])

    def _metadata_for(self, topics: set[str], deadline: float) -> dict[str, set[int]]:
        self._fetcher.metadata_topics.update(topics)
        self._fetcher.request_metadata()
        start = time.monotonic()

        def answered() -> bool:
            if not self._fetcher.metadata_fresh_since(start):
                return False
            known = all(t in self._fetcher.topic_partitions for t in topics)
            return known or time.monotonic() - start > 1.0

        self._fetcher.pump_until(answered, deadline)
        return {
            t: self._fetcher.topic_partitions[t]
            for t in topics
            if t in self._fetcher.topic_partitions
        }

    def _ensure_group(self, deadline: float) -> None:
        group = self._group
        if group is None or self._subscription is None:
            return
        group.polled()
        self._update_pattern()
        if not group.rejoin_needed:
            return
        if not self._subscription:
            return
        self._revoke(commit=self.config["enable_auto_commit"])
        now = time.monotonic()
        join_deadline = max(deadline, now + self.config["max_poll_interval_ms"] / 1000 + 5)
        try:
            parts = group.join(
                set(self._subscription),
                self._metadata_for,
                join_deadline,
                lookup_deadline=max(deadline, now + 0.05),
            )
        except kerrors.KafkaTimeoutError as exc:
            log.debug("group_join_deferred", group=group.group_id, error=repr(exc))
            return
        self._set_assignment(parts)
        self._restore_positions(join_deadline)
        if self._listener is not None:
            self._listener.on_partitions_assigned(set(parts))

    # ------------------------------------------------------------------ polling

    def poll(
        self, timeout_ms: int = 0, max_records: int | None = None, update_offsets: bool = True
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Fetch records: ``{TopicPartition: [ConsumerRecord, ...]}``.

        Raises :class:`LogTruncationError` (policy ``"raise"``) once per detected truncation;
        those partitions stay stopped until :meth:`seek`, the others keep flowing.
        """
        self._ensure_open()
        if not update_offsets:
            raise NotImplementedError("update_offsets=False is not supported")
        if max_records is None:
            max_records = self.config["max_poll_records"]
        if max_records < 1:
            raise ValueError("max_records must be positive")
        if not self._assigned and self._subscription is None:
            raise kerrors.IllegalStateError("no partitions assigned and no subscription")
        fetcher = self._fetcher
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._ensure_group(deadline)
            # Bounded by the poll timeout (at least one round trip): with the coordinator
            # down, poll() still returns on time and the next one tries again.
            self._restore_positions(max(deadline, time.monotonic() + 1.0))
            self._maybe_auto_commit()
            self._run_commit_callbacks()
            fetcher.process_completions()
            self._raise_pending()
            records = fetcher.fetched_records(max_records, self._eligible)
            now = time.monotonic()
            wake_at = fetcher.send_requests(now)
            if records:
                return records
            if now >= deadline:
                return {}
            fetcher.wait(min(deadline, wake_at) - now)

    def _eligible(self, tp: TopicPartition) -> bool:
        return tp not in self._paused

    def _raise_pending(self) -> None:
        if self._pending_truncations:
            truncations, self._pending_truncations = self._pending_truncations, {}
            raise LogTruncationError(truncations)
        if self._pending_errors:
            tp, error = next(iter(self._pending_errors.items()))
            del self._pending_errors[tp]
            raise as_consumer_error(error)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> ConsumerRecord:
        self._ensure_open()
        if self._iterator is None:
            self._iterator = self._message_generator()
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = None
            raise

    def _message_generator(self) -> Iterator[ConsumerRecord]:
        timeout = self.config["consumer_timeout_ms"]
        last = time.monotonic()
        while True:
            batch = self.poll(timeout_ms=200)
            if batch:
                last = time.monotonic()
                for records in batch.values():
                    yield from records
            elif (time.monotonic() - last) * 1000 >= timeout:
                return

    # ------------------------------------------------------------------ positions

    def seek(
        self, partition: TopicPartition, offset: int | EpochOffset | OffsetAndMetadata
    ) -> None:
        """Move the position. With an epoch (``EpochOffset`` or ``OffsetAndMetadata`` with a
        ``leader_epoch``) the position is validated before fetching from it."""
        self._ensure_open()
        tracker = self._tracker(partition)
        position: EpochOffset | int
        if isinstance(offset, OffsetAndMetadata):
            epoch = offset.leader_epoch
            position = EpochOffset(
                offset.offset, epoch if epoch is not None and epoch >= 0 else None
            )
        elif isinstance(offset, EpochOffset) or (
            isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0
        ):
            position = offset
        else:
            raise ValueError(f"seek needs an offset >= 0 or an EpochOffset, got {offset!r}")
        tracker.seek(position)
        self._restored.add(partition)
        self._pending_truncations.pop(partition, None)
        self._pending_errors.pop(partition, None)
        self._fetcher.drop_buffer(partition)
        self._fetcher.after_input(partition)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_reset(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_reset(partitions, "latest")

    def _seek_reset(self, partitions: tuple[TopicPartition, ...], strategy: str) -> None:
        self._ensure_open()
        for tp in partitions or tuple(self._assigned):
            tracker = self._tracker(tp)
            tracker.request_reset(strategy, reason=f"seek_to_{strategy}")
            self._restored.add(tp)
            self._pending_truncations.pop(tp, None)
            self._pending_errors.pop(tp, None)
            self._fetcher.drop_buffer(tp)
            self._fetcher.after_input(tp)

    def _wait_position(self, tp: TopicPartition, timeout_ms: int | None) -> EpochOffset:
        tracker = self._tracker(tp)
        timeout = self._timeout() if timeout_ms is None else timeout_ms / 1000
        deadline = time.monotonic() + timeout

        def settled() -> bool:
            # Restoring (committed offsets) is part of getting a position: keep at it.
            self._restore_positions(deadline)
            self._fetcher.process_completions()
            if tracker.state is PartitionState.FETCHING and tracker.position is not None:
                return True
            return tracker.state in _STOPPED and tracker.error is not None

        if not self._fetcher.pump_until(settled, deadline):
            raise kerrors.KafkaTimeoutError(f"no valid position for {tp} within {timeout}s")
        if tracker.state is PartitionState.FETCHING and tracker.position is not None:
            return tracker.position
        assert tracker.error is not None
        raise as_consumer_error(tracker.error)

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record to be returned (waits for a validated position)."""
        self._ensure_open()
        return self._wait_position(partition, timeout_ms).offset

    def position_with_epoch(
        self, partition: TopicPartition, timeout_ms: int | None = None
    ) -> EpochOffset:
        """Like :meth:`position`, with the leader epoch of the record before it."""
        self._ensure_open()
        return self._wait_position(partition, timeout_ms)

    def committed(
        self, partition: TopicPartition, metadata: bool = False, timeout_ms: int | None = None
    ) -> EpochOffset | None:
        """The last committed position (offset and committed leader epoch), or ``None``."""
        self._ensure_open()
        deadline = time.monotonic() + (self._timeout() if timeout_ms is None else timeout_ms / 1000)
        if self._store is not None:
            return self._store.load().get(partition)  # type: ignore[no-any-return]
        if self._group is None:
            raise kerrors.IllegalStateError("committed() needs a group_id or an offset_store")
        return self._group.fetch_committed([partition], deadline).get(partition)

    def _current_positions(self) -> dict[TopicPartition, EpochOffset]:
        out = {}
        for tp in self._assigned:
            tracker = self._fetcher.trackers.get(tp)
            if tracker is not None and tracker.state is PartitionState.FETCHING:
                pos = tracker.position
                if pos is not None:
                    out[tp] = pos
        return out

    def _normalise_offsets(
        self, offsets: Mapping[TopicPartition, Any] | None
    ) -> dict[TopicPartition, tuple[EpochOffset, str]]:
        if offsets is None:
            return {tp: (pos, "") for tp, pos in self._current_positions().items()}
        out: dict[TopicPartition, tuple[EpochOffset, str]] = {}
        for tp, value in offsets.items():
            if isinstance(value, EpochOffset):
                out[tp] = (value, "")
            elif isinstance(value, OffsetAndMetadata):
                epoch = value.leader_epoch if value.leader_epoch is not None else -1
                out[tp] = (
                    EpochOffset(value.offset, epoch if epoch >= 0 else None),
                    value.metadata or "",
                )
            elif isinstance(value, int) and not isinstance(value, bool):
                out[tp] = (EpochOffset(value), "")
            else:
                raise TypeError(f"cannot commit {value!r} for {tp}")
        return out

    def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit positions (default: the current ones) with their leader epochs.

        Commits made earlier with :meth:`commit_async` complete first (their callbacks run
        before this returns), so a synchronous commit is never overtaken by an older one."""
        self._ensure_open()
        norm = self._normalise_offsets(offsets)
        self._finish_async_commits(time.monotonic() + self._timeout())
        if not norm:
            return
        if self._store is not None:
            self._store.save({tp: pos for tp, (pos, _m) in norm.items()})
            return
        if self._group is None:
            raise kerrors.IllegalStateError("commit() needs a group_id or an offset_store")
        self._group.commit(norm, time.monotonic() + self._timeout())
        cb = self.config["default_offset_commit_callback"]
        if cb is not None:
            cb(_as_offsets_and_metadata(norm), None)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, Any] | None = None,
        callback: Callable[[Any, Any], Any] | None = None,
    ) -> Future[dict[TopicPartition, OffsetAndMetadata]]:
        """Commit without waiting for the coordinator's answer.

        The positions (default: the current ones, with their epochs) are taken now. The
        returned future completes with the committed ``{tp: OffsetAndMetadata}`` or fails
        with the commit's error; ``callback(offsets, exception_or_None)`` (default:
        ``default_offset_commit_callback``) runs on the caller's thread during a later
        :meth:`poll`, :meth:`commit` or :meth:`close`. Commits complete in call order; a
        failed one is not retried (a later commit supersedes it), as in kafka-python and Java.
        """
        self._ensure_open()
        norm = self._normalise_offsets(offsets)
        done = self.config["default_offset_commit_callback"] if callback is None else callback
        committed = _as_offsets_and_metadata(norm)
        if self._store is not None or not norm:
            # Offset stores are local (and SQLite connections belong to their thread).
            future: Future[dict[TopicPartition, OffsetAndMetadata]] = Future()
            try:
                if norm and self._store is not None:
                    self._store.save({tp: pos for tp, (pos, _m) in norm.items()})
                future.set_result(committed)
            except Exception as exc:
                future.set_exception(exc)
        else:
            if self._group is None:
                raise kerrors.IllegalStateError(
                    "commit_async() needs a group_id or an offset_store"
                )
            group, deadline = self._group, time.monotonic() + self._timeout()

            def send() -> dict[TopicPartition, OffsetAndMetadata]:
                group.commit(norm, deadline)
                return committed

            if self._commit_worker is None:
                self._commit_worker = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="epochguard-commit"
                )
            future = self._commit_worker.submit(send)
        self._async_commits.append(_AsyncCommit(future, committed, done))
        return future

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

    def _maybe_auto_commit(self) -> None:
        if not self.config["enable_auto_commit"] or (self._group is None and self._store is None):
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config["auto_commit_interval_ms"] / 1000
        try:
            self.commit()
        except kerrors.KafkaError as exc:
            log.warning("auto_commit_failed", error=repr(exc))

    # ------------------------------------------------------------------ pause/resume

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._tracker(tp).pause()
            self._paused.add(tp)
            self._fetcher.after_input(tp)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._tracker(tp).resume()
            self._paused.discard(tp)
            self._fetcher.after_input(tp)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    # ------------------------------------------------------------------ offsets lookup

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        res = self._list(partitions, -2, timeout_ms)
        return {tp: v[0] for tp, v in res.items()}

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        res = self._list(partitions, -1, timeout_ms)
        return {tp: v[0] for tp, v in res.items()}

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Earliest offset with timestamp >= the given one, with its leader epoch (kafka's
        ``OffsetAndTimestamp(offset, timestamp, leader_epoch)``); ``None`` if none."""
        self._ensure_open()
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0, got {ts}")
        timeout = self._timeout() if timeout_ms is None else timeout_ms / 1000
        res = self._fetcher.list_offsets(dict(timestamps), timeout)
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp in timestamps:
            offset, epoch, ts = res[tp]
            out[tp] = (
                None
                if offset < 0
                else OffsetAndTimestamp(offset, ts, -1 if epoch is None else epoch)
            )
        return out

    def _list(
        self, partitions: Iterable[TopicPartition], ts: int, timeout_ms: int | None
    ) -> dict[TopicPartition, tuple[int, int | None, int]]:
        self._ensure_open()
        timeout = self._timeout() if timeout_ms is None else timeout_ms / 1000
        return self._fetcher.list_offsets({tp: ts for tp in partitions}, timeout)

    # ------------------------------------------------------------------ validation

    def validate_offsets(
        self, offsets: Mapping[TopicPartition, EpochOffset], timeout_ms: int | None = None
    ) -> dict[TopicPartition, ValidationResult]:
        """Check positions kept outside Kafka against the leaders' logs, without assigning
        anything: one :class:`ValidationResult` per partition."""
        self._ensure_open()
        timeout = self._timeout() if timeout_ms is None else timeout_ms / 1000
        deadline = time.monotonic() + timeout
        policy = OffsetPolicy(
            auto_offset_reset="none",
            on_truncation="raise",
            retry_backoff=self._policy.retry_backoff,
        )
        probe = Fetcher(self._client, self.config, policy, None, None, lambda _e: None)
        results: dict[TopicPartition, ValidationResult] = {}
        for tp, pos in offsets.items():
            if not isinstance(pos, EpochOffset):
                raise TypeError(f"validate_offsets needs EpochOffset values, got {pos!r}")
            probe.add_partition(tp).restore(pos, source="validate_offsets")

        def settled() -> bool:
            for tp, tracker in list(probe.trackers.items()):
                pos = offsets[tp]
                if tracker.state is PartitionState.FETCHING:
                    valid_pos = tracker.position
                    results[tp] = ValidationResult(tp, pos, True, safe_position=valid_pos)
                    probe.remove_partition(tp)
                elif tracker.state is PartitionState.TRUNCATED:
                    report = tracker.last_report
                    results[tp] = ValidationResult(
                        tp,
                        pos,
                        False,
                        report=report,
                        safe_position=None if report is None else report.divergence,
                    )
                    probe.remove_partition(tp)
                elif tracker.state is PartitionState.NO_VALID_OFFSET:
                    results[tp] = ValidationResult(tp, pos, False, error=str(tracker.error))
                    probe.remove_partition(tp)
            return not probe.trackers

        if not probe.pump_until(settled, deadline):
            raise kerrors.KafkaTimeoutError(
                f"validate_offsets: no answer for {sorted(probe.trackers)} in {timeout}s"
            )
        return results

    # ------------------------------------------------------------------ metadata

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        self._ensure_open()
        parts = self._metadata_for({topic}, time.monotonic() + self._timeout())
        return parts.get(topic)

    def topics(self) -> set[str]:
        self._ensure_open()
        fetcher = self._fetcher
        prev = fetcher.metadata.want_all
        fetcher.want_all_topics(True)
        start = time.monotonic()
        deadline = start + self._timeout()
        fetcher.request_metadata()
        fetcher.pump_until(lambda: fetcher.metadata_fresh_since(start), deadline)
        fetcher.want_all_topics(prev)
        return set(fetcher.all_topics or ())

    def metrics(self, raw: bool = False) -> dict[str, Any]:
        """Counters: records, requests, truncations detected, records lost, ..."""
        m: dict[str, Any] = self._fetcher.metrics.as_dict()
        if self._group is not None:
            m["heartbeats_sent"] = self._group.heartbeats_sent
            m["rebalances"] = self._group.rebalances
        m["assigned_partitions"] = len(self._assigned)
        return {"consumer-metrics": m} if not raw else m

    def truncation_reports(self) -> list[TruncationReport]:
        """Every truncation report seen so far (oldest first)."""
        return list(self._truncation_reports)

    # ------------------------------------------------------------------ closing

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        """Commit (if auto commit), leave the group and close connections. Bounded by
        ``timeout_ms`` (default ``close_timeout_ms``) even when every broker is down."""
        if self._closed:
            return
        self._closed = True
        timeout = (self.config["close_timeout_ms"] if timeout_ms is None else timeout_ms) / 1000
        deadline = time.monotonic() + timeout
        try:
            self._finish_async_commits(time.monotonic() + timeout / 2)
        except Exception as exc:
            log.warning("close_commit_callback_failed", error=repr(exc))
        if self._commit_worker is not None:
            # A commit still waiting for its coordinator fails when the client closes.
            self._commit_worker.shutdown(wait=False, cancel_futures=True)
        try:
            if (
                autocommit
                and self.config["enable_auto_commit"]
                and (self._group is not None or self._store is not None)
            ):
                positions = self._current_positions()
                if positions and self._store is not None:
                    self._store.save(positions)
                elif (
                    positions and self._group is not None and self._group.coordinator_id is not None
                ):
                    self._group.commit(
                        {tp: (p, "") for tp, p in positions.items()},
                        time.monotonic() + max(0.1, timeout / 2),
                    )
        except Exception as exc:
            log.warning("close_commit_failed", error=repr(exc))
        if self._group is not None:
            try:
                if self._listener is not None and self._assigned:
                    self._listener.on_partitions_revoked(set(self._assigned))
            except Exception as exc:
                log.warning("close_listener_failed", error=repr(exc))
            self._group.leave()
        self._client.close(max(0.2, deadline - time.monotonic()))
        log.debug("consumer_closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@attrs.frozen
class _AsyncCommit:
    future: Future[dict[TopicPartition, OffsetAndMetadata]]
    offsets: dict[TopicPartition, OffsetAndMetadata]
    callback: Callable[[Any, Any], Any] | None


def _as_offsets_and_metadata(
    norm: Mapping[TopicPartition, tuple[EpochOffset, str]],
) -> dict[TopicPartition, OffsetAndMetadata]:
    return {tp: OffsetAndMetadata(p.offset, m, p.wire_epoch) for tp, (p, m) in norm.items()}
