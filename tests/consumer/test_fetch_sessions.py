"""KIP-227 fetch sessions against the EmbeddedCluster, read off the broker's own session
cache: what the consumer's session holds while partitions are paused or under validation,
and how it recovers when the broker forgets it. The cross-cluster tests (real Kafka too) are
in tests/scenarios/test_fetch_sessions.py; the state table in test_session_table.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer, read

pytestmark = pytest.mark.timeout(60)

TOPIC = "s"
TPS = [TopicPartition(TOPIC, p) for p in range(4)]
OFFSET_FOR_LEADER_EPOCH = 23


@pytest.fixture
def single() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=1) as c:
        c.create_topic(TOPIC, partitions=len(TPS), replication_factor=1)
        for tp in TPS:
            c.append(TOPIC, tp.partition, [b"%d-0" % tp.partition])
        yield c


def _broker(cluster: EmbeddedCluster) -> int:
    (broker,) = cluster.broker_ids
    return broker


def _held(cluster: EmbeddedCluster) -> dict[int, tuple[int, int]]:
    """Partition -> (fetch offset, current leader epoch) in the broker's only session."""
    sessions = cluster.fetch_sessions(_broker(cluster))
    assert len(sessions) <= 1, sessions
    if not sessions:
        return {}
    (held,) = sessions.values()
    return {p: v for (_t, p), v in held.items()}


def _poll_until(
    consumer: EpochConsumer, cond: Callable[[], bool], what: str, sink: list[Any] | None = None
) -> list[Any]:
    got: list[Any] = [] if sink is None else sink
    deadline = time.monotonic() + 20
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not reached; {consumer.metrics(raw=True)}"
        for recs in consumer.poll(timeout_ms=50).values():
            got += recs
    return got


def _started(cluster: EmbeddedCluster, **kw: Any) -> EpochConsumer:
    consumer = make_consumer(cluster, **kw)
    consumer.assign(TPS)
    assert len(read(consumer, len(TPS))) == len(TPS)
    return consumer


def test_paused_partition_leaves_the_session_and_comes_back(single: EmbeddedCluster) -> None:
    consumer = _started(single)
    try:
        _poll_until(consumer, lambda: _held(single) == {p: (1, 0) for p in range(4)}, "all held")
        consumer.pause(TPS[2])
        _poll_until(consumer, lambda: set(_held(single)) == {0, 1, 3}, "2 forgotten")
        single.append(TOPIC, 2, [b"2-1"])
        assert not _poll_until(consumer, lambda: 2 not in _held(single), "still forgotten")
        consumer.resume(TPS[2])
        got = _poll_until(consumer, lambda: 2 in _held(single) and _held(single)[2][0] == 2, "2")
        assert [(r.partition, r.offset, r.value) for r in got] == [(2, 1, b"2-1")]
    finally:
        consumer.close()


def test_partition_under_validation_leaves_the_session_and_returns_fenced_by_the_new_epoch(
    single: EmbeddedCluster,
) -> None:
    # Fetch v11: the new epoch is validated by OffsetForLeaderEpoch. At v12+ the leader, which
    # has answered this consumer's fetches, judges the position by the next fetch instead
    # (DivergingEpoch), and the partition never leaves the session.
    consumer = _started(single, max_fetch_version=11)
    broker = _broker(single)
    try:
        _poll_until(consumer, lambda: len(_held(single)) == 4, "all held")
        # Hold the OffsetsForLeaderEpoch answer so the validation stays in flight a while.
        single.faults.delay_responses(1.0, api_key=OFFSET_FOR_LEADER_EPOCH, count=1)
        single.elect_leader(TOPIC, 1, broker)  # same leader, next epoch
        new_epoch = single.leader_epoch(TOPIC, 1)
        assert new_epoch > 0

        def validating_outside_the_session() -> bool:
            sent = consumer.metrics(raw=True)["offset_for_leader_epoch_requests"]
            return sent >= 1 and set(_held(single)) == {0, 2, 3}

        _poll_until(consumer, validating_outside_the_session, "1 forgotten while validating")
        _poll_until(consumer, lambda: _held(single).get(1) == (1, new_epoch), "1 back")
        single.append(TOPIC, 1, [b"1-1"])
        got = _poll_until(consumer, lambda: _held(single).get(1, (0, 0))[0] == 2, "1 moved")
        assert [(r.partition, r.offset, r.leader_epoch) for r in got] == [(1, 1, new_epoch)]
        assert consumer.metrics(raw=True)["truncations_detected"] == 0
    finally:
        consumer.close()


def test_a_session_the_broker_forgot_is_opened_again(single: EmbeddedCluster) -> None:
    consumer = _started(single)
    broker = _broker(single)
    try:
        _poll_until(consumer, lambda: len(_held(single)) == 4, "all held")
        (old_id,) = single.fetch_sessions(broker)
        single.drop_fetch_sessions(broker)
        single.append(TOPIC, 3, [b"3-1", b"3-2"])
        got: list[Any] = []

        def reopened() -> bool:
            return len(got) >= 2 and len(single.fetch_sessions(broker)) == 1

        _poll_until(consumer, reopened, "reopened", got)
        assert [(r.partition, r.offset) for r in got] == [(3, 1), (3, 2)]
        (new_id,) = single.fetch_sessions(broker)
        assert new_id != old_id
        m = consumer.metrics(raw=True)
        assert m["fetch_session_resets"] >= 1 and m["fetch_errors"] == 0
        assert m["request_failures"] == 0
    finally:
        consumer.close()


def test_sessions_off_leaves_the_broker_without_sessions(single: EmbeddedCluster) -> None:
    consumer = _started(single, enable_incremental_fetch_sessions=False)
    try:
        single.append(TOPIC, 0, [b"0-1"])
        assert [r.value for r in read(consumer, 1)] == [b"0-1"]
        assert single.fetch_sessions(_broker(single)) == {}
        m = consumer.metrics(raw=True)
        assert m["incremental_fetch_requests"] == 0 and m["fetch_requests"] > 0
    finally:
        consumer.close()


def test_the_switch_takes_booleans_only() -> None:
    from epochguard.consumer.config import build_config
    from epochguard.consumer.errors import ConsumerConfigError

    with pytest.raises(ConsumerConfigError, match="enable_incremental_fetch_sessions"):
        build_config({"enable_incremental_fetch_sessions": "no"})
