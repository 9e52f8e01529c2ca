"""Every row of the fetch-session TRANSITIONS table, driven through FetchSession's public
API (plan / on_answer / on_failure / event), and what each state puts on the wire next;
plus the request diff (added, changed, forgotten) and answers that arrive after a reset."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from kafka.structs import TopicPartition

from epochguard._errors import ErrorCode
from epochguard.consumer.session import (
    TRANSITIONS,
    FetchSession,
    SessionEvent,
    SessionPlan,
    SessionState,
)

S, E = SessionState, SessionEvent
A, B, C = (TopicPartition("t", p) for p in range(3))
TID = "4f1c5b6e-0000-4000-8000-000000000001"
SID = 7
ROWS = [(s, e, n) for s, row in TRANSITIONS.items() for e, n in row.items()]


@attrs.frozen
class Entry:
    tp: TopicPartition
    offset: int
    current_leader_epoch: int | None = 1
    last_fetched_epoch: int | None = 1
    topic_id: str | None = TID


ENTRIES = [Entry(A, 10), Entry(B, 20)]


def reach(state: SessionState) -> FetchSession:
    if state is S.OFF:
        return FetchSession(1, enabled=False)
    s = FetchSession(1)
    if state is S.NEW:
        return s
    plan = s.plan(ENTRIES, by_id=True)
    assert s.on_answer(plan, 0, SID, [A, B]) is S.OPEN
    if state is S.OPEN:
        return s
    s.on_failure(s.plan(ENTRIES, by_id=True))
    assert s.state is S.REOPEN
    return s


def trigger(s: FetchSession, event: SessionEvent) -> Any:
    """Cause ``event`` the way the fetcher does; returns the plan it answered, if any."""
    if event is E.LEADER_CHANGED:
        s.event(event)
        return None
    if event is E.TOPIC_IDS_CHANGED:
        return s.plan([attrs.evolve(e, topic_id=None) for e in ENTRIES], by_id=False)
    plan = s.plan(ENTRIES, by_id=True)
    if event is E.REQUEST_FAILED:
        s.on_failure(plan)
    elif event is E.OPENED:
        s.on_answer(plan, 0, SID + 1, [A, B])
    elif event is E.CONTINUED:
        s.on_answer(plan, 0, s.session_id, [A])
    elif event is E.NO_SESSION:
        s.on_answer(plan, 0, 0, [A, B])
    elif event is E.ID_NOT_FOUND:
        s.on_answer(plan, ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, [])
    elif event is E.SESSION_ERROR:
        s.on_answer(plan, ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0, [])
    elif event is E.UNEXPECTED_PARTITION:
        s.on_answer(plan, 0, s.session_id, [C])
    elif event is E.PARTITION_RETURNED:
        s.event(event)
    return plan


def wire_of(plan: SessionPlan) -> tuple[int, int, bool]:
    return plan.session_id, plan.epoch, plan.incremental


@pytest.mark.parametrize(
    ("state", "event", "after"), ROWS, ids=[f"{s.name}-{e.name}" for s, e, _ in ROWS]
)
def test_transition_row(state: SessionState, event: SessionEvent, after: SessionState) -> None:
    s = reach(state)
    trigger(s, event)
    if event is E.TOPIC_IDS_CHANGED:
        # The change is found while planning: that plan is already the full fetch.
        assert s.state is after
        return
    assert s.state is after
    nxt = s.plan(ENTRIES, by_id=True)
    if after is S.OFF:
        assert wire_of(nxt) == (0, -1, False)
    elif after is S.NEW:
        assert wire_of(nxt) == (0, 0, False)
    elif after is S.OPEN:
        assert nxt.incremental and nxt.session_id > 0 and nxt.epoch >= 1
    else:
        assert nxt.epoch == 0 and not nxt.incremental and nxt.session_id in (0, SID, SID + 1)
    if not nxt.incremental:
        assert [e.tp for e in nxt.entries] == [A, B]  # a full fetch names every partition


def test_missing_pairs_leave_the_state_alone() -> None:
    for state in S:
        for event in E:
            if event in TRANSITIONS[state] or event is E.TOPIC_IDS_CHANGED:
                continue
            s = reach(state)
            before = (s.state, s.session_id)
            s.event(event)
            assert (s.state, s.session_id) == before, (state, event)


def test_open_session_epochs_count_up_from_one() -> None:
    s = reach(S.NEW)
    opening = s.plan(ENTRIES, by_id=True)
    assert wire_of(opening) == (0, 0, False)
    s.on_answer(opening, 0, SID, [A, B])
    for epoch in (1, 2, 3):
        plan = s.plan(ENTRIES, by_id=True)
        assert wire_of(plan) == (SID, epoch, True)
        s.on_answer(plan, 0, SID, [])


def test_incremental_plan_sends_only_changes_and_forgets_dropped_partitions() -> None:
    s = reach(S.OPEN)
    idle = s.plan(ENTRIES, by_id=True)
    assert idle.entries == () and idle.forgotten == ()
    s.on_answer(idle, 0, SID, [])
    # A moved on, B left the request (paused, buffered, validating, other leader), C is new.
    moved = Entry(A, 15)
    plan = s.plan([moved, Entry(C, 0)], by_id=True)
    assert [e.tp for e in plan.entries] == [A, C]
    assert plan.forgotten == ((B, TID),)
    assert set(plan.names.values()) == {"t"}
    s.on_answer(plan, 0, SID, [A])
    assert s.partitions == {A, C}
    # The same partition back with a new current leader epoch is sent again, so the broker
    # fences it with the epoch the tracker has now.
    again = s.plan([moved, Entry(C, 0, current_leader_epoch=4), Entry(B, 20)], by_id=True)
    assert [(e.tp, e.current_leader_epoch) for e in again.entries] == [(C, 4), (B, 1)]
    # A last fetched epoch that changed is a change too.
    s.on_answer(again, 0, SID, [])
    lfe = s.plan(
        [moved, Entry(C, 0, current_leader_epoch=4), Entry(B, 20, last_fetched_epoch=3)],
        by_id=True,
    )
    assert [e.tp for e in lfe.entries] == [B]


def test_a_partition_fetched_under_another_topic_id_forgets_its_old_key() -> None:
    # The broker's session holds a partition by topic id and partition (Kafka's
    # TopicIdPartition): under a new id it is a new key, and the old one is forgotten, as
    # Java's FetchSessionHandler does with replaced partitions. Kept, the broker would go
    # on answering the old key, read as the partition's answer.
    s = reach(S.OPEN)
    other = "7d1c5b6e-0000-4000-8000-000000000002"
    plan = s.plan([Entry(A, 10, topic_id=other), Entry(B, 20)], by_id=True)
    assert [(e.tp, e.topic_id) for e in plan.entries] == [(A, other)]
    assert plan.forgotten == ((A, TID),)
    s.on_answer(plan, 0, SID, [A])
    back = s.plan(ENTRIES, by_id=True)
    assert [(e.tp, e.topic_id) for e in back.entries] == [(A, TID)]
    assert back.forgotten == ((A, other),)


def test_an_answer_after_a_reset_does_not_reopen_the_old_session() -> None:
    s = reach(S.OPEN)
    in_flight = s.plan(ENTRIES, by_id=True)
    s.event(E.LEADER_CHANGED)
    assert s.on_answer(in_flight, 0, SID, [A]) is S.REOPEN
    full = s.plan(ENTRIES, by_id=True)
    assert wire_of(full) == (SID, 0, False)


def test_a_full_fetch_in_flight_during_a_leader_change_is_closed_next() -> None:
    s = reach(S.NEW)
    opening = s.plan(ENTRIES, by_id=True)
    s.event(E.LEADER_CHANGED)
    # The answer opened session 9 under the old epochs: the next request closes it.
    s.on_answer(opening, 0, 9, [A, B])
    assert s.state is S.REOPEN
    assert wire_of(s.plan(ENTRIES, by_id=True)) == (9, 0, False)


def test_sessions_off_never_open() -> None:
    s = reach(S.OFF)
    plan = s.plan(ENTRIES, by_id=True)
    s.on_answer(plan, 0, SID, [A, B])
    assert s.state is S.OFF and wire_of(s.plan(ENTRIES, by_id=True)) == (0, -1, False)
