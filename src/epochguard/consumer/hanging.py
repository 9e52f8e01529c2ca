"""The engine's watch over read_committed partitions whose last stable offset stopped.

Drives one :class:`~epochguard.offsets.hanging.HangingTransactionWatch` per partition from
what the fetcher records of each Fetch answer (last stable offset, high watermark) and the
trackers' positions, and sends the DescribeProducers requests the watches ask for to the
partition leaders. It never waits: :meth:`HangingTransactionMonitor.tick` runs in each
round of ``poll()`` under either driver; answers are queued by the request futures (on
whichever thread serves the connections), wake the driver through the fetcher's signal and
are applied by the next tick, on the driver's thread.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.consumer import wire
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.fetcher import Fetcher
from epochguard.offsets.hanging import (
    DescribeProducersAction,
    HangingTransaction,
    HangingTransactionWatch,
)
from epochguard.offsets.policy import RetryBackoff

__all__ = ["HangingTransactionMonitor"]

log = get_logger("epochguard.consumer")

#: Errors after which asking again cannot help: the stall is reported without a producer.
_REFUSALS = (
    wire.ERR.TopicAuthorizationFailedError,
    wire.ERR.ClusterAuthorizationFailedError,
    wire.ERR.UnsupportedVersionError,
    wire.ERR.InvalidRequestError,
)
#: How often a failed DescribeProducers is asked again.
_RETRY = RetryBackoff(0.5, 10.0)


class HangingTransactionMonitor:
    """Watches every assigned partition of a read_committed consumer (see the module doc);
    ``found`` gets each hanging transaction, once per stall."""

    def __init__(
        self,
        client: BrokerClient,
        fetcher: Fetcher,
        max_timeout_ms: int,
        request_timeout_ms: int,
        found: Callable[[HangingTransaction], None],
    ) -> None:
        self._client = client
        self._fetcher = fetcher
        self._max_timeout_s = max_timeout_ms / 1000
        self._request_timeout_ms = request_timeout_ms
        self._found = found
        self._watches: dict[TopicPartition, HangingTransactionWatch] = {}
        self._answers: collections.deque[tuple[dict[TopicPartition, Any], Any]] = (
            collections.deque()
        )
        self._failures = 0
        # Looking at every partition in every poll round is not needed to notice a stall
        # of minutes: at most ten looks per timeout, and at least one a second.
        self._interval_s = min(1.0, self._max_timeout_s / 10)
        self._next_look = 0.0
        self.requests_sent = 0
        self.detected = 0

    def tick(self, now: float) -> None:
        """Apply the DescribeProducers answers that arrived; then, at most every
        ``_interval_s``, feed each partition's last fetch answer to its watch and send
        the requests the watches ask for."""
        while self._answers:
            self._apply(*self._answers.popleft())
        if now < self._next_look:
            return
        self._next_look = now + self._interval_s
        fetcher = self._fetcher
        highwaters = fetcher.highwaters
        watches = self._watches
        for tp in [tp for tp in watches if tp not in fetcher.trackers]:
            del watches[tp]
        by_leader: dict[int, dict[TopicPartition, DescribeProducersAction]] = {}
        for tp, lso in fetcher.last_stable_offsets.items():
            tracker = fetcher.trackers.get(tp)
            hw = highwaters.get(tp)
            if tracker is None or hw is None:
                continue
            watch = watches.get(tp)
            if watch is None:
                watch = watches[tp] = HangingTransactionWatch(tp, self._max_timeout_s)
            position = tracker.position
            action = watch.observe(lso, hw, None if position is None else position.offset, now)
            if action is None:
                continue
            leader = fetcher.metadata.leaders.get(tp, (None, None))[0]
            if leader is None:
                watch.on_failed(action, now + _RETRY.delay(self._failures))
                fetcher.request_metadata()
                continue
            by_leader.setdefault(leader, {})[tp] = action
        for leader, actions in by_leader.items():
            self._send(leader, actions)

    def _send(self, leader: int, actions: dict[TopicPartition, DescribeProducersAction]) -> None:
        self.requests_sent += 1
        log.debug(
            "describe_producers_sent",
            node=leader,
            partitions=sorted(str(tp) for tp in actions),
        )
        future = self._client.send(
            leader, wire.describe_producers_request(actions), self._request_timeout_ms
        )
        wake = self._fetcher.wake_signal

        def done(_value: Any) -> None:
            self._answers.append((actions, future))
            wake.set()

        future.add_both(done)

    def _apply(self, actions: dict[TopicPartition, DescribeProducersAction], future: Any) -> None:
        now = time.monotonic()
        if future.exception is not None:
            self._failures += 1
            log.debug("describe_producers_failed", error=repr(future.exception))
            for tp, action in actions.items():
                self._fail(tp, action, now)
            return
        self._failures = 0
        for tp, error, producers in wire.read_describe_producers(future.value):
            asked = actions.pop(tp, None)
            watch = self._watches.get(tp)
            if asked is None or watch is None:
                continue
            if error is None:
                found = watch.on_producers(asked, producers, now)
            elif issubclass(error, _REFUSALS):
                found = watch.on_refused(asked, error.__name__, now)
            else:
                # Not the leader any more, a leader election under way: ask the new one.
                log.debug(
                    "describe_producers_error",
                    topic=tp.topic,
                    partition=tp.partition,
                    error=error.__name__,
                )
                self._fetcher.request_metadata()
                watch.on_failed(asked, now + _RETRY.delay(0))
                continue
            if found is not None:
                self.detected += 1
                self._found(found)
        for tp, action in actions.items():  # partitions the answer left out
            self._fail(tp, action, now)

    def _fail(self, tp: TopicPartition, action: DescribeProducersAction, now: float) -> None:
        watch = self._watches.get(tp)
        if watch is not None:
            watch.on_failed(action, now + _RETRY.delay(self._failures))
