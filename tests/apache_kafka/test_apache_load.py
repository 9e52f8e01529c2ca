"""One EpochConsumer on 1,000 partitions of real Kafka through unclean elections on a subset.

Replicas are pinned so that only the subset can be truncated: the subset's partitions live on
brokers A and B (A leads), every other partition is led by broker C, which stays up. The
usual staging (test_apache_unclean.py) then runs once for the whole subset: stop B, doomed
records on A, the consumer reads them, stop A, start B, elect B uncleanly on each subset
partition, fresh records, start A. The consumer (policy rewind, with fetch sessions) must
report every truncation at its divergence point and end up holding exactly the final log of
all 1,000 partitions (``epochguard.testing.load.Ledger``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from kafka import KafkaProducer
from kafka.structs import TopicPartition

from epochguard import EpochConsumer
from epochguard.testing.apache_kafka import ApacheKafkaCluster
from epochguard.testing.load import Election, Ledger, LedgerPoller

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

PARTITIONS = 1000
SUBSET = 6
A, B, C = 0, 1, 2
DOOMED, FRESH = 3, 5


def _send(producer: KafkaProducer, topic: str, values: dict[int, list[bytes]]) -> None:
    futures = [producer.send(topic, v, partition=p) for p, vals in values.items() for v in vals]
    producer.flush()
    for f in futures:
        f.get(timeout=30)


def _wait(poller: LedgerPoller, done: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert poller.error is None, poller.error
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout:.0f}s"
        time.sleep(0.05)


def test_one_consumer_on_1000_partitions_through_unclean_elections(
    cluster: ApacheKafkaCluster,
) -> None:
    topic = f"load1k-{os.getpid()}"
    subset = list(range(SUBSET))
    assignments = {p: [A, B] if p < SUBSET else [C, A if p % 2 else B] for p in range(PARTITIONS)}
    cluster.create_topic(topic, config={"min.insync.replicas": "1"}, assignments=assignments)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    expected: dict[TopicPartition, list[bytes]] = {tp: [] for tp in tps}
    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap_servers,
        acks=1,
        enable_idempotence=False,
        retries=0,
        linger_ms=5,
    )
    ledger = Ledger()
    consumer = EpochConsumer(
        bootstrap_servers=cluster.all_bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        on_truncation="rewind",
        on_truncation_report=ledger.on_report,
        fetch_max_wait_ms=100,
        retry_backoff_ms=50,
        reconnect_backoff_ms=50,
        reconnect_backoff_max_ms=500,
        request_timeout_ms=10000,
    )
    poller = LedgerPoller(consumer, ledger)
    try:
        first = {p: [b"a-%d" % p] for p in range(PARTITIONS)}
        _send(producer, topic, first)
        for p, vals in first.items():
            expected[TopicPartition(topic, p)] += vals
        for p in subset:
            cluster.wait_for_isr(topic, p, [A, B])
        consumer.assign(tps)
        poller.start()

        def caught_up(ends: dict[TopicPartition, int]) -> Callable[[], bool]:
            return lambda: all(ledger.position(tp) >= n for tp, n in ends.items())

        _wait(poller, caught_up({tp: 1 for tp in tps}), "initial records read")
        m = consumer.metrics(raw=True)
        assert m is not None and m["incremental_fetch_requests"] > 0

        cluster.stop_broker(B)
        for p in subset:
            cluster.wait_for_isr(topic, p, [A])
        _send(
            producer, topic, {p: [b"doomed-%d-%d" % (p, i) for i in range(DOOMED)] for p in subset}
        )
        _wait(
            poller,
            caught_up({TopicPartition(topic, p): 1 + DOOMED for p in subset}),
            "doomed records read",
        )
        cluster.stop_broker(A)
        for p in subset:
            cluster.wait_for_partition(topic, p, lambda s: s.leader < 0, "no leader")
        cluster.start_broker(B)
        elections = []
        for p in subset:
            cluster.elect_leader(topic, p, B, unclean=True)
            elections.append(Election(TopicPartition(topic, p), time.monotonic(), 1, 1 + DOOMED))
        fresh = {p: [b"fresh-%d-%d" % (p, i) for i in range(FRESH)] for p in subset}
        _send(producer, topic, fresh)
        for p, vals in fresh.items():
            expected[TopicPartition(topic, p)] += vals
        _wait(poller, lambda: len(ledger.reports) >= SUBSET, "every truncation reported")
        cluster.start_broker(A)
        _wait(
            poller,
            caught_up({tp: len(v) for tp, v in expected.items()}),
            "caught up with the final log",
        )
        for p in subset:
            assert cluster.log_end_offset(topic, p) == 1 + FRESH
        with ledger.lock:
            assert ledger.violations == []
            assert ledger.missed(elections) == []
            assert sorted((tp.partition, lost) for tp, _d, lost, _at in ledger.reports) == [
                (p, DOOMED) for p in subset
            ]
            assert ledger.mismatches(expected) == []
    finally:
        poller.halt()
        consumer.close()
        producer.close(timeout=5)
    assert poller.error is None, poller.error
