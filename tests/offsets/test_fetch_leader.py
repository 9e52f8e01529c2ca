"""``PartitionTracker.fetch_leader(now)`` (the fetcher's cheap look-ahead) names a leader
exactly when ``next_action(now)`` would return a ``FetchAction`` to it, and changes nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epochguard.offsets import (
    EpochOffset,
    ErrorCode,
    FetchAction,
    OffsetPolicy,
    PartitionTracker,
    TopicPartition,
)

TP = TopicPartition("look-ahead", 0)


def _fetching() -> PartitionTracker:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(2, 3, "id-1")
    tr.seek(EpochOffset(5))
    return tr


def _in_flight() -> PartitionTracker:
    tr = _fetching()
    tr.next_action(0.0)
    return tr


def _backoff() -> PartitionTracker:
    tr = _fetching()
    action = tr.next_action(0.0)
    assert isinstance(action, FetchAction)
    tr.on_fetch_error(action, ErrorCode.NOT_LEADER_OR_FOLLOWER, 0.0)
    return tr


def _paused() -> PartitionTracker:
    tr = _fetching()
    tr.pause()
    return tr


def _no_leader() -> PartitionTracker:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.seek(EpochOffset(5))
    return tr


def _validating() -> PartitionTracker:
    tr = _fetching()
    tr.seek(EpochOffset(5, 2))
    return tr


def _initializing() -> PartitionTracker:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    tr.on_metadata(2, 3, "id-1")
    return tr


SITUATIONS: dict[str, Callable[[], PartitionTracker]] = {
    "fetching": _fetching,
    "in_flight": _in_flight,
    "backoff": _backoff,
    "paused": _paused,
    "no_leader": _no_leader,
    "validating": _validating,
    "initializing": _initializing,
}


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
@pytest.mark.parametrize("now", [0.0, 0.01, 10.0])
def test_fetch_leader_matches_next_action(situation: str, now: float) -> None:
    tr = SITUATIONS[situation]()
    before = (tr.state, tr.position, tr.leader_id, tr.leader_epoch)
    leader = tr.fetch_leader(now)
    assert (tr.state, tr.position, tr.leader_id, tr.leader_epoch) == before
    action = tr.next_action(now)
    expected = action.leader_id if isinstance(action, FetchAction) else None
    assert leader == expected, (situation, action)


def test_fetch_leader_is_set_for_a_plain_fetching_tracker() -> None:
    # Guards the test above against every situation answering None.
    assert _fetching().fetch_leader(0.0) == 2
