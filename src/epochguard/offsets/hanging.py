"""Hanging transactions: when a partition's last stable offset stops for good.

A read_committed consumer cannot read past a partition's last stable offset (LSO), the
first offset of the oldest transaction still open there. A transaction whose COMMIT or
ABORT marker was lost (an unclean election truncated it away on the new leader) stays open
on that partition forever: the LSO stops while the high watermark moves on, and every
read_committed consumer of the partition stalls without an error. No transaction may stay
open longer than the broker's ``transaction.max.timeout.ms`` (its coordinator aborts it
then), so an LSO that has not moved for longer than that, with records behind it, is a
hanging transaction.

Sans-IO, one :class:`HangingTransactionWatch` per partition: the driver feeds each fetch
answer's LSO and high watermark and the consumer's position with
:meth:`~HangingTransactionWatch.observe`; when it answers a :class:`DescribeProducersAction`
the driver asks the partition leader DescribeProducers (KIP-664) and hands the answer to
:meth:`~HangingTransactionWatch.on_producers`, which names the hanging transaction. Each
stall is reported once; a watch starts over when the LSO moves. Time is a float ``now``
in the driver's clock. Moves follow :data:`TRANSITIONS`, checked at run time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Final

import attrs

from epochguard.offsets.errors import InvalidTransitionError

__all__ = [
    "TRANSITIONS",
    "DescribeProducersAction",
    "HangingTransaction",
    "HangingTransactionWatch",
    "ProducerState",
    "WatchState",
    "WatchTrigger",
]


class WatchState(enum.Enum):
    CLEAR = "clear"  # the LSO moves, or nothing waits behind it, or the consumer is behind it
    STALLED = "stalled"  # records wait behind an LSO the consumer reached; the clock runs
    ASKING = "asking"  # DescribeProducers sent to the leader
    REPORTED = "reported"  # this LSO's hanging transaction was reported; quiet until it moves


class WatchTrigger(enum.Enum):
    LSO_MOVED = "lso_moved"  # a new LSO value (a new clock)
    STALL_SEEN = "stall_seen"  # high watermark ahead of the LSO, position at it
    STALL_ENDED = "stall_ended"  # no longer so (the consumer sought back, the LSO caught up)
    TIMED_OUT = "timed_out"  # the LSO stood longer than transaction.max.timeout.ms
    FOUND = "found"  # the leader names a producer whose transaction starts at the LSO
    NOT_FOUND = "not_found"  # the leader knows no open transaction there (yet)
    FAILED = "failed"  # the request failed; asked again after a backoff


_S, _T = WatchState, WatchTrigger
#: Every move a watch can make. ``LSO_MOVED`` from any state lands in CLEAR.
TRANSITIONS: Final[dict[tuple[WatchState, WatchTrigger], WatchState]] = {
    **{(s, _T.LSO_MOVED): _S.CLEAR for s in WatchState},
    (_S.CLEAR, _T.STALL_SEEN): _S.STALLED,
    (_S.STALLED, _T.STALL_ENDED): _S.CLEAR,
    (_S.STALLED, _T.TIMED_OUT): _S.ASKING,
    (_S.ASKING, _T.FOUND): _S.REPORTED,
    (_S.ASKING, _T.NOT_FOUND): _S.STALLED,
    (_S.ASKING, _T.FAILED): _S.STALLED,
}


@attrs.frozen
class DescribeProducersAction:
    """Ask the partition leader DescribeProducers for ``tp``; pass the answer (or the
    failure) back to the watch."""

    tp: Any
    last_stable_offset: int


@attrs.frozen
class ProducerState:
    """One producer a partition leader has state for (a DescribeProducers entry).
    ``txn_start_offset`` is the first offset of its open transaction (``None``: none open)."""

    producer_id: int
    producer_epoch: int
    txn_start_offset: int | None
    last_timestamp: int | None = None
    coordinator_epoch: int | None = None


@attrs.frozen
class HangingTransaction:
    """A transaction open on ``tp`` longer than the broker allows: the LSO stood at
    ``first_offset`` for ``stalled_s`` seconds while the high watermark was ahead.

    ``producer_id``/``producer_epoch`` name the producer (what ``kafka-transactions.sh
    abort`` needs); ``None`` when the leader could not say (DescribeProducers refused or
    not supported), then ``kafka-transactions.sh find-hanging`` names it."""

    tp: Any
    first_offset: int
    high_watermark: int
    stalled_s: float
    producer_id: int | None = None
    producer_epoch: int | None = None
    coordinator_epoch: int | None = None
    #: Why no producer is named (the leader's error), when none is.
    unconfirmed_reason: str | None = None

    def describe(self) -> str:
        who = (
            f"producer {self.producer_id} epoch {self.producer_epoch}"
            if self.producer_id is not None
            else f"producer unknown ({self.unconfirmed_reason})"
        )
        return (
            f"{self.tp.topic}-{self.tp.partition}: transaction of {who} open since offset "
            f"{self.first_offset} for {self.stalled_s:.1f}s, longer than the broker's "
            f"transaction.max.timeout.ms; read_committed consumers stop at offset "
            f"{self.first_offset} while the high watermark is {self.high_watermark}. "
            "Abort it with kafka-transactions.sh abort (see the transactions guide)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values for a log line."""
        return {
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "coordinator_epoch": self.coordinator_epoch,
            "first_offset": self.first_offset,
            "last_stable_offset": self.first_offset,
            "high_watermark": self.high_watermark,
            "stalled_ms": round(self.stalled_s * 1000),
            "unconfirmed_reason": self.unconfirmed_reason,
        }


def hanging_producer(lso: int, producers: Iterable[ProducerState]) -> ProducerState | None:
    """The producer whose open transaction holds the LSO: the one starting at it, else the
    oldest open one (an LSO read before a later answer moved it)."""
    open_ = [p for p in producers if p.txn_start_offset is not None]
    for p in open_:
        if p.txn_start_offset == lso:
            return p
    return min(open_, key=lambda p: p.txn_start_offset or 0, default=None)


class HangingTransactionWatch:
    """One partition's watch over its last stable offset (see the module doc)."""

    __slots__ = ("_high_watermark", "_lso", "_retry_at", "_since", "max_timeout_s", "state", "tp")

    def __init__(self, tp: Any, max_timeout_s: float) -> None:
        if max_timeout_s <= 0:
            raise ValueError(f"max_timeout_s must be positive, got {max_timeout_s}")
        self.tp = tp
        self.max_timeout_s = max_timeout_s
        self.state = WatchState.CLEAR
        self._lso: int | None = None
        self._high_watermark = 0
        # When the current LSO value was first seen: how long it has stood.
        self._since = 0.0
        # No request before this (after a failure or an answer without an open transaction).
        self._retry_at = 0.0

    def _goto(self, trigger: WatchTrigger) -> None:
        target = TRANSITIONS.get((self.state, trigger))
        if target is None:
            raise InvalidTransitionError(
                f"hanging-transaction watch of {self.tp}: no move from "
                f"{self.state.value} on {trigger.value}"
            )
        self.state = target

    def observe(
        self, last_stable_offset: int, high_watermark: int, position: int | None, now: float
    ) -> DescribeProducersAction | None:
        """A fetch answer's LSO and high watermark, the consumer's position (``None``: none
        yet). Answers the request to send, if the LSO has now stood too long."""
        if last_stable_offset != self._lso:
            self._lso = last_stable_offset
            self._since = now
            self._retry_at = 0.0
            self._goto(WatchTrigger.LSO_MOVED)
        self._high_watermark = high_watermark
        stalled = (
            high_watermark > last_stable_offset
            and position is not None
            and position >= last_stable_offset
        )
        if self.state is WatchState.CLEAR and stalled:
            self._goto(WatchTrigger.STALL_SEEN)
        elif self.state is WatchState.STALLED and not stalled:
            self._goto(WatchTrigger.STALL_ENDED)
        if (
            self.state is WatchState.STALLED
            and now - self._since > self.max_timeout_s
            and now >= self._retry_at
        ):
            self._goto(WatchTrigger.TIMED_OUT)
            return DescribeProducersAction(self.tp, last_stable_offset)
        return None

    def on_producers(
        self, action: DescribeProducersAction, producers: Iterable[ProducerState], now: float
    ) -> HangingTransaction | None:
        """The leader's DescribeProducers answer: the hanging transaction, or ``None`` if
        the leader has no open transaction (asked again one timeout later)."""
        if self.state is not WatchState.ASKING or action.last_stable_offset != self._lso:
            return None  # the LSO moved while the request was out: nothing hangs there
        found = hanging_producer(action.last_stable_offset, producers)
        if found is None:
            self._goto(WatchTrigger.NOT_FOUND)
            self._retry_at = now + self.max_timeout_s
            return None
        self._goto(WatchTrigger.FOUND)
        return HangingTransaction(
            tp=self.tp,
            first_offset=found.txn_start_offset
            if found.txn_start_offset is not None
            else action.last_stable_offset,
            high_watermark=self._high_watermark,
            stalled_s=now - self._since,
            producer_id=found.producer_id,
            producer_epoch=found.producer_epoch,
            coordinator_epoch=found.coordinator_epoch,
        )

    def on_refused(
        self, action: DescribeProducersAction, reason: str, now: float
    ) -> HangingTransaction | None:
        """The leader cannot describe its producers to this client (not authorized, an
        older broker): the stall is reported without a producer."""
        if self.state is not WatchState.ASKING or action.last_stable_offset != self._lso:
            return None
        self._goto(WatchTrigger.FOUND)
        return HangingTransaction(
            tp=self.tp,
            first_offset=action.last_stable_offset,
            high_watermark=self._high_watermark,
            stalled_s=now - self._since,
            unconfirmed_reason=reason,
        )

    def on_failed(self, action: DescribeProducersAction, retry_at: float) -> None:
        """The request failed (no answer, the broker no longer leads): ask again from
        ``retry_at``."""
        if self.state is WatchState.ASKING and action.last_stable_offset == self._lso:
            self._goto(WatchTrigger.FAILED)
            self._retry_at = retry_at
