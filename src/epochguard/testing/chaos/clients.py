"""Client adapters for the chaos runner: each maps a client's own truncation signal (or its
absence) to the oracle's events.

* ``epoch_consumer``: EpochConsumer; reports come from ``on_truncation_report``; under
  ``raise`` the application seeks to the divergence (the log start when unknown).
* ``aio_epoch_consumer``: AIOEpochConsumer, the same application on an event loop of its
  own (each poll runs the loop until ``getmany`` returns).
* ``kafka_python``, ``confluent``, ``aiokafka``: the reference clients (scoreboard). A
  client's exception or error event that says the log was truncated or the offset is out of
  range counts as a report with an unknown divergence; the application then does what that
  client's documentation suggests (seek to the beginning).

Every adapter commits what it delivered after each poll (to the group, or to a
``SqliteOffsetStore`` for EpochConsumer with ``offsets="store"``), so a restarted or
rebalanced consumer resumes where the application left off.

In a run with transactions every client reads with ``isolation_level="read_committed"``.
EpochConsumer's application is told the brokers' ``transaction.max.timeout.ms``
(``MemberContext.transaction_max_timeout_ms``), takes each hanging-transaction report
(``HangingTransactionError`` under policy ``raise``, ``hanging_transactions()`` under
``rewind``, which runs with ``on_hanging_transaction="warn"``) and does what the
transactions guide says an operator does: aborts it with the admin client, with the
producer id, epoch and coordinator epoch of the report. It takes each reopened-transaction
report the same way (``ReopenedTransactionError`` or ``reopened_transactions()``) and
notes which records it no longer knows the fate of, as the guide's second option says (it
does not abort: a transaction that then hangs is reported as hanging).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka import ConsumerRebalanceListener
from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.testing.chaos.oracle import (
    Assigned,
    Committed,
    Delivered,
    HangingAborted,
    HangingReported,
    ReopenedReported,
    Reported,
    Seeked,
)
from epochguard.testing.chaos.runner import ClientFactory, MemberContext

__all__ = [
    "CLIENTS",
    "aio_epoch_consumer",
    "aiokafka",
    "confluent",
    "epoch_consumer",
    "kafka_python",
]

log = get_logger(__name__)

_POLL_MS = 20

# Group timings short enough for rebalances inside a run of a few seconds.
_GROUP_KW: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 100,
    "max_poll_interval_ms": 20000,
}


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, adapter: _KafkaPythonLike) -> None:
        self.adapter = adapter

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.adapter.commit()

    def on_partitions_assigned(self, assigned: Any) -> None:
        for tp in assigned:
            self.adapter.session_started(tp)


class _KafkaPythonLike:
    """Shared by EpochConsumer and kafka-python's KafkaConsumer (the same API)."""

    consumer: Any

    def __init__(self, ctx: MemberContext) -> None:
        self.ctx = ctx
        self.tps = [TopicPartition(ctx.topic, p) for p in range(ctx.partitions)]
        self.done: dict[TopicPartition, tuple[int, int | None]] = {}
        self.seen: set[int] = set()  # partitions with a delivery

    def _start(self) -> None:
        if self.ctx.subscribe:
            self.consumer.subscribe([self.ctx.topic], listener=_Listener(self))
        else:
            self.consumer.assign(self.tps)
            for tp in self.tps:
                self.session_started(tp)

    def session_started(self, tp: TopicPartition) -> None:
        """The client starts a session on ``tp`` (the oracle's Assigned)."""
        self.ctx.emit(Assigned(-1, tp.partition, -1))

    def _deliver(self, batch: Any) -> None:
        self._received(batch)
        if self.done:
            self.commit()

    def _received(self, batch: Any) -> None:
        """The application has the records a poll returned (the oracle's Delivered)."""
        for tp, records in batch.items():
            for r in records:
                epoch = getattr(r, "leader_epoch", None)
                self.ctx.emit(
                    Delivered(
                        -1,
                        tp.partition,
                        r.offset,
                        None if epoch is None or epoch < 0 else epoch,
                        r.value,
                        -1,
                    )
                )
                self.done[tp] = (r.offset + 1, epoch)

    def commit(self) -> None:
        done, self.done = self.done, {}
        if not done:
            return
        try:
            self._wait(self.consumer.commit(self._offsets(done)))
        except Exception as exc:  # a rebalance, a fault: the next owner re-reads (allowed)
            log.info("chaos_commit_failed", error=repr(exc))
            # As an application does: try again after the next poll (a coordinator that
            # lags metadata refuses commits for a moment).
            self.done = {**done, **self.done}
            return
        for tp, (offset, _epoch) in done.items():
            self.ctx.emit(Committed(-1, tp.partition, offset, -1))

    def _wait(self, result: Any) -> Any:
        """What a call returned (the asyncio adapter runs a coroutine to its end)."""
        return result

    def _offsets(self, done: dict[TopicPartition, tuple[int, int | None]]) -> Any:
        from kafka.structs import OffsetAndMetadata

        return {
            tp: OffsetAndMetadata(o, "", e if e is not None else -1) for tp, (o, e) in done.items()
        }

    def close(self) -> None:
        self.consumer.close(autocommit=False)


class _HangingAborts:
    """The application's answer to hanging-transaction reports: note each one, abort it
    with the admin client (``kafka-transactions.sh abort``), asked again after a failure
    until the leader refuses it for good (the producer wrote under a newer epoch since: its
    own next marker ends the transaction)."""

    #: Attempts per report, a poll or more apart.
    ATTEMPTS = 20

    def __init__(self, ctx: MemberContext) -> None:
        self.ctx = ctx
        self.seen = 0  # hanging_transactions() already taken
        self.todo: list[tuple[Any, int]] = []  # (HangingTransaction, attempts left)
        self.admin: Any = None
        self.next_try = 0.0

    def reported(self, found: Any) -> None:
        self.ctx.emit(
            HangingReported(
                -1,
                found.tp.partition,
                found.first_offset,
                found.producer_id,
                -1,
                text=found.describe(),
            )
        )
        if found.producer_id is not None and found.producer_epoch is not None:
            self.todo.append((found, self.ATTEMPTS))

    def take_new(self, consumer: Any) -> None:
        """Reports kept by ``hanging_transactions()`` since the last call (policy warn)."""
        found = consumer.hanging_transactions()
        for f in found[self.seen :]:
            self.reported(f)
        self.seen = len(found)

    def abort_due(self) -> None:
        import time

        from kafka.admin import AbortTransactionSpec, KafkaAdminClient
        from kafka.errors import (
            InvalidProducerEpochError,
            ProducerFencedError,
            TransactionCoordinatorFencedError,
        )

        if not self.todo or time.monotonic() < self.next_try:
            return
        left: list[tuple[Any, int]] = []
        for found, attempts in self.todo:
            coordinator_epoch = found.coordinator_epoch
            if coordinator_epoch is None or coordinator_epoch < 0:
                coordinator_epoch = 0  # the leader has seen no marker of the producer yet
            spec = AbortTransactionSpec(
                found.tp, found.producer_id, found.producer_epoch, coordinator_epoch
            )
            try:
                if self.admin is None:
                    self.admin = KafkaAdminClient(
                        bootstrap_servers=self.ctx.bootstrap, request_timeout_ms=3000
                    )
                self.admin.abort_transaction(spec)
            except (
                InvalidProducerEpochError,
                ProducerFencedError,
                TransactionCoordinatorFencedError,
            ) as exc:
                log.info("chaos_hanging_abort_refused", error=repr(exc))
                continue
            except Exception as exc:  # a leader moving, a broker down: again later
                log.info("chaos_hanging_abort_failed", error=repr(exc))
                if attempts > 1:
                    left.append((found, attempts - 1))
                continue
            self.ctx.emit(
                HangingAborted(-1, found.tp.partition, found.first_offset, found.producer_id, -1)
            )
        self.todo = left
        self.next_try = time.monotonic() + 0.2

    def close(self) -> None:
        if self.admin is not None:
            self.admin.close()


class _Reopened:
    """The application's answer to reopened-transaction reports: it notes which records it
    no longer knows the fate of."""

    def __init__(self, ctx: MemberContext) -> None:
        self.ctx = ctx
        self.seen = 0  # reopened_transactions() already taken

    def reported(self, found: Any) -> None:
        self.ctx.emit(
            ReopenedReported(
                -1,
                found.tp.partition,
                found.producer_id,
                found.first_offset,
                found.last_offset,
                -1,
                from_start=found.from_start,
                text=found.describe(),
            )
        )

    def take_new(self, consumer: Any) -> None:
        """Reports kept by ``reopened_transactions()`` since the last call."""
        found = consumer.reopened_transactions()
        for f in found[self.seen :]:
            self.reported(f)
        self.seen = len(found)


class _EpochConsumerClient(_KafkaPythonLike):
    def __init__(self, ctx: MemberContext) -> None:
        from epochguard.consumer import EpochConsumer

        super().__init__(ctx)
        cfg = self._config(ctx)
        self.positions: dict[TopicPartition, Any] = {}
        self.unannounced: set[TopicPartition] = set()
        self.hanging = _HangingAborts(ctx)
        self.reopened = _Reopened(ctx)
        self.consumer: Any = EpochConsumer(**cfg)
        self._start()

    def _config(self, ctx: MemberContext) -> dict[str, Any]:
        from epochguard.offsets.stores import SqliteOffsetStore

        cfg: dict[str, Any] = {
            "bootstrap_servers": ctx.bootstrap,
            "auto_offset_reset": "earliest",
            "enable_auto_commit": False,
            "fetch_max_wait_ms": 50,
            "metadata_max_age_ms": 300,
            "retry_backoff_ms": 20,
            "request_timeout_ms": 1500,
            "reconnect_backoff_max_ms": 200,
            "on_truncation": ctx.policy,
            "on_truncation_report": self._report,
            "group_id": None if ctx.store_path is not None else ctx.group_id,
        }
        if ctx.store_path is not None:
            self.store: SqliteOffsetStore | None = SqliteOffsetStore(ctx.store_path)
            cfg["offset_store"] = self.store
        else:
            self.store = None
        if ctx.subscribe:
            cfg.update(_GROUP_KW)
            # A new connection's set-up bounded within the session timeout, as Java's
            # defaults are (10 s within 45 s): a handshake a half-open link swallowed must
            # not keep a member from its coordinator past its session.
            cfg["socket_connection_setup_timeout_ms"] = 2000
            cfg["socket_connection_setup_timeout_max_ms"] = 5000
        if ctx.read_committed:
            cfg["isolation_level"] = "read_committed"
            cfg["transaction_max_timeout_ms"] = ctx.transaction_max_timeout_ms
            cfg["on_hanging_transaction"] = "raise" if ctx.policy == "raise" else "warn"
        return cfg

    def _report(self, report: Any) -> None:
        from epochguard.offsets.position import EpochOffset

        # The application dropped what the report says is gone: its commit goes back to the
        # divergence (the start, when unknown), or a restart from the old commit would
        # skip records that an election brings back later.
        tp = TopicPartition(report.topic, report.partition)
        div = report.divergence
        back = EpochOffset(0) if div is None else EpochOffset(div.offset, div.leader_epoch)
        self.done[tp] = (back.offset, back.leader_epoch)
        self.positions[tp] = back
        self.ctx.emit(
            Reported(
                -1,
                report.partition,
                None if report.divergence is None else report.divergence.offset,
                report.consumed_to.offset,
                -1,
                text=str(report.detected_by),
                consumed_epoch=report.consumed_to.leader_epoch,
            )
        )

    def session_started(self, tp: TopicPartition) -> None:
        # A session starts where it reads its commit, not at the assignment: a topic deleted
        # in between takes the group's commits with it (Kafka deletes them), and then no
        # client can know what the application had read. Announced once the consumer has
        # read the commit (its restore is done).
        self.unannounced.add(tp)

    def _announce(self) -> None:
        restored = self.consumer._engine._restored  # the partitions whose commit has been read
        for tp in [tp for tp in self.unannounced if tp in restored]:
            self.unannounced.discard(tp)
            self.ctx.emit(Assigned(-1, tp.partition, -1))

    def poll_once(self) -> None:
        from epochguard.consumer import (
            HangingTransactionError,
            LogTruncationError,
            ReopenedTransactionError,
        )

        self.hanging.abort_due()
        try:
            batch = self._fetch()
            self._announce()
        except ReopenedTransactionError:
            # Policy raise: the reports are kept in reopened_transactions() too.
            self.reopened.take_new(self.consumer)
            return
        except HangingTransactionError as exc:
            # Policy raise: the partition keeps being fetched; the operator aborts it.
            for found in exc.transactions.values():
                self.hanging.reported(found)
            self.hanging.seen = len(self.consumer.hanging_transactions())
            self.hanging.abort_due()
            return
        except LogTruncationError as exc:
            # Policy raise: the callback reported it; resume at the divergence point.
            for tp, divergence in exc.truncation_offsets().items():
                if divergence is None:
                    self._wait(self.consumer.seek_to_beginning(tp))
                    self.ctx.emit(Seeked(-1, tp.partition, None, -1))
                else:
                    self.consumer.seek(tp, divergence)
                    self.ctx.emit(Seeked(-1, tp.partition, divergence.offset, -1))
            # The application dropped what the report says is gone: its commit goes back
            # now (the report callback queued it), before anything else can happen. Left to
            # the next poll, a restart in between restored the old commit past the dropped
            # records, and records an election brought back were never read again (seed
            # 2084).
            self.commit()
            return
        # The application has the records once poll() returns: a report that the position
        # lookups below bring (they may finish a validation) comes after them (raft chaos
        # seed 189: logged before them, the records looked re-read without a report).
        self._received(batch)
        for tp, records in batch.items():
            if records:
                try:
                    pos = self._wait(self.consumer.position_with_epoch(tp, timeout_ms=1000))
                except Exception as exc:  # moved on already: commit without the topic id
                    log.info("chaos_position_unknown", error=repr(exc))
                    self.positions.pop(tp, None)
                    continue
                after = records[-1].offset + 1
                # Under read_committed the position also steps over the markers and aborted
                # records after the last record delivered: that position is what the
                # exactly-once recipe commits (with its epoch known exactly, so a restart
                # can judge what it read before; an offset and epoch of the last record
                # make the epoch only an upper bound: docs/reliability.md, "What applications
                # should know").
                fits = pos.offset >= after if self.ctx.read_committed else pos.offset == after
                self.positions[tp] = pos if fits else None
        if self.done:
            self.commit()
        if self.ctx.read_committed:
            self.hanging.take_new(self.consumer)
            self.reopened.take_new(self.consumer)

    def _fetch(self) -> Any:
        return self.consumer.poll(timeout_ms=_POLL_MS)

    def _offsets(self, done: dict[TopicPartition, tuple[int, int | None]]) -> Any:
        # The position right after the records: with the leader epoch and the topic id (an
        # EpochOffset without one cannot show a topic re-created since). Not commit() without
        # offsets: it leaves out a partition under validation and still returns normally.
        from epochguard.offsets.position import EpochOffset

        return {
            tp: self.positions.get(tp) or EpochOffset(o, e if e is not None and e >= 0 else None)
            for tp, (o, e) in done.items()
        }

    def close(self) -> None:
        try:
            self.consumer.close(autocommit=False)
        finally:
            self.hanging.close()
            if self.store is not None:
                self.store.close()


def epoch_consumer(ctx: MemberContext) -> _EpochConsumerClient:
    return _EpochConsumerClient(ctx)


epoch_consumer.client_name = "epochguard"  # type: ignore[attr-defined]


class _AIOEpochConsumerClient(_EpochConsumerClient):
    """The EpochConsumer application on AIOEpochConsumer: the same reports, seeks and
    commits, each call run on the adapter's own event loop."""

    def __init__(self, ctx: MemberContext) -> None:
        from epochguard.consumer import AIOEpochConsumer

        _KafkaPythonLike.__init__(self, ctx)
        self.positions = {}
        self.unannounced = set()
        self.hanging = _HangingAborts(ctx)
        self.reopened = _Reopened(ctx)
        self.loop = asyncio.new_event_loop()
        self.consumer = AIOEpochConsumer(**self._config(ctx))
        self.loop.run_until_complete(self.consumer.start())
        if ctx.subscribe:
            self.consumer.subscribe([ctx.topic], listener=_AIORevokeCommits(self))
        else:
            self.consumer.assign(self.tps)
            for tp in self.tps:
                self.session_started(tp)

    def _wait(self, result: Any) -> Any:
        if asyncio.iscoroutine(result):
            return self.loop.run_until_complete(result)
        return result

    def _fetch(self) -> Any:
        return self.loop.run_until_complete(self.consumer.getmany(timeout_ms=_POLL_MS))

    async def commit_async(self) -> None:
        done, self.done = self.done, {}
        if not done:
            return
        try:
            await self.consumer.commit(self._offsets(done))
        except Exception as exc:
            log.info("chaos_commit_failed", error=repr(exc))
            self.done = {**done, **self.done}
            return
        for tp, (offset, _epoch) in done.items():
            self.ctx.emit(Committed(-1, tp.partition, offset, -1))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.consumer.stop())
        finally:
            self.hanging.close()
            if self.store is not None:
                self.store.close()
            self.loop.close()


class _AIORevokeCommits:
    def __init__(self, adapter: _AIOEpochConsumerClient) -> None:
        self.adapter = adapter

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.adapter.commit_async()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        for tp in assigned:
            self.adapter.session_started(tp)


def aio_epoch_consumer(ctx: MemberContext) -> _AIOEpochConsumerClient:
    return _AIOEpochConsumerClient(ctx)


aio_epoch_consumer.client_name = "epochguard-asyncio"  # type: ignore[attr-defined]


def _truncation_like(exc: BaseException) -> bool:
    name = type(exc).__name__.lower()
    return (
        "truncat" in name
        or "outofrange" in name
        or "nooffset" in name
        or "out of range" in str(exc).lower()
    )


def _signalled(exc: BaseException, assigned: Any) -> list[Any]:
    """The partitions an out-of-range/truncation exception names (all assigned ones when
    it names none): kafka-python and aiokafka put a ``{tp: offset}`` dict or one partition
    in ``args[0]``."""
    arg = exc.args[0] if exc.args else None
    if isinstance(arg, dict):
        return list(arg)
    if isinstance(arg, tuple) and hasattr(arg, "partition"):
        return [arg]
    return list(assigned)


def _on_signal(ctx: MemberContext, seen: set[int], tps: list[Any], text: str, seek: Any) -> None:
    """The application's answer to a client's truncation signal: note it (a report with an
    unknown divergence, unless nothing was delivered on the partition yet: the first
    position of a consumer without a commit) and start over from the log start."""
    for tp in tps:
        if tp.partition in seen:
            ctx.emit(Reported(-1, tp.partition, None, None, -1, text=text))
        seek(tp)
        ctx.emit(Seeked(-1, tp.partition, None, -1))


class _KafkaPythonClient(_KafkaPythonLike):
    def __init__(self, ctx: MemberContext) -> None:
        from kafka import KafkaConsumer

        super().__init__(ctx)
        cfg: dict[str, Any] = {
            "bootstrap_servers": ctx.bootstrap,
            "group_id": ctx.group_id,
            # "none": an out-of-range position raises instead of resetting silently
            "auto_offset_reset": "none",
            "enable_auto_commit": False,
            "fetch_max_wait_ms": 50,
            "metadata_max_age_ms": 300,
            "retry_backoff_ms": 20,
            "request_timeout_ms": 1500,
            "reconnect_backoff_max_ms": 200,
            "isolation_level": ctx.isolation_level,
        }
        if ctx.subscribe:
            cfg.update(_GROUP_KW)
        self.consumer = KafkaConsumer(**cfg)
        self._start()

    def poll_once(self) -> None:
        try:
            batch = self.consumer.poll(timeout_ms=_POLL_MS)
        except Exception as exc:
            if not _truncation_like(exc):
                log.info("chaos_kafka_python_error", error=repr(exc))
                return
            divergent = getattr(exc, "divergent_offsets", None)
            if isinstance(divergent, dict):
                # kafka-python 3's LogTruncationError (KIP-320): the divergence per
                # partition when the leader gave one; the application seeks there.
                for tp, at in divergent.items():
                    div = None if at is None else int(at.offset)
                    if tp.partition in self.seen:
                        self.ctx.emit(Reported(-1, tp.partition, div, None, -1, text=repr(exc)))
                    if div is None:
                        self.consumer.seek_to_beginning(tp)
                    else:
                        self.consumer.seek(tp, div)
                    self.ctx.emit(Seeked(-1, tp.partition, div, -1))
                return
            tps = _signalled(exc, self.consumer.assignment())
            _on_signal(self.ctx, self.seen, tps, repr(exc), self.consumer.seek_to_beginning)
            return
        self.seen.update(tp.partition for tp, recs in batch.items() if recs)
        self._deliver(batch)


def kafka_python(ctx: MemberContext) -> _KafkaPythonClient:
    return _KafkaPythonClient(ctx)


kafka_python.client_name = "kafka-python"  # type: ignore[attr-defined]


class _ConfluentClient:
    def __init__(self, ctx: MemberContext) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka import TopicPartition as CTopicPartition

        self.ctx = ctx
        self._tp = CTopicPartition
        self.consumer = Consumer(
            {
                "bootstrap.servers": ctx.bootstrap,
                "group.id": ctx.group_id,
                "enable.auto.commit": False,
                # "error": a detected truncation or an out-of-range position is an error
                # event (the divergence only in its text) instead of a silent reset
                "auto.offset.reset": "error",
                "topic.metadata.refresh.interval.ms": 300,
                "fetch.wait.max.ms": 50,
                "retry.backoff.ms": 20,
                "reconnect.backoff.max.ms": 200,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 100,
                # librdkafka's default; said in a run with transactions, where it matters
                **({"isolation.level": ctx.isolation_level} if ctx.read_committed else {}),
                "log_level": 0,
            }
        )
        self.done: dict[int, tuple[int, int | None]] = {}
        self.seen: set[int] = set()
        if ctx.subscribe:
            self.consumer.subscribe(
                [ctx.topic], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        else:
            self._on_assign(
                self.consumer, [CTopicPartition(ctx.topic, p) for p in range(ctx.partitions)]
            )

    def _restart_at_0(self, tp: Any) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        # After the error librdkafka stops fetching the partition and refuses a seek in
        # that state: assigning it again at the log start restarts it.
        start = self._tp(self.ctx.topic, tp.partition, OFFSET_BEGINNING)
        try:
            self.consumer.seek(start)
        except Exception:
            # Eager rebalancing allows only assign(): the whole assignment, at the current
            # positions, the stopped partition at the log start.
            current = self.consumer.position(self.consumer.assignment())
            self.consumer.assign([start if c.partition == tp.partition else c for c in current])

    def _on_assign(self, _c: Any, parts: Any) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        # With auto.offset.reset=error a partition without a commit needs its first
        # position from the application: the log start.
        committed = self.consumer.committed(parts, timeout=10)
        self.consumer.assign(
            [
                c if c.offset >= 0 else self._tp(self.ctx.topic, c.partition, OFFSET_BEGINNING)
                for c in committed
            ]
        )
        for tp in parts:
            self.ctx.emit(Assigned(-1, tp.partition, -1))

    def _on_revoke(self, _c: Any, _parts: Any) -> None:
        self.commit()

    def commit(self) -> None:
        done, self.done = self.done, {}
        if not done:
            return
        offsets = []
        for p, (o, e) in done.items():
            if e is not None and e >= 0:
                offsets.append(self._tp(self.ctx.topic, p, o, leader_epoch=e))
            else:
                offsets.append(self._tp(self.ctx.topic, p, o))
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:
            log.info("chaos_commit_failed", error=repr(exc))
            self.done = {**done, **self.done}  # again after the next poll
            return
        for p, (o, _e) in done.items():
            self.ctx.emit(Committed(-1, p, o, -1))

    def poll_once(self) -> None:
        m = self.consumer.poll(_POLL_MS / 1000)
        if m is None:
            self.commit()  # a commit that failed before
            return
        err = m.error()
        if err is not None:
            text = err.str()
            name = err.name()
            # librdkafka names a detected truncation in the text of an auto offset reset
            if "truncat" in text.lower() or name in ("_AUTO_OFFSET_RESET", "OFFSET_OUT_OF_RANGE"):
                p = m.partition()
                if p is not None and p >= 0:
                    tp = self._tp(self.ctx.topic, p)
                    _on_signal(self.ctx, self.seen, [tp], f"{name}: {text}", self._restart_at_0)
            return
        epoch = m.leader_epoch()
        partition, offset, value = m.partition(), m.offset(), m.value()
        if partition is None or offset is None or value is None:
            return  # not a record of ours (every value the runner writes is set)
        self.ctx.emit(
            Delivered(
                -1, partition, offset, None if epoch is None or epoch < 0 else epoch, value, -1
            )
        )
        self.done[partition] = (offset + 1, epoch)
        self.seen.add(partition)
        self.commit()

    def close(self) -> None:
        self.consumer.close()


def confluent(ctx: MemberContext) -> _ConfluentClient:
    return _ConfluentClient(ctx)


confluent.client_name = "confluent-kafka"  # type: ignore[attr-defined]


class _AioKafkaClient:
    def __init__(self, ctx: MemberContext) -> None:
        import aiokafka as ak

        self.ctx = ctx
        self.loop = asyncio.new_event_loop()
        self.tps = [ak.TopicPartition(ctx.topic, p) for p in range(ctx.partitions)]
        self.done: dict[Any, int] = {}
        self.seen: set[int] = set()

        async def make() -> Any:
            c = ak.AIOKafkaConsumer(
                bootstrap_servers=ctx.bootstrap,
                group_id=ctx.group_id,
                # aiokafka has no truncation signal: "none" only stops a consumer that has
                # no commit yet, so it runs with its usual reset
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                fetch_max_wait_ms=50,
                metadata_max_age_ms=300,
                retry_backoff_ms=20,
                request_timeout_ms=1500,
                session_timeout_ms=6000,
                heartbeat_interval_ms=100,
                isolation_level=ctx.isolation_level,
            )
            await c.start()
            if ctx.subscribe:
                c.subscribe([ctx.topic], listener=_aio_listener(self))
            else:
                c.assign(self.tps)
                for tp in self.tps:
                    ctx.emit(Assigned(-1, tp.partition, -1))
            return c

        self.consumer = self.loop.run_until_complete(make())

    def commit(self) -> None:
        done, self.done = self.done, {}
        if not done:
            return
        try:
            self.loop.run_until_complete(self.consumer.commit(done))
        except Exception as exc:
            log.info("chaos_commit_failed", error=repr(exc))
            self.done = {**done, **self.done}  # again after the next poll
            return
        for tp, o in done.items():
            self.ctx.emit(Committed(-1, tp.partition, o, -1))

    async def _commit_async(self) -> None:
        done, self.done = self.done, {}
        if not done:
            return
        try:
            await self.consumer.commit(done)
        except Exception as exc:
            log.info("chaos_commit_failed", error=repr(exc))
            self.done = {**done, **self.done}  # again after the next poll
            return
        for tp, o in done.items():
            self.ctx.emit(Committed(-1, tp.partition, o, -1))

    def poll_once(self) -> None:
        try:
            batch = self.loop.run_until_complete(self.consumer.getmany(timeout_ms=_POLL_MS))
        except Exception as exc:
            if not _truncation_like(exc):
                log.info("chaos_aiokafka_error", error=repr(exc))
                return
            tps = _signalled(exc, self.consumer.assignment())
            _on_signal(self.ctx, self.seen, tps, repr(exc), self.consumer.seek_to_beginning)
            return
        for tp, records in batch.items():
            if records:
                self.seen.add(tp.partition)
            for r in records:
                self.ctx.emit(Delivered(-1, tp.partition, r.offset, None, r.value, -1))
                self.done[tp] = r.offset + 1
        self.commit()

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.consumer.stop())
        finally:
            self.loop.close()


def _aio_listener(adapter: _AioKafkaClient) -> Any:
    import aiokafka as ak

    class Listener(ak.ConsumerRebalanceListener):  # type: ignore[misc]
        async def on_partitions_revoked(self, revoked: Any) -> None:
            await adapter._commit_async()

        async def on_partitions_assigned(self, assigned: Any) -> None:
            for tp in assigned:
                adapter.ctx.emit(Assigned(-1, tp.partition, -1))

    return Listener()


def aiokafka(ctx: MemberContext) -> _AioKafkaClient:
    return _AioKafkaClient(ctx)


aiokafka.client_name = "aiokafka"  # type: ignore[attr-defined]

CLIENTS: dict[str, ClientFactory] = {
    "epochguard": epoch_consumer,
    "epochguard-asyncio": aio_epoch_consumer,
    "kafka-python": kafka_python,
    "confluent-kafka": confluent,
    "aiokafka": aiokafka,
}
