"""The transaction ledger (offsets/reopened.py) on hand-fed answers: each signal fires where a
decision the consumer acted on no longer holds, and never on a log that keeps its markers."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from epochguard.offsets.errors import InvalidTransitionError
from epochguard.offsets.reopened import (
    TRANSITIONS,
    BatchKind,
    ReopenCause,
    ReopenedTransaction,
    TransactionLedger,
    TxnBatch,
    TxnState,
    TxnTrigger,
    UndecidedTransaction,
    _Txn,
)

from ..examples import scaled

TP = TopicPartition("t", 0)
P, Q = 1000, 2000
D, S, C, A = BatchKind.DELIVERED, BatchKind.SKIPPED, BatchKind.COMMIT, BatchKind.ABORT


def b(pid: int, first: int, last: int, kind: BatchKind, epoch: int = 0) -> TxnBatch:
    return TxnBatch(pid, epoch, first, last, kind)


def test_a_truncation_below_a_commit_read_reopens_its_transaction() -> None:
    ledger = TransactionLedger(TP)
    # P's records 0..2 delivered, its COMMIT at 3, a plain record at 4.
    assert ledger.read(0, [b(P, 0, 2, D, epoch=5), b(P, 3, 3, C, epoch=5)], 5) == []
    (found,) = ledger.truncated(2)
    assert found.cause is ReopenCause.MARKER_TRUNCATED
    assert (found.producer_id, found.producer_epoch) == (P, 5)
    assert (found.first_offset, found.last_offset) == (0, 1)  # 2 is gone with the marker
    assert found.delivered and found.now_committed is None and found.was == "committed"
    assert (found.marker_offset, found.divergence) == (3, 2)
    assert found.covers(0) and found.covers(1) and not found.covers(2)
    assert "open again" in found.describe() and "t-0" in found.describe()
    assert found.to_dict()["cause"] == "marker_truncated"


def test_a_truncation_above_the_marker_or_below_the_records_reopens_nothing() -> None:
    for divergence in (4, 5, 0):
        ledger = TransactionLedger(TP)
        ledger.read(0, [b(P, 0, 2, D), b(P, 3, 3, C)], 5)
        assert ledger.truncated(divergence) == []


def test_records_skipped_as_aborted_are_reopened_too() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 1, S), b(P, 2, 2, A)], 3, aborted=[(P, 0)])
    (found,) = ledger.truncated(2)
    assert not found.delivered and found.was == "aborted"
    assert (found.first_offset, found.last_offset) == (0, 1)


def test_records_whose_marker_was_never_read_are_reopened_below_the_divergence() -> None:
    """The answer ended before the marker (its records were read as committed, below the last
    stable offset): a truncation at or below where the reading stopped reopens them."""
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 1, D)], 2)
    (found,) = ledger.truncated(1)
    assert (found.first_offset, found.last_offset, found.marker_offset) == (0, 0, None)


def test_the_next_marker_deciding_otherwise_is_reported() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 2, D), b(P, 3, 3, C)], 4)
    ledger.truncated(3)
    # On the new leader the producer's next transaction (4..5) joins it; its ABORT at 6
    # decides both. This answer has no aborted list entry (the bare marker rule).
    (found,) = ledger.read(3, [b(P, 4, 5, S), b(P, 6, 6, A)], 7)
    assert found.cause is ReopenCause.DECIDED_AGAIN
    assert (found.first_offset, found.last_offset) == (0, 2)
    assert found.delivered and found.now_committed is False and found.now == "aborted"
    assert found.marker_offset == 6
    assert "decided again, now aborted" in found.describe()


def test_the_next_marker_deciding_the_same_way_is_quiet() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 2, D), b(P, 3, 3, C)], 4)
    ledger.truncated(3)
    assert ledger.read(3, [b(P, 4, 5, D), b(P, 6, 6, C)], 7) == []
    # ... and it is decided again, its records now 0..5: a later truncation below its new
    # marker reopens all it read.
    (found,) = ledger.truncated(6)
    assert (found.first_offset, found.last_offset) == (0, 5)


def test_skipped_records_committed_since_are_reported() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 1, S), b(P, 2, 2, A)], 3, aborted=[(P, 0)])
    ledger.truncated(2)
    (found,) = ledger.read(2, [b(P, 3, 3, D), b(P, 4, 4, C)], 5)
    assert not found.delivered and found.now_committed is True
    assert found.cause is ReopenCause.DECIDED_AGAIN


def test_an_aborted_list_reaching_below_the_fetch_reverts_deliveries() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 2, D), b(P, 3, 3, C)], 4)
    ledger.truncated(3)
    # Kafka lists an aborted transaction whose range overlaps the fetch, first offset 0
    # included, although the fetch starts at 3.
    found = ledger.read(3, [b(P, 3, 4, S)], 5, aborted=[(P, 0)])
    assert [f.cause for f in found] == [ReopenCause.ABORTED_LISTED]
    assert (found[0].first_offset, found[0].last_offset, found[0].now_committed) == (0, 2, False)
    # Reported once: the ABORT marker that follows, and the same list again, are quiet.
    assert ledger.read(5, [b(P, 5, 5, A)], 6, aborted=[(P, 0)]) == []


def test_an_aborted_list_names_a_decided_transaction_whose_truncation_went_unseen() -> None:
    """The consumer never saw the truncation (it had read up to the divergence exactly), but
    the transaction it read committed is aborted in the new leader's index."""
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 1, D), b(P, 2, 2, C)], 3)
    (found,) = ledger.read(3, [], 4, aborted=[(P, 0)])
    assert found.cause is ReopenCause.ABORTED_LISTED and found.delivered


def test_a_log_that_keeps_its_markers_reports_nothing() -> None:
    """Interleaved producers, commits and aborts, answers cut between records and markers,
    aborted lists that reach back below the fetch for transactions this consumer skipped."""
    ledger = TransactionLedger(TP)
    answers = [
        (0, [b(P, 0, 1, D), b(Q, 2, 2, S)], 3, [(Q, 2)]),
        (3, [b(P, 3, 3, C), b(Q, 4, 4, S)], 5, [(Q, 2)]),
        (5, [b(Q, 5, 5, A), b(P, 6, 7, S)], 8, [(P, 6)]),
        (8, [b(P, 8, 8, A), b(Q, 9, 9, D), b(Q, 10, 10, C)], 11, [(P, 6)]),
    ]
    for offset, batches, end, aborted in answers:
        assert ledger.read(offset, batches, end, aborted) == []


def test_a_seek_back_forgets_what_will_be_read_again() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 2, D), b(P, 3, 3, C)], 4)
    # Sought back to 2: the marker at 3 is read again, the transaction is open from 0.
    assert ledger.read(2, [b(P, 2, 2, D)], 3) == []
    (found,) = ledger.truncated(3)  # the marker is gone after all
    assert (found.first_offset, found.last_offset, found.marker_offset) == (0, 2, None)


def test_a_seek_forward_forgets_open_transactions() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 1, D)], 2)
    ledger.read(10, [b(Q, 10, 10, D)], 11)  # 2..9 never read: P's marker may be there
    assert [f.producer_id for f in ledger.truncated(11)] == [Q]


def test_a_transaction_begun_before_the_reading_says_so() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(7, [b(P, 7, 8, D), b(P, 9, 9, C)], 10)
    (found,) = ledger.truncated(9)
    assert not found.from_start and found.covers(3) and not found.covers(9)
    assert "read earlier" in found.describe()


def test_a_second_truncation_does_not_report_a_reopened_transaction_again() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 2, D), b(P, 3, 3, C)], 4)
    assert len(ledger.truncated(3)) == 1
    assert ledger.truncated(2) == []
    (found,) = ledger.read(2, [b(P, 2, 2, A)], 3)
    assert (found.first_offset, found.last_offset) == (0, 1)


def test_memory_is_bounded_and_says_what_it_forgot() -> None:
    ledger = TransactionLedger(TP, max_transactions=3)
    offset = 0
    for _ in range(10):
        ledger.read(offset, [b(P, offset, offset, D), b(P, offset + 1, offset + 1, C)], offset + 2)
        offset += 2
    assert len(ledger) == 3
    assert ledger.forgotten_below == 14  # the markers at 1..13 are forgotten
    assert ledger.truncated(1) == []  # too deep to name
    with pytest.raises(ValueError, match="max_transactions"):
        TransactionLedger(TP, max_transactions=0)


def test_reset_forgets_everything() -> None:
    ledger = TransactionLedger(TP)
    ledger.read(0, [b(P, 0, 2, D), b(P, 3, 3, C)], 4)
    ledger.reset()
    assert len(ledger) == 0 and ledger.next_offset is None
    assert ledger.truncated(1) == []


def test_every_move_is_in_the_table_and_others_refused() -> None:
    for (state, trigger), target in TRANSITIONS.items():
        txn = _Txn(P, 0, 0, 0, True, True, state)
        txn.goto(trigger)
        assert txn.state is target
    missing = [(s, t) for s in TxnState for t in TxnTrigger if (s, t) not in TRANSITIONS]
    assert (TxnState.REVERTED, TxnTrigger.COMMIT_READ) in missing
    for state, trigger in missing:
        txn = _Txn(P, 0, 0, 0, True, True, state)
        with pytest.raises(InvalidTransitionError):
            txn.goto(trigger)


def test_a_truncation_found_before_reading_names_aborted_transactions_across_it() -> None:
    """A restarted consumer (or a new owner) finds its committed position 6 diverged at 4:
    an aborted transaction of the new log from 2 to past 4 lost its old marker to the
    truncation, whatever an earlier session read of it."""
    ledger = TransactionLedger(TP)
    assert ledger.truncated(4) == []
    (found,) = ledger.read(4, [b(P, 4, 4, S, epoch=2), b(P, 5, 5, A, epoch=2)], 6, [(P, 2)])
    assert found.cause is ReopenCause.ABORTED_LISTED and found.delivered is None
    assert (found.first_offset, found.last_offset, found.divergence) == (2, 3, 4)
    assert found.producer_epoch is None and found.was == "unknown" and found.now == "aborted"
    assert "read by an earlier session" in found.describe()
    # Once: the same list in the next answer is quiet.
    assert ledger.read(6, [], 7, [(P, 2)]) == []
    # A transaction aborted from above the divergence, or ending below it, is no such one.
    other = TransactionLedger(TP)
    other.truncated(4)
    assert other.read(4, [b(Q, 4, 4, S), b(Q, 5, 5, A)], 6, [(Q, 4)]) == []
    # A consumer that read the partition knows what it read: no such guess.
    reading = TransactionLedger(TP)
    reading.read(0, [b(Q, 0, 0, D), b(Q, 1, 1, C)], 2)
    reading.truncated(2)
    assert reading.read(2, [b(P, 2, 2, S), b(P, 3, 3, A)], 4, [(P, 0)]) == []


def _handed_over(ledger: TransactionLedger, at: int) -> TransactionLedger:
    """A new reader of the partition starting at ``at``, a position committed by ``ledger``'s
    consumer with what it read there undecided (the group commit's metadata, as JSON)."""
    txns = ledger.undecided_below(at)
    carried = [UndecidedTransaction.from_json(t.to_json()) for t in txns]
    assert carried == list(txns)
    nxt = TransactionLedger(TP)
    nxt.inherit(at, carried)
    return nxt


def test_a_new_reader_reports_a_marker_that_decides_what_its_predecessor_read_otherwise() -> None:
    """The predecessor read P's records 0..1 as committed and stopped at 2, before their
    marker; an unclean election took that marker at exactly 2 (no truncation shows to
    anyone) and the producer's next marker aborted the transaction."""
    first = TransactionLedger(TP)
    first.read(0, [b(P, 0, 1, D, epoch=3)], 2)
    (txn,) = first.undecided_below(2)
    assert (txn.producer_id, txn.producer_epoch, txn.first_offset, txn.last_offset) == (P, 3, 0, 1)
    assert txn.delivered and txn.from_start
    # The new leader's aborted index lists it from 0: the fetch at 2 names it.
    found = _handed_over(first, 2).read(2, [b(P, 2, 2, A, epoch=3)], 3, aborted=[(P, 0)])
    assert [f.cause for f in found] == [ReopenCause.ABORTED_LISTED]
    assert (found[0].first_offset, found[0].last_offset, found[0].delivered) == (0, 1, True)
    # Without the list (the bare marker rule): the marker itself.
    (found2,) = _handed_over(first, 2).read(2, [b(P, 2, 2, A, epoch=3)], 3)
    assert found2.cause is ReopenCause.DECIDED_AGAIN and found2.now_committed is False
    # Where the marker the predecessor went by is there, nothing.
    assert _handed_over(first, 2).read(2, [b(P, 2, 2, C, epoch=3)], 3) == []


def test_records_a_predecessor_skipped_as_aborted_and_committed_since_are_reported() -> None:
    first = TransactionLedger(TP)
    first.read(0, [b(P, 0, 1, S)], 2, aborted=[(P, 0)])
    (found,) = _handed_over(first, 2).read(2, [b(P, 2, 2, C)], 3)
    assert found.cause is ReopenCause.DECIDED_AGAIN and found.delivered is False
    assert found.now_committed is True
    assert _handed_over(first, 2).read(2, [b(P, 2, 2, A)], 3, aborted=[(P, 0)]) == []


def test_a_marker_read_past_the_committed_position_is_handed_over_too() -> None:
    """The predecessor fetched ahead and read the COMMIT at 2, but its position (what the
    application was handed) stood at 2: the next reader reads that marker again."""
    first = TransactionLedger(TP)
    first.read(0, [b(P, 0, 1, D), b(P, 2, 2, C)], 3)
    (txn,) = first.undecided_below(2)
    assert (txn.first_offset, txn.last_offset, txn.delivered) == (0, 1, True)
    assert first.undecided_below(3) == ()  # decided below: nothing to hand over
    (found,) = _handed_over(first, 2).read(2, [b(P, 2, 2, A)], 3)
    assert found.cause is ReopenCause.DECIDED_AGAIN


def test_a_hand_over_is_clipped_to_the_position_and_bounded() -> None:
    first = TransactionLedger(TP)
    first.read(0, [b(P, 0, 3, D), b(Q, 4, 5, D)], 6)
    (txn,) = first.undecided_below(2)  # Q's records lie past it: the next reader reads them
    assert (txn.producer_id, txn.last_offset) == (P, 1)
    assert first.undecided_below(7) == ()  # past what was read: nothing vouched for
    assert first.undecided_below(0) == ()
    many = TransactionLedger(TP)
    many.read(0, [b(pid, pid, pid, D) for pid in range(40)], 40)
    handed = many.undecided_below(40)
    assert len(handed) == 16 and [t.producer_id for t in handed] == list(range(16))


def test_a_new_reader_that_starts_elsewhere_keeps_only_what_still_holds() -> None:
    first = TransactionLedger(TP)
    first.read(0, [b(P, 0, 3, D)], 4)
    # Past the position (a seek forward): the marker may lie in between, nothing is kept.
    ahead = _handed_over(first, 4)
    assert ahead.read(6, [b(P, 6, 6, A)], 7) == []
    # Below it (records read again): the hand-over keeps what lies below the fetch.
    back = _handed_over(first, 4)
    (found,) = back.read(2, [b(P, 2, 3, S)], 4, aborted=[(P, 0)])
    assert found.cause is ReopenCause.ABORTED_LISTED
    assert (found.first_offset, found.last_offset, found.delivered) == (0, 1, True)
    # A truncation found before the first answer reopens what was handed over below it.
    cut = _handed_over(first, 4)
    (reopened,) = cut.truncated(2)
    assert reopened.cause is ReopenCause.MARKER_TRUNCATED
    assert (reopened.first_offset, reopened.last_offset, reopened.delivered) == (0, 1, True)
    # A reader that already read the partition keeps its own record.
    own = TransactionLedger(TP)
    own.read(0, [b(Q, 0, 0, D), b(Q, 1, 1, C)], 2)
    own.inherit(2, first.undecided_below(2))
    assert own.read(2, [b(P, 2, 2, A)], 3) == []


@pytest.mark.parametrize(
    "bad",
    [
        [1, 2, 3],
        [1, 2, 5, 4, 1, 1],
        [1, 2, 3, 4, 2, 1],
        ["1", 2, 3, 4, 1, 1],
        [1, 2, 3, 4, True, 1],
    ],
)
def test_a_malformed_hand_over_is_refused(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="not an undecided transaction"):
        UndecidedTransaction.from_json(bad)


# One reader, or two with a hand-over: the same reports. The prefix a first reader read (and
# perhaps past the committed position), then one continuation from that position, read
# either by the same reader or by a new one that inherited the commit's transactions.
_KINDS = st.sampled_from([D, S, C, A])


@st.composite
def _log(draw: st.DrawFn, start: int, size: int) -> list[TxnBatch]:
    out: list[TxnBatch] = []
    at = start
    for _ in range(draw(st.integers(0, size))):
        kind = draw(_KINDS)
        n = 1 if kind in (C, A) else draw(st.integers(1, 2))
        out.append(b(draw(st.sampled_from([P, Q, 3000])), at, at + n - 1, kind))
        at += n
    return out


def _answers(draw: Any, log: list[TxnBatch], start: int) -> list[tuple[int, list[TxnBatch], int]]:
    """``log`` cut into Fetch answers: (fetch offset, batches, next offset)."""
    out: list[tuple[int, list[TxnBatch], int]] = []
    at, i = start, 0
    while i < len(log):
        j = i + draw(st.integers(1, 3))
        part = log[i:j]
        out.append((at, part, part[-1].last + 1))
        at, i = part[-1].last + 1, j
    return out


def _plain(found: list[ReopenedTransaction]) -> list[tuple[Any, ...]]:
    return [
        (
            f.producer_id,
            f.first_offset,
            f.last_offset,
            f.delivered,
            f.cause,
            f.now_committed,
            f.marker_offset,
        )
        for f in found
    ]


@settings(max_examples=scaled(300), deadline=None)
@given(st.data())
def test_a_hand_over_reports_what_the_reader_itself_would_have(data: st.DataObject) -> None:
    prefix = data.draw(_log(0, 8))
    end = prefix[-1].last + 1 if prefix else 0
    at = data.draw(st.integers(0, end))
    first = TransactionLedger(TP)
    for fetch, part, nxt in _answers(data.draw, prefix, 0):
        first.read(fetch, part, nxt)
    if first.next_offset is None:
        first.read(0, [], end)
    handed = first.undecided_below(at)
    follower = TransactionLedger(TP)
    follower.inherit(at, [UndecidedTransaction.from_json(t.to_json()) for t in handed])
    rest = _answers(data.draw, data.draw(_log(at, 8)), at)
    same: list[tuple[Any, ...]] = []
    other: list[tuple[Any, ...]] = []
    for fetch, part, nxt in rest:
        same += _plain(first.read(fetch, part, nxt))
        other += _plain(follower.read(fetch, part, nxt))
    assert other == same
