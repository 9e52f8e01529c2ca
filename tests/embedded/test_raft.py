"""Raft-term leader epochs (``EmbeddedCluster(epochs="raft")``): the term rules, durability,
and what the brokers answer (OffsetForLeaderEpoch as Redpanda's leader-epoch RFC says,
ListOffsets, the versions they serve)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import (
    FetchRequest,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.handlers import REGISTRY
from epochguard.testing.embedded.partition_log import EpochEntry, PartitionLog
from epochguard.testing.embedded.raft import RaftElections
from epochguard.testing.embedded.records import build_batch
from epochguard.testing.embedded.state import (
    ClusterState,
    ControllerUnavailableError,
    EmbeddedClusterError,
    PartitionState,
)

from .wire import Wire

FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 74, 75


def raft_state(brokers: int = 3) -> ClusterState:
    state = ClusterState(list(range(1, brokers + 1)))
    state.raft = RaftElections(state)
    state.elr_enabled = False
    return state


def append(state: ClusterState, n: int, tag: str, topic: str = "t") -> None:
    p = state.partition(topic, 0)
    assert p.leader is not None
    for i in range(n):
        state.append(p, p.leader, build_batch([f"{tag}{i}".encode()]), p.leader_epoch)


def values(log: PartitionLog) -> list[bytes]:
    from kafka.record.default_records import DefaultRecordBatch

    out: list[bytes] = []
    for raw in log.batches_from(0):
        out += [r.value for r in DefaultRecordBatch(raw)]
    return out


def term_log(*terms: tuple[int, int]) -> PartitionLog:
    """A Raft leader log that took each ``(term, records)`` in turn."""
    log = PartitionLog(raft=True)
    for term, count in terms:
        log.assign_epoch(term)
        for i in range(count):
            log.append_as_leader(build_batch([b"%d-%d" % (term, i)]), term)
    return log


# -- one replica log -------------------------------------------------------------------------


def test_a_term_without_records_stays_in_a_raft_log_and_is_superseded_in_kafkas() -> None:
    raft = term_log((1, 3), (2, 0), (4, 2), (7, 0))
    assert raft.epoch_cache == [
        EpochEntry(1, 0),
        EpochEntry(2, 3),
        EpochEntry(4, 3),
        EpochEntry(7, 5),
    ]
    kafka = PartitionLog()
    for epoch, count in ((1, 3), (2, 0), (4, 2), (7, 0)):
        kafka.assign_epoch(epoch)
        for _ in range(count):
            kafka.append_as_leader(build_batch([b"v"]), epoch)
    assert kafka.epoch_cache == [EpochEntry(1, 0), EpochEntry(4, 3), EpochEntry(7, 5)]


def test_offset_for_leader_epoch_answers_as_the_rfc_says() -> None:
    log = term_log((1, 3), (2, 0), (4, 2), (7, 0))  # terms 3, 5 and 6 never led here
    answers = {t: log.term_end_offset(t) for t in range(-1, 9)}
    assert answers == {
        -1: (-1, -1),  # no epoch asked
        0: (0, 0),  # older than every term kept: the log start
        1: (1, 3),  # the end of the requested term
        2: (2, 3),  # a term with no record: where the next term starts
        3: (3, 3),  # a term this log never had: likewise
        4: (4, 5),
        5: (5, 5),
        6: (6, 5),
        7: (7, 5),  # the current term, without records yet: the log end
        8: (8, -1),  # a term that has not begun here
    }
    # Kafka's rule names the largest epoch at or below the one asked for: same offsets, other
    # epochs (the leader never says which of its terms the offset ends).
    assert log.end_offset_for_epoch(3) == (2, 3) and log.end_offset_for_epoch(6) == (4, 5)
    log.delete_before(4)
    assert log.epoch_cache == [EpochEntry(4, 4), EpochEntry(7, 5)]
    assert log.term_end_offset(1) == (1, 4) and log.term_end_offset(4) == (4, 5)


def test_a_power_cut_keeps_the_durable_prefix_and_the_terms_written_before_it() -> None:
    log = term_log((1, 2))
    log.flush()
    log.append_as_leader(build_batch([b"x"]), 1)
    log.assign_epoch(3)
    log.append_as_leader(build_batch([b"y"]), 3)
    assert log.flushed_offset == 2
    assert log.lose_unflushed() == 2
    assert (log.log_end_offset, log.epoch_cache) == (2, [EpochEntry(1, 0)])
    # A term flushed where it starts survives with nothing in it.
    log.assign_epoch(4)
    log.flush()
    log.append_as_leader(build_batch([b"z"]), 4)
    assert log.lose_unflushed() == 1
    assert log.epoch_cache == [EpochEntry(1, 0), EpochEntry(4, 2)]
    assert values(log) == [b"1-0", b"1-1"]
    # Retention moves a durable term's start, not its durability (found by the chaos runs:
    # a replica that lost every record kept no term, and voted for any log).
    log.append_as_leader(build_batch([b"z2"]), 4)
    log.flush()
    log.append_as_leader(build_batch([b"z3"]), 4)
    log.delete_before(3)
    assert log.lose_unflushed() == 1
    assert log.epoch_cache == [EpochEntry(4, 3)] and log.latest_epoch == 4


# -- terms and elections ---------------------------------------------------------------------


def test_every_election_attempt_takes_a_term() -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    first = p.leader
    assert (first, p.leader_epoch, sorted(p.isr)) == (1, 1, [1, 2, 3])
    append(state, 3, "a")
    # The same broker re-elected: a new term that holds no record.
    state.elect_leader("t", 0, 1, unclean=False)
    assert (p.leader, p.leader_epoch) == (1, 2)
    # Two failed rounds first: the epoch skips two numbers.
    state.elect_leader("t", 0, 2, unclean=False, failed_attempts=2)
    assert (p.leader, p.leader_epoch) == (2, 5)
    assert p.logs[2].epoch_cache == [EpochEntry(1, 0), EpochEntry(2, 3), EpochEntry(5, 3)]
    # Every replica holds every term, the empty ones too.
    for b in (1, 3):
        assert p.logs[b].epoch_cache == p.logs[2].epoch_cache
    with pytest.raises(EmbeddedClusterError, match="no unclean elections"):
        state.elect_leader("t", 0, 3, unclean=True)


def test_a_leader_failure_elects_the_most_up_to_date_replica_and_may_split_the_vote() -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    append(state, 2, "a")
    state.pause_replication(3)  # 3 falls behind
    append(state, 2, "b")
    term = p.leader_epoch
    split = RaftElections.split_votes(p)
    state.stop_broker(1)
    assert p.leader == 2  # 3 is behind: it votes for 2, and would not get 2's vote
    assert p.leader_epoch == term + 1 + split
    assert values(p.logs[2]) == [b"a0", b"a1", b"b0", b"b1"]


def test_split_votes_are_a_fixed_function_of_topic_partition_and_term() -> None:
    splits = []
    for term in range(30):
        p = PartitionState("t", 0, [1, 2, 3], [1], 1, term, {})
        splits.append(RaftElections.split_votes(p))
        assert RaftElections.split_votes(p) == splits[-1]
    assert 0 < sum(splits) < 30


def test_majority_loss_leaves_the_partition_leaderless_under_new_terms() -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    append(state, 2, "a")
    state.stop_broker(3)
    assert (p.leader, p.leader_epoch) == (1, 1)  # a majority still runs
    state.stop_broker(2)
    # The leader reaches no majority: it steps down and campaigns in vain.
    assert (p.leader, p.leader_epoch) == (None, 2)
    state.stop_broker(1)
    state.start_broker(1)  # alone: another failed attempt
    assert (p.leader, p.leader_epoch) == (None, 3)
    state.start_broker(3)
    # Both lost the acks=1 records and hold the same log: the first in replica order wins,
    # under the next term or the one after (a split vote).
    assert p.leader == 1 and p.leader_epoch in (4, 5)
    assert values(p.logs[1]) == values(p.logs[3]) == []


def test_acks_one_records_are_visible_on_a_majority_and_lost_with_it() -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    append(state, 2, "a")
    state.flush(p)  # a0, a1 on disk everywhere
    state.pause_replication(3)
    append(state, 3, "b")  # on 1 and 2 only: a majority, so visible
    assert p.logs[1].high_watermark == 5
    state.pause_replication(2)
    append(state, 1, "c")  # on the leader alone: not visible
    assert p.logs[1].high_watermark == 5
    # The majority that held b0..b2 loses power (the follower first: stopping the leader
    # first would elect the follower, whose new term's flush would save them).
    state.stop_broker(2)
    assert p.leader == 1
    state.stop_broker(1)
    assert p.leader is None
    state.resume_replication(3)
    state.resume_replication(2)
    state.start_broker(2)
    leader = p.leader
    assert leader is not None
    # The new leader's log ends where the durable prefix did: the high watermark went back.
    assert values(p.logs[leader]) == [b"a0", b"a1"]
    assert p.logs[leader].high_watermark == 2
    state.start_broker(1)
    for b in (1, 2, 3):
        assert values(p.logs[b]) == [b"a0", b"a1"]


def test_a_term_with_visible_records_outlives_a_power_cut_of_the_majority_that_held_them() -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    state.pause_replication(3)
    state.elect_leader("t", 0, 1, unclean=False)  # term 2, started while 3 is behind
    append(state, 2, "a")  # visible in term 2: on 1 and 2
    state.stop_broker(2)
    state.stop_broker(1)
    state.resume_replication(3)
    state.start_broker(2)
    # The records are gone with the power cut, but 2 wrote term 2's start to disk when it
    # followed it: a consumer that read a0 in term 2 asks a leader that knows the term.
    assert p.leader == 2
    assert [e.epoch for e in p.logs[2].epoch_cache] == [1, 2, p.leader_epoch]
    assert values(p.logs[2]) == []


def test_a_follower_that_learns_a_term_with_its_records_writes_the_term_to_disk() -> None:
    """Found by the Raft-term chaos runs (seed 739): a follower that caught up with a new
    term's records in one fetch did not flush the term's start, lost it with its power, and
    voted for a log without it: a consumer's reads in that term went unreported."""
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    state.pause_replication(3)
    state.elect_leader("t", 0, 1, unclean=False)  # term 2 while 3 is behind
    append(state, 2, "a")
    state.resume_replication(3)  # term 2's start and its records in one catch-up
    assert values(p.logs[3]) == [b"a0", b"a1"]
    state.stop_broker(3)
    assert [e.epoch for e in p.logs[3].epoch_cache] == [1, 2]


def test_acks_all_records_survive_a_majority_power_cut() -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    append(state, 2, "a")
    state.flush_acknowledged(p)
    state.stop_broker(1)
    state.stop_broker(2)
    state.start_broker(1)
    assert p.leader is not None
    assert values(p.logs[p.leader]) == [b"a0", b"a1"]


def test_one_replica_comes_back_as_the_same_leader_under_a_new_term_without_its_records() -> None:
    state = raft_state(1)
    state.create_topic("t", 1, 1)
    p = state.partition("t", 0)
    append(state, 2, "a")
    state.flush(p)
    append(state, 3, "b")
    assert p.logs[1].high_watermark == 5
    state.stop_broker(1)
    assert (p.leader, p.leader_epoch) == (None, 1)  # no replica left to campaign
    split = RaftElections.split_votes(p)
    state.start_broker(1)
    assert (p.leader, p.leader_epoch) == (1, 2 + split)
    assert values(p.logs[1]) == [b"a0", b"a1"]
    assert p.logs[1].high_watermark == 2


def test_an_election_a_majority_would_not_vote_for_is_refused() -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    state.pause_replication(3)
    append(state, 2, "a")
    with pytest.raises(EmbeddedClusterError, match="cannot win"):
        state.elect_leader("t", 0, 3, unclean=False)
    state.stop_broker(2)
    state.stop_broker(1)
    with pytest.raises(EmbeddedClusterError, match="not running"):
        state.elect_leader("t", 0, 1, unclean=False)
    with pytest.raises(EmbeddedClusterError, match="cannot win"):
        state.elect_leader("t", 0, 3, unclean=False)  # alone: no majority


def test_kafka_rules_refuse_failed_attempts() -> None:
    state = ClusterState([1, 2, 3])
    state.create_topic("t", 1, 3)
    with pytest.raises(EmbeddedClusterError, match="Raft-term cluster"):
        state.elect_leader("t", 0, 2, unclean=False, failed_attempts=1)


# -- random faults: terms only grow, acknowledged records stay, replicas converge -------------

BROKERS = [1, 2, 3]
raft_ops = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["append", "append_all"]), st.integers(1, 3)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(
            st.sampled_from(["stop", "start", "elect", "reelect", "pause", "resume"]),
            st.sampled_from(BROKERS),
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(raft_ops)
def test_random_faults_keep_the_raft_promises(ops: list[tuple[str, int]]) -> None:
    state = raft_state()
    state.create_topic("t", 1, 3)
    p = state.partition("t", 0)
    acknowledged: dict[int, bytes] = {}  # acks=all writes a majority acknowledged
    visible: dict[int, bytes] = {}
    # Terms a record was visible in: a consumer may ask about them; every later leader keeps
    # them (their start was on disk on a majority), so its answer names no term it lacks.
    visible_terms: set[int] = set()
    power_cuts = 0
    counter = 0
    term = p.leader_epoch
    for op, arg in ops:
        try:
            if op in ("append", "append_all") and p.leader is not None:
                for _ in range(arg):
                    counter += 1
                    base, _ = state.append(
                        p, p.leader, build_batch([b"v%d" % counter]), p.leader_epoch
                    )
                    if op == "append_all":
                        state.flush_acknowledged(p)
                        if p.logs[p.leader].high_watermark > base:
                            acknowledged[base] = b"v%d" % counter
            elif op == "flush":
                state.flush(p)
            elif op == "stop":
                if state.brokers[arg].alive:
                    power_cuts += 1
                state.stop_broker(arg)
            elif op == "start":
                state.start_broker(arg)
            elif op == "elect":
                state.elect_leader("t", 0, arg, unclean=False)
            elif op == "reelect" and p.leader is not None:
                state.elect_leader("t", 0, p.leader, unclean=False, failed_attempts=arg - 1)
            elif op == "pause":
                state.pause_replication(arg)
            elif op == "resume":
                state.resume_replication(arg)
        except EmbeddedClusterError:
            pass
        assert p.leader_epoch >= term
        term = p.leader_epoch
        for b in BROKERS:
            cache = p.logs[b].epoch_cache
            assert [e.epoch for e in cache] == sorted({e.epoch for e in cache})
            assert all(e.epoch <= term for e in cache)
        if p.leader is not None:
            leader_log = p.logs[p.leader]
            assert leader_log.latest_epoch == term
            assert leader_log.high_watermark <= leader_log.log_end_offset
            records = dict(enumerate(values(leader_log)))  # no retention: offset = index
            for offset, value in acknowledged.items():
                assert records.get(offset) == value, f"acknowledged offset {offset} lost"
            if not power_cuts:
                for offset, value in visible.items():
                    assert records.get(offset) == value, f"visible offset {offset} lost"
            terms = {e.epoch for e in leader_log.epoch_cache}
            assert visible_terms <= terms, f"leader {p.leader} lacks terms {visible_terms - terms}"
            for offset in range(leader_log.high_watermark):
                visible.setdefault(offset, records[offset])
                visible_terms.add(leader_log.epoch_for_offset(offset))
    for b in BROKERS:
        state.resume_replication(b)
        state.start_broker(b)
    assert p.leader is not None
    leader_log = p.logs[p.leader]
    for b in BROKERS:
        assert values(p.logs[b]) == values(leader_log)
        assert p.logs[b].epoch_cache == leader_log.epoch_cache
    assert leader_log.high_watermark == leader_log.log_end_offset


# -- what the brokers answer -----------------------------------------------------------------


@pytest.fixture
def raft_cluster() -> Any:
    with EmbeddedCluster(brokers=3, epochs="raft") as c:
        yield c


def offset_for_leader_epoch(
    cluster: EmbeddedCluster, broker: int, current: int, epoch: int
) -> tuple[int, int, int]:
    R = OffsetForLeaderEpochRequest
    T = R.OffsetForLeaderTopic
    req = R(
        version=3,
        replica_id=-1,
        topics=[
            T(
                version=3,
                topic="t",
                partitions=[
                    T.OffsetForLeaderPartition(
                        version=3, partition=0, current_leader_epoch=current, leader_epoch=epoch
                    )
                ],
            )
        ],
    )
    w = Wire.to(cluster, broker)
    try:
        p = w.call(req, OffsetForLeaderEpochResponse).topics[0].partitions[0]
    finally:
        w.close()
    return p.error_code, p.leader_epoch, p.end_offset


def list_offsets(cluster: EmbeddedCluster, broker: int, timestamp: int) -> tuple[int, int]:
    R = ListOffsetsRequest
    T = R.ListOffsetsTopic
    req = R(
        version=7,
        replica_id=-1,
        isolation_level=0,
        topics=[
            T(
                version=7,
                name="t",
                partitions=[
                    T.ListOffsetsPartition(
                        version=7, partition_index=0, current_leader_epoch=-1, timestamp=timestamp
                    )
                ],
            )
        ],
    )
    w = Wire.to(cluster, broker)
    try:
        p = w.call(req, ListOffsetsResponse).topics[0].partitions[0]
    finally:
        w.close()
    return p.offset, p.leader_epoch


def test_the_new_leader_answers_the_lost_term_with_where_the_next_one_starts(
    raft_cluster: EmbeddedCluster,
) -> None:
    c = raft_cluster
    c.create_topic("t", 1, 3)
    a = c.leader("t", 0)
    assert a is not None
    b, other = [r for r in c.replicas("t", 0) if r != a]
    c.append("t", 0, [b"a0", b"a1", b"a2"], timestamp_ms=1_000)
    c.flush("t", 0)
    c.elect_leader("t", 0, a)  # term 2, same leader, no record yet
    c.pause_replication(other)
    c.append("t", 0, [b"d0", b"d1"], timestamp_ms=2_000)  # term 2: visible on a and b
    assert c.high_watermark("t", 0) == 5
    c.stop_broker(b)
    c.stop_broker(a)  # the majority that held d0, d1 lost power; a failed attempt: term 3
    assert (c.leader("t", 0), c.leader_epoch("t", 0)) == (None, 3)
    c.resume_replication(other)
    c.start_broker(b)
    new = c.leader("t", 0)
    assert new is not None
    term = c.leader_epoch("t", 0)
    assert term in (4, 5)  # 5 when the vote split once
    c.settle()
    assert c.epoch_cache("t", 0, new) == [(1, 0), (2, 3), (term, 3)]
    # Term 2 holds nothing in the new leader's log (d0, d1 are gone) and term 3 never led:
    # their end is where the next term starts. The leader echoes the term asked about.
    assert offset_for_leader_epoch(c, new, term, 2) == (0, 2, 3)
    assert offset_for_leader_epoch(c, new, term, 3) == (0, 3, 3)
    assert offset_for_leader_epoch(c, new, term, 1) == (0, 1, 3)
    assert offset_for_leader_epoch(c, new, term, term) == (0, term, 3)
    assert offset_for_leader_epoch(c, new, term, term + 1) == (0, term + 1, -1)
    assert offset_for_leader_epoch(c, new, term - 1, 1)[0] == FENCED_LEADER_EPOCH
    assert offset_for_leader_epoch(c, new, term + 1, 1)[0] == UNKNOWN_LEADER_EPOCH
    # ListOffsets names the current term, whatever the query.
    assert list_offsets(c, new, -2) == (0, term)
    assert list_offsets(c, new, -1) == (3, term)
    assert list_offsets(c, new, 500) == (0, term)
    assert list_offsets(c, new, 9_000) == (-1, -1)


def test_raft_brokers_serve_fetch_up_to_v11_and_offset_for_leader_epoch_up_to_v3(
    raft_cluster: EmbeddedCluster,
) -> None:
    w = Wire.to(raft_cluster, 1)
    try:
        resp = w.call(
            ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1"),
            ApiVersionsResponse,
        )
        keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert keys[1] == (4, 11) and keys[23] == (2, 3)
        metadata = REGISTRY[3]  # the other APIs as Kafka's rules serve them
        assert keys[3] == (metadata.min_version, metadata.max_version)
        # A Fetch above what is advertised closes the connection, as an unparsable request.
        req = FetchRequest[12](
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1024,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[],
            forgotten_topics_data=[],
            rack_id="",
        )
        w.send(req)
        assert w.closed_by_peer()
    finally:
        w.close()


def test_topics_change_only_while_a_majority_of_brokers_runs(raft_cluster: EmbeddedCluster) -> None:
    """The controller is a Raft group of every broker too: without a majority running,
    topics are neither created nor deleted (CreateTopics and DeleteTopics time out)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import RequestTimedOutError

    c = raft_cluster
    c.create_topic("t", 1, 3)
    c.stop_broker(1)
    assert c.controller_available
    c.stop_broker(2)
    assert not c.controller_available
    with pytest.raises(ControllerUnavailableError, match="1 of 3 brokers running"):
        c.create_topic("u", 1, 1)
    with pytest.raises(ControllerUnavailableError):
        c.delete_topic("t")
    admin = KafkaAdminClient(bootstrap_servers=c.bootstrap_servers, request_timeout_ms=5000)
    try:
        with pytest.raises(RequestTimedOutError):
            admin.create_topics([NewTopic("u", 1, 1)])
        with pytest.raises(RequestTimedOutError):
            admin.delete_topics(["t"])
    finally:
        admin.close()
    c.start_broker(2)
    c.create_topic("u", 1, 1)
    c.delete_topic("t")


def test_a_controlled_stop_loses_nothing_and_a_kill_loses_what_was_not_flushed(
    raft_cluster: EmbeddedCluster,
) -> None:
    c = raft_cluster
    c.create_topic("t", 1, 1)
    leader = c.leader("t", 0)
    assert leader is not None
    c.append("t", 0, [b"a", b"b"])
    c.stop_broker(leader, controlled=True, grace_s=0.0)
    c.start_broker(leader)
    assert c.log_end_offset("t", 0) == 2
    c.append("t", 0, [b"c"])
    c.stop_broker(leader)
    c.start_broker(leader)
    assert c.log_end_offset("t", 0) == 2


def test_epochs_must_name_known_rules() -> None:
    with pytest.raises(ValueError, match="kafka, raft"):
        EmbeddedCluster(epochs="zab")
    assert EmbeddedCluster(brokers=1).epochs == "kafka"
