"""The controller and in-process replication, driven without the network."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochguard.testing.embedded.records import build_batch
from epochguard.testing.embedded.state import ClusterState, EmbeddedClusterError

from ..examples import scaled


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
    state.stop_broker(2)  # leaderless, epoch 2; the last ISR member moves to the ELR
    assert (p.leader, p.leader_epoch, p.isr, p.elr) == (None, 2, [], [2])
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


# -- random fault sequences: replicas converge, clean elections never lose committed data ----

BROKERS = [1, 2, 3]
fault_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3)),
        st.tuples(
            st.sampled_from(["stop", "start", "elect", "elect_unclean", "pause", "resume"]),
            st.sampled_from(BROKERS),
        ),
    ),
    max_size=30,
)


@settings(max_examples=scaled(300), deadline=None)
@given(fault_ops, st.booleans())
def test_random_faults_converge_and_clean_elections_keep_committed_records(
    ops: list[tuple[str, int]], min_isr_two: bool
) -> None:
    state = ClusterState(BROKERS)
    config = {"min.insync.replicas": "2"} if min_isr_two else {}
    state.create_topic("t", 1, 3, config)
    p = state.partition("t", 0)
    committed: dict[int, bytes] = {}
    unclean = False
    counter = 0
    for op, arg in ops:
        try:
            if op == "append" and p.leader is not None:
                for _ in range(arg):
                    counter += 1
                    state.append(p, p.leader, build_batch([b"v%d" % counter]), p.leader_epoch)
            elif op == "stop":
                state.stop_broker(arg)
            elif op == "start":
                state.start_broker(arg)
            elif op == "elect":
                state.elect_leader("t", 0, arg, unclean=False)
            elif op == "elect_unclean":
                clean = arg in p.isr or (not p.isr and arg in p.elr)
                state.elect_leader("t", 0, arg, unclean=True)
                unclean = unclean or not clean
            elif op == "pause":
                state.pause_replication(arg)
            elif op == "resume":
                state.resume_replication(arg)
        except EmbeddedClusterError:
            pass
        if p.leader is not None:
            leader_log = p.logs[p.leader]
            assert leader_log.high_watermark <= leader_log.log_end_offset
            assert p.leader in p.isr
            for off, _, value in _records(leader_log, leader_log.high_watermark):
                committed.setdefault(off, value)
    # Heal: every broker up and fetching; elect someone if nobody leads.
    for b in BROKERS:
        state.resume_replication(b)
        state.start_broker(b)
    if p.leader is None:
        unclean = unclean or not state.eligible_leaders(p)
        assert state.elect_any_leader(p)
        state.publish()
    leader_log = p.logs[p.leader]  # type: ignore[index]
    # Followers learn epochs from replicated batches: the leader's entry for an epoch that
    # has no record yet is the only difference Kafka allows.
    with_records = [e for e in leader_log.epoch_cache if e.start_offset < leader_log.log_end_offset]
    for b in BROKERS:
        assert p.logs[b].read(0, 10**9) == leader_log.read(0, 10**9)
        if b != p.leader:
            assert p.logs[b].epoch_cache == with_records
    assert sorted(p.isr) == BROKERS
    assert leader_log.high_watermark == leader_log.log_end_offset
    if not unclean:
        final = {off: value for off, _, value in _records(leader_log, 10**9)}
        for off, value in committed.items():
            assert final.get(off) == value, f"committed offset {off} lost"


def _records(log: object, upper: int) -> list[tuple[int, int, bytes]]:
    from kafka.record.default_records import DefaultRecordBatch

    out = []
    for raw in log.batches_from(0):  # type: ignore[attr-defined]
        b = DefaultRecordBatch(raw)
        for r in b:
            if r.offset < upper:
                out.append((r.offset, b.leader_epoch, r.value))
    return out


def test_eligible_leader_replicas_kip966() -> None:
    state = ClusterState([1, 2, 3])
    state.create_topic("t", 1, 3, {"min.insync.replicas": "2"})
    p = state.partition("t", 0)
    append(state, 2, "x")
    assert p.logs[1].high_watermark == 2
    state.stop_broker(3)  # ISR [1, 2] still meets min ISR: 3 is simply out
    assert (p.isr, p.elr) == ([1, 2], [])
    state.stop_broker(2)  # below min ISR: 2 keeps its claim in the ELR
    assert (p.isr, p.elr) == ([1], [2])
    append(state, 2, "y")  # acks=1 writes are not committed below min ISR
    assert (p.logs[1].log_end_offset, p.logs[1].high_watermark) == (4, 2)
    state.stop_broker(1)
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (None, [], [2, 1], [2, 1])
    state.start_broker(3)  # never eligible: stays a follower of nobody
    assert p.leader is None
    state.start_broker(2)  # an ELR member comes back as a clean leader
    assert (p.leader, p.isr, p.elr, p.last_known_elr) == (2, [2, 3], [], [])
    # 3 caught up from 2 and the ISR is back at min ISR: the ELR is cleared.
    assert p.logs[2].high_watermark == 2 and p.logs[3].log_end_offset == 2


def test_without_elr_the_last_isr_member_stays() -> None:
    state = ClusterState([1, 2])
    state.elr_enabled = False
    state.create_topic("t", 1, 2)
    p = state.partition("t", 0)
    state.stop_broker(2)
    state.stop_broker(1)
    assert (p.leader, p.isr, p.elr) == (None, [1], [])


def test_empty_follower_starts_at_the_batch_holding_the_leaders_log_start() -> None:
    """DeleteRecords moves the log start inside a batch; a follower that must start over
    gets that whole batch (batches are atomic), as Kafka's fetcher does on
    UnexpectedAppendOffsetException, then takes the leader's log start."""
    state = ClusterState([1, 2])
    state.create_topic("t", 1, 2)
    p = state.partition("t", 0)
    leader = p.leader
    assert leader == 1
    state.pause_replication(2)
    state.append(p, 1, build_batch([b"r%d" % i for i in range(10)]), p.leader_epoch)
    state.delete_records("t", 0, 5)
    state.resume_replication(2)
    follower, leader_log = p.logs[2], p.logs[1]
    assert (follower.log_start_offset, follower.log_end_offset) == (5, 10)
    assert follower.read(5, 10**6) == leader_log.read(5, 10**6)
    assert sorted(p.isr) == [1, 2]


def test_delete_records_reaches_a_follower_only_through_its_fetches() -> None:
    """Kafka's follower takes the leader's log start from its fetch responses, so a follower
    that is not fetching keeps its log start and epoch cache, and serves those records if it
    is elected uncleanly before it fetches again."""
    state = ClusterState([1, 2])
    state.create_topic("t", 1, 2)
    p = state.partition("t", 0)
    append(state, 4, "a")  # 0..3 on both
    state.pause_replication(2)
    state.delete_records("t", 0, 2)
    assert p.logs[1].log_start_offset == 2
    assert p.logs[2].log_start_offset == 0
    assert [(e.epoch, e.start_offset) for e in p.logs[2].epoch_cache] == [(0, 0)]
    state.resume_replication(2)  # its next fetch brings the log start
    assert p.logs[2].log_start_offset == 2
    assert [(e.epoch, e.start_offset) for e in p.logs[2].epoch_cache] == [(0, 2)]


def test_follower_with_records_below_a_mid_batch_log_start_fails_its_partition() -> None:
    """Seed 1110 of the chaos test. A follower whose log reaches past the leader's log start
    (inside a batch, after DeleteRecords) with records of its own below it truncates to that
    log start; the leader's first batch then starts below its log end. Kafka's
    appendAsFollower throws UnexpectedAppendOffsetException, Partition only recovers on an
    empty log, and the fetcher marks the partition failed: the follower stays out of sync
    until it learns a new leader epoch (or restarts)."""
    state = ClusterState([1, 2])
    state.create_topic("t", 1, 2)
    p = state.partition("t", 0)
    append(state, 1, "x")  # 0 on both
    state.pause_replication(2)
    append(state, 7, "a")  # 1..7 in epoch 0 on broker 1 only
    state.stop_broker(1)  # leaderless, epoch 1
    state.elect_leader("t", 0, 2, unclean=True)  # epoch 2 with only offset 0
    assert (p.leader, p.leader_epoch) == (2, 2)
    state.append(p, 2, build_batch([b"b%d" % i for i in range(6)]), 2)  # one batch 1..6
    state.delete_records("t", 0, 4)  # log start 4, inside that batch
    assert [(e.epoch, e.start_offset) for e in p.logs[2].epoch_cache] == [(2, 4)]
    state.pause_replication(1)
    state.start_broker(1)  # 0..7 in epoch 0: the leader answers (0, 4) for epoch 0
    state.resume_replication(1)  # must not raise
    flog = p.logs[1]
    assert (flog.log_start_offset, flog.log_end_offset) == (0, 4)
    assert p.failed_followers == {1} and p.isr == [2]
    append(state, 1, "c")  # the leader goes on without it
    assert flog.log_end_offset == 4 and p.logs[2].high_watermark == 8
    # Retention passes the batch; a new leader epoch restarts the follower's fetcher, which
    # now finds its log end below the leader's log start and starts over there.
    state.delete_records("t", 0, 7)
    state.elect_leader("t", 0, 2, unclean=False)
    assert p.failed_followers == set() and sorted(p.isr) == [1, 2]
    assert (flog.log_start_offset, flog.log_end_offset) == (7, 8)


retention_fault_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3), st.integers(1, 6)),
        st.tuples(st.just("delete"), st.integers(0, 3), st.just(0)),
        st.tuples(
            st.sampled_from(["stop", "start", "elect", "elect_unclean", "pause", "resume"]),
            st.sampled_from(BROKERS),
            st.just(0),
        ),
    ),
    max_size=40,
)


@settings(max_examples=scaled(300), deadline=None)
@given(retention_fault_ops)
def test_random_faults_with_retention_and_multi_record_batches_never_break_the_cluster(
    ops: list[tuple[str, int, int]],
) -> None:
    """Retention inside multi-record batches mixed with elections (the ingredients of chaos
    seed 1110; the test above is its exact regression, which random sequences rarely hit):
    control calls raise only EmbeddedClusterError, every replica's log stays well formed, and
    after healing every follower that did not fail its partition has caught up."""
    state = ClusterState(BROKERS)
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    counter = 0
    for op, arg, size in ops:
        try:
            if op == "append" and p.leader is not None:
                for _ in range(arg):
                    values = [b"v%d" % (counter + i) for i in range(size)]
                    counter += size
                    state.append(p, p.leader, build_batch(values), p.leader_epoch)
            elif op == "delete" and p.leader is not None:
                llog = p.logs[p.leader]
                span = llog.high_watermark - llog.log_start_offset
                state.delete_records("t", 0, llog.log_start_offset + min(arg, span))
            elif op == "stop":
                state.stop_broker(arg)
            elif op == "start":
                state.start_broker(arg)
            elif op == "elect":
                state.elect_leader("t", 0, arg, unclean=False)
            elif op == "elect_unclean":
                state.elect_leader("t", 0, arg, unclean=True)
            elif op == "pause":
                state.pause_replication(arg)
            elif op == "resume":
                state.resume_replication(arg)
        except EmbeddedClusterError:
            pass
        for log in p.logs.values():
            assert log.log_start_offset <= log.high_watermark <= log.log_end_offset
            starts = [e.start_offset for e in log.epoch_cache]
            epochs = [e.epoch for e in log.epoch_cache]
            assert starts == sorted(starts) and epochs == sorted(set(epochs))
            assert all(s >= log.log_start_offset for s in starts)
            offsets = [o for o, _, _ in _records(log, 10**9)]
            assert offsets == sorted(set(offsets))
        if p.leader is not None:
            assert p.leader in p.isr and p.leader not in p.failed_followers
    for b in BROKERS:
        state.resume_replication(b)
        state.start_broker(b)
    if p.leader is None:
        assert state.elect_any_leader(p)
        state.publish()
    leader = p.leader
    assert leader is not None
    for b in BROKERS:
        if b != leader and b not in p.failed_followers:
            assert p.logs[b].log_end_offset == p.logs[leader].log_end_offset


class _HeldLoop:
    """A loop whose delayed calls wait until the test runs them."""

    def __init__(self) -> None:
        self.held: list[tuple[object, tuple[object, ...]]] = []

    def call_later(self, _delay: float, fn: object, *args: object) -> None:
        self.held.append((fn, args))

    def run_held(self) -> None:
        held, self.held = self.held, []
        for fn, args in held:
            fn(*args)  # type: ignore[operator]


def test_a_follower_not_yet_checked_against_the_new_leader_does_not_count() -> None:
    """A follower that learns of a new leader before the leader itself does cannot check its
    log against it yet: records the leader then appends must not be copied onto its old,
    diverging log, nor its log end count toward the high watermark (Kafka's leader counts
    a follower's position from its fetches, and a diverging follower truncates first).
    Otherwise a consumer reads records of the new epoch at offsets the next leader (this
    follower) holds other records at, and no epoch comparison can tell."""
    state = ClusterState([1, 2, 3])
    loop = _HeldLoop()
    state.loop = loop  # type: ignore[assignment]
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    append(state, 1, "e0-")  # 0 everywhere
    state.faults.set_metadata_delay(3, 1.0)  # broker 3 learns every change late
    state.stop_broker(1)
    assert (p.leader, p.leader_epoch) == (2, 1)
    append(state, 2, "e1-")  # 1..2 on broker 2 alone: 3 does not follow it yet
    assert p.logs[2].high_watermark == 1 and 3 in p.isr
    state.elect_leader("t", 0, 3, unclean=False)  # 3 is in the ISR; it does not know yet
    assert (p.leader, p.leader_epoch) == (3, 2)
    append(state, 4, "e2-")  # 1..4 on broker 3
    assert p.logs[2].read(1, 10**6) != p.logs[3].read(1, 10**6)
    assert p.logs[3].high_watermark == 1
    loop.run_held()  # broker 3 takes over; broker 2 truncates to 1 and copies 1..4
    assert p.logs[2].read(0, 10**6) == p.logs[3].read(0, 10**6)
    assert p.logs[2].epoch_cache == p.logs[3].epoch_cache
    assert p.logs[3].high_watermark == 5
