"""Scale: one EpochConsumer on 1,000 partitions and a group of 8 on 256, through unclean
elections on a subset (``epochguard.testing.load``): every truncation reported at its exact
divergence point, and what the application holds at the end (reports applied) equals the
final log record for record. Kept small enough for ``make test``; the full-size runs with
throughput, detection latency and RSS are ``benchmarks/load.py`` and ``make soak``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.testing import EmbeddedCluster
from epochguard.testing.load import (
    Ledger,
    LedgerPoller,
    final_logs,
    pick_unclean_subset,
    produce_round,
    unclean_round,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _config(cluster: EmbeddedCluster, ledger: Ledger, **kw: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "on_truncation": "rewind",
        "on_truncation_report": ledger.on_report,
        "fetch_max_wait_ms": 100,
        "metadata_max_age_ms": 2000,
        "retry_backoff_ms": 20,
        "request_timeout_ms": 10000,
    }
    cfg.update(kw)
    return cfg


def _drive(
    pollers: list[LedgerPoller], ledger: Ledger, done: Callable[[], bool], what: str
) -> None:
    deadline = time.monotonic() + 90
    while not done():
        errors = [p.error for p in pollers if p.error is not None]
        assert not errors, errors
        assert time.monotonic() < deadline, f"{what}: not reached ({len(ledger.reports)} reports)"
        time.sleep(0.02)


def _caught_up(ledger: Ledger, topic: str, ends: Mapping[int, int]) -> Callable[[], bool]:
    return lambda: all(ledger.position(TopicPartition(topic, p)) >= e for p, e in ends.items())


def _run(
    cluster: EmbeddedCluster,
    consumers: list[LedgerPoller],
    ledger: Ledger,
    topic: str,
    partitions: int,
    subset_size: int,
) -> None:
    ends = produce_round(cluster, topic, range(partitions), 2, "a")
    _drive(consumers, ledger, _caught_up(ledger, topic, ends), "initial records read")
    elections = []
    for round_no, follower in enumerate(cluster.broker_ids[:2]):
        subset = pick_unclean_subset(
            cluster, topic, partitions, follower, subset_size, start=round_no * 97
        )
        assert len(subset) == subset_size

        def consumed(ends: Mapping[int, int]) -> None:
            _drive(consumers, ledger, _caught_up(ledger, topic, ends), "doomed records read")

        elections += unclean_round(cluster, topic, subset, follower, consumed, tag=f"r{round_no}")
        produce_round(cluster, topic, range(0, partitions, 7), 1, f"b{round_no}")
        expected = len(elections)
        _drive(
            consumers,
            ledger,
            lambda expected=expected: len(ledger.reports) >= expected,
            "every truncation reported",
        )
    final = final_logs(cluster, topic, range(partitions))
    _drive(
        consumers,
        ledger,
        _caught_up(ledger, topic, {tp.partition: len(v) for tp, v in final.items()}),
        "caught up with the final log",
    )
    assert ledger.violations == []
    assert ledger.missed(elections) == []
    assert len(ledger.reports) == len(elections)  # nothing reported that did not happen
    assert {(tp, lost) for tp, _d, lost, _at in ledger.reports} == {
        (e.tp, e.consumed_to - e.divergence) for e in elections
    }
    assert ledger.mismatches(final) == []


def _stop(pollers: list[LedgerPoller]) -> None:
    for p in pollers:
        p.stop.set()
    for p in pollers:
        p.halt()
        p.consumer.close()
    errors = [p.error for p in pollers if p.error is not None]
    assert not errors, errors


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=3) as c:
        yield c


def test_one_consumer_on_1000_partitions_through_unclean_elections(
    cluster: EmbeddedCluster,
) -> None:
    topic, partitions = "load1k", 1000
    cluster.create_topic(topic, partitions=partitions, replication_factor=2)
    ledger = Ledger()
    consumer = EpochConsumer(**_config(cluster, ledger))
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    poller = LedgerPoller(consumer, ledger)
    poller.start()
    try:
        _run(cluster, [poller], ledger, topic, partitions, subset_size=20)
    finally:
        _stop([poller])
    m = consumer.metrics(raw=True)
    assert m is not None and m["incremental_fetch_requests"] > 0


def test_group_of_8_on_256_partitions_through_unclean_elections(
    cluster: EmbeddedCluster,
) -> None:
    topic, partitions = "load256", 256
    cluster.create_topic(topic, partitions=partitions, replication_factor=2)
    ledger = Ledger()
    consumers = [
        EpochConsumer(
            **_config(
                cluster,
                ledger,
                group_id="load-group",
                session_timeout_ms=30000,
                heartbeat_interval_ms=500,
                max_poll_interval_ms=120000,
            )
        )
        for _ in range(8)
    ]
    for c in consumers:
        c.subscribe([topic])
    pollers = [LedgerPoller(c, ledger) for c in consumers]
    for p in pollers:
        p.start()
    try:

        def stable() -> bool:
            sizes = [len(c.assignment()) for c in consumers]
            return sum(sizes) == partitions and min(sizes) > 0

        # Nothing is produced until the group settled: each partition has one reader.
        _drive(pollers, ledger, stable, "group assignment")
        assignments = [set(c.assignment()) for c in consumers]
        _run(cluster, pollers, ledger, topic, partitions, subset_size=8)
        assert [set(c.assignment()) for c in consumers] == assignments  # no rebalance
    finally:
        _stop(pollers)
