"""The hanging-transaction watch, sans-IO: when a stopped last stable offset is a hanging
transaction, and which producer the leader's answer names."""

from __future__ import annotations

import pytest
from kafka.structs import TopicPartition

from epochguard.offsets.errors import InvalidTransitionError
from epochguard.offsets.hanging import (
    TRANSITIONS,
    DescribeProducersAction,
    HangingTransactionWatch,
    ProducerState,
    WatchState,
    WatchTrigger,
    hanging_producer,
)

TP = TopicPartition("t", 0)
TIMEOUT = 10.0


def _stalled_watch() -> HangingTransactionWatch:
    w = HangingTransactionWatch(TP, TIMEOUT)
    assert w.observe(0, 2, 0, now=0.0) is None
    assert w.state is WatchState.STALLED
    return w


# (lso, high watermark, position, now) fed in order; whether the last one asks.
CASES = [
    ("stood exactly the timeout: not yet", [(0, 2, 0, 0.0), (0, 2, 0, 10.0)], False),
    ("stood longer than the timeout", [(0, 2, 0, 0.0), (0, 2, 0, 10.1)], True),
    ("the clock runs from the first sight of the LSO, not from the position reaching it",
     [(0, 2, None, 0.0), (0, 2, 0, 10.1)], True),
    ("nothing behind the LSO: an idle partition", [(2, 2, 2, 0.0), (2, 2, 2, 99.0)], False),
    ("consumer still behind the LSO", [(5, 9, 3, 0.0), (5, 9, 3, 99.0)], False),
    ("the LSO moved: a new clock", [(0, 2, 0, 0.0), (1, 3, 1, 9.0), (1, 3, 1, 18.0)], False),
    ("the new LSO stood too long in turn",
     [(0, 2, 0, 0.0), (1, 3, 1, 9.0), (1, 3, 1, 19.1)], True),
    ("a new LSO reached late is timed from its first sight",
     [(0, 2, 0, 0.0), (4, 6, 0, 1.0), (4, 6, 4, 11.2)], True),
]  # fmt: skip


@pytest.mark.parametrize(("name", "feed", "asks"), CASES, ids=[c[0] for c in CASES])
def test_when_a_stopped_lso_is_asked_about(
    name: str, feed: list[tuple[int, int, int | None, float]], asks: bool
) -> None:
    w = HangingTransactionWatch(TP, TIMEOUT)
    answers = [w.observe(lso, hw, pos, now) for lso, hw, pos, now in feed]
    assert all(a is None for a in answers[:-1])
    assert (answers[-1] is not None) is asks
    if asks:
        assert answers[-1] == DescribeProducersAction(TP, feed[-1][0])
        assert w.state is WatchState.ASKING


def test_the_producer_whose_transaction_starts_at_the_lso_is_named_once() -> None:
    w = _stalled_watch()
    action = w.observe(0, 2, 0, now=10.5)
    assert action is not None
    producers = [
        ProducerState(1, 0, None),
        ProducerState(7, 3, 0, coordinator_epoch=2),
        ProducerState(9, 0, 1),
    ]
    found = w.on_producers(action, producers, now=10.6)
    assert found is not None
    assert (found.tp, found.producer_id, found.producer_epoch, found.first_offset) == (TP, 7, 3, 0)
    assert (found.high_watermark, found.coordinator_epoch) == (2, 2)
    assert found.stalled_s == pytest.approx(10.6)
    assert "producer 7 epoch 3" in found.describe()
    assert found.to_dict()["stalled_ms"] == 10600
    # Reported: quiet while the LSO stands, however long.
    assert w.observe(0, 5, 0, now=100.0) is None
    assert w.state is WatchState.REPORTED
    # Aborted by an operator: the LSO moves and the watch starts over.
    assert w.observe(5, 5, 5, now=101.0) is None
    assert w.state is WatchState.CLEAR


def test_no_open_transaction_at_the_leader_asks_again_one_timeout_later() -> None:
    w = _stalled_watch()
    action = w.observe(0, 2, 0, now=10.5)
    assert action is not None
    assert w.on_producers(action, [ProducerState(1, 0, None)], now=10.6) is None
    assert w.state is WatchState.STALLED
    assert w.observe(0, 2, 0, now=20.0) is None
    assert w.observe(0, 2, 0, now=20.7) == action


def test_a_failed_request_is_asked_again_after_the_backoff() -> None:
    w = _stalled_watch()
    action = w.observe(0, 2, 0, now=10.5)
    assert action is not None
    w.on_failed(action, retry_at=11.0)
    assert w.observe(0, 2, 0, now=10.9) is None
    assert w.observe(0, 2, 0, now=11.0) == action


def test_a_refusal_reports_the_stall_without_a_producer() -> None:
    w = _stalled_watch()
    action = w.observe(0, 2, 0, now=10.5)
    assert action is not None
    found = w.on_refused(action, "TopicAuthorizationFailedError", now=10.6)
    assert found is not None
    assert (found.producer_id, found.first_offset) == (None, 0)
    assert "producer unknown (TopicAuthorizationFailedError)" in found.describe()


def test_an_answer_for_an_lso_that_moved_meanwhile_is_ignored() -> None:
    w = _stalled_watch()
    action = w.observe(0, 2, 0, now=10.5)
    assert action is not None
    w.observe(2, 2, 2, now=10.6)
    assert w.on_producers(action, [ProducerState(7, 0, 0)], now=10.7) is None
    assert w.state is WatchState.CLEAR


def test_oldest_open_transaction_when_none_starts_at_the_lso() -> None:
    producers = [ProducerState(1, 0, 8), ProducerState(2, 0, 5), ProducerState(3, 0, None)]
    assert hanging_producer(4, producers) == ProducerState(2, 0, 5)
    assert hanging_producer(4, [ProducerState(3, 0, None)]) is None


def test_moves_outside_the_table_are_refused() -> None:
    w = HangingTransactionWatch(TP, TIMEOUT)
    assert (WatchState.CLEAR, WatchTrigger.FOUND) not in TRANSITIONS
    with pytest.raises(InvalidTransitionError):
        w._goto(WatchTrigger.FOUND)
    with pytest.raises(ValueError, match="max_timeout_s"):
        HangingTransactionWatch(TP, 0)
