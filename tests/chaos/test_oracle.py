"""The oracle judges hand-built histories: every broken promise is caught (the oracle can
fail), and honest histories pass."""

from __future__ import annotations

from collections.abc import Mapping

from epochguard.testing.chaos.oracle import (
    Assigned,
    Committed,
    Delivered,
    Event,
    History,
    LogSnapshot,
    Recreated,
    Reported,
    Seeked,
    Stalled,
    Started,
    judge,
)


def log(start: int, *values: tuple[int, bytes], base: int | None = None) -> LogSnapshot:
    """A leader log from ``base`` (default ``start``): (epoch, value) per offset."""
    first = start if base is None else base
    return LogSnapshot(start, {first + i: ev for i, ev in enumerate(values)})


def d(offset: int, value: bytes, step: int, epoch: int | None = 0, member: int = 0) -> Delivered:
    return Delivered(member, 0, offset, epoch, value, step)


def history(
    events: list[Event],
    snapshots: list[LogSnapshot | None],
    final: LogSnapshot,
    policy: str = "rewind",
) -> History:
    snaps: tuple[Mapping[int, LogSnapshot | None], ...] = tuple({0: s} for s in snapshots)
    return History(tuple(events), snaps, {0: final}, policy)


# The log a..c under epoch 0; then an unclean election replaces c (offset 2) by x, epoch 1.
BEFORE = log(0, (0, b"a"), (0, b"b"), (0, b"c"))
AFTER = log(0, (0, b"a"), (0, b"b"), (1, b"x"))
#: The log after an election that took c and left nothing in its place.
SHORT = log(0, (0, b"a"), (0, b"b"))


def read_abc(commit: int | None = None) -> list[Event]:
    """Member 0 reads a, b and c of BEFORE, with a commit of ``commit`` acknowledged before
    it reads c."""
    acked: list[Event] = [] if commit is None else [Committed(0, 0, commit, 0)]
    return [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0), *acked, d(2, b"c", 0)]


def test_an_honest_run_passes() -> None:
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        d(2, b"c", 0),
        Reported(0, 0, 2, 3, 1),
        d(2, b"x", 1, epoch=1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.ok, v.describe()
    assert (v.delivered, v.reports) == (4, 1)


def test_a_replaced_record_read_on_without_a_report_is_a_silent_loss() -> None:
    # The application holds c at 2 and never hears that x replaced it.
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0), d(2, b"c", 0)]
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.silent_losses == 1 and not v.ok
    assert "holds b'c'" in v.describe()


def test_a_replacement_delivered_at_a_held_offset_without_a_report_is_a_silent_reread() -> None:
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        d(2, b"c", 0),
        d(2, b"x", 1, epoch=1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.silent_rereads == 1 and v.silent_losses == 0
    assert "delivered again without a report" in v.describe()


def test_the_same_record_twice_is_a_silent_reread() -> None:
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0), d(1, b"b", 0)]
    final = log(0, (0, b"a"), (0, b"b"))
    v = judge(history(events, [final], final))
    assert v.silent_rereads == 1


def test_a_surviving_record_never_delivered_is_a_silent_loss() -> None:
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(2, b"c", 0)]
    v = judge(history(events, [BEFORE], BEFORE))
    assert v.silent_losses == 1
    assert "offset 1 (b'b') of the final log was never delivered" in v.describe()


def test_a_report_of_records_that_were_never_replaced_is_spurious() -> None:
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        d(2, b"c", 0),
        Reported(0, 0, 1, 3, 1),  # claims b and c are gone: nothing happened
        d(1, b"b", 1),
        d(2, b"c", 1),
    ]
    v = judge(history(events, [BEFORE, BEFORE], BEFORE))
    assert v.spurious_reports == 1 and v.silent_rereads == 0


def test_a_report_whose_divergence_lies_before_the_real_one_is_spurious() -> None:
    # x replaced offset 2 only; a report from offset 1 claims b was lost too.
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        d(2, b"c", 0),
        Reported(0, 0, 1, 3, 1),
        d(1, b"b", 1),
        d(2, b"x", 1, epoch=1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.spurious_reports == 1


def test_records_below_the_log_start_cannot_be_shown_gone() -> None:
    # Retention removed a and b (log start 2): a report claiming them is not real; the
    # application need not receive them either.
    trimmed = log(2, (0, b"c"), base=2)
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        Reported(0, 0, None, 2, 1),
        d(2, b"c", 1),
    ]
    v = judge(history(events, [BEFORE, trimmed], trimmed))
    assert v.spurious_reports == 1 and v.silent_losses == 0


def test_a_report_with_an_unknown_divergence_is_real_when_a_held_record_is_gone() -> None:
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        d(2, b"c", 0),
        Reported(0, 0, None, 3, 1),
        Seeked(0, 0, None, 1),
        d(0, b"a", 1),
        d(1, b"b", 1),
        d(2, b"x", 1, epoch=1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER, policy="raise"))
    assert v.ok, v.describe()


def test_raise_delivering_past_the_divergence_before_the_seek_is_a_breach() -> None:
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        d(2, b"c", 0),
        Reported(0, 0, 2, 3, 1),
        d(2, b"x", 1, epoch=1),  # the partition should have stopped until the seek
        Seeked(0, 0, 2, 1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER, policy="raise"))
    assert v.raise_breaches == 1
    ok = [*events[:5], events[6], events[5]]  # seek first, then the new record
    assert judge(history(ok, [BEFORE, AFTER], AFTER, policy="raise")).ok


def test_the_wrong_epoch_at_the_right_offset_is_a_silent_loss() -> None:
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0, epoch=3)]
    final = log(0, (0, b"a"))
    assert judge(history(events, [final], final)).silent_losses == 1


def test_a_new_owner_may_reread_past_the_commit_but_not_below_it() -> None:
    final = log(0, (0, b"a"), (0, b"b"), (0, b"c"))
    handover: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        Committed(0, 0, 1, 0),  # b delivered but not committed
        Assigned(1, 0, 1),
        d(1, b"b", 1, member=1),
        d(2, b"c", 1, member=1),
    ]
    assert judge(history(handover, [final, final], final)).ok
    below = [*handover[:5], d(0, b"a", 1, member=1), *handover[5:]]
    v = judge(history(below, [final, final], final))
    assert v.silent_rereads == 1


def test_a_stall_is_counted() -> None:
    final = log(0, (0, b"a"))
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), Stalled(0, "no end marker")]
    v = judge(history(events, [final], final))
    assert v.stalls == 1 and not v.ok


def test_applications_are_judged_apart() -> None:
    final = log(0, (0, b"a"))
    events: list[Event] = [
        Delivered(0, 0, 0, 0, b"a", 0, app="one"),
        Delivered(0, 0, 0, 0, b"a", 0, app="two"),
    ]
    h = history(events, [final], final)
    assert judge(h, "one").ok and judge(h, "two").ok
    assert judge(h).silent_rereads == 1  # both together read a twice


def test_an_uncommitted_tail_may_come_again_but_must_still_match_the_final_log() -> None:
    # Member 0 read c past its commit; member 1 takes over at the commit (offset 2) after the
    # log replaced c by x, and never delivers x: the application still holds c.
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        Committed(0, 0, 2, 0),
        d(2, b"c", 0),
        Assigned(1, 0, 1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.silent_losses == 1 and v.silent_rereads == 0
    fixed = [*events, d(2, b"x", 1, epoch=1, member=1)]
    assert judge(history(fixed, [BEFORE, AFTER], AFTER)).ok


def test_a_tail_past_the_last_acknowledged_commit_is_the_old_sessions_alone() -> None:
    # Member 0 read c past its commit (offset 2) and stopped before a commit covering c
    # landed; an election then took c, and the log ends at 2. Member 1 starts at the commit:
    # nothing it or any client reads can tell it of c, so c gone is not a loss. Without the
    # new session the application still held c from a live member: a loss.
    events = read_abc(commit=2)
    assert judge(history(events, [BEFORE, SHORT], SHORT)).silent_losses == 1
    handover = [*events, Assigned(1, 0, 1)]
    assert judge(history(handover, [BEFORE, SHORT], SHORT)).ok
    # Below the commit the new session still answers for what the application holds.
    cut = log(0, (0, b"a"))
    v = judge(history(handover, [BEFORE, cut], cut))
    assert v.silent_losses == 1 and "offset 1" in v.describe()


def test_a_commit_that_landed_unacknowledged_leaves_the_tail_delivered() -> None:
    # Member 0's commit of 3 landed but its answer was lost; member 1 starts there and reads
    # nothing more: a, b and c, delivered once, are the final log's.
    events = [*read_abc(), Assigned(1, 0, 1)]
    assert judge(history(events, [BEFORE, BEFORE], BEFORE)).ok
    # Replaced at 2 and never delivered, x is lost all the same.
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.silent_losses == 1 and "offset 2 (b'x')" in v.describe()


def test_a_commit_past_an_orphaned_tail_shows_the_new_session_knew_of_it() -> None:
    # Member 0's commit of 3 landed unanswered; member 1 starts there and commits 3 itself:
    # it was told of c (offset 2) by that commit, and c gone unreported is a loss.
    events = [*read_abc(), Assigned(1, 0, 1), Committed(1, 0, 3, 1)]
    assert judge(history(events, [BEFORE, SHORT], SHORT)).silent_losses == 1


def test_a_member_given_back_its_partition_answers_for_what_it_read_itself() -> None:
    # Member 0 read c past its commit, gave the partition up and got it back, never
    # stopping: it remembers c. Restarted in between, it does not.
    read = [Started(0, 0), *read_abc(commit=2)]
    given_back = [*read, Assigned(0, 0, 1)]
    assert judge(history(given_back, [BEFORE, SHORT], SHORT)).silent_losses == 1
    restarted = [*read, Started(0, 1), Assigned(0, 0, 1)]
    assert judge(history(restarted, [BEFORE, SHORT], SHORT)).ok


def test_a_recreated_topic_read_from_zero_needs_a_report_or_a_new_assignment() -> None:
    new = log(0, (0, b"n0"), (0, b"n1"))
    events: list[Event] = [Assigned(0, 0, 0), d(0, b"a", 0), d(1, b"b", 0), Recreated(1)]
    silent = [*events, d(0, b"n0", 1), d(1, b"n1", 1)]
    v = judge(history(silent, [BEFORE, new], new))
    assert v.silent_rereads == 2
    told = [*events, Reported(0, 0, 0, 2, 1), d(0, b"n0", 1), d(1, b"n1", 1)]
    assert judge(history(told, [BEFORE, new], new)).ok
    reassigned = [*events, Assigned(1, 0, 1), d(0, b"n0", 1, member=1), d(1, b"n1", 1, member=1)]
    assert judge(history(reassigned, [BEFORE, new], new)).ok


def test_a_report_repeated_after_a_restart_from_an_older_commit_is_real() -> None:
    # The first report dropped c; the application committed 3 before it and restarts from
    # there: validating 3 again finds the same truncation, without a divergence this time.
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        d(2, b"c", 0),
        Committed(0, 0, 3, 0),
        Reported(0, 0, 2, 3, 1),
        Assigned(0, 0, 1),
        Reported(0, 0, None, 3, 1),
        d(0, b"a", 1),
        d(1, b"b", 1),
        d(2, b"x", 1, epoch=1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.ok, v.describe()
    # Without any truncation the same pair of reports is spurious (twice).
    unchanged = judge(history([*events[:-1], d(2, b"c", 1)], [BEFORE, BEFORE], BEFORE))
    assert unchanged.spurious_reports == 2


#: Member 0 reads a and b, then the partition moves to member 1, which reads c.
HANDED_OVER: list[Event] = [
    Assigned(0, 0, 0),
    d(0, b"a", 0),
    d(1, b"b", 0),
    Assigned(1, 0, 0),
    d(2, b"c", 0, member=1),
]


def test_a_member_given_back_a_partition_is_judged_on_what_it_received_itself() -> None:
    # Member 0 reads a and b, and the partition moves to member 1, which reads c. An unclean
    # election replaces the whole log by x, y: member 1 reports [0, 3) and reads x. Given the
    # partition back, member 0 reports the a and b it had: gone, so real (if redundant),
    # though the application already received x at the divergence.
    replaced = log(0, (1, b"x"), (1, b"y"))
    events: list[Event] = [
        *HANDED_OVER,
        Reported(1, 0, 0, 3, 1),
        Seeked(1, 0, 0, 1),
        d(0, b"x", 1, epoch=1, member=1),
        Committed(1, 0, 1, 1),
        Assigned(0, 0, 1),
        Reported(0, 0, 0, 2, 1),
        Seeked(0, 0, 0, 1),
        d(0, b"x", 1, epoch=1),
        d(1, b"y", 1, epoch=1),
    ]
    v = judge(history(events, [BEFORE, replaced], replaced))
    assert v.ok, v.describe()
    # Had a and b stayed in the log, the member's report would be spurious all the same.
    kept = log(0, (0, b"a"), (0, b"b"), (1, b"x"))
    still = [*events[:7], d(2, b"x", 1, epoch=1, member=1), *events[8:11]]
    v = judge(history(still, [BEFORE, kept], kept))
    assert v.spurious_reports >= 1, v.describe()


def test_a_restarted_member_is_judged_on_what_the_group_received_too() -> None:
    # Member 0 reads a, b; member 1 reads c, which an unclean election replaces. Member 0,
    # restarted from member 1's commit of 3, reports without a divergence: its own a and b
    # are intact, but c, which the group received, is gone, so the report is real.
    events: list[Event] = [
        *HANDED_OVER,
        Committed(1, 0, 3, 0),
        Assigned(0, 0, 1),
        Reported(0, 0, None, 3, 1),
        Seeked(0, 0, None, 1),
        d(0, b"a", 1),
        d(1, b"b", 1),
        d(2, b"x", 1, epoch=1),
    ]
    v = judge(history(events, [BEFORE, AFTER], AFTER))
    assert v.ok, v.describe()
    unchanged = [*events[:-1], d(2, b"c", 1)]
    assert judge(history(unchanged, [BEFORE, BEFORE], BEFORE)).spurious_reports == 1


def test_a_report_of_older_reads_leaves_what_the_group_read_since() -> None:
    # Member 0 reads a, b (epoch 0) and commits 2; the partition moves to member 1, and an
    # unclean election replaces the log by x, y, z (epoch 1). Member 1 reports and reads the
    # new log to its end, committed. Given the partition back, member 0 reports the a and b
    # it had (read in epoch 0): that report is not about x and y, which the group still holds.
    replaced = log(0, (1, b"x"), (1, b"y"), (1, b"z"))
    events: list[Event] = [
        Assigned(0, 0, 0),
        d(0, b"a", 0),
        d(1, b"b", 0),
        Committed(0, 0, 2, 0),
        Assigned(1, 0, 0),
        Reported(1, 0, 0, 2, 1, consumed_epoch=0),
        d(0, b"x", 1, epoch=1, member=1),
        d(1, b"y", 1, epoch=1, member=1),
        d(2, b"z", 1, epoch=1, member=1),
        Committed(1, 0, 3, 1),
        Assigned(0, 0, 1),
        Reported(0, 0, 0, 2, 1, consumed_epoch=0),
    ]
    v = judge(history(events, [BEFORE, replaced], replaced))
    assert v.ok, v.describe()
    # Rewound to the divergence, member 0 reads again what the group had committed.
    again = [*events, *(d(o, x, 1, epoch=1) for o, x in enumerate([b"x", b"y", b"z"]))]
    assert judge(history(again, [BEFORE, replaced], replaced)).silent_rereads == 3
    # A report that does not say its epoch is about everything from its divergence on.
    unsaid = [*events[:-1], Reported(0, 0, 0, 2, 1)]
    assert judge(history(unsaid, [BEFORE, replaced], replaced)).silent_losses == 2
    # Member 1's commit failed: x, y, z are not committed, member 0 (restored from the old
    # commit 2) may rewind and read them again.
    uncommitted = [e for e in again if not (isinstance(e, Committed) and e.offset == 3)]
    v = judge(history(uncommitted, [BEFORE, replaced], replaced))
    assert v.ok, v.describe()
