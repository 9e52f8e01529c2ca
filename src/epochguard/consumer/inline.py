"""The threaded driver without an IO thread: connections served by the threads that wait.

``EpochConsumer(io_thread=False)`` builds its ``BrokerClient`` without kafka-python's IO
thread. Whichever thread blocks in the consumer (the application in ``poll()`` or
``commit()``, the heartbeat thread awaiting its answer, ``commit_async``'s worker) steps the
connections' selector while it waits, one thread at a time: the others wait for their answer
as before, and when the stepping thread is done it wakes them, so one of them takes over.
A fetch answer is then read and decoded on one thread, with no GIL hand-off between an IO
thread and the application's.

A request goes on the wire when it is handed over (the selector is stepped once without
waiting, unless another thread steps it already), so a fetch sent ahead reaches the broker
before the answer in hand is decoded. Answers are read when a thread waits: a fetch answer
waits in the socket's buffer until ``poll()`` has handed out what is buffered. Reading them
earlier (between polls) made the fetches of many partitions smaller and more numerous: each
early answer freed its broker for a fetch of the few partitions drained by then. Heartbeats
keep their own thread: it sleeps between heartbeats and steps the selector only while
awaiting its answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from epochguard._log import get_logger
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.effects import (
    Await,
    Effect,
    Pump,
    Signal,
    Step,
    TaskHandle,
    block_on,
    run_blocking,
    timeout_error,
)

__all__ = ["CallerThreadIO"]

log = get_logger("epochguard.consumer")

T = TypeVar("T")

#: Most turns of the selector per :meth:`CallerThreadIO.send_now` (a request's task starts
#: in the turn after it was handed over; a few turns see it onto the socket).
_FLUSH_TURNS = 3


class CallerThreadIO:
    """Runs engine steps on the calling thread, serving ``client``'s connections while it
    waits (``client`` built with ``io_thread=False``)."""

    def __init__(self, client: BrokerClient) -> None:
        self._net = client.selector
        # Held by the thread stepping the selector (kafka-python's own lock refuses a second
        # one with an error rather than making it wait).
        self._stepping = threading.Lock()
        self._stepper: int | None = None
        # Threads waiting for an answer while another one steps: woken when it stops, so
        # one of them takes over.
        self._waiters: set[threading.Event] = set()
        self._waiters_lock = threading.Lock()
        client.on_send = self.send_now
        client.send_directly = self.send_directly

    # ------------------------------------------------------------------ the selector

    def _wake_stepper(self) -> None:
        """Make a thread blocked in the selector return (another thread's event)."""
        if self._stepper is not None and self._stepper != threading.get_ident():
            self._net.wakeup()

    def _serve_until(
        self,
        ready: Callable[[], bool],
        deadline: float,
        watch: Callable[[Callable[[], None]], Callable[[], None]],
    ) -> None:
        """Step the selector until ``ready()`` or ``deadline``. When another thread steps it,
        wait until ``ready()`` (``watch(wake)`` calls ``wake`` when it may have become true,
        from any thread, and returns how to stop watching) or until that thread stops
        stepping, and then take over."""
        if ready():
            return
        event = threading.Event()
        unwatch = watch(event.set)
        with self._waiters_lock:
            self._waiters.add(event)
        try:
            while not ready():
                # A wait already due still turns the selector once: the answers that arrived
                # are read (a poll(timeout_ms=0) loop gets its records).
                if self._stepping.acquire(blocking=False):
                    try:
                        self._stepper = threading.get_ident()
                        self._step_until(ready, deadline)
                    finally:
                        self._stepper = None
                        self._stepping.release()
                        self._hand_over()
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                event.wait(remaining)
                event.clear()
        finally:
            with self._waiters_lock:
                self._waiters.discard(event)
            unwatch()

    def _step_until(self, ready: Callable[[], bool], deadline: float) -> None:
        """Turn the selector until ``ready()`` or ``deadline``, at least once."""
        net = self._net
        while not net._closed:
            net.poll(timeout_ms=max(0.0, deadline - time.monotonic()) * 1000)
            if ready() or time.monotonic() >= deadline:
                return

    def _hand_over(self) -> None:
        with self._waiters_lock:
            waiters = list(self._waiters)
        for event in waiters:
            event.set()

    def send_now(self) -> None:
        """Step the selector without waiting (requests handed over go on the wire, what
        arrived is read), unless a thread steps it already: that one sends them (a request
        handed over from another thread wakes it)."""
        net = self._net
        if net._closed or not self._stepping.acquire(blocking=False):
            return
        try:
            self._stepper = threading.get_ident()
            for _ in range(_FLUSH_TURNS):
                net.poll(timeout_ms=0)
                if not net._ready:
                    break
        finally:
            self._stepper = None
            self._stepping.release()
            self._hand_over()

    def send_directly(self, send: Callable[[], T]) -> T | None:
        """``BrokerClient.send_directly``: unless another thread steps the selector (or this
        one, from within a turn), a request goes on its connection at once, from this
        thread, under the stepping lock."""
        net = self._net
        if net._closed or not self._stepping.acquire(blocking=False):
            return None
        try:
            if net._closed:
                return None
            result = send()
            # What the socket did not take waits for the selector's writer: a turn or two.
            for _ in range(_FLUSH_TURNS):
                if not net._ready:
                    break
                net.poll(timeout_ms=0)
            return result
        finally:
            self._stepping.release()
            self._hand_over()

    def close(self, timeout_s: float = 1.0) -> None:
        """Close the selector (after the client closed its connections). A thread still
        stepping it (a call made from another thread during ``close()``) is waited for at
        most ``timeout_s``; if it is still at it then, the selector is left open."""
        if not self._stepping.acquire(timeout=max(0.0, timeout_s)):
            # Not under a thread inside it: its connections are closed already.
            log.debug("client_selector_busy_at_close")
            return
        try:
            self._net.close()
        except Exception as exc:
            log.debug("client_selector_close_error", error=repr(exc))
        finally:
            self._stepping.release()
        self._hand_over()

    # ------------------------------------------------------------------ effects

    def _watch_signal(self, signal: Signal) -> Callable[[Callable[[], None]], Callable[[], None]]:
        def watch(wake: Callable[[], None]) -> Callable[[], None]:
            # Also wakes this thread out of the selector when another thread sets it.
            signal.add_waker(self._wake_stepper)
            signal.add_waker(wake)

            def unwatch() -> None:
                signal.remove_waker(wake)
                signal.remove_waker(self._wake_stepper)

            return unwatch

        return watch

    @staticmethod
    def _watch_future(future: Any) -> Callable[[Callable[[], None]], Callable[[], None]]:
        def watch(wake: Callable[[], None]) -> Callable[[], None]:
            # A kafka Future keeps its callbacks: a spent wake only sets a spent event.
            future.add_both(lambda _v: wake())
            return lambda: None

        return watch

    def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, Pump):
            fetcher = effect.fetcher
            now = time.monotonic()
            wake_at = fetcher.send_requests(now)
            signal = fetcher.wake_signal
            if not fetcher.has_completions(effect.decode):
                self._serve_until(
                    signal.is_set, min(effect.until, wake_at), self._watch_signal(signal)
                )
            signal.clear()
            return None
        if isinstance(effect, Await) and not effect.future.is_done:
            future = effect.future
            self._serve_until(
                lambda: bool(future.is_done),
                time.monotonic() + effect.timeout_s,
                self._watch_future(future),
            )
            if not future.is_done:
                raise timeout_error(effect.timeout_s)
        # A completed future's outcome, and the effects that only wait, as without this
        # runner. Heartbeats wait for a signal other threads set between beats (WaitSignal)
        # without stepping the selector meanwhile, which would make theirs the IO thread again.
        return block_on(effect)

    def run(self, step: Step[T]) -> T:
        """Run ``step`` to its end on this thread, serving the connections while it waits."""
        return run_blocking(step, self._perform)

    def spawn(self, step: Step[None], name: str) -> TaskHandle:
        """A background step (heartbeats) on a daemon thread of its own."""
        thread = threading.Thread(target=self.run, args=(step,), name=name, daemon=True)
        thread.start()

        def join(timeout_s: float) -> None:
            if thread is not threading.current_thread():
                thread.join(timeout_s)

        return TaskHandle(join, thread.is_alive)
