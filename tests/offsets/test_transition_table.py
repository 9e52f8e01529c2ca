"""Every row of TRANSITIONS, driven through the public API (h11-style table test), plus a
hypothesis fuzz of arbitrary, stale and contradictory inputs."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochguard.offsets import (
    TRANSITIONS,
    EpochOffset,
    ErrorCode,
    FetchAction,
    OffsetPolicy,
    PartitionState,
    PartitionTracker,
    ResetAction,
    TopicPartition,
    Trigger,
    ValidateAction,
    WaitAction,
)
from epochguard.offsets.state import STOPPED_STATES, SUB_STATES, TRACKER_FIELDS

from ..examples import scaled

S, T = PartitionState, Trigger
TP = TopicPartition("table", 0)
ROWS = [(s, t, n) for s, row in TRANSITIONS.items() for t, n in row.items()]


def _act(tr: PartitionTracker) -> Any:
    a = tr.next_action(0.0)
    assert a is not None and not isinstance(a, WaitAction), a
    return a


def reach(state: PartitionState, trigger: Trigger) -> PartitionTracker:
    reset = "none" if trigger is T.STOP_NO_OFFSET else "earliest"
    raise_ = trigger is T.TRUNCATION_RAISED or state is S.TRUNCATED
    on_truncation = "raise" if raise_ else "auto"
    tr = PartitionTracker(TP, OffsetPolicy(reset, on_truncation))
    tr.on_metadata(1, 1, "id-1")
    if state is S.INITIALIZING:
        return tr
    if state is S.NO_VALID_OFFSET:
        tr = PartitionTracker(TP, OffsetPolicy("none", on_truncation))
        tr.on_metadata(1, 1, "id-1")
        tr.restore(None)
        return tr
    tr.seek(EpochOffset(0))
    assert tr.on_records(_act(tr), 0, 9, 1)
    if state is S.FETCHING:
        return tr
    if state is S.AWAIT_RESET:
        if trigger is T.VALIDATION_NEEDED:
            # Skipping forward after OFFSET_OUT_OF_RANGE...
            tr.on_fetch_error(_act(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
            tr.on_validation(_act(tr), 0, 1, 10, 0.0)
        else:
            tr.request_reset("earliest")
        assert tr.state is S.AWAIT_RESET
        return tr
    tr.on_metadata(2, 2, "id-1")
    if state is S.AWAIT_VALIDATION:
        return tr
    assert state is S.TRUNCATED
    tr.on_validation(_act(tr), 0, 1, 4, 0.0)
    return tr


def fire(tr: PartitionTracker, state: PartitionState, trigger: Trigger) -> None:
    if trigger is T.SEEK_UNVALIDATED:
        tr.seek(EpochOffset(5, 1))
    elif trigger is T.SEEK_VALIDATED:
        tr.seek(EpochOffset(5))
    elif trigger is T.RESET_REQUESTED:
        tr.request_reset("earliest")
    elif trigger is T.STOP_NO_OFFSET:
        tr.request_reset(None)
    elif trigger is T.VALIDATION_NEEDED:
        if state is S.AWAIT_RESET:
            # ... found the log start behind the position: the log was replaced.
            tr.on_list_offsets(_act(tr), 0, 2)
        else:
            tr.on_metadata(3, 3, "id-1")
    elif trigger is T.VALIDATED:
        tr.on_validation(_act(tr), 0, 1, 10, 0.0)
    elif trigger in (T.TRUNCATION_REWOUND, T.TRUNCATION_RAISED):
        if state is S.FETCHING:
            tr.on_metadata(1, 0, "id-2")  # another topic id: is it served?
            probe = _act(tr)
            assert isinstance(probe, FetchAction) and probe.topic_probe
            tr.on_empty_fetch(probe)  # served: the topic was re-created
        else:
            tr.on_validation(_act(tr), 0, 1, 4, 0.0)
    elif trigger is T.RESET_DONE:
        tr.on_list_offsets(_act(tr), 3, 1)
    else:  # pragma: no cover - a new trigger needs a recipe here
        raise AssertionError(trigger)


@pytest.mark.parametrize(("state", "trigger", "target"), ROWS, ids=lambda v: getattr(v, "name", v))
def test_every_row_of_the_table(
    state: PartitionState, trigger: Trigger, target: PartitionState
) -> None:
    tr = reach(state, trigger)
    assert tr.state is state
    fire(tr, state, trigger)
    assert tr.state is target


def assert_sub_states_idle(tr: PartitionTracker) -> None:
    """Outside the states it refines, every sub-state holds its idle value."""
    for field, sub in SUB_STATES.items():
        if tr.state not in sub.states:
            assert getattr(tr, field) == sub.idle, (field, tr.state, getattr(tr, field))


def test_every_tracker_field_is_listed() -> None:
    """Nothing hidden: each slot is a documented sub-state or a documented field, and the
    methods the sub-state table names exist."""
    slots = set(PartitionTracker.__slots__)
    assert not set(SUB_STATES) & set(TRACKER_FIELDS)
    assert set(SUB_STATES) | set(TRACKER_FIELDS) == slots
    for field, sub in SUB_STATES.items():
        assert sub.states and sub.states <= set(S), field
        for method in sub.written_by + sub.read_by:
            assert callable(getattr(PartitionTracker, method, None)), (field, method)


def test_leaving_a_state_puts_its_sub_states_back() -> None:
    """A second validation round and a log-start probe, then a seek: nothing of the
    validation is left behind for the next one."""
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(1, 5, "id-1")
    tr.seek(EpochOffset(10, 3))
    assert tr.state is S.AWAIT_VALIDATION and tr._query_epoch == 3
    tr.on_validation(_act(tr), 0, None, None, 0.0)  # the leader knows no epoch <= 3
    assert tr._probe and tr.state is S.AWAIT_VALIDATION
    probe = _act(tr)
    assert isinstance(probe, ResetAction) and probe.purpose == "log_start_probe"
    tr.seek(EpochOffset(4))
    assert tr.state is S.FETCHING
    assert_sub_states_idle(tr)
    tr.on_fetch_error(_act(tr), ErrorCode.OFFSET_OUT_OF_RANGE, 0.0)
    assert tr.state is S.AWAIT_RESET and tr._reset_reason == "offset_out_of_range"
    tr.on_list_offsets(_act(tr), 7, 5)
    assert tr.state is S.FETCHING and tr._reset_reason is None


def test_table_has_no_dead_states() -> None:
    reachable = {n for row in TRANSITIONS.values() for n in row.values()}
    assert reachable | {S.INITIALIZING} == set(S)
    for state in S:
        assert TRANSITIONS[state], state


# --------------------------------------------------------------------------- fuzz

INPUT = st.one_of(
    st.tuples(st.just("metadata"), st.integers(0, 2), st.integers(-1, 6), st.sampled_from("abc")),
    st.tuples(
        st.just("seek"),
        st.integers(0, 30),
        st.none() | st.integers(0, 6),
        st.none() | st.sampled_from("abc"),
    ),
    st.tuples(st.just("restore_none")),
    st.tuples(st.just("reset"), st.sampled_from(["earliest", "latest"])),
    st.tuples(st.just("act"), st.integers(0, 30), st.integers(-1, 6), st.integers(-1, 40)),
    st.tuples(st.just("error"), st.sampled_from([1, 3, 5, 6, 7, 74, 75, 100, 42])),
    st.tuples(st.just("replay"), st.integers(0, 10)),
    st.tuples(st.just("pause"), st.booleans()),
    st.tuples(st.just("time"), st.floats(0, 100)),
)


@settings(
    max_examples=int(os.environ.get("EPOCHGUARD_FUZZ_EXAMPLES", "0")) or scaled(400), deadline=None
)
@given(
    inputs=st.lists(INPUT, max_size=40),
    reset=st.sampled_from(["earliest", "latest", "none"]),
    on_truncation=st.sampled_from(["auto", "raise", "rewind"]),
)
def test_fuzz_inputs_keep_the_invariants(
    inputs: list[tuple[Any, ...]], reset: str, on_truncation: str
) -> None:
    """Arbitrary (also stale, duplicated and contradictory) inputs: never a crash, never an
    edge outside the table, and the state invariants hold after every input."""
    tr = PartitionTracker(TP, OffsetPolicy(reset, on_truncation))
    now = 0.0
    sent: list[Any] = []
    for op in inputs:
        before = tr.state
        name = op[0]
        if name == "metadata":
            tr.on_metadata(op[1], op[2], op[3])
        elif name == "seek":
            tr.seek(EpochOffset(op[1], op[2], topic_id=op[3]))
        elif name == "restore_none":
            tr.restore(None)
        elif name == "reset":
            tr.request_reset(op[1])
        elif name == "time":
            now += op[1]
        elif name == "pause":
            tr.pause() if op[1] else tr.resume()
        elif name in ("act", "error", "replay"):
            if name == "replay" and sent:
                a = sent[op[1] % len(sent)]  # a stale or duplicate answer
            else:
                a = tr.next_action(now)
                if a is None or isinstance(a, WaitAction):
                    if isinstance(a, WaitAction):
                        assert a.until >= now or a.reason == "metadata_refresh"
                        now = max(now, a.until)
                    continue
                sent.append(a)
            code = op[1] if name == "error" else 0
            x, e, end = (op[1], op[2], op[3]) if name == "act" else (3, 1, 5)
            # The wire layer hands "undefined" over as None; -1 must mean the same.
            ne, nend = (None, None) if e < 0 and x % 2 else (e, end)
            if isinstance(a, FetchAction):
                if code:
                    tr.on_fetch_error(a, code, now)
                elif e >= 0 and x % 3 == 0:
                    tr.on_diverging_epoch(a, e, end, now)
                elif e < 0 and x % 3 == 0:
                    tr.on_diverging_epoch(a, None, None if end < 0 else end, now)
                else:
                    delivered = tr.on_records(a, a.offset, a.offset + x % 5, e)
                    assert not (delivered and a.topic_probe), "a probe's records delivered"
            elif isinstance(a, ValidateAction):
                tr.on_validation(a, code if code != 1 else 0, ne, nend, now)
            elif isinstance(a, ResetAction):
                tr.on_list_offsets(a, max(end, 0), e, code if code != 1 else 0, now)
        after = tr.state
        assert (
            after is before
            or after in TRANSITIONS[before].values()
            or any(after in TRANSITIONS[mid].values() for mid in TRANSITIONS[before].values())
        )
        if after is S.FETCHING:
            assert tr.position is not None
        if after in STOPPED_STATES:
            assert tr.error is not None and tr.next_action(now) is None
        if after is S.TRUNCATED:
            assert tr.last_report is not None
        assert_sub_states_idle(tr)
        tr.drain_events()
