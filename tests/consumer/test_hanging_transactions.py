"""A transaction left hanging by an unclean election, seen by read_committed consumers of
both drivers on the EmbeddedCluster: reported (raised or warned), not a silent stall, and
delivering again once an operator aborts it."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import AbortTransactionSpec, KafkaAdminClient

from epochguard import AIOEpochConsumer, HangingTransactionError
from epochguard.consumer import ConsumerConfigError, EpochConsumer
from epochguard.offsets.hanging import HangingTransaction
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, consumer_config, make_consumer

pytestmark = pytest.mark.timeout(60)

#: The broker's transaction.max.timeout.ms as the consumers here believe it.
MAX_TIMEOUT_MS = 1000


def stage_hanging_transaction(cluster: EmbeddedCluster) -> tuple[int, int]:
    """A COMMIT marker only the old leader had, truncated away by an unclean election: the
    transactional record at offset 0 stays open forever, a plain record follows at 1
    (high watermark 2, last stable offset 0). The hanging producer's id and epoch."""
    cluster.create_topic("t", replication_factor=2)
    leader = cluster.leader("t", 0)
    follower = next(b for b in cluster.replicas("t", 0) if b != leader)
    p = KafkaProducer(bootstrap_servers=cluster.all_bootstrap_servers, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"committed-then-lost", partition=0)
    p.flush()
    cluster.pause_replication(follower)
    p.commit_transaction()
    p.close()
    cluster.stop_broker(leader)
    cluster.elect_leader("t", 0, follower, unclean=True)
    cluster.resume_replication(follower)
    cluster.start_broker(leader)
    cluster.settle()
    cluster.append("t", 0, [b"plain"])
    assert (cluster.high_watermark("t", 0), cluster.last_stable_offset("t", 0)) == (2, 0)
    (state,) = _describe(cluster)
    assert state.current_transaction_start_offset == 0
    return state.producer_id, state.producer_epoch


def _describe(cluster: EmbeddedCluster) -> list[Any]:
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        return list(admin.describe_producers([TP0])[TP0].active_producers)
    finally:
        admin.close()


def abort(cluster: EmbeddedCluster, found: HangingTransaction) -> None:
    """What ``kafka-transactions.sh abort`` does, with what the report names."""
    assert found.producer_id is not None and found.producer_epoch is not None
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.abort_transaction(
            AbortTransactionSpec(
                TP0, found.producer_id, found.producer_epoch, found.coordinator_epoch or 0
            )
        )
    finally:
        admin.close()


def _check(found: HangingTransaction, producer: tuple[int, int]) -> None:
    assert found.tp == TP0
    assert (found.producer_id, found.producer_epoch) == producer
    assert (found.first_offset, found.high_watermark) == (0, 2)
    assert found.stalled_s > MAX_TIMEOUT_MS / 1000


def test_epoch_consumer_raises_once_and_delivers_after_the_abort(
    cluster: EmbeddedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    producer = stage_hanging_transaction(cluster)
    with (
        caplog.at_level(logging.ERROR, logger="epochguard"),
        make_consumer(
            cluster,
            isolation_level="read_committed",
            transaction_max_timeout_ms=MAX_TIMEOUT_MS,
        ) as c,
    ):
        c.assign([TP0])
        start = time.monotonic()
        delivered: list[Any] = []
        with pytest.raises(HangingTransactionError) as raised:
            while time.monotonic() - start < 15:
                for records in c.poll(timeout_ms=100).values():
                    delivered += records
        assert delivered == []
        assert time.monotonic() - start > MAX_TIMEOUT_MS / 1000
        found = raised.value.transaction
        _check(found, producer)
        assert raised.value.transactions == {TP0: found}
        assert c.hanging_transactions() == [found]
        assert c.position(TP0) == 0
        metrics = c.metrics(raw=True)
        assert metrics is not None
        assert metrics["hanging_transactions_detected"] == 1
        assert metrics["describe_producers_requests"] >= 1
        # Once per stall: more polls stay quiet while nothing moves.
        assert c.poll(timeout_ms=MAX_TIMEOUT_MS * 2) == {}
        abort(cluster, found)
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=100).values():
                got += records
        # The transaction's record is aborted now; the plain one after it arrives.
        assert [(r.offset, r.value) for r in got] == [(1, b"plain")]
        assert c.hanging_transactions() == [found]
    (record,) = [
        r
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg["event"] == "hanging_transaction_detected"
    ]
    event = record.msg
    assert isinstance(event, dict)
    assert (event["topic"], event["partition"], event["first_offset"]) == ("t", 0, 0)
    assert (event["producer_id"], event["producer_epoch"]) == producer
    assert event["decision"] == "raise"


def test_aio_consumer_warns_under_the_warn_policy(cluster: EmbeddedCluster) -> None:
    producer = stage_hanging_transaction(cluster)

    async def main() -> list[HangingTransaction]:
        async with AIOEpochConsumer(
            **consumer_config(
                cluster,
                isolation_level="read_committed",
                transaction_max_timeout_ms=MAX_TIMEOUT_MS,
                on_hanging_transaction="warn",
            )
        ) as c:
            c.assign([TP0])
            deadline = time.monotonic() + 15
            while not c.hanging_transactions() and time.monotonic() < deadline:
                assert await c.getmany(timeout_ms=100) == {}
            found = c.hanging_transactions()
            # Still one report while the stall lasts.
            await c.getmany(timeout_ms=MAX_TIMEOUT_MS * 2)
            assert c.hanging_transactions() == found
            metrics = c.metrics(raw=True)
            assert metrics is not None and metrics["hanging_transactions_detected"] == 1
            return found

    (found,) = asyncio.run(main())
    _check(found, producer)


def test_an_open_transaction_younger_than_the_timeout_is_not_reported(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("t", replication_factor=1)
    p = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"open", partition=0)
    p.flush()
    cluster.append("t", 0, [b"plain"])
    try:
        with make_consumer(
            cluster, isolation_level="read_committed", transaction_max_timeout_ms=60_000
        ) as c:
            c.assign([TP0])
            assert c.poll(timeout_ms=1500) == {}
            assert c.hanging_transactions() == []
            metrics = c.metrics(raw=True)
            assert metrics is not None and metrics["describe_producers_requests"] == 0
    finally:
        p.abort_transaction()
        p.close()


def test_the_policy_is_checked() -> None:
    with pytest.raises(ConsumerConfigError, match="on_hanging_transaction"):
        EpochConsumer(on_hanging_transaction="ignore")
    with pytest.raises(ConsumerConfigError, match="transaction_max_timeout_ms"):
        EpochConsumer(transaction_max_timeout_ms=0)
