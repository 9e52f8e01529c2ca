"""Unclean leader elections on real Kafka 4.x brokers: the truncation every scenario relies on.

Scenario (topic RF=2 on brokers A=0 and B=1, min.insync.replicas=1, acks=1):
1. produce a0..a4, replicated to both;
2. stop follower B (it leaves the ISR); produce d0..d2 to A only (offsets 5..7);
3. stop A: the partition has no leader; with ELR (KIP-966, on by default for a new 4.x
   cluster) the ISR becomes empty and A is kept as the eligible leader replica;
4. start B; it is neither in the ISR nor in the ELR, so nothing elects it by itself;
5. ElectLeaders(UNCLEAN) makes B leader under a new epoch; produce b0, b1 (offsets 5, 6);
6. start A: it fetches from B, learns it diverged at offset 5, truncates d0..d2 and copies b0, b1.
Broker 2 stays up throughout, so metadata requests always have a broker to go to.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from epochguard import EpochConsumer, EpochOffset
from epochguard.testing import produce, wait_until
from epochguard.testing.apache_kafka import ApacheKafkaCluster, JavaTruncationProbe

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

A, B = 0, 1
_names = itertools.count()


def new_topic(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def wait_for_high_watermark(cluster: ApacheKafkaCluster, topic: str, offset: int) -> None:
    deadline = time.monotonic() + 20
    while cluster.high_watermark(topic, 0) < offset:
        assert time.monotonic() < deadline, f"high watermark of {topic}-0 stuck below {offset}"
        time.sleep(0.05)


@attrs.frozen
class Truncation:
    topic: str
    first_epoch: int
    unclean_epoch: int


def drive_unclean_election(
    cluster: ApacheKafkaCluster,
    topic: str,
    before_election: Callable[[], None] = lambda: None,
    config: dict[str, str] | None = None,
) -> Truncation:
    """Steps 1-5 of the module docstring; A stays stopped. Asserts what Kafka reports."""
    cluster.create_topic(
        topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1", **(config or {})}
    )
    produce(cluster, topic, [f"a{i}" for i in range(5)])
    cluster.wait_for_partition(
        topic, 0, lambda s: s.leader == A and sorted(s.isr) == [A, B], "A leads, ISR [A, B]"
    )
    # acks=1: B may not have fetched a4 yet; the scenario needs B to hold exactly a0..a4.
    wait_for_high_watermark(cluster, topic, 5)
    first_epoch = cluster.leader_epoch(topic, 0)
    cluster.stop_broker(B)
    cluster.wait_for_isr(topic, 0, [A])
    produce(cluster, topic, ["d0", "d1", "d2"])
    assert cluster.log_end_offset(topic, 0, A) == 8
    assert cluster.high_watermark(topic, 0) == 8  # committed: the ISR is just A
    assert cluster.log_end_offset(topic, 0, B) == 5  # from B's segment files
    before_election()
    cluster.stop_broker(A)
    leaderless = cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
    # KIP-966: with eligible.leader.replicas.version=1 the last ISR member moves to the ELR.
    assert leaderless.isr == () and leaderless.elr == (A,)
    cluster.start_broker(B)
    return Truncation(topic, first_epoch, leaderless.leader_epoch + 1)


def test_unclean_election_truncates_the_old_leader(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("unclean")
    t = drive_unclean_election(cluster, topic)
    assert cluster.leader(topic, 0) is None  # B is not eligible: no automatic election
    cluster.elect_leader(topic, 0, B, unclean=True)
    state = cluster.partition_state(topic, 0)
    assert (state.leader, state.isr, state.elr) == (B, (B,), ())
    assert state.leader_epoch == t.unclean_epoch > t.first_epoch
    produce(cluster, topic, ["b0", "b1"])
    assert cluster.log_end_offset(topic, 0, B) == 7
    assert cluster.log_end_offset(topic, 0, A) == 8  # stopped A still holds d0..d2

    # What a consumer that read d2 under the first epoch is told by the new leader.
    end = cluster.offset_for_leader_epoch(topic, 0, t.first_epoch, state.leader_epoch)
    assert (end.error, end.leader_epoch, end.end_offset) == ("NoError", t.first_epoch, 5)
    # The leaderless epoch between them never had a leader: it maps to the older epoch.
    between = cluster.offset_for_leader_epoch(topic, 0, t.unclean_epoch - 1)
    assert (between.leader_epoch, between.end_offset) == (t.first_epoch, 5)
    current = cluster.offset_for_leader_epoch(topic, 0, t.unclean_epoch)
    assert (current.leader_epoch, current.end_offset) == (t.unclean_epoch, 7)
    future = cluster.offset_for_leader_epoch(topic, 0, t.unclean_epoch + 5)
    assert (future.leader_epoch, future.end_offset) == (-1, -1)
    stale = cluster.offset_for_leader_epoch(topic, 0, t.first_epoch, current_leader_epoch=0)
    assert stale.error == "FencedLeaderEpochError"
    latest = cluster.list_offsets(topic, 0)
    assert (latest.offset, latest.leader_epoch) == (7, t.unclean_epoch)

    cluster.start_broker(A)
    cluster.wait_for_isr(topic, 0, [A, B])
    # A had 8 records; it now has B's 7: it cut its log back to offset 5 and refilled it.
    assert cluster.log_end_offset(topic, 0, A) == 7
    expected_cache = [(t.first_epoch, 0), (t.unclean_epoch, 5)]
    assert cluster.epoch_cache(topic, 0, A) == expected_cache
    assert cluster.epoch_cache(topic, 0, B) == expected_cache
    log_text = cluster.node_log(A).read_text()
    assert f"Truncating partition {topic}-0 with TruncationState(offset=5" in log_text
    # Committed records were lost: Kafka itself warns that it cut below the high watermark.
    assert f"Truncating {topic}-0 to offset 5 below high watermark 8" in log_text
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10000,
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        seen = [(m.offset, m.value.decode()) for _, m in zip(range(7), consumer, strict=False)]
    finally:
        consumer.close()
    assert seen == [(i, f"a{i}") for i in range(5)] + [(5, "b0"), (6, "b1")]


def test_topic_config_lets_the_controller_elect_uncleanly_by_itself(
    cluster: ApacheKafkaCluster,
) -> None:
    topic = new_topic("auto-unclean")
    t = drive_unclean_election(cluster, topic, config={"unclean.leader.election.enable": "true"})
    state = cluster.wait_for_partition(topic, 0, lambda s: s.leader == B, "B elected by itself")
    assert state.leader_epoch == t.unclean_epoch
    cluster.elect_leader(topic, 0, B, unclean=True)  # already done: success, no new epoch
    assert cluster.leader_epoch(topic, 0) == t.unclean_epoch
    assert cluster.log_end_offset(topic, 0, B) == 5


def test_eligible_leader_replica_comes_back_as_a_clean_leader(cluster: ApacheKafkaCluster) -> None:
    """Without an unclean election the ELR member A is re-elected and nothing is lost."""
    topic = new_topic("elr")
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    produce(cluster, topic, ["a0", "a1"])
    cluster.wait_for_isr(topic, 0, [A, B])
    wait_for_high_watermark(cluster, topic, 2)
    cluster.stop_broker(B)
    produce(cluster, topic, ["d0"])
    cluster.stop_broker(A)
    cluster.wait_for_partition(topic, 0, lambda s: s.elr == (A,), "A in the ELR")
    cluster.start_broker(A)
    state = cluster.wait_for_partition(topic, 0, lambda s: s.leader == A, "A leads again")
    assert state.isr == (A,) and state.elr == ()
    assert cluster.log_end_offset(topic, 0, A) == 3
    cluster.start_broker(B)
    cluster.wait_for_isr(topic, 0, [A, B])
    assert cluster.log_end_offset(topic, 0, B) == 3


def _consume_past_the_divergence(cluster: ApacheKafkaCluster, probe: JavaTruncationProbe) -> None:
    events = probe.poll(8, 20000)
    seen = [(e["offset"], e["leader_epoch"], e["value"]) for e in events if e["event"] == "record"]
    assert seen == [(i, 0, f"a{i}") for i in range(5)] + [(5 + i, 0, f"d{i}") for i in range(3)]


def test_java_consumer_raises_log_truncation_exception(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("java-none")
    probes: list[JavaTruncationProbe] = []

    def read_divergent_records() -> None:
        probe = cluster.java_probe(topic, 0, "none")
        probes.append(probe)
        probe.seek(0)
        _consume_past_the_divergence(cluster, probe)

    t = drive_unclean_election(cluster, topic, before_election=read_divergent_records)
    (probe,) = probes
    with probe:
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        events = probe.poll(5, 20000)
        truncation = [e for e in events if e["event"] == "truncation"]
        assert truncation, events
        assert truncation[0]["divergent_offsets"] == {
            f"{topic}-0": {"offset": 5, "leader_epoch": t.first_epoch}
        }
        assert truncation[0]["fetch_offsets"] == {f"{topic}-0": 8}
        assert not [e for e in events if e["event"] == "record"]
        # The partition stays stopped until the application seeks.
        again = probe.poll(1, 2000)
        assert [e["event"] for e in again] == ["polled"] and again[-1]["count"] == 0
        probe.seek(5, t.unclean_epoch)
        after = probe.poll(2, 20000)
        values = [(e["offset"], e["value"]) for e in after if e["event"] == "record"]
        assert values == [(5, "b0"), (6, "b1")]


def test_java_consumer_with_a_reset_policy_rewinds_silently(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("java-earliest")
    probes: list[JavaTruncationProbe] = []

    def read_divergent_records() -> None:
        probe = cluster.java_probe(topic, 0, "earliest")
        probes.append(probe)
        _consume_past_the_divergence(cluster, probe)

    t = drive_unclean_election(cluster, topic, before_election=read_divergent_records)
    (probe,) = probes
    with probe:
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        events = probe.poll(2, 20000)
        kinds = [e["event"] for e in events]
        assert "truncation" not in kinds
        assert {"event": "position_jump", "from": 8, "to": 5} in events
        records = [(e["offset"], e["leader_epoch"], e["value"]) for e in events if "value" in e]
        assert records == [(5, t.unclean_epoch, "b0"), (6, t.unclean_epoch, "b1")]
        assert "Truncation detected for partition" in probe.log_text()


@pytest.mark.parametrize("read_on_b", [6, 8])
def test_a_divergence_below_the_log_start_counts_only_what_the_log_still_holds(
    cluster: ApacheKafkaCluster, read_on_b: int
) -> None:
    """Issue 11 (chaos seeds 1072, 1116) on real Kafka.

    A alone writes a0..a7 and DeleteRecords moves its log start to 6: truncateFromStart
    leaves the epoch cache starting at (first epoch, 6). B, empty, is elected uncleanly and
    the consumer reads B's records 0..read_on_b-1. Then A is elected uncleanly again. For the
    epoch the consumer read in, A answers (first epoch, 8): Java's rule (8 >= position) calls
    the position valid. The consumer's own reads show everything from 0 diverged, but A no
    longer holds anything below 6, so only [6, position) can be reported lost."""
    topic = new_topic("retention-unclean")
    tp = TopicPartition(topic, 0)
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    cluster.stop_broker(B)
    cluster.wait_for_isr(topic, 0, [A])
    produce(cluster, topic, [f"a{i}" for i in range(8)])
    first_epoch = cluster.leader_epoch(topic, 0)
    cluster.delete_records(topic, 0, 6)
    wait_until(  # the checkpoint file is written asynchronously
        "A's epoch cache trimmed to the log start",
        lambda: cluster.epoch_cache(topic, 0, A) == [(first_epoch, 6)],
    )
    cluster.stop_broker(A)
    cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
    cluster.start_broker(B)
    cluster.elect_leader(topic, 0, B, unclean=True)
    b_epoch = cluster.leader_epoch(topic, 0)
    produce(cluster, topic, [f"b{i}" for i in range(read_on_b)])

    reports: list[Any] = []
    consumer = EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        on_truncation="rewind",
        on_truncation_report=reports.append,
        metadata_max_age_ms=500,
    )
    held: dict[int, str] = {}

    def poll() -> None:
        for records in consumer.poll(timeout_ms=200).values():
            for r in records:
                held[r.offset] = r.value.decode()

    try:
        consumer.assign([tp])
        wait_until("B's records read", lambda: poll() or len(held) == read_on_b)
        assert held == {i: f"b{i}" for i in range(read_on_b)}

        cluster.stop_broker(B)
        cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
        cluster.start_broker(A)
        cluster.elect_leader(topic, 0, A, unclean=True)
        a_epoch = cluster.leader_epoch(topic, 0)
        end = cluster.offset_for_leader_epoch(topic, 0, b_epoch, a_epoch)
        assert (end.error, end.leader_epoch, end.end_offset) == ("NoError", first_epoch, 8)
        earliest = cluster.list_offsets(topic, 0, timestamp=-2)
        assert (earliest.offset, earliest.leader_epoch) == (6, first_epoch)

        wait_until("A's records read", lambda: poll() or held.get(7) == "a7")
        if read_on_b == 6:
            assert reports == []  # all we read lies below A's log start
        else:
            (report,) = reports
            assert report.divergence == EpochOffset(6, first_epoch)
            assert (report.lost_from, report.lost_to, report.lost_count) == (6, 8, 2)
        assert {o: v for o, v in held.items() if o >= 6} == {6: "a6", 7: "a7"}
    finally:
        consumer.close()


def test_a_follower_truncated_to_a_mid_batch_log_start_fails_its_partition(
    cluster: ApacheKafkaCluster,
) -> None:
    """Issue 11 (chaos seed 1110, which crashed the EmbeddedCluster). A holds x then a0..a6
    in the first epoch; B, with only x, is elected uncleanly and writes one batch of six
    records (offsets 1..6); DeleteRecords moves B's log start to 4, inside that batch, and
    its epoch cache to [(B's epoch, 4)]. A comes back: B answers (first epoch, 4) for A's
    epoch, A truncates to 4 keeping x, a0..a2 below it, then cannot append B's batch (base
    1 < its log end 4, on a log that is not empty): UnexpectedAppendOffsetException, and the
    fetcher marks the partition failed. tests/embedded/test_state.py models exactly this."""
    topic = new_topic("mid-batch")
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    produce(cluster, topic, ["x"])
    wait_for_high_watermark(cluster, topic, 1)
    first_epoch = cluster.leader_epoch(topic, 0)
    cluster.stop_broker(B)
    cluster.wait_for_isr(topic, 0, [A])
    produce(cluster, topic, [f"a{i}" for i in range(7)])  # 1..7 on A only
    cluster.stop_broker(A)
    cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
    cluster.start_broker(B)
    cluster.elect_leader(topic, 0, B, unclean=True)
    b_epoch = cluster.leader_epoch(topic, 0)
    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap_servers, acks=1, linger_ms=2000, batch_size=1 << 20
    )
    try:
        futures = [producer.send(topic, b"b%d" % i, partition=0) for i in range(6)]
        producer.flush(timeout=15)
        assert [f.get(timeout=15).offset for f in futures] == list(range(1, 7))
    finally:
        producer.close(timeout=5)
    cluster.delete_records(topic, 0, 4)
    wait_until(
        "B's epoch cache trimmed to the log start",
        lambda: cluster.epoch_cache(topic, 0, B) == [(b_epoch, 4)],
    )
    assert cluster.offset_for_leader_epoch(topic, 0, first_epoch, b_epoch).end_offset == 4

    cluster.start_broker(A)
    wait_until(
        "A's fetcher gives up on the partition",
        lambda: f"Partition {topic}-0 marked as failed" in cluster.node_log(A).read_text(),
    )
    assert "UnexpectedAppendOffsetException" in cluster.node_log(A).read_text()
    assert cluster.log_end_offset(topic, 0, A) == 4
    produce(cluster, topic, ["b6"])  # B goes on without A
    assert cluster.high_watermark(topic, 0) == 8
    assert cluster.isr(topic, 0) == [B] and cluster.log_end_offset(topic, 0, A) == 4


def test_a_clean_leader_change_reaches_the_consumer_through_the_fetch_hint(
    cluster: ApacheKafkaCluster,
) -> None:
    """KIP-951 on Kafka 4.3.1: after a preferred election EpochConsumer (Fetch v17, metadata
    not due for minutes) reads on from the new leader with nothing reported. Most runs move
    on the refused fetch's leader hint; some do not, for a reason not yet found, so the hint
    itself is asserted on the EmbeddedCluster (tests/consumer/test_leader_hints.py) and here
    only counted in the failure message."""
    topic = new_topic("hint")
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    produce(cluster, topic, [f"a{i}" for i in range(5)])
    cluster.wait_for_isr(topic, 0, [A, B])
    tp = TopicPartition(topic, 0)
    with EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=600_000,
        fetch_max_wait_ms=100,
        on_truncation="raise",
    ) as consumer:
        consumer.assign([tp])
        got = _read(consumer, 5)
        assert [r.value for r in got] == [b"a%d" % i for i in range(5)]
        cluster.elect_leader(topic, 0, B)
        produce(cluster, topic, [f"b{i}" for i in range(3)])
        got = _read(consumer, 3)
        assert [r.value for r in got] == [b"b0", b"b1", b"b2"]
        metrics = consumer.metrics(raw=True)
        assert metrics["leader_hints_applied"] <= 1, metrics
        assert consumer.truncation_reports() == [], metrics
        assert consumer.position_with_epoch(tp).offset == 8, metrics


def _read(consumer: EpochConsumer, n: int, timeout: float = 30.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got += records
    return got


def test_a_commit_marker_lost_to_an_unclean_election_is_reported_as_hanging(
    cluster: ApacheKafkaCluster,
) -> None:
    """A COMMIT marker only A had: B, elected uncleanly, keeps the transaction open forever
    (high watermark 2, last stable offset 0). A read_committed EpochConsumer names it
    (DescribeProducers) once the LSO stood longer than transaction_max_timeout_ms, and
    delivers the record after it once an operator aborts it (KIP-664)."""
    from kafka.admin import AbortTransactionSpec, KafkaAdminClient

    from epochguard import HangingTransactionError

    topic = new_topic("hanging")
    tp = TopicPartition(topic, 0)
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    cluster.wait_for_partition(
        topic, 0, lambda s: s.leader == A and sorted(s.isr) == [A, B], "A leads, ISR [A, B]"
    )
    # The third broker coordinates the transaction: A and B stop below, and kafka-python's
    # commit_transaction() waits without a timeout for a coordinator it may not find.
    (spare,) = set(cluster.broker_ids) - {A, B}
    p = KafkaProducer(
        bootstrap_servers=cluster.all_bootstrap_servers,
        transactional_id=cluster.transactional_id_coordinated_by(spare, f"tx-{topic}"),
    )
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"committed-then-lost", partition=0)
    p.flush()
    wait_for_high_watermark(cluster, topic, 1)  # B holds the record
    cluster.stop_broker(B)
    cluster.wait_for_isr(topic, 0, [A])
    p.commit_transaction()
    p.close()
    wait_until("the COMMIT marker on A", lambda: cluster.log_end_offset(topic, 0, A) == 2)
    cluster.stop_broker(A)
    cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
    cluster.start_broker(B)
    cluster.elect_leader(topic, 0, B, unclean=True)
    cluster.start_broker(A)
    cluster.wait_for_isr(topic, 0, [A, B])
    assert cluster.log_end_offset(topic, 0, A) == 1  # the marker is gone
    produce(cluster, topic, ["plain"])
    wait_for_high_watermark(cluster, topic, 2)

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        (state,) = admin.describe_producers([tp])[tp].active_producers
        assert state.current_transaction_start_offset == 0
        with EpochConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            transaction_max_timeout_ms=1000,  # the brokers' is 900000: pretend it is 1 s
        ) as consumer:
            consumer.assign([tp])
            deadline = time.monotonic() + 30
            with pytest.raises(HangingTransactionError) as raised:
                while time.monotonic() < deadline:
                    assert consumer.poll(timeout_ms=100) == {}
            found = raised.value.transaction
            assert (found.tp, found.first_offset, found.high_watermark) == (tp, 0, 2)
            assert (found.producer_id, found.producer_epoch) == (
                state.producer_id,
                state.producer_epoch,
            )
            print(f"reported: {found.describe()}")
            admin.abort_transaction(
                AbortTransactionSpec(
                    tp, state.producer_id, state.producer_epoch, max(0, state.coordinator_epoch)
                )
            )
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while not got and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=100).values():
                    got += records
            assert [(r.offset, r.value) for r in got] == [(1, b"plain")]
    finally:
        admin.close()
