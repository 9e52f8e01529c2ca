"""What the consumer engine asks its driver for, and the threaded driver's runner.

The engine never blocks, sleeps or starts a thread. Every multi-step operation (a commit
with its retries, a group join, fetching committed offsets, a position lookup) is a
generator, a :data:`Step`, that yields an *effect* whenever it needs time to pass or an
answer to arrive, and gets the result sent back in. A driver runs steps:

- the threaded driver (:func:`run_blocking`, used by ``EpochConsumer``) blocks the calling
  thread on each effect;
- the asyncio driver (``epochguard.consumer.aio``) awaits each effect on the event loop.

Both run the same engine code, so a retry rule or a rebalance decision is written once.
Effects are small and complete: :class:`Await` (a request's future), :class:`Sleep`,
:class:`WaitSignal` (until another party sets a :class:`Signal`), :class:`Pump` (let the
fetcher's requests go out and its answers come in) and :class:`Call` (an application
callback, which under asyncio may be a coroutine function).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import kafka.errors as kerrors

if TYPE_CHECKING:
    from epochguard.consumer.fetcher import Fetcher

__all__ = [
    "Await",
    "Call",
    "Pump",
    "Signal",
    "Sleep",
    "Step",
    "TaskHandle",
    "WaitSignal",
    "block_on",
    "request",
    "run_blocking",
    "spawn_thread",
]

T = TypeVar("T")


class Signal:
    """A flag any thread can set, waking whichever driver waits on it (:class:`WaitSignal`).

    ``threading.Event`` cannot wake an event loop and ``asyncio.Event`` cannot be set from
    another thread; a driver registers its own wake-up here while it waits."""

    __slots__ = ("_lock", "_set", "_wakers")

    def __init__(self) -> None:
        self._set = False
        self._lock = threading.Lock()
        self._wakers: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._lock:
            self._set = True
            if not self._wakers:  # every fetch answer sets it; most often nobody waits
                return
            wakers = list(self._wakers)
        for wake in wakers:
            wake()

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def add_waker(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wakers.append(wake)
            already = self._set
        if already:
            wake()

    def remove_waker(self, wake: Callable[[], None]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._wakers.remove(wake)

    def wait_blocking(self, timeout_s: float) -> bool:
        """Block this thread until set or ``timeout_s`` passed; whether it is set."""
        if self._set:
            return True
        event = threading.Event()
        self.add_waker(event.set)
        try:
            event.wait(max(0.0, timeout_s))
        finally:
            self.remove_waker(event.set)
        return self._set


@attrs.frozen
class Await:
    """Wait for a kafka ``Future`` (a request sent through ``BrokerClient.send``) at most
    ``timeout_s``; the step gets its value, or its exception raised into it
    (``KafkaTimeoutError`` when the time runs out first)."""

    future: Any
    timeout_s: float


@attrs.frozen
class Sleep:
    seconds: float


@attrs.frozen
class WaitSignal:
    """Wait until ``signal`` is set or ``timeout_s`` passed; the step gets whether it is set."""

    signal: Signal
    timeout_s: float


@attrs.frozen
class Pump:
    """Send what ``fetcher`` has to send, then wait for its next answer (or its next timer)
    until ``until`` at the latest. The step that yields it applies the answers
    (``process_completions``) at the top of its loop: once per turn, so a decode budget
    bounds what one turn decodes."""

    fetcher: Fetcher
    until: float
    #: False: answers whose records wait undecoded (the asyncio driver's decode budget) are
    #: no reason not to wait. A step that hands out no records (a lookup, a position) leaves
    #: them to the reads, which decode what they hand out.
    decode: bool = True


@attrs.frozen
class Turn:
    """The step applied answers and is about to hand out records and send what they call
    for: a driver whose thread runs other work too (the asyncio loop's tasks) lets it run
    now if it has waited long. The threaded drivers have nothing to let run."""


@attrs.frozen
class Call:
    """Run an application callback; under asyncio a coroutine it returns is awaited."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


Effect = Await | Sleep | WaitSignal | Pump | Turn | Call
#: A multi-step engine operation returning ``T``.
Step = Generator[Effect, Any, T]


def request(client: Any, node: Any, req: Any, timeout_s: float) -> Step[Any]:
    """Send ``req`` to ``node`` and wait for the answer (``BrokerClient.request``'s bound:
    half a second past the request's own timeout)."""
    future = client.send(node, req, timeout_s * 1000)
    return (yield Await(future, timeout_s + 0.5))


def timeout_error(timeout_s: float) -> kerrors.KafkaTimeoutError:
    return kerrors.KafkaTimeoutError(f"no answer within {timeout_s:.1f}s")


# ---------------------------------------------------------------------- threaded driver


def block_on(effect: Effect) -> Any:
    """Carry out ``effect`` on this thread, blocking until it is done (kafka-python's IO
    thread, or another thread, completes the futures)."""
    if isinstance(effect, Turn):
        return None
    if isinstance(effect, Pump):
        fetcher = effect.fetcher
        now = time.monotonic()
        wake_at = fetcher.send_requests(now)
        fetcher.wait(max(0.0, min(effect.until, wake_at) - now), effect.decode)
        return None
    if isinstance(effect, Await):
        future = effect.future
        if not future.is_done:
            done = threading.Event()
            future.add_both(lambda _v: done.set())
            if not done.wait(max(0.0, effect.timeout_s)):
                raise timeout_error(effect.timeout_s)
        if future.exception is not None:
            raise future.exception
        return future.value
    if isinstance(effect, Sleep):
        if effect.seconds > 0:
            time.sleep(effect.seconds)
        return None
    if isinstance(effect, WaitSignal):
        return effect.signal.wait_blocking(effect.timeout_s)
    if isinstance(effect, Call):
        result = effect.fn(*effect.args)
        if inspect.isawaitable(result):
            raise TypeError(
                f"{effect.fn!r} returned an awaitable: async callbacks need AIOEpochConsumer"
            )
        return result
    raise TypeError(f"not an effect: {effect!r}")


def run_blocking(step: Step[T], perform: Callable[[Effect], Any] = block_on) -> T:
    """Run ``step`` to its end on this thread, each effect carried out by ``perform``
    (default: blocking on it)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = step.send(value) if error is None else step.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            value = perform(effect)
        except Exception as exc:
            error = exc


class TaskHandle:
    """A step running on its own (heartbeats): stopped by the signal its step watches."""

    def __init__(self, join: Callable[[float], None], alive: Callable[[], bool]) -> None:
        self._join = join
        self._alive = alive

    def join(self, timeout_s: float) -> None:
        self._join(timeout_s)

    def is_alive(self) -> bool:
        return self._alive()


def spawn_thread(step: Step[None], name: str) -> TaskHandle:
    """The threaded driver's way to run a background step: a daemon thread."""

    def main() -> None:
        run_blocking(step)

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()

    def join(timeout_s: float) -> None:
        if thread is not threading.current_thread():
            thread.join(timeout_s)

    return TaskHandle(join, thread.is_alive)
