"""KIP-227 incremental fetch sessions: the cache rules and what clients see."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import LogTruncationError
from kafka.protocol.consumer import FetchRequest, FetchResponse

from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.fetch_sessions import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    FetchSessionCache,
    FetchTarget,
    SessionError,
)

from .wire import Wire

pytestmark = pytest.mark.timeout(60)


def target(partition: int, offset: int = 0) -> FetchTarget:
    return FetchTarget("t", partition, -1, offset, -1, 1000)


def test_session_cache_rules() -> None:
    cache = FetchSessionCache()
    session, targets, incremental = cache.open(0, 0, [target(0), target(1)], [])
    assert session is not None and session.session_id > 0 and not incremental
    assert [t.partition for t in targets] == [0, 1]
    sid = session.session_id
    # Epoch 1: partition 1 moved on, partition 2 added, partition 0 forgotten.
    s1, targets, incremental = cache.open(sid, 1, [target(1, 5), target(2)], [("t", 0)])
    assert s1 is session and incremental
    assert [(t.partition, t.fetch_offset) for t in targets] == [(1, 5), (2, 0)]
    with pytest.raises(SessionError) as e:
        cache.open(sid, 1, [], [])  # epoch 1 again: the next one is 2
    assert e.value.error_code == INVALID_FETCH_SESSION_EPOCH
    with pytest.raises(SessionError) as e:
        cache.open(sid + 100, 1, [], [])
    assert e.value.error_code == FETCH_SESSION_ID_NOT_FOUND
    # Epoch -1 closes it and answers sessionless.
    none, targets, incremental = cache.open(sid, -1, [target(3)], [])
    assert none is None and not incremental and len(cache) == 0
    assert cache.open(0, 0, [target(0)], [], create=False)[0] is None


def request(
    session_id: int, epoch: int, parts: list[tuple[int, int]], forgotten: list[int] | None = None
) -> Any:
    FT = FetchRequest.FetchTopic
    v = 12
    return FetchRequest(
        version=v,
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1_000_000,
        isolation_level=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=[
            FT(
                version=v,
                topic="t",
                partitions=[
                    FT.FetchPartition(
                        version=v,
                        partition=p,
                        current_leader_epoch=-1,
                        fetch_offset=off,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=100_000,
                    )
                    for p, off in parts
                ],
            )
        ]
        if parts
        else [],
        forgotten_topics_data=[
            FetchRequest.ForgottenTopic(version=v, topic="t", partitions=forgotten)
        ]
        if forgotten
        else [],
        rack_id="",
    )


def partitions(resp: Any) -> dict[int, tuple[int, int, int]]:
    return {
        p.partition_index: (p.error_code, p.high_watermark, len(p.records))
        for t in resp.responses
        for p in t.partitions
    }


def test_incremental_responses_carry_only_changed_partitions() -> None:
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("t", partitions=2)
        cluster.append("t", 0, [b"a", b"b"])
        w = Wire.to(cluster, 1)
        try:
            full = w.call(request(0, 0, [(0, 0), (1, 0)]), FetchResponse)
            sid = full.session_id
            assert sid != 0
            got = partitions(full)
            assert got[0][:2] == (0, 2) and got[0][2] > 0 and got[1] == (0, 0, 0)
            # The client consumed 0..1 of partition 0: it sends only that partition. Nothing
            # changed for either partition, so the response lists none.
            idle = w.call(request(sid, 1, [(0, 2)]), FetchResponse)
            assert (idle.error_code, idle.session_id, partitions(idle)) == (0, sid, {})
            cluster.append("t", 1, [b"c"])
            moved = partitions(w.call(request(sid, 2, []), FetchResponse))
            assert set(moved) == {1} and moved[1][:2] == (0, 1) and moved[1][2] > 0
            stale = w.call(request(sid, 2, []), FetchResponse)
            assert (stale.error_code, stale.session_id) == (INVALID_FETCH_SESSION_EPOCH, 0)
            gone = w.call(request(sid + 1000, 1, []), FetchResponse)
            assert gone.error_code == FETCH_SESSION_ID_NOT_FOUND
            closed = w.call(request(sid, -1, [(0, 0)]), FetchResponse)
            assert closed.session_id == 0 and set(partitions(closed)) == {0}
        finally:
            w.close()


def test_idle_kafka_python_consumer_keeps_its_epoch_and_sees_truncation(
    cluster: EmbeddedCluster,
) -> None:
    """Caught up and idle, kafka-python still has epoch 0, as against real Kafka."""
    cluster.create_topic("t", replication_factor=2)
    old = cluster.leader("t", 0)
    assert old is not None
    new = next(b for b in cluster.replicas("t", 0) if b != old)
    cluster.append("t", 0, [b"kept-%d" % i for i in range(5)], batch_size=1)
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"lost-%d" % i for i in range(3)], batch_size=1)  # 5..7
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="none",
        enable_auto_commit=False,
        metadata_max_age_ms=500,
        fetch_max_wait_ms=100,
    )
    tp = TopicPartition("t", 0)
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[int] = []
        deadline = time.monotonic() + 15
        while len(got) < 8 and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                got += [r.offset for r in recs]
        assert got == list(range(8))
        consumer.poll(timeout_ms=1000)  # idle at the log end: incremental, empty
        position = consumer._subscription.assignment[tp].position
        assert (position.offset, position.leader_epoch) == (8, 0)

        cluster.stop_broker(old)
        cluster.start_broker(new)
        cluster.elect_leader("t", 0, new, unclean=True)
        cluster.append("t", 0, [b"new-%d" % i for i in range(6)], batch_size=1)  # 5..10
        cluster.start_broker(old)
        with pytest.raises(LogTruncationError) as info:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for recs in consumer.poll(timeout_ms=200).values():
                    pytest.fail(f"read {[(r.offset, r.value) for r in recs]} silently")
        (divergent,) = info.value.divergent_offsets.values()
        assert (divergent.offset, divergent.leader_epoch) == (5, 0)
    finally:
        consumer.close()


def test_sessions_can_be_turned_off() -> None:
    with EmbeddedCluster(brokers=1, fetch_sessions=False) as cluster:
        cluster.create_topic("t")
        w = Wire.to(cluster, 1)
        try:
            resp = w.call(request(0, 0, [(0, 0)]), FetchResponse)
        finally:
            w.close()
        assert resp.session_id == 0 and set(partitions(resp)) == {0}
