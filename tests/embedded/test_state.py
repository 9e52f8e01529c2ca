"""The controller and in-process replication, driven without the network."""

from __future__ import annotations

import pytest

from epochguard.testing.embedded.records import build_batch
from epochguard.testing.embedded.state import ClusterState, EmbeddedClusterError


def append(state: ClusterState, n: int, tag: str) -> None:
    p = state.partition("t", 0)
    assert p.leader is not None
    for i in range(n):
        state.append(p, p.leader, build_batch([f"{tag}{i}".encode()]), p.leader_epoch)


def test_follower_with_an_epoch_the_new_leader_never_had_truncates_kip279() -> None:
    state = ClusterState([1, 2, 3])
    truncations: list[tuple[str, int, int, int]] = []
    state.on_truncate.append(lambda *args: truncations.append(args))
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    assert (p.leader, p.replicas) == (1, [1, 2, 3])
    append(state, 5, "e0-")  # 0..4 everywhere
    state.stop_broker(3)
    append(state, 2, "e0-only12-")  # 5..6 on 1 and 2
    state.stop_broker(1)  # clean: 2 leads at epoch 1
    assert (p.leader, p.leader_epoch) == (2, 1)
    append(state, 2, "e1-")  # 7..8 on 2 only
    state.stop_broker(2)  # leaderless, epoch 2; ISR keeps its last member
    assert (p.leader, p.leader_epoch, p.isr) == (None, 2, [2])
    state.start_broker(3)
    assert p.leader is None  # out of sync and unclean election disabled
    state.elect_leader("t", 0, 3, unclean=True)  # epoch 3 with only 0..4
    append(state, 5, "e3-")  # 5..9
    state.start_broker(1)
    state.start_broker(2)
    leader_log = p.logs[3]
    for b in (1, 2):
        assert p.logs[b].epoch_cache == leader_log.epoch_cache
        assert p.logs[b].read(0, 10**6) == leader_log.read(0, 10**6)
    assert [(e.epoch, e.start_offset) for e in leader_log.epoch_cache] == [(0, 0), (3, 5)]
    # Broker 1 held epoch 0 up to 7; broker 2 held epoch 1 (which 3 never had) up to 9:
    # both go back to 5, where epoch 0 ends on the new leader.
    assert sorted(truncations) == [("t", 0, 1, 5), ("t", 0, 2, 5)]
    assert sorted(p.isr) == [1, 2, 3]
    assert leader_log.high_watermark == 10


def test_min_isr_and_clean_election_rules() -> None:
    state = ClusterState([1, 2])
    state.create_topic("t", 1, 2, {"min.insync.replicas": "2"})
    with pytest.raises(EmbeddedClusterError, match="already exists"):
        state.create_topic("t", 1, 2)
    with pytest.raises(EmbeddedClusterError, match="replication factor"):
        state.create_topic("u", 1, 3)
    p = state.partition("t", 0)
    state.stop_broker(2)
    assert p.isr == [1]
    with pytest.raises(EmbeddedClusterError, match="not running"):
        state.elect_leader("t", 0, 2, unclean=True)
    state.start_broker(2)
    assert sorted(p.isr) == [1, 2]  # caught up at once: nothing was written
    assert state.delete_records("t", 0, -1) == 0
