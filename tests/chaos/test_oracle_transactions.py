"""The oracle's transaction rules on hand-built histories: each broken promise is caught
(every rule can fail), honest histories pass, and histories without transactions are judged
as before."""

from __future__ import annotations

from collections.abc import Mapping

from epochguard.testing.chaos.oracle import (
    Assigned,
    Committing,
    Decided,
    Delivered,
    Event,
    HangingAborted,
    HangingReported,
    History,
    LogSnapshot,
    ReopenedReported,
    Reported,
    judge,
    txn_view,
)

PID, OTHER = 1000, 2000


def log(
    *entries: tuple[int, bytes] | tuple[str, int, bool],
    txn: Mapping[int, int] | None = None,
    held_open: frozenset[int] | None = frozenset(),
    start: int = 0,
) -> LogSnapshot:
    """A leader log from offset ``start``: ``(epoch, value)`` for a record, ``("marker",
    producer id, commit)`` for a transaction marker; ``txn`` maps offsets of transactional
    records to their producer."""
    records: dict[int, tuple[int, bytes | None]] = {}
    markers: dict[int, tuple[int, bool]] = {}
    for i, e in enumerate(entries):
        if e[0] == "marker":
            markers[start + i] = (int(e[1]), bool(e[2]))
        else:
            records[start + i] = (int(e[0]), e[1])  # type: ignore[arg-type]
    return LogSnapshot(start, records, dict(txn or {}), markers, held_open)


def d(offset: int, value: bytes, step: int, epoch: int = 0) -> Delivered:
    return Delivered(0, 0, offset, epoch, value, step)


def history(
    events: list[Event],
    snapshots: list[LogSnapshot | None],
    final: LogSnapshot,
    committed: frozenset[bytes] = frozenset(),
) -> History:
    snaps: tuple[Mapping[int, LogSnapshot | None], ...] = tuple({0: s} for s in snapshots)
    return History(
        tuple(events), snaps, {0: final}, read_committed=True, committed_values=committed
    )


def hanging(first: int, pid: int | None, step: int, app: str = "app") -> HangingReported:
    return HangingReported(0, 0, first, pid, step, app=app)


# A committed transaction (a, b) of PID, a plain record p, an aborted one (x) of OTHER.
DECIDED = log(
    (0, b"a"),
    (0, b"b"),
    ("marker", PID, True),
    (0, b"p"),
    (0, b"x"),
    ("marker", OTHER, False),
    txn={0: PID, 1: PID, 4: OTHER},
)


def test_the_walk_decides_each_producers_records_by_its_next_marker() -> None:
    v = txn_view(DECIDED)
    assert v.states == {0: "committed", 1: "committed", 4: "aborted"}
    assert v.last_stable is None and v.committed(3) and not v.committed(4)
    # Interleaved producers; PID's second transaction is still open.
    s = log(
        (0, b"a"),
        (0, b"o"),
        ("marker", PID, False),
        (0, b"b"),
        ("marker", OTHER, True),
        txn={0: PID, 1: OTHER, 3: PID},
    )
    v = txn_view(s)
    assert v.states == {0: "aborted", 1: "committed", 3: "open"}
    assert v.open_first == {PID: 3} and v.last_stable == 3


def test_an_honest_transactional_run_passes() -> None:
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 1), d(1, b"b", 1), d(3, b"p", 1)]
    v = judge(history(events, [log(), DECIDED], DECIDED, frozenset({b"a", b"b"})))
    assert v.ok, v.describe()
    assert v.transactional and v.delivered == 3
    assert (v.committed_lost_by_cluster, v.hanging_transactions) == (0, 0)
    assert "aborted deliveries 0" in v.describe()
    assert v.counts()["aborted_deliveries"] == 0


def test_an_aborted_record_delivered_is_caught() -> None:
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 1),
        d(1, b"b", 1),
        d(3, b"p", 1),
        d(4, b"x", 1),
    ]
    v = judge(history(events, [log(), DECIDED], DECIDED))
    assert v.aborted_deliveries == 1 and not v.ok
    assert "offset 4 (b'x')" in v.describe() and "was aborted" in v.describe()


def test_a_record_read_past_the_last_stable_offset_is_caught() -> None:
    open_ = log((0, b"o"), (0, b"p"), txn={0: PID}, held_open=frozenset({PID}))
    ended = log((0, b"o"), (0, b"p"), ("marker", PID, True), txn={0: PID})
    # o delivered while its transaction was open (steps 0 and 1), committed only at step 3.
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"o", 0)]
    v = judge(history(events, [open_, open_, open_, ended], ended))
    assert v.aborted_deliveries == 1 and "was open" in v.describe()
    # Delivered once the snapshot after the delivery shows it committed: fine.
    events = [Assigned(0, 0, 0), d(0, b"o", 2), d(1, b"p", 2)]
    assert judge(history(events, [open_, open_, open_, ended], ended)).ok


def test_a_commit_seen_written_between_snapshots_counts() -> None:
    """The COMMIT marker was written after one snapshot and taken by an unclean election
    before the next: only the runner's Decided event saw it. A delivery after it is
    fine; before it, the record was read past the last stable offset."""
    open_ = log((0, b"o"), txn={0: PID}, held_open=frozenset({PID}))
    gone = log((1, b"n"))
    decided = Decided(0, True, frozenset({b"o"}), 1)
    after = [Assigned(0, 0, 0), decided, d(0, b"o", 1), Reported(0, 0, 0, 1, 2)]
    after.append(d(0, b"n", 2, epoch=1))
    assert judge(history(after, [open_, open_, gone], gone)).aborted_deliveries == 0
    before = [Assigned(0, 0, 0), d(0, b"o", 1), decided, Reported(0, 0, 0, 1, 2)]
    before.append(d(0, b"n", 2, epoch=1))
    assert judge(history(before, [open_, open_, gone], gone)).aborted_deliveries == 1
    # An ABORT seen written is no commit.
    aborted = [Assigned(0, 0, 0), Decided(0, False, frozenset({b"o"}), 1), d(0, b"o", 1)]
    aborted += [Reported(0, 0, 0, 1, 2), d(0, b"n", 2, epoch=1)]
    assert judge(history(aborted, [open_, open_, gone], gone)).aborted_deliveries == 1


def test_a_marker_read_before_the_commit_call_returned_counts_once_the_commit_is_seen() -> None:
    """On real brokers the runner sees a COMMIT marker only when the commit call returns; a
    consumer may read it first. A delivery after the commit began (Committing) is fine when
    the commit is then seen written; without it (the commit failed) it is still caught."""
    open_ = log((0, b"o"), txn={0: PID}, held_open=frozenset({PID}))
    gone = log((1, b"n"))
    committing = Committing(0, frozenset({b"o"}), 1)
    decided = Decided(0, True, frozenset({b"o"}), 1)
    tail: list[Event] = [Reported(0, 0, 0, 1, 2), d(0, b"n", 2, epoch=1)]
    raced = [Assigned(0, 0, 0), committing, d(0, b"o", 1), decided, *tail]
    assert judge(history(raced, [open_, open_, gone], gone)).aborted_deliveries == 0
    failed = [Assigned(0, 0, 0), committing, d(0, b"o", 1), *tail]
    assert judge(history(failed, [open_, open_, gone], gone)).aborted_deliveries == 1
    early = [Assigned(0, 0, 0), d(0, b"o", 1), committing, decided, *tail]
    assert judge(history(early, [open_, open_, gone], gone)).aborted_deliveries == 1


def test_a_commit_seen_written_and_aborted_in_the_end_was_decided_again() -> None:
    open_ = log((0, b"o"), txn={0: PID}, held_open=frozenset({PID}))
    aborted = log((0, b"o"), ("marker", PID, False), txn={0: PID})
    events: list[Event] = [Assigned(0, 0, 0), Decided(0, True, frozenset({b"o"}), 1)]
    events.append(d(0, b"o", 1))
    v = judge(history(events, [open_, open_, aborted], aborted))
    assert (v.committed_losses, v.decided_again, v.only_decided_again) == (1, 1, True)
    assert "(committed when its marker was written: its marker was lost" in v.describe()


def test_committed_when_delivered_and_aborted_later_is_no_aborted_delivery() -> None:
    lost_marker = log((0, b"a"), (0, b"b"), txn={0: PID, 1: PID})
    aborted = log((0, b"a"), (0, b"b"), ("marker", PID, False), txn={0: PID, 1: PID})
    committed = log((0, b"a"), (0, b"b"), ("marker", PID, True), txn={0: PID, 1: PID})
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0)]
    v = judge(history(events, [committed, lost_marker, aborted], aborted))
    assert v.aborted_deliveries == 0
    # ... but the application holds two records the final log no longer has as committed.
    assert v.committed_losses == 2 and not v.ok
    assert "its transaction is aborted in the final log (committed at step 0:" in v.describe()
    assert v.decided_again == 2 and v.only_decided_again


def test_a_record_skipped_as_aborted_and_committed_since_is_a_silent_loss() -> None:
    """The ABORT marker the consumer read is lost; the producer's next transaction on the
    partition (c) and its COMMIT close the range from a: a and b are committed now."""
    aborted = log((0, b"a"), (0, b"b"), ("marker", PID, False), txn={0: PID, 1: PID})
    lost_marker = log((0, b"a"), (0, b"b"), txn={0: PID, 1: PID})
    merged = log(
        (0, b"a"), (0, b"b"), (1, b"c"), ("marker", PID, True), txn={0: PID, 1: PID, 2: PID}
    )
    events: list[Event] = [Assigned(0, 0, 0), Reported(0, 0, 2, 3, 1), d(2, b"c", 2, epoch=1)]
    v = judge(history(events, [aborted, lost_marker, merged], merged))
    assert v.silent_losses == 2 and v.aborted_deliveries == 0
    assert "(aborted at step 0: its marker was lost" in v.describe()
    assert v.decided_again == 2 and v.only_decided_again


def test_a_hanging_report_of_the_producer_covers_its_records_and_another_does_not() -> None:
    lost_marker = log((0, b"a"), (0, b"b"), txn={0: PID, 1: PID})
    aborted = log((0, b"a"), (0, b"b"), ("marker", PID, False), txn={0: PID, 1: PID})
    committed = log((0, b"a"), (0, b"b"), ("marker", PID, True), txn={0: PID, 1: PID})
    snaps = [committed, lost_marker, aborted]
    base: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0)]
    covered = judge(history([*base, hanging(0, PID, 1)], snaps, aborted))
    assert covered.ok, covered.describe()
    assert covered.hanging_reports == 1
    # A report above the first record covers only the second one.
    assert judge(history([*base, hanging(1, PID, 1)], snaps, aborted)).committed_losses == 1
    other = judge(history([*base, hanging(0, OTHER, 1)], snaps, aborted))
    assert other.committed_losses == 2 and other.decided_again == 2
    # A report that could not name the producer covers every producer's records.
    assert judge(history([*base, hanging(0, None, 1)], snaps, aborted)).ok


def test_a_transaction_left_hanging_at_the_end_needs_a_report() -> None:
    # a's COMMIT marker was lost; the coordinator holds nothing open: it hangs. p after it
    # cannot be read by anyone (behind the last stable offset): not a loss.
    committed = log((0, b"a"), ("marker", PID, True), txn={0: PID})
    hung = log((0, b"a"), (0, b"p"), txn={0: PID})
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0)]
    v = judge(history(events, [committed, hung], hung))
    assert (v.unreported_hanging, v.hanging_transactions) == (1, 1)
    assert v.silent_losses == 0  # p is behind the hanging transaction
    assert v.committed_losses == 1  # a is held, and open in the final log
    assert v.decided_again == 1 and not v.only_decided_again  # hung, unreported: no gap
    assert "hung and was never reported" in v.describe()
    reported = judge(history([*events, hanging(0, PID, 1)], [committed, hung], hung))
    assert reported.ok, reported.describe()
    # Still open in the coordinator at the end: only long, no report needed.
    live = log((0, b"a"), (0, b"p"), txn={0: PID}, held_open=frozenset({PID}))
    assert judge(history(events, [committed, live], live)).unreported_hanging == 0


def test_a_transaction_another_application_aborted_needed_a_report_here_too() -> None:
    committed = log((0, b"a"), ("marker", PID, True), txn={0: PID})
    hung = log((0, b"a"), (0, b"p"), txn={0: PID})
    aborted = log((0, b"a"), (0, b"p"), ("marker", PID, False), txn={0: PID})
    events: list[Event] = []
    for app in ("java", "ours"):
        events += [Assigned(0, 0, 0, app=app), Delivered(0, 0, 0, 0, b"a", 0, app=app)]
    # Only ours reports it, and aborts it as the transactions guide says; both read on.
    events += [hanging(0, PID, 1, app="ours"), HangingAborted(0, 0, 0, PID, 1, app="ours")]
    events += [Delivered(0, 0, 1, 0, b"p", 2, app=app) for app in ("java", "ours")]
    h = history(events, [committed, hung, aborted], aborted)
    ours, java = judge(h, "ours"), judge(h, "java")
    assert ours.ok, ours.describe()
    assert (java.unreported_hanging, java.committed_losses) == (1, 1) and not java.ok


def test_a_report_of_a_transaction_that_is_only_long_is_spurious() -> None:
    live = log((0, b"o"), (0, b"p"), txn={0: PID}, held_open=frozenset({PID}))
    ended = log((0, b"o"), (0, b"p"), ("marker", PID, False), txn={0: PID})
    events: list[Event] = [Assigned(0, 0, 0), hanging(0, PID, 1), d(1, b"p", 2)]
    v = judge(history(events, [log(), live, ended], ended))
    assert v.spurious_hanging == 1 and not v.ok
    assert "held open all along" in v.describe()
    # The coordinator had closed it in a snapshot: it hung then, the report may be right.
    closed = log((0, b"o"), (0, b"p"), txn={0: PID})
    assert judge(history(events, [log(), closed, ended], ended)).spurious_hanging == 0
    # Decided once (its marker since lost): hanging even while the producer's next
    # transaction is open in the coordinator.
    decided = log((0, b"o"), ("marker", PID, True), txn={0: PID})
    relapsed = log((0, b"o"), (0, b"p"), txn={0: PID}, held_open=frozenset({PID}))
    events = [Assigned(0, 0, 0), d(0, b"o", 0), hanging(0, PID, 1), d(1, b"p", 2)]
    v = judge(history(events, [decided, relapsed, ended], ended))
    assert v.spurious_hanging == 0
    # The coordinator's state not known (real Kafka): never judged spurious.
    unknown = log((0, b"o"), (0, b"p"), txn={0: PID}, held_open=None)
    events = [Assigned(0, 0, 0), hanging(0, PID, 1), d(1, b"p", 2)]
    assert judge(history(events, [log(), unknown, ended], ended)).spurious_hanging == 0


def test_committed_records_the_cluster_lost_are_counted_for_information_only() -> None:
    committed = log((0, b"a"), ("marker", PID, True), txn={0: PID})
    truncated = log((1, b"n"))
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"n", 1, epoch=1)]
    v = judge(history(events, [committed, truncated], truncated, frozenset({b"a"})))
    assert v.committed_lost_by_cluster == 1 and v.ok, v.describe()


def test_without_transactions_the_judgement_and_its_figures_are_unchanged() -> None:
    before = LogSnapshot(0, {0: (0, b"a"), 1: (0, b"b")})
    after = LogSnapshot(0, {0: (0, b"a"), 1: (1, b"x")})
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0), Reported(0, 0, 1, 2, 1)]
    events.append(d(1, b"x", 1, epoch=1))
    h = History(tuple(events), ({0: before}, {0: after}), {0: after})
    v = judge(h)
    assert v.ok and not v.transactional
    assert set(v.counts()) == {
        "silent_losses",
        "silent_rereads",
        "spurious_reports",
        "stalls",
        "raise_breaches",
        "delivered",
        "reports",
    }
    assert "aborted deliveries" not in v.describe()


def reopened(first: int, last: int, pid: int = PID, from_start: bool = True) -> ReopenedReported:
    return ReopenedReported(0, 0, pid, first, last, 1, from_start=from_start)


def test_records_decided_again_are_covered_only_by_a_report_naming_them() -> None:
    """Read as committed, aborted since: a committed loss unless a reopened-transaction
    report names the producer and those offsets."""
    lost_marker = log((0, b"a"), (0, b"b"), txn={0: PID, 1: PID})
    aborted = log((0, b"a"), (0, b"b"), ("marker", PID, False), txn={0: PID, 1: PID})
    committed = log((0, b"a"), (0, b"b"), ("marker", PID, True), txn={0: PID, 1: PID})
    snaps = [committed, lost_marker, aborted]
    base: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0)]
    told = judge(history([*base, reopened(0, 1)], snaps, aborted))
    assert told.ok, told.describe()
    assert (told.decided_again_reported, told.reopened_reports, told.decided_again) == (2, 1, 0)
    # Without it, or with one of another producer, both records fail.
    for events in (base, [*base, reopened(0, 1, pid=OTHER)]):
        v = judge(history(events, snaps, aborted))
        assert (v.committed_losses, v.decided_again, v.decided_again_reported) == (2, 2, 0)
    # One naming the first record only leaves the second.
    assert judge(history([*base, reopened(0, 0)], snaps, aborted)).committed_losses == 1
    # One that says the transaction began before its first offset covers what is below.
    assert judge(history([*base, reopened(1, 1, from_start=False)], snaps, aborted)).ok


def test_skipped_records_committed_since_are_covered_by_a_report_naming_them() -> None:
    aborted = log((0, b"a"), (0, b"b"), ("marker", PID, False), txn={0: PID, 1: PID})
    lost_marker = log((0, b"a"), (0, b"b"), txn={0: PID, 1: PID})
    merged = log(
        (0, b"a"), (0, b"b"), (1, b"c"), ("marker", PID, True), txn={0: PID, 1: PID, 2: PID}
    )
    events: list[Event] = [Assigned(0, 0, 0), Reported(0, 0, 2, 3, 1), d(2, b"c", 2, epoch=1)]
    snaps = [aborted, lost_marker, merged]
    assert judge(history(events, snaps, merged)).silent_losses == 2
    told = judge(history([*events, reopened(0, 1)], snaps, merged))
    assert told.ok, told.describe()
    assert told.decided_again_reported == 2


def test_a_reopened_report_covers_no_loss_that_was_not_decided_again() -> None:
    """A record replaced by the truncation (another value at its offset) is a silent loss
    whatever reopened-transaction report names its offset."""
    committed = log((0, b"a"), ("marker", PID, True), txn={0: PID})
    replaced = log((1, b"z"), txn={})
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), reopened(0, 0)]
    v = judge(history(events, [committed, replaced], replaced))
    assert v.silent_losses == 1 and not v.ok  # a was replaced by z, unreported
    assert v.decided_again_reported == 0
