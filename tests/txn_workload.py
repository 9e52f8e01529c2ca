"""One transactional workload and what a cluster answers after it, for any cluster.

The EmbeddedCluster's transaction tests run it alone; the differential test runs it against
the EmbeddedCluster and real Kafka and compares the two :class:`Observation` values.

The workload (topic with two partitions, ``group`` holding offsets of the topic itself):

1. commit: ``c1``, ``c2`` to partition 0, ``c3`` to partition 1, the group's offset of
   partition 0 at 5 (leader epoch 0);
2. abort: ``a1``, ``a2`` to partition 0 (sent before the abort), the group's offset of
   partition 1 at 9;
3. commit: ``c4`` to partition 1;
4. a second transactional id leaves ``o1`` in partition 0 in an open transaction.

So partition 0 is c1@0 c2@1 COMMIT@2 a1@3 a2@4 ABORT@5 o1@6 (last stable offset 6, high
watermark 7) and partition 1 is c3@0 COMMIT@1 c4@2 COMMIT@3.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import Producer as CkProducer
from confluent_kafka import TopicPartition as CkTopicPartition
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import AbortTransactionSpec
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.structs import OffsetAndMetadata

from epochguard.consumer import EpochConsumer

from .embedded.wire import Wire

PARTITIONS = (0, 1)
TIMEOUT_MS = 60_000


@attrs.frozen
class Observation:
    high_watermarks: dict[int, int]
    last_stable_offsets: dict[int, int]
    #: (offset, value) per partition, as each reader sees them.
    read_uncommitted: dict[int, list[tuple[int, bytes]]]
    kafka_python_committed: dict[int, list[tuple[int, bytes]]]
    confluent_committed: dict[int, list[tuple[int, bytes]]]
    epoch_consumer_committed: dict[int, list[tuple[int, bytes]]]
    #: Raw read_committed Fetch from offset 0: (HW, LSO, [(transactional id, first offset)]).
    fetch_answers: dict[int, tuple[int, int, list[tuple[str, int]]]]
    #: (offset, leader epoch) per partition.
    group_offsets: dict[int, tuple[int, int]]
    #: DescribeTransactions: id -> (state, epoch, partitions, timeout).
    transactions: dict[str, tuple[str, int, list[int], int]]
    #: ListTransactions filtered on Ongoing.
    ongoing: list[str]
    #: DescribeProducers: partition -> [(transactional id, epoch, last sequence, txn start)].
    producers: dict[int, list[tuple[str, int, int, int]]]


def kafka_python_workload(bootstrap: str, topic: str, group: str, ids: tuple[str, str]) -> Any:
    """Run the workload with kafka-python; returns the producer left with an open txn."""
    p = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=ids[0], transaction_timeout_ms=TIMEOUT_MS
    )
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"c1", partition=0)
    p.send(topic, b"c2", partition=0)
    p.send(topic, b"c3", partition=1)
    p.send_offsets_to_transaction({TopicPartition(topic, 0): OffsetAndMetadata(5, "", 0)}, group)
    p.commit_transaction()
    p.begin_transaction()
    p.send(topic, b"a1", partition=0)
    p.send(topic, b"a2", partition=0)
    p.send_offsets_to_transaction({TopicPartition(topic, 1): OffsetAndMetadata(9, "", 0)}, group)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    p.send(topic, b"c4", partition=1)
    p.commit_transaction()
    p.close()
    left_open = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=ids[1], transaction_timeout_ms=TIMEOUT_MS
    )
    left_open.init_transactions()
    left_open.begin_transaction()
    left_open.send(topic, b"o1", partition=0)
    left_open.flush()
    return left_open


def confluent_workload(bootstrap: str, topic: str, group: str, ids: tuple[str, str]) -> Any:
    """The same workload with librdkafka; the group metadata comes from a consumer."""
    common = {"bootstrap.servers": bootstrap, "transaction.timeout.ms": TIMEOUT_MS, "log_level": 0}
    consumer = CkConsumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    metadata = consumer.consumer_group_metadata()
    p = CkProducer({**common, "transactional.id": ids[0]})
    p.init_transactions(20)
    p.begin_transaction()
    p.produce(topic, b"c1", partition=0)
    p.produce(topic, b"c2", partition=0)
    p.produce(topic, b"c3", partition=1)
    p.send_offsets_to_transaction([CkTopicPartition(topic, 0, 5, leader_epoch=0)], metadata, 20)
    p.commit_transaction(20)
    p.begin_transaction()
    p.produce(topic, b"a1", partition=0)
    p.produce(topic, b"a2", partition=0)
    p.send_offsets_to_transaction([CkTopicPartition(topic, 1, 9, leader_epoch=0)], metadata, 20)
    assert p.flush(20) == 0
    p.abort_transaction(20)
    p.begin_transaction()
    p.produce(topic, b"c4", partition=1)
    p.commit_transaction(20)
    consumer.close()
    left_open = CkProducer({**common, "transactional.id": ids[1]})
    left_open.init_transactions(20)
    left_open.begin_transaction()
    left_open.produce(topic, b"o1", partition=0)
    assert left_open.flush(20) == 0
    return left_open


def _read_kafka_python(
    bootstrap: str, topic: str, isolation: str, ends: dict[int, int]
) -> dict[int, list[tuple[int, bytes]]]:
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in PARTITIONS}
    tps = [TopicPartition(topic, p) for p in PARTITIONS]
    try:
        c.assign(tps)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if all(c.position(tp) >= ends[tp.partition] for tp in tps):
                break
            for tp, recs in c.poll(timeout_ms=100).items():
                got[tp.partition] += [(r.offset, r.value) for r in recs]
    finally:
        c.close()
    return got


def _read_confluent(
    bootstrap: str, topic: str, expected: int
) -> dict[int, list[tuple[int, bytes]]]:
    c = CkConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "txn-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in PARTITIONS}
    try:
        c.assign([CkTopicPartition(topic, p, 0) for p in PARTITIONS])
        deadline = time.monotonic() + 15
        while sum(map(len, got.values())) < expected and time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is None or m.error():
                continue
            got[m.partition()].append((m.offset(), m.value()))
        # Anything past the expected count (an aborted record let through) shows up here.
        extra_deadline = time.monotonic() + 0.5
        while time.monotonic() < extra_deadline:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return got


def _read_epoch_consumer(
    bootstrap: str, topic: str, ends: dict[int, int]
) -> dict[int, list[tuple[int, bytes]]]:
    c = EpochConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in PARTITIONS}
    tps = [TopicPartition(topic, p) for p in PARTITIONS]
    try:
        c.assign(tps)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if all(c.position(tp) >= ends[tp.partition] for tp in tps):
                break
            for tp, recs in c.poll(timeout_ms=100).items():
                got[tp.partition] += [(r.offset, r.value) for r in recs]
    finally:
        c.close()
    return got


def _fetch_read_committed(
    address: str, topic: str, partition: int, names: dict[int, str]
) -> tuple[int, int, list[tuple[str, int]]]:
    v = 11
    FT = FetchRequest.FetchTopic
    request = FetchRequest(
        version=v,
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1_000_000,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=[
            FT(
                version=v,
                topic=topic,
                partitions=[
                    FT.FetchPartition(
                        version=v,
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        log_start_offset=-1,
                        partition_max_bytes=1_000_000,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    wire = Wire(address)
    try:
        answer = wire.call(request, FetchResponse).responses[0].partitions[0]
    finally:
        wire.close()
    assert answer.error_code == 0, answer.error_code
    aborted = [
        (names.get(a.producer_id, str(a.producer_id)), a.first_offset)
        for a in answer.aborted_transactions or []
    ]
    return answer.high_watermark, answer.last_stable_offset, aborted


def observe(bootstrap: str, topic: str, group: str, ids: tuple[str, str]) -> Observation:
    tps = [TopicPartition(topic, p) for p in PARTITIONS]
    plain = KafkaConsumer(bootstrap_servers=bootstrap)
    committed = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        hws = {tp.partition: o for tp, o in plain.end_offsets(tps).items()}
        lsos = {tp.partition: o for tp, o in committed.end_offsets(tps).items()}
    finally:
        plain.close()
        committed.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_transactions(list(ids))
        names = {d.producer_id: txn_id for txn_id, d in described.items()}
        transactions = {
            txn_id: (
                d.state.value,
                d.producer_epoch,
                sorted(tp.partition for tp in d.topic_partitions),
                d.transaction_timeout_ms,
            )
            for txn_id, d in described.items()
        }
        listed = admin.list_transactions(state_filters=["Ongoing"])
        ongoing = sorted(
            t.transactional_id for ts in listed.values() for t in ts if t.transactional_id in ids
        )
        offsets = admin.list_group_offsets({group: None})[group]
        group_offsets = {
            tp.partition: (om.offset, om.leader_epoch)
            for tp, om in offsets.items()
            if tp.topic == topic
        }
        producers_by_tp = admin.describe_producers(tps)
        producers = {
            tp.partition: sorted(
                (
                    names.get(s.producer_id, str(s.producer_id)),
                    s.producer_epoch,
                    s.last_sequence,
                    s.current_transaction_start_offset,
                )
                for s in state.active_producers
            )
            for tp, state in producers_by_tp.items()
        }
        topic_info = admin.describe_topics([topic])[0]
        leaders = {p["partition_index"]: p["leader_id"] for p in topic_info["partitions"]}
        brokers = {
            b["broker_id"]: f"{b['host']}:{b['port']}" for b in admin.describe_cluster()["brokers"]
        }
    finally:
        admin.close()
    fetch_answers = {
        p: _fetch_read_committed(brokers[leaders[p]], topic, p, names) for p in PARTITIONS
    }
    uncommitted = _read_kafka_python(bootstrap, topic, "read_uncommitted", hws)
    kp_committed = _read_kafka_python(bootstrap, topic, "read_committed", lsos)
    n_committed = sum(map(len, kp_committed.values()))
    return Observation(
        high_watermarks=hws,
        last_stable_offsets=lsos,
        read_uncommitted=uncommitted,
        kafka_python_committed=kp_committed,
        confluent_committed=_read_confluent(bootstrap, topic, n_committed),
        epoch_consumer_committed=_read_epoch_consumer(bootstrap, topic, lsos),
        fetch_answers=fetch_answers,
        group_offsets=group_offsets,
        transactions=transactions,
        ongoing=ongoing,
        producers=producers,
    )


def abort_with_admin(
    bootstrap: str, topic: str, partition: int, txn_id: str, ids: tuple[str, ...]
) -> tuple[int, int, list[tuple[str, int]]]:
    """Abort ``txn_id``'s open transaction on one partition as ``kafka-transactions.sh abort``
    does (WriteTxnMarkers to the leader, KIP-664); the raw read_committed Fetch after it
    (producer ids named by their transactional id among ``ids``)."""
    tp = TopicPartition(topic, partition)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_transactions(list(ids))
        names = {d.producer_id: name for name, d in described.items()}
        txn = described[txn_id]
        (state,) = [
            s
            for s in admin.describe_producers([tp])[tp].active_producers
            if s.producer_id == txn.producer_id
        ]
        admin.abort_transaction(
            AbortTransactionSpec(
                topic_partition=tp,
                producer_id=state.producer_id,
                producer_epoch=state.producer_epoch,
                coordinator_epoch=max(0, state.coordinator_epoch),
            )
        )
        topic_info = admin.describe_topics([topic])[0]
        leader = next(
            p["leader_id"] for p in topic_info["partitions"] if p["partition_index"] == partition
        )
        address = next(
            f"{b['host']}:{b['port']}"
            for b in admin.describe_cluster()["brokers"]
            if b["broker_id"] == leader
        )
    finally:
        admin.close()
    return _fetch_read_committed(address, topic, partition, names)


#: What the workload must leave on any cluster.
EXPECTED_COMMITTED = {0: [(0, b"c1"), (1, b"c2")], 1: [(0, b"c3"), (2, b"c4")]}
EXPECTED_UNCOMMITTED = {
    0: [(0, b"c1"), (1, b"c2"), (3, b"a1"), (4, b"a2"), (6, b"o1")],
    1: [(0, b"c3"), (2, b"c4")],
}


def _outcome(call: Any) -> str:
    """``ok`` or the name of the exception ``call()`` raised."""
    try:
        call()
    except Exception as e:  # the exception's type is what is compared
        return type(e).__name__
    return "ok"


def fencing_scenario(bootstrap: str, topic: str, group: str, txn_id: str) -> dict[str, Any]:
    """Zombie fencing and KIP-447 fencing with kafka-python; what each step answered.

    A producer whose transactional id is taken over mid-transaction is fenced (its open
    transaction aborted, the newer instance two epochs on); a producer committing offsets with
    the group metadata of a member that has left the group is refused.
    """
    out: dict[str, Any] = {}
    zombie = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send(topic, b"zombie", partition=0)
    zombie.flush()
    fresh = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    fresh.init_transactions()
    out["zombie_commit"] = _outcome(zombie.commit_transaction)
    zombie.close(timeout=1)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        out["epoch_after_takeover"] = admin.describe_transactions([txn_id])[txn_id].producer_epoch
    finally:
        admin.close()
    member = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    deadline = time.monotonic() + 20
    # Topic known before the join: see tests/embedded/test_transactions.py::_joined_member.
    while not member.partitions_for_topic(topic) and time.monotonic() < deadline:
        time.sleep(0.05)
    member.subscribe([topic])
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(timeout_ms=100)
    # Not compared: kafka-python rejoins once if it joined before it knew the topic (timing).
    stale = member.group_metadata()
    member.close()  # leaves the group: its member id is no longer known
    fresh.begin_transaction()
    fresh.send(topic, b"fresh", partition=0)
    out["stale_metadata_offsets"] = _outcome(
        lambda: fresh.send_offsets_to_transaction(
            {TopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)}, stale
        )
    )
    out["commit_after_stale"] = _outcome(fresh.commit_transaction)
    fresh.close(timeout=1)
    reader = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )
    reader.assign([TopicPartition(topic, 0)])
    out["read_committed"] = [(m.offset, m.value) for m in reader]
    reader.close()
    return out


def group_metadata_scenario(
    bootstrap: str, topic: str, group: str, txn_id: str, group_protocol: str
) -> dict[str, Any]:
    """EpochConsumer's position with epoch and group metadata in kafka-python's transaction:
    what a stale generation (member epoch for KIP-848) answers, and what a current one
    commits."""
    out: dict[str, Any] = {}
    produce_plain = KafkaProducer(bootstrap_servers=bootstrap)
    for v in (b"a", b"b", b"c"):
        produce_plain.send(topic, v, partition=0)
    produce_plain.flush()
    produce_plain.close()
    consumer = EpochConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        group_protocol=group_protocol,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    tp = TopicPartition(topic, 0)
    try:
        seen: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(seen) < 3 and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=100).values():
                seen += [r.value for r in recs]
        position = consumer.position_with_epoch(tp)
        metadata = consumer.group_metadata()
        p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"x", partition=0)
        stale = metadata._replace(generation_id=metadata.generation_id + 1)
        out["stale_generation"] = _outcome(
            lambda: p.send_offsets_to_transaction({tp: OffsetAndMetadata(1, "", -1)}, stale)
        )
        p.close(timeout=1)
        p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"x", partition=0)
        out["current_generation"] = _outcome(
            lambda: p.send_offsets_to_transaction(
                {tp: OffsetAndMetadata(position.offset, "", position.leader_epoch)}, metadata
            )
        )
        out["commit"] = _outcome(p.commit_transaction)
        p.close()
    finally:
        consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        committed = admin.list_group_offsets({group: None})[group].get(tp)
    finally:
        admin.close()
    out["committed"] = None if committed is None else (committed.offset, committed.leader_epoch)
    return out
