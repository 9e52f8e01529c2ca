"""``AIOEpochConsumer``: aiokafka's ``AIOKafkaConsumer`` API, truncation-safe, on asyncio.

The asyncio driver of the consumer engine (:mod:`epochguard.consumer.engine`), the same
engine ``EpochConsumer`` drives with threads. Nothing runs on another thread:

- the connections (kafka-python's connection layer: ApiVersions, SASL, TLS, reconnect
  backoff) are served from the application's event loop. Their selector has no thread of
  its own; the loop watches the selector's descriptor (readable whenever a socket it waits
  on is) and steps it without blocking, and calls it again when its next timer is due. A
  plaintext connection's socket, once connected, is watched by the loop itself, which
  reads it as it becomes readable;
- the engine's steps (:data:`~epochguard.consumer.effects.Step`) run as coroutines: each
  effect they yield is awaited on the loop (:func:`run_async`);
- group heartbeats are a task on the same loop.

So every call is a coroutine on the caller's loop with no thread hop, and a coroutine
cancelled while it waits (``asyncio.wait_for`` around ``getmany``) leaves nothing half
done: records are taken from the buffers only in the same step that returns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import select
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

import kafka.errors as kerrors
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.structs import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition

from epochguard._log import get_logger
from epochguard.consumer.client import BrokerClient, plain_error
from epochguard.consumer.config import build_config
from epochguard.consumer.effects import (
    Await,
    Call,
    Effect,
    Pump,
    Signal,
    Sleep,
    Step,
    TaskHandle,
    Turn,
    WaitSignal,
    timeout_error,
)
from epochguard.consumer.engine import ConsumerEngine, ValidationResult, make_policy
from epochguard.consumer.errors import ConsumerConfigError, LogTruncationError
from epochguard.consumer.records import ConsumerRecord, log_decoder_once
from epochguard.offsets.hanging import HangingTransaction
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.reopened import ReopenedTransaction
from epochguard.offsets.report import TruncationReport

__all__ = ["AIOEpochConsumer", "run_async"]

log = get_logger("epochguard.consumer")

#: aiokafka 0.14's defaults where they differ from kafka-python's (``EpochConsumer``'s).
AIOKAFKA_DEFAULTS: Mapping[str, Any] = {
    "request_timeout_ms": 40000,
    "session_timeout_ms": 10000,
    "max_poll_records": None,
    "sasl_mechanism": "PLAIN",
    "partition_assignment_strategy": (RoundRobinPartitionAssignor,),
}
#: aiokafka's assignors are its own copies of kafka-python's: the same protocol names.
_ASSIGNORS_BY_NAME = {
    "range": RangePartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
    "sticky": StickyPartitionAssignor,
}
#: ``getmany(max_records=None)`` (aiokafka: everything buffered).
_UNBOUNDED = 2**31 - 1
#: A read that finds records buffered returns without waiting, so an application reading
#: at full speed would otherwise never give the loop back while the fetches keep up. Reads
#: give the loop a turn (``asyncio.sleep(0)``) once this long has passed since it last had
#: one: at 1 KB about every read of 500 records. A task waiting on a timer (or a socket)
#: resumes two turns of the loop after its time comes, so it waits about twice this, plus
#: two reads with the application's handling of their records, plus a turn of the
#: connections (:data:`READ_BUDGET_BYTES`); after a step of :data:`LONG_STEP_S`, that one
#: step.
YIELD_INTERVAL_S = 0.0005
#: A turn given after the loop went this long without one lets the tasks whose timers came
#: due meanwhile run before the read resumes (two hops, see :meth:`_LoopIO.give_loop_a_turn`):
#: with one, they would wait for the read's next step as well.
LONG_STEP_S = 0.004
#: Fetched record bytes one read decodes at most (at least one partition's): a fetch answer
#: for many partitions (up to ``fetch_max_bytes``, 50 MiB by default) is decoded over several
#: reads, so the loop gets its turns in between. 1 MiB of 100-byte records decodes in about
#: a millisecond with the C decoder.
DECODE_BUDGET_BYTES = 1 << 20
#: Bytes a step of the connections' selector reads off one socket at most: a large answer
#: (up to ``fetch_max_bytes``) is read over several turns of the loop, as it is decoded.
#: Reading a socket costs up to about a millisecond per MiB here; half that per step keeps
#: each turn short, and each step's fixed cost (kafka-python's selector) small against it.
READ_BUDGET_BYTES = 512 * 1024
#: Most turns of the connections' selector per :meth:`_LoopIO.flush`.
_FLUSH_TURNS = 3
#: A read steps the connections' selector (see :meth:`_LoopIO.flush`) when requests wait
#: to go out, or when it was last stepped this long ago: often enough that an answer
#: arriving while the application works is read off the socket (the broker writes on
#: meanwhile), rarely enough that most reads of small batches skip the system call.
_FLUSH_INTERVAL_S = 0.0005


class _LoopIO:
    """Serves a ``BrokerClient``'s connections from an event loop and performs effects."""

    def __init__(self, client: BrokerClient, loop: asyncio.AbstractEventLoop) -> None:
        self._net = client.selector
        self._loop = loop
        self._thread = threading.get_ident()
        # The loop's call of _step for the selector's next timer (or for its ready tasks:
        # due at once), and when it is due (time.monotonic(), the default loop's clock).
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._timer_due = 0.0
        self._fd: int = self._net._selector.fileno()
        # Whether the selector's descriptor is readable (a socket it watches is ready),
        # asked without a turn of the selector (see flush).
        self._ready_fd = select.poll()
        self._ready_fd.register(self._fd, select.POLLIN)
        #: The plaintext connections' sockets, which the loop watches itself (see
        #: :meth:`add_reader`), and what reads each.
        self._readers: dict[int, Callable[[], None]] = {}
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        #: When the loop last ran other callbacks (see :meth:`give_loop_a_turn`).
        self.loop_ran_at = time.monotonic()
        self._stepped_at = 0.0
        loop.add_reader(self._fd, self._step)
        loop.call_soon(self._step)
        client.send_directly = self.send_directly
        client.manager.loop_reads = self

    # ------------------------------------------------------------------ the selector

    def _step(self) -> None:
        # The loop called this: it is turning, so the application's other tasks run too.
        self.loop_ran_at = time.monotonic()
        self._serve()

    def _on_timer(self) -> None:
        self._timer = None
        self._step()

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """``LoopReads.add_reader``: the loop calls ``callback`` whenever the connection's
        socket ``fd`` is readable (kafka-python's selector no longer waits on it)."""
        if self._closed:
            return  # a read task run by the selector's close: its socket is closed next
        self._readers[fd] = callback
        self._ready_fd.register(fd, select.POLLIN)
        self._loop.add_reader(fd, self._read, callback)

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is None:
            return
        with contextlib.suppress(KeyError):
            self._ready_fd.unregister(fd)
        try:
            self._loop.remove_reader(fd)
        except Exception as exc:  # the loop is closing already
            log.debug("loop_reader_remove_failed", error=repr(exc))

    def _read(self, callback: Callable[[], None]) -> None:
        self.loop_ran_at = time.monotonic()
        callback()
        # What was read may have resumed a task of the selector (a connection's set-up) or
        # set one of its timers (a throttled connection's resumption).
        self._arm_timer(time.monotonic())

    def _read_watched(self, callback: Callable[[], None]) -> None:
        """A watched socket's read from :meth:`flush`, which runs as a read returns: an
        error must not replace the records it returns (the loop's own calls report
        theirs to the loop's exception handler)."""
        try:
            callback()
        except Exception as exc:
            log.warning("connection_read_failed", error=plain_error(exc))

    def flush(self) -> None:
        """Serve the connections now if requests wait to go out or they were last served
        :data:`_FLUSH_INTERVAL_S` ago, without blocking.

        The loop serves them when the selector's descriptor is readable, but only once the
        running task gives the loop a turn; a read that finds records buffered does not.
        So each read ends with this: the fetch sent ahead while the application works
        through its records goes out at once rather than when the buffers run dry (which
        left the broker idle for that time), and an answer arriving meanwhile is read off
        the socket, so the broker can keep writing. Leaving those reads to the loop's turns
        was measured slower where records are large: the application then frees a read's
        records before the next answer's buffer is taken, and the allocator hands the freed
        heap back to the system and faults it in again (10 KB records in lz4 batches: about
        eight times the page faults, half the records/s)."""
        net = self._net
        if net._ready:
            self._serve()
            return
        now = time.monotonic()
        if now - self._stepped_at < _FLUSH_INTERVAL_S:
            return
        # Nothing waits to go out: a turn would only read what the sockets hold and run
        # the selector's timers that are due. Its descriptor tells whether a socket is
        # ready (one poll(2)), so the turns that would find nothing are skipped: most of
        # them once a large answer is in and its records are handed out.
        wait = net._next_scheduled_timeout(now)
        serve = wait is not None and wait <= 0
        read = False
        for fd, _events in self._ready_fd.poll(0):
            if fd == self._fd:
                serve = True
            else:
                callback = self._readers.get(fd)
                if callback is not None:
                    self._read_watched(callback)
                    read = True
        if serve or net._ready:
            self._serve()
        else:
            self._stepped_at = now
            if read:
                self._arm_timer(time.monotonic())

    def _serve(self) -> None:
        """Send the requests handed to the connections and read what the sockets hold (the
        answers' futures complete here)."""
        net = self._net
        if net._closed or net._poll_lock.locked():
            return  # closed, or called from a callback of the selector's own step
        # A turn may make more tasks ready (a request's task starts in the turn after it
        # was handed over); a few turns see a request onto the socket.
        for _ in range(_FLUSH_TURNS):
            net.poll(timeout_ms=0)
            if not net._ready:
                break
        now = self._stepped_at = time.monotonic()
        self._arm_timer(now)

    def send_directly(self, send: Callable[[], Any]) -> Any:
        """``BrokerClient.send_directly``: on the loop's thread, outside a turn of the
        selector, a request goes on its connection at once (the connection's own timer for
        its timeout is then the selector's, which the loop's next call is armed for)."""
        net = self._net
        if net._closed or net._poll_lock.locked() or threading.get_ident() != self._thread:
            return None
        future = send()
        self._arm_timer(time.monotonic())
        return future

    def _arm_timer(self, now: float) -> None:
        net = self._net
        # The next call: at once for tasks still ready, else at the selector's next timer.
        # A call already due no later is kept (an early one only finds nothing to do).
        if net._ready:
            due: float | None = now
        else:
            wait = net._next_scheduled_timeout(now)
            due = None if wait is None else now + max(0.0, wait)
        if self._timer is not None:
            if due is not None and self._timer_due <= due:
                return
            self._timer.cancel()
            self._timer = None
        if due is None:
            return
        self._timer_due = due
        if due <= now:
            self._timer = self._loop.call_soon(self._on_timer)
        else:
            self._timer = self._loop.call_later(due - now, self._on_timer)

    async def give_loop_a_turn(self) -> None:
        """Let the loop run its other tasks if it has not for :data:`YIELD_INTERVAL_S`.

        ``asyncio.sleep(0)`` queues this task's wake-up before the callbacks of the timers
        that came due while it ran, so a task waiting on a timer resumes only after this
        task's next step too. After a step of :data:`LONG_STEP_S` or more the wake-up comes
        from a callback the loop calls from a callback it calls: the timers' tasks run
        first."""
        idle = time.monotonic() - self.loop_ran_at
        if idle >= YIELD_INTERVAL_S:
            if idle >= LONG_STEP_S:
                resumed = self._loop.create_future()
                self._loop.call_soon(self._loop.call_soon, _settle, resumed)
                await resumed
            else:
                await asyncio.sleep(0)
            self.loop_ran_at = time.monotonic()

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self._loop.remove_reader(self._fd)
        except Exception as exc:  # the loop is closing already
            log.debug("loop_reader_remove_failed", error=repr(exc))
        for fd in list(self._readers):
            self.remove_reader(fd)
        for task in list(self._tasks):
            task.cancel()
        try:
            self._net.close()
        except Exception as exc:
            log.debug("client_selector_close_error", error=repr(exc))

    # ------------------------------------------------------------------ effects

    def _wake_from_any_thread(self, future: asyncio.Future[None]) -> None:
        if threading.get_ident() == self._thread:
            _settle(future)
        else:
            self._loop.call_soon_threadsafe(_settle, future)

    async def wait_signal(self, signal: Signal, timeout_s: float) -> bool:
        if signal.is_set():
            return True
        if timeout_s <= 0:
            return False
        future: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            self._wake_from_any_thread(future)

        signal.add_waker(wake)
        try:
            await asyncio.wait([future], timeout=timeout_s)
        finally:
            signal.remove_waker(wake)
            future.cancel()
        return signal.is_set()

    async def perform(self, effect: Effect) -> Any:
        if isinstance(effect, Turn):
            await self.give_loop_a_turn()
            return None
        if isinstance(effect, Pump):
            fetcher = effect.fetcher
            now = time.monotonic()
            wake_at = fetcher.send_requests(now)
            signal = fetcher.wake_signal
            if not fetcher.has_completions(effect.decode):
                await self.wait_signal(signal, min(effect.until, wake_at) - now)
            signal.clear()
            return None
        if isinstance(effect, Await):
            kfuture = effect.future
            if not kfuture.is_done:
                done: asyncio.Future[None] = self._loop.create_future()
                kfuture.add_both(lambda _v: self._wake_from_any_thread(done))
                try:
                    await asyncio.wait([done], timeout=max(0.0, effect.timeout_s))
                finally:
                    done.cancel()
                if not kfuture.is_done:
                    raise timeout_error(effect.timeout_s)
            if kfuture.exception is not None:
                raise kfuture.exception
            return kfuture.value
        if isinstance(effect, Sleep):
            await asyncio.sleep(max(0.0, effect.seconds))
            return None
        if isinstance(effect, WaitSignal):
            return await self.wait_signal(effect.signal, effect.timeout_s)
        if isinstance(effect, Call):
            result = effect.fn(*effect.args)
            if inspect.isawaitable(result):
                result = await result
            return result
        raise TypeError(f"not an effect: {effect!r}")

    def spawn(self, step: Step[None], name: str) -> TaskHandle:
        task = self._loop.create_task(run_async(step, self), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def stop(_timeout_s: float) -> None:
            # A task cannot be joined from synchronous code: it is cancelled instead, so a
            # step stopped while it awaits an answer never acts on it (the threaded driver
            # joins its thread for the same): a heartbeat's late refusal or timeout, taken
            # after the join that stopped it, would ask for another rebalance and forget
            # the coordinator. Not from within itself: a heartbeat that leaves the group
            # stops its own heartbeats first.
            if asyncio.current_task(self._loop) is not task:
                task.cancel()

        return TaskHandle(stop, lambda: not task.done())


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def run_async(step: Step[Any], io: _LoopIO) -> Any:
    """Run ``step`` to its end on the event loop, awaiting each effect."""
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                effect = step.send(value) if error is None else step.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = await io.perform(effect)
            except Exception as exc:
                error = exc
    except BaseException:
        # Cancelled (or interrupted) while waiting: the step's own cleanup runs now.
        step.close()
        raise


def _as_tp(tp: Any) -> TopicPartition:
    """aiokafka's ``TopicPartition`` is its own named tuple with the same fields."""
    if isinstance(tp, TopicPartition):
        return tp
    topic, partition = getattr(tp, "topic", None), getattr(tp, "partition", None)
    if isinstance(topic, str) and isinstance(partition, int):
        return TopicPartition(topic, partition)
    raise TypeError(f"partition must be a TopicPartition, got {tp!r}")


def _aiokafka_config(configs: dict[str, Any]) -> dict[str, Any]:
    """aiokafka's keyword arguments as the engine's configuration."""
    if "io_thread" in configs:
        raise ConsumerConfigError(
            "io_thread", "is EpochConsumer's: AIOEpochConsumer serves its connections from the loop"
        )
    cfg = {**AIOKAFKA_DEFAULTS, **configs}
    cfg.pop("loop", None)  # deprecated in aiokafka: the running loop is used
    # aiokafka's own meaning (the background fetcher's wait), not kafka-python's iterator
    # timeout: an ``async for`` over AIOEpochConsumer runs until stop(), as aiokafka's.
    cfg.pop("consumer_timeout_ms", None)
    rebalance_timeout = cfg.pop("rebalance_timeout_ms", None)
    if rebalance_timeout is not None:
        # The engine sends max_poll_interval_ms as the rebalance timeout (as kafka-python).
        cfg.setdefault("max_poll_interval_ms", rebalance_timeout)
    if cfg.get("api_version") == "auto":
        cfg["api_version"] = None
    if cfg.get("max_poll_records", 0) is None:
        cfg["max_poll_records"] = _UNBOUNDED
    if cfg.get("client_rack", "") is None:
        cfg["client_rack"] = ""
    strategies = cfg.get("partition_assignment_strategy")
    if strategies is not None:
        cfg["partition_assignment_strategy"] = tuple(
            _ASSIGNORS_BY_NAME.get(getattr(s, "name", ""), s)
            if getattr(s, "__module__", "").startswith("aiokafka")
            else s
            for s in strategies
        )
    if str(cfg.get("group_protocol", "classic")).lower() == "consumer":
        # The broker assigns (KIP-848); the classic-only defaults are not sent.
        for key in ("partition_assignment_strategy", "session_timeout_ms"):
            if key not in configs:
                del cfg[key]
    return cfg


def _aiokafka_truncation_error() -> type[LogTruncationError] | None:
    try:
        from aiokafka.errors import OffsetOutOfRangeError as AIOOffsetOutOfRangeError
    except ImportError:
        return None

    class AIOLogTruncationError(LogTruncationError, AIOOffsetOutOfRangeError):  # type: ignore[misc]
        """``LogTruncationError`` that aiokafka code also catches as its own
        ``OffsetOutOfRangeError``."""

    # What tracebacks and logs show: the class users know (an epochguard LogTruncationError).
    AIOLogTruncationError.__name__ = AIOLogTruncationError.__qualname__ = "LogTruncationError"
    AIOLogTruncationError.__module__ = LogTruncationError.__module__
    return AIOLogTruncationError


_AIO_TRUNCATION_ERROR = _aiokafka_truncation_error()


class AIOEpochConsumer:
    """A Kafka consumer for asyncio that detects log truncation (KIP-320) instead of hiding it.

    aiokafka's ``AIOKafkaConsumer`` API (the same methods, arguments and defaults), plus
    what ``EpochConsumer`` adds: ``on_truncation`` policies, ``LogTruncationError``,
    ``seek`` with an ``EpochOffset``, ``position_with_epoch``, ``validate_offsets``,
    commits with leader epochs, KIP-848 and cooperative groups, ``offset_store``. See
    the asyncio guide (``docs/guides/asyncio.md``).
    """

    def __init__(self, *topics: str, **configs: Any) -> None:
        cfg = build_config(_aiokafka_config(configs))
        self._policy = make_policy(cfg)
        self.config = cfg
        self._topics = topics
        self._engine: ConsumerEngine | None = None
        self._client: BrokerClient | None = None
        self._io: _LoopIO | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect to the cluster (bootstrap) and, with topics given, subscribe."""
        if self._engine is not None:
            return
        loop = asyncio.get_running_loop()
        log_decoder_once()
        client = BrokerClient(self.config, io_thread=False, read_budget_bytes=READ_BUDGET_BYTES)
        io = _LoopIO(client, loop)
        engine = ConsumerEngine(self.config, self._policy, client, io.spawn)
        engine.kind = "AIOEpochConsumer"
        engine.fetcher.decode_budget_bytes = DECODE_BUDGET_BYTES
        engine.fetcher.chain_prefetches = True
        try:
            await run_async(client.bootstrap_step(self.config["bootstrap_timeout_ms"]), io)
        except BaseException:
            await run_async(client.close_step(1.0), io)
            io.close()
            raise
        self._client, self._io, self._engine = client, io, engine
        if self._topics:
            self.subscribe(topics=list(self._topics))

    async def stop(self) -> None:
        """Commit (with auto commit), leave the group (static members stay) and close."""
        engine, io, client = self._engine, self._io, self._client
        if engine is None or io is None or client is None or engine.closed:
            return
        deadline = time.monotonic() + self.config["close_timeout_ms"] / 1000
        try:
            # As aiokafka: the rebalance listener is not called on stop().
            await run_async(engine.close(True, deadline, tell_listener=False), io)
        finally:
            await run_async(client.close_step(max(0.2, deadline - time.monotonic())), io)
            io.close()
            engine.close_deserializers()
            log.debug("consumer_closed")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _started(self) -> tuple[ConsumerEngine, _LoopIO]:
        if self._engine is None or self._io is None:
            raise kerrors.IllegalStateError("AIOEpochConsumer is not started: await start()")
        return self._engine, self._io

    async def _run(self, step: Step[Any]) -> Any:
        _engine, io = self._started()
        try:
            return await run_async(step, io)
        except LogTruncationError as exc:
            if _AIO_TRUNCATION_ERROR is not None and not isinstance(exc, _AIO_TRUNCATION_ERROR):
                raise _AIO_TRUNCATION_ERROR(exc.truncations) from None
            raise

    # ------------------------------------------------------------------ assignment

    def subscribe(
        self, topics: Iterable[str] = (), pattern: str | None = None, listener: Any = None
    ) -> None:
        """Subscribe to topics (or a regex ``pattern``); ``listener`` is aiokafka's
        ``ConsumerRebalanceListener`` (its methods may be coroutine functions)."""
        engine, _io = self._started()
        if listener is not None and not (
            callable(getattr(listener, "on_partitions_revoked", None))
            and callable(getattr(listener, "on_partitions_assigned", None))
        ):
            raise TypeError("listener must be a ConsumerRebalanceListener")
        engine.subscribe(topics, pattern, listener)

    def subscription(self) -> set[str]:
        engine, _io = self._started()
        return engine.subscription() or set()

    def unsubscribe(self) -> None:
        """Drop the subscription and the assignment (positions are committed first with
        auto commit, and the group is left, in a task on the loop, as aiokafka does)."""
        engine, io = self._started()
        io.spawn(engine.unsubscribe_now(), "epochguard-unsubscribe")

    def assign(self, partitions: Iterable[Any]) -> None:
        engine, _io = self._started()
        engine.assign([_as_tp(tp) for tp in partitions])

    def assignment(self) -> set[TopicPartition]:
        engine, _io = self._started()
        return engine.assignment()

    # ------------------------------------------------------------------ records

    async def getmany(
        self, *partitions: Any, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records of every assigned partition (or of ``partitions``) that arrive within
        ``timeout_ms``; ``{}`` when none did."""
        got: dict[TopicPartition, list[ConsumerRecord]] = await self._poll(
            partitions, timeout_ms, max_records, columns=False
        )
        return got

    async def getmany_columns(
        self, *partitions: Any, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, Any]:
        """:meth:`getmany` for ``record_format="columns"``: one ``RecordColumns`` per
        partition (``to_arrow()`` without copying)."""
        got: dict[TopicPartition, Any] = await self._poll(
            partitions, timeout_ms, max_records, columns=True
        )
        return got

    async def _poll(
        self, partitions: tuple[Any, ...], timeout_ms: int, max_records: int | None, columns: bool
    ) -> Any:
        engine, io = self._started()
        only = [_as_tp(tp) for tp in partitions] or None
        limit = _UNBOUNDED if max_records is None else max_records
        # Before anything is taken from the buffers: cancelled here, nothing is lost.
        await io.give_loop_a_turn()
        try:
            return await self._run(engine.poll(timeout_ms, limit, columns=columns, only=only))
        finally:
            io.flush()

    async def getone(self, *partitions: Any) -> ConsumerRecord:
        """The next record (of ``partitions``, if given); waits until there is one."""
        while True:
            got: dict[TopicPartition, list[ConsumerRecord]] = await self._poll(
                partitions, 60_000, 1, columns=False
            )
            for records in got.values():
                return records[0]

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self

    async def __anext__(self) -> ConsumerRecord:
        if self._closed or (self._engine is not None and self._engine.closed):
            raise StopAsyncIteration
        return await self.getone()

    # ------------------------------------------------------------------ positions

    def seek(self, partition: Any, offset: int | EpochOffset | OffsetAndMetadata) -> None:
        """Move the position; with an epoch (``EpochOffset``, or ``OffsetAndMetadata`` with a
        ``leader_epoch``) it is validated before fetching from it."""
        engine, _io = self._started()
        engine.seek(_as_tp(partition), offset)

    async def seek_to_beginning(self, *partitions: Any) -> None:
        engine, _io = self._started()
        engine.seek_to_beginning(*(_as_tp(tp) for tp in partitions))

    async def seek_to_end(self, *partitions: Any) -> None:
        engine, _io = self._started()
        engine.seek_to_end(*(_as_tp(tp) for tp in partitions))

    async def seek_to_committed(self, *partitions: Any) -> dict[TopicPartition, int | None]:
        """Move each partition (default: all assigned) to its committed offset, with the
        committed leader epoch (validated before the next fetch); returns the offsets."""
        engine, _io = self._started()
        tps = [_as_tp(tp) for tp in partitions] or sorted(engine.assignment())
        out: dict[TopicPartition, int | None] = {}
        for tp in tps:
            got = await self._run(engine.committed(tp, None))
            if got is None:
                out[tp] = None
                continue
            position: EpochOffset = got[0]
            engine.seek(tp, position)
            out[tp] = position.offset
        return out

    async def position(self, partition: Any) -> int:
        engine, _io = self._started()
        got: EpochOffset = await self._run(engine.position_with_epoch(_as_tp(partition), None))
        return got.offset

    async def position_with_epoch(
        self, partition: Any, timeout_ms: int | None = None
    ) -> EpochOffset:
        """The validated position with the leader epoch of the record before it."""
        engine, _io = self._started()
        got: EpochOffset = await self._run(
            engine.position_with_epoch(_as_tp(partition), timeout_ms)
        )
        return got

    async def committed(self, partition: Any) -> int | None:
        engine, _io = self._started()
        got = await self._run(engine.committed(_as_tp(partition), None))
        return None if got is None else int(got[0].offset)

    async def committed_with_epoch(self, partition: Any) -> EpochOffset | None:
        engine, _io = self._started()
        got = await self._run(engine.committed(_as_tp(partition), None))
        return None if got is None else got[0]

    async def commit(self, offsets: Mapping[Any, Any] | None = None) -> None:
        """Commit positions (default: the current ones) with their leader epochs. Values
        may be offsets, ``(offset, metadata)`` pairs (aiokafka), ``OffsetAndMetadata`` or
        ``EpochOffset``."""
        engine, _io = self._started()
        norm: dict[TopicPartition, Any] | None = None
        if offsets is not None:
            norm = {}
            for tp, value in offsets.items():
                if isinstance(value, tuple) and not isinstance(value, OffsetAndMetadata):
                    value = OffsetAndMetadata(value[0], value[1], -1)
                norm[_as_tp(tp)] = value
        await self._run(engine.commit(norm))

    def highwater(self, partition: Any) -> int | None:
        engine, _io = self._started()
        return engine.highwater(_as_tp(partition))

    def last_stable_offset(self, partition: Any) -> int | None:
        engine, _io = self._started()
        tp = _as_tp(partition)
        engine.highwater(tp)  # raises for a partition not assigned, as highwater()
        return engine.fetcher.last_stable_offsets.get(tp)

    def last_poll_timestamp(self, partition: Any) -> int | None:
        engine, _io = self._started()
        tp = _as_tp(partition)
        engine.highwater(tp)
        return engine.fetcher.last_fetch_ms.get(tp)

    def pause(self, *partitions: Any) -> None:
        engine, _io = self._started()
        engine.pause(*(_as_tp(tp) for tp in partitions))

    def resume(self, *partitions: Any) -> None:
        engine, _io = self._started()
        engine.resume(*(_as_tp(tp) for tp in partitions))

    def paused(self) -> set[TopicPartition]:
        engine, _io = self._started()
        return engine.paused()

    # ------------------------------------------------------------------ lookups

    async def beginning_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        engine, _io = self._started()
        got: dict[TopicPartition, int] = await self._run(
            engine.beginning_offsets([_as_tp(tp) for tp in partitions])
        )
        return got

    async def end_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        engine, _io = self._started()
        got: dict[TopicPartition, int] = await self._run(
            engine.end_offsets([_as_tp(tp) for tp in partitions])
        )
        return got

    async def offsets_for_times(
        self, timestamps: Mapping[Any, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        engine, _io = self._started()
        got: dict[TopicPartition, OffsetAndTimestamp | None] = await self._run(
            engine.offsets_for_times({_as_tp(tp): ts for tp, ts in timestamps.items()})
        )
        return got

    async def validate_offsets(
        self, offsets: Mapping[Any, EpochOffset], timeout_ms: int | None = None
    ) -> dict[TopicPartition, ValidationResult]:
        """Check positions kept outside Kafka against the leaders' logs (see
        ``EpochConsumer.validate_offsets``)."""
        engine, _io = self._started()
        got: dict[TopicPartition, ValidationResult] = await self._run(
            engine.validate_offsets({_as_tp(tp): p for tp, p in offsets.items()}, timeout_ms)
        )
        return got

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partitions from the metadata at hand (``None`` if unknown), as
        aiokafka."""
        engine, _io = self._started()
        parts = engine.fetcher.topic_partitions.get(topic)
        return None if parts is None else set(parts)

    async def topics(self) -> set[str]:
        engine, _io = self._started()
        got: set[str] = await self._run(engine.topics())
        return got

    def truncation_reports(self) -> list[TruncationReport]:
        """Every truncation report seen so far (oldest first)."""
        engine, _io = self._started()
        return engine.truncation_reports()

    def hanging_transactions(self) -> list[HangingTransaction]:
        """Every hanging transaction reported so far (read_committed only; oldest first)."""
        engine, _io = self._started()
        return engine.hanging_transactions()

    def reopened_transactions(self) -> list[ReopenedTransaction]:
        """Every transaction reported reopened by a truncation, or decided again otherwise
        than this consumer read it (read_committed only; oldest first)."""
        engine, _io = self._started()
        return engine.reopened_transactions()

    def metrics(self, raw: bool = False) -> dict[str, Any] | None:
        engine, _io = self._started()
        return engine.metrics(raw)
