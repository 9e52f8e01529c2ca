"""Transactions in the EmbeddedCluster: the coordinator's rules (sans-IO), each replica's
producer state, last stable offset and aborted-transaction index, and the whole protocol
driven by kafka-python's and librdkafka's transactional producers."""

from __future__ import annotations

import time
import zlib
from typing import Any

import attrs
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse

from epochguard._errors import ErrorCode
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.consumer_groups import consumer_coordinator
from epochguard.testing.embedded.groups import CommittedOffset
from epochguard.testing.embedded.handlers._group_common import coordinator_broker
from epochguard.testing.embedded.partition_log import PartitionLog
from epochguard.testing.embedded.records import TRANSACTIONAL, build_batch, build_control_batch
from epochguard.testing.embedded.transactions import TransactionCoordinator, TxnState

from .. import txn_workload as w
from .wire import Wire

pytestmark = pytest.mark.timeout(60)


# -- the coordinator, sans-IO ----------------------------------------------------------------


@attrs.define
class FakeParticipants:
    writable: bool = True
    markers: list[tuple[str, int, int, int, bool]] = attrs.field(factory=list)
    group_ends: list[tuple[str, int, bool]] = attrs.field(factory=list)
    next_id: int = 100

    def new_producer_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def partition_exists(self, topic: str, partition: int) -> bool:
        return topic == "t"

    def write_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> bool:
        if self.writable:
            self.markers.append((topic, partition, producer_id, producer_epoch, commit))
        return self.writable

    def end_group_transaction(self, group_id: str, producer_id: int, commit: bool) -> None:
        self.group_ends.append((group_id, producer_id, commit))


def _coordinator() -> tuple[TransactionCoordinator, FakeParticipants]:
    parts = FakeParticipants()
    return TransactionCoordinator(parts), parts


def test_each_init_bumps_the_epoch_and_fences_the_older_instance() -> None:
    coord, _ = _coordinator()
    first = coord.init_producer_id("tx", 60_000, now_ms=0)
    second = coord.init_producer_id("tx", 60_000, now_ms=1)
    assert (first.error, first.producer_epoch) == (0, 0)
    assert (second.error, second.producer_id, second.producer_epoch) == (0, first.producer_id, 1)
    old = coord.add_partitions("tx", first.producer_id, 0, [("t", 0)], now_ms=2)
    assert old == {("t", 0): ErrorCode.PRODUCER_FENCED}
    assert coord.end_transaction("tx", first.producer_id, 0, True, 3) == ErrorCode.PRODUCER_FENCED
    assert coord.add_offsets("tx", 999, 1, "g", 3) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    # KIP-360: re-initialising with a stale id and epoch is fenced too.
    stale = coord.init_producer_id("tx", 60_000, 4, first.producer_id, 0)
    assert stale.error == ErrorCode.PRODUCER_FENCED


def test_init_rejects_bad_timeouts_and_empty_ids() -> None:
    coord, _ = _coordinator()
    assert coord.init_producer_id("tx", 0, 0).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert coord.init_producer_id("tx", 900_001, 0).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert coord.init_producer_id("", 1000, 0).error == ErrorCode.INVALID_REQUEST


def test_end_transaction_follows_kafkas_state_machine() -> None:
    coord, parts = _coordinator()
    r = coord.init_producer_id("tx", 60_000, 0)
    pid = r.producer_id
    assert coord.end_transaction("tx", pid, 0, True, 1) == ErrorCode.INVALID_TXN_STATE  # Empty
    assert coord.add_partitions("tx", pid, 0, [("t", 0), ("t", 1)], 2) == {
        ("t", 0): 0,
        ("t", 1): 0,
    }
    assert coord.add_offsets("tx", pid, 0, "g", 2) == 0
    assert coord.describe("tx").state is TxnState.ONGOING  # type: ignore[union-attr]
    assert coord.end_transaction("tx", pid, 0, True, 3) == 0
    assert parts.markers == [("t", 0, pid, 0, True), ("t", 1, pid, 0, True)]
    assert parts.group_ends == [("g", pid, True)]
    assert coord.describe("tx").state is TxnState.COMPLETE_COMMIT  # type: ignore[union-attr]
    assert coord.end_transaction("tx", pid, 0, True, 4) == 0  # a retried commit
    assert coord.end_transaction("tx", pid, 0, False, 4) == ErrorCode.INVALID_TXN_STATE


def test_unknown_partitions_fail_the_whole_add() -> None:
    coord, _ = _coordinator()
    pid = coord.init_producer_id("tx", 60_000, 0).producer_id
    assert coord.add_partitions("tx", pid, 0, [("t", 0), ("nope", 0)], 1) == {
        ("t", 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
        ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert coord.describe("tx").state is TxnState.EMPTY  # type: ignore[union-attr]


def test_markers_that_cannot_be_written_stay_pending_until_a_tick_writes_them() -> None:
    coord, parts = _coordinator()
    pid = coord.init_producer_id("tx", 60_000, 0).producer_id
    coord.add_partitions("tx", pid, 0, [("t", 0)], 1)
    parts.writable = False
    assert coord.end_transaction("tx", pid, 0, False, 2) == 0
    assert coord.describe("tx").state is TxnState.PREPARE_ABORT  # type: ignore[union-attr]
    assert coord.add_partitions("tx", pid, 0, [("t", 0)], 3) == {
        ("t", 0): ErrorCode.CONCURRENT_TRANSACTIONS
    }
    assert coord.init_producer_id("tx", 60_000, 3).error == ErrorCode.CONCURRENT_TRANSACTIONS
    assert coord.end_transaction("tx", pid, 0, False, 3) == ErrorCode.CONCURRENT_TRANSACTIONS
    parts.writable = True
    coord.tick(4)
    assert parts.markers == [("t", 0, pid, 0, False)]
    assert coord.describe("tx").state is TxnState.COMPLETE_ABORT  # type: ignore[union-attr]


def test_init_with_an_open_transaction_aborts_it_under_a_new_epoch() -> None:
    coord, parts = _coordinator()
    pid = coord.init_producer_id("tx", 60_000, 0).producer_id
    coord.add_partitions("tx", pid, 0, [("t", 0)], 1)
    assert coord.init_producer_id("tx", 60_000, 2).error == ErrorCode.CONCURRENT_TRANSACTIONS
    assert parts.markers == [("t", 0, pid, 1, False)]
    retried = coord.init_producer_id("tx", 60_000, 3)
    assert (retried.error, retried.producer_epoch) == (0, 2)  # as Kafka: two bumps


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    coord, parts = _coordinator()
    pid = coord.init_producer_id("tx", 1000, 0).producer_id
    coord.add_partitions("tx", pid, 0, [("t", 0)], 10)
    coord.tick(1010)
    assert parts.markers == []
    coord.tick(1011)
    assert parts.markers == [("t", 0, pid, 1, False)]
    assert coord.end_transaction("tx", pid, 0, True, 1012) == ErrorCode.PRODUCER_FENCED


def test_produce_verification_needs_the_partition_in_the_open_transaction() -> None:
    coord, _ = _coordinator()
    pid = coord.init_producer_id("tx", 60_000, 0).producer_id
    assert coord.produce_error(pid, 0, ("t", 0)) == ErrorCode.INVALID_TXN_STATE
    coord.add_partitions("tx", pid, 0, [("t", 0)], 1)
    assert coord.produce_error(pid, 0, ("t", 0)) == 0
    assert coord.produce_error(pid, 0, ("t", 1)) == ErrorCode.INVALID_TXN_STATE
    assert coord.produce_error(pid + 1, 0, ("t", 0)) == ErrorCode.INVALID_PRODUCER_ID_MAPPING


# -- one replica's producer state ----------------------------------------------------------


def _txn_batch(pid: int, epoch: int, values: list[bytes], seq: int = 0) -> bytes:
    raw = bytearray(build_batch(values, timestamp_ms=1))
    # attributes, producer id, epoch and base sequence (the CRC is not checked on append).
    raw[21:23] = TRANSACTIONAL.to_bytes(2, "big")
    raw[43:57] = pid.to_bytes(8, "big") + epoch.to_bytes(2, "big") + seq.to_bytes(4, "big")
    return bytes(raw)


def _marker(pid: int, epoch: int, commit: bool) -> bytes:
    return build_control_batch(pid, epoch, commit=commit, coordinator_epoch=0, timestamp_ms=1)


def test_replica_keeps_the_aborted_index_and_the_last_stable_offset() -> None:
    log = PartitionLog()
    log.append_as_leader(_txn_batch(1, 0, [b"a", b"b"]), 0)  # 0-1
    log.append_as_leader(_txn_batch(2, 0, [b"x"]), 0)  # 2
    log.append_as_leader(_marker(1, 0, commit=False), 0)  # 3
    log.append_as_leader(_marker(2, 0, commit=True), 0)  # 4
    log.append_as_leader(_txn_batch(1, 0, [b"c"], seq=2), 0)  # 5 (open)
    # A marker not below the high watermark yet (not replicated) holds the LSO back.
    log.high_watermark = 4
    assert log.last_stable_offset == 2
    log.high_watermark = log.log_end_offset
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in log._aborted] == [(1, 0, 3)]
    assert log.last_stable_offset == 5
    assert log.aborted_transactions(4, 6) == []
    assert log.aborted_transactions(3, 6)[0].first_offset == 0
    entry = log.producer(1)
    assert entry is not None
    assert (entry.epoch, entry.last_sequence, entry.txn_first_offset) == (0, 2, 5)


def test_truncating_a_marker_away_reopens_its_transaction() -> None:
    # An unclean election that drops an ABORT marker leaves the transaction open (hanging).
    log = PartitionLog()
    log.append_as_leader(_txn_batch(7, 0, [b"a"]), 0)
    log.append_as_leader(_marker(7, 0, commit=False), 0)
    log.high_watermark = log.log_end_offset
    assert (log.last_stable_offset, len(log._aborted)) == (2, 1)
    log.truncate_to(1)
    log.high_watermark = 1
    assert log._aborted == []
    assert log.last_stable_offset == 0
    assert log.producer(7).txn_first_offset == 0  # type: ignore[union-attr]


# -- the cluster -----------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_transactional_workload(cluster: EmbeddedCluster, client: str) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=3)
    run = w.kafka_python_workload if client == "kafka-python" else w.confluent_workload
    left_open = run(cluster.bootstrap_servers, "t", "g", ("a", "b"))
    observed = w.observe(cluster.bootstrap_servers, "t", "g", ("a", "b"))
    assert observed == w.Observation(
        high_watermarks={0: 7, 1: 4},
        last_stable_offsets={0: 6, 1: 4},
        read_uncommitted=w.EXPECTED_UNCOMMITTED,
        kafka_python_committed=w.EXPECTED_COMMITTED,
        confluent_committed=w.EXPECTED_COMMITTED,
        epoch_consumer_committed=w.EXPECTED_COMMITTED,
        fetch_answers={0: (7, 6, [("a", 3)]), 1: (4, 4, [])},
        group_offsets={0: (5, 0)},
        transactions={"a": ("CompleteCommit", 0, [], 60_000), "b": ("Ongoing", 0, [0], 60_000)},
        ongoing=["b"],
        producers={0: [("a", 0, 3, -1), ("b", 0, 0, 6)], 1: [("a", 0, 1, -1)]},
    )
    # Every replica got the markers through replication and has the same stable offset.
    for p in (0, 1):
        for b in cluster.replicas("t", p):
            assert cluster.last_stable_offset("t", p, b) == (6 if p == 0 else 4)
            assert cluster.log_end_offset("t", p, b) == (7 if p == 0 else 4)
    # KIP-664: an operator's abort (WriteTxnMarkers) makes the partition stable again.
    assert w.abort_with_admin(cluster.bootstrap_servers, "t", 0, "b", ("a", "b")) == (
        8,
        8,
        [("a", 3), ("b", 6)],
    )
    if client == "kafka-python":
        left_open.abort_transaction()
        left_open.close()
    else:
        left_open.abort_transaction(10)
    # The coordinator's own ABORT marker follows; it changes nothing more.
    assert cluster.high_watermark("t", 0) == 9
    assert cluster.last_stable_offset("t", 0) == 9
    pid_a = cluster.call(lambda: cluster.state.transactions.describe("a").producer_id)
    pid_b = cluster.call(lambda: cluster.state.transactions.describe("b").producer_id)
    assert cluster.aborted_transactions("t", 0) == [(pid_a, 3, 5), (pid_b, 6, 7)]


def test_a_newer_instance_fences_the_older_one(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    old = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="tx")
    old.init_transactions()
    old.begin_transaction()
    old.send("t", b"zombie", partition=0)
    old.flush()
    new = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="tx")
    new.init_transactions()  # aborts the zombie's transaction
    with pytest.raises(KafkaError):
        old.commit_transaction()
    new.begin_transaction()
    new.send("t", b"ok", partition=0)
    new.commit_transaction()
    reader = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )
    reader.assign([TopicPartition("t", 0)])
    assert [m.value for m in reader] == [b"ok"]
    reader.close()
    old.close(timeout=1)
    new.close()


def test_a_timed_out_transaction_is_aborted(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    p = KafkaProducer(
        bootstrap_servers=cluster.bootstrap_servers,
        transactional_id="slow",
        transaction_timeout_ms=300,
    )
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"late", partition=0)
    p.flush()
    log = cluster.call(lambda: cluster.state.partition("t", 0).leader_log)
    assert cluster.call(lambda: log.last_stable_offset) == 0
    deadline = time.monotonic() + 10
    while cluster.call(lambda: log.last_stable_offset) != 2:
        assert time.monotonic() < deadline, "the coordinator did not abort the transaction"
        time.sleep(0.05)
    aborted = cluster.call(lambda: log.aborted_transactions(0, 2))
    assert [(a.first_offset, a.last_offset) for a in aborted] == [(0, 1)]
    with pytest.raises(KafkaError):
        p.commit_transaction()
    p.close(timeout=1)


def test_a_marker_waits_for_a_leader(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    leader = cluster.leader("t", 0)
    assert leader is not None

    def coordinated_elsewhere(txn_id: str) -> bool:
        # Both before and after the leader stops (the coordinator hash follows live brokers).
        def check() -> bool:
            before = coordinator_broker(cluster.state, txn_id)
            alive = [b for b in cluster.state.alive_brokers() if b.node_id != leader]
            after = sorted(alive, key=lambda b: b.node_id)[zlib.crc32(txn_id.encode()) % len(alive)]
            return before is not None and leader not in (before.node_id, after.node_id)

        return cluster.call(check)

    txn_id = next(t for t in (f"tx{i}" for i in range(50)) if coordinated_elsewhere(t))
    p = KafkaProducer(bootstrap_servers=cluster.all_bootstrap_servers, transactional_id=txn_id)
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"v", partition=0)
    p.flush()
    cluster.stop_broker(leader)
    p.commit_transaction()  # PrepareCommit: the marker is pending
    state = cluster.call(lambda: cluster.state.transactions.describe(txn_id).state)
    assert state is TxnState.PREPARE_COMMIT
    cluster.start_broker(leader)
    deadline = time.monotonic() + 10
    while cluster.call(lambda: cluster.state.transactions.describe(txn_id).state) is not (
        TxnState.COMPLETE_COMMIT
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert cluster.high_watermark("t", 0) == 2
    p.close()


def _joined_member(cluster: EmbeddedCluster) -> tuple[KafkaConsumer, Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers, group_id="g", enable_auto_commit=False
    )
    # Know the topic before joining. Otherwise kafka-python 3.0.12 leads a second rebalance
    # when the metadata arrives, and if poll's timeout ends while that join is in flight, the
    # leader never applies its own assignment and stays with none.
    deadline = time.monotonic() + 20
    while not consumer.partitions_for_topic("t"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    consumer.subscribe(["t"])
    while not consumer.assignment():
        assert time.monotonic() < deadline
        consumer.poll(timeout_ms=100)
    return consumer, consumer.group_metadata()


def test_txn_offset_commit_is_fenced_by_group_metadata(cluster: EmbeddedCluster) -> None:
    """KIP-447: a commit carrying a member's metadata must be from a current member of the
    current generation; one with the group id alone is accepted."""
    cluster.create_topic("t")
    consumer, metadata = _joined_member(cluster)
    try:
        gen, member = metadata.generation_id, metadata.member_id
        offsets = {("t", 0): CommittedOffset(3, 0)}

        def commit(generation: int, member_id: str) -> int:
            groups = cluster.state.groups
            return cluster.call(
                lambda: groups.txn_commit_offsets("g", 42, generation, member_id, None, offsets)
            )[("t", 0)]

        assert commit(gen, member) == 0
        assert commit(gen + 1, member) == ErrorCode.ILLEGAL_GENERATION
        assert commit(gen, "someone-else") == ErrorCode.UNKNOWN_MEMBER_ID
        assert commit(-1, "") == 0
        # Held until the transaction ends: nothing visible, KIP-447's stable fetch refuses.
        assert cluster.call(lambda: cluster.state.groups.fetch_offsets("g", None)) == {}
        coord = cluster.call(lambda: coordinator_broker(cluster.state, "g"))
        assert coord is not None
        wire = Wire.to(cluster, coord.node_id)
        T = OffsetFetchRequest.OffsetFetchRequestTopic
        answer = wire.call(
            OffsetFetchRequest(
                version=7,
                group_id="g",
                topics=[T(version=7, name="t", partition_indexes=[0])],
                require_stable=True,
            ),
            OffsetFetchResponse,
        )
        wire.close()
        assert answer.topics[0].partitions[0].error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT
        cluster.call(lambda: cluster.state.groups.end_transaction("g", 42, True))
        committed = cluster.call(lambda: cluster.state.groups.fetch_offsets("g", None))
        assert committed[("t", 0)].offset == 3
    finally:
        consumer.close()


def test_send_offsets_with_consumer_metadata_commits_with_the_transaction(
    cluster: EmbeddedCluster,
) -> None:
    from kafka.structs import OffsetAndMetadata

    cluster.create_topic("t")
    consumer, metadata = _joined_member(cluster)
    try:
        p = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="tx")
        p.init_transactions()
        for offset, commit in ((4, False), (7, True)):
            p.begin_transaction()
            p.send("t", b"v", partition=0)
            p.send_offsets_to_transaction(
                {TopicPartition("t", 0): OffsetAndMetadata(offset, "", 0)}, metadata
            )
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
        p.close()
        got = consumer.committed(TopicPartition("t", 0))
        assert got == 7
    finally:
        consumer.close()


def test_read_committed_list_offsets_answers_the_last_stable_offset(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("t")
    cluster.append("t", 0, [b"plain"])
    p = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"open", partition=0)
    p.flush()
    tp = TopicPartition("t", 0)
    for isolation, end in (("read_uncommitted", 2), ("read_committed", 1)):
        c = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, isolation_level=isolation)
        assert c.end_offsets([tp]) == {tp: end}
        c.close()
    p.abort_transaction()
    p.close()


def test_a_marker_lost_to_an_unclean_election_hangs_its_transaction(
    cluster: EmbeddedCluster,
) -> None:
    """A COMMIT marker only the old leader had is truncated away: the new leader sees the
    transaction open forever (its last stable offset stops), DescribeProducers names it, and
    an operator's abort (WriteTxnMarkers) frees the partition, the records now aborted."""
    from kafka.admin import AbortTransactionSpec, KafkaAdminClient

    cluster.create_topic("t", replication_factor=2)
    leader = cluster.leader("t", 0)
    follower = next(b for b in cluster.replicas("t", 0) if b != leader)
    p = KafkaProducer(bootstrap_servers=cluster.all_bootstrap_servers, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"v", partition=0)
    p.flush()
    assert cluster.log_end_offset("t", 0, follower) == 1
    cluster.pause_replication(follower)
    p.commit_transaction()
    p.close()
    assert cluster.last_stable_offset("t", 0) == 2
    cluster.stop_broker(leader)
    cluster.elect_leader("t", 0, follower, unclean=True)
    cluster.resume_replication(follower)
    cluster.start_broker(leader)  # truncates to the new leader's log: the marker is gone
    cluster.settle()
    for b in (leader, follower):
        assert cluster.log_end_offset("t", 0, b) == 1
        assert cluster.last_stable_offset("t", 0, b) == 0
    # The coordinator believes the transaction committed.
    state = cluster.call(lambda: cluster.state.transactions.describe("tx").state)
    assert state is TxnState.COMPLETE_COMMIT
    tp = TopicPartition("t", 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        (hanging,) = admin.describe_producers([tp])[tp].active_producers
        assert hanging.current_transaction_start_offset == 0
        admin.abort_transaction(
            AbortTransactionSpec(tp, hanging.producer_id, hanging.producer_epoch, 0)
        )
        with pytest.raises(KafkaError):  # an older producer epoch is fenced
            admin.abort_transaction(
                AbortTransactionSpec(tp, hanging.producer_id, hanging.producer_epoch - 1, 0)
            )
    finally:
        admin.close()
    assert cluster.last_stable_offset("t", 0) == 2
    assert cluster.aborted_transactions("t", 0) == [(hanging.producer_id, 0, 1)]


def test_zombie_and_stale_member_fencing(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    assert w.fencing_scenario(cluster.bootstrap_servers, "t", "g", "tx") == {
        "zombie_commit": "ProducerFencedError",
        "epoch_after_takeover": 2,  # the zombie's transaction was aborted under epoch 1
        "stale_metadata_offsets": "CommitFailedError",  # UNKNOWN_MEMBER_ID
        "commit_after_stale": "KafkaError",  # the transaction is abortable only
        "read_committed": [],
    }


def test_transaction_timeouts_above_the_broker_maximum_are_refused() -> None:
    with EmbeddedCluster(brokers=1, transaction_max_timeout_ms=5_000) as cluster:
        ok = KafkaProducer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="ok",
            transaction_timeout_ms=5_000,
        )
        ok.init_transactions()
        ok.close()
        too_long = KafkaProducer(
            bootstrap_servers=cluster.bootstrap_servers,
            transactional_id="long",
            transaction_timeout_ms=5_001,
        )
        with pytest.raises(KafkaError) as raised:
            too_long.init_transactions()
        assert "InvalidTransactionTimeoutError" in str(raised.value)  # error 50
        too_long.close(timeout=1)
    with pytest.raises(ValueError, match="transaction_max_timeout_ms"):
        EmbeddedCluster(transaction_max_timeout_ms=0)


def test_kip848_group_offsets_in_a_transaction_are_fenced_by_membership(
    cluster: EmbeddedCluster,
) -> None:
    """librdkafka's KIP-848 consumer: its group metadata (member id, member epoch) commits
    offsets in a transaction; once it has left the group the same metadata is refused."""
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka import TopicPartition as CkTopicPartition

    cluster.create_topic("t")
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "g848",
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.subscribe(["t"])
    deadline = time.monotonic() + 20
    while not consumer.assignment():
        assert time.monotonic() < deadline
        consumer.poll(0.1)
    modern = cluster.call(lambda: consumer_coordinator(cluster.state))
    assert modern is not None
    assert cluster.call(lambda: "g848" in modern.groups)
    metadata = consumer.consumer_group_metadata()
    p = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": "tx", "log_level": 0}
    )
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("t", b"v", partition=0)
    p.send_offsets_to_transaction([CkTopicPartition("t", 0, 7, leader_epoch=0)], metadata, 10)
    p.commit_transaction(10)
    (committed,) = consumer.committed([CkTopicPartition("t", 0)], 10)
    assert committed.offset == 7
    consumer.close()  # leaves the group: its member id is gone
    p.begin_transaction()
    p.produce("t", b"v", partition=0)
    with pytest.raises(KafkaException):  # UNKNOWN_MEMBER_ID
        p.send_offsets_to_transaction([CkTopicPartition("t", 0, 9)], metadata, 10)
    p.abort_transaction(10)


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_epoch_consumer_group_metadata_commits_offsets_in_a_transaction(
    cluster: EmbeddedCluster, group_protocol: str
) -> None:
    """The consume-transform-produce loop with EpochConsumer: its position with epoch and
    group metadata go into kafka-python's transaction; a stale generation (member epoch in a
    KIP-848 group) is refused as ILLEGAL_GENERATION, which kafka-python raises as
    CommitFailedError."""
    cluster.create_topic("in")
    assert w.group_metadata_scenario(
        cluster.bootstrap_servers, "in", "app", "tx", group_protocol
    ) == {
        "stale_generation": "CommitFailedError",
        "current_generation": "ok",
        "commit": "ok",
        "committed": (3, 0),
    }
