"""Broker restarts, leader moves, dropped connections: nothing lost, nothing twice."""

from __future__ import annotations

import time

import pytest
from kafka.structs import TopicPartition

from .conftest import make_consumer, poll_until, read

pytestmark = pytest.mark.timeout(90)

FETCH = 1


def test_leader_restart_and_dropped_connections_lose_nothing(cluster) -> None:
    cluster.create_topic("r", partitions=2, replication_factor=3)
    tps = [TopicPartition("r", p) for p in range(2)]
    for p in range(2):
        cluster.append("r", p, [b"a-%d" % i for i in range(20)], batch_size=5)
    with make_consumer(cluster, reconnect_backoff_max_ms=500, on_truncation="raise") as c:
        c.assign(tps)
        got = read(c, 40)
        leader = cluster.leader("r", 0)
        cluster.stop_broker(leader)  # leader moves (clean: ISR has the others)
        for p in range(2):
            cluster.append("r", p, [b"b-%d" % i for i in range(20)], batch_size=5)
        got += read(c, 40, timeout=20)
        cluster.start_broker(leader)
        cluster.faults.disconnect_on(api_key=FETCH, count=2)  # connections dropped mid-fetch
        for p in range(2):
            cluster.append("r", p, [b"c-%d" % i for i in range(20)], batch_size=5)
        got += read(c, 40, timeout=20)
        time.sleep(0.2)
        got += [r for v in c.poll(timeout_ms=200).values() for r in v]
        for tp in tps:
            offsets = [r.offset for r in got if r.partition == tp.partition]
            assert offsets == list(range(60)), tp
        assert c.truncation_reports() == []


def test_topic_deleted_and_recreated_is_reported(cluster) -> None:
    from epochguard.offsets.position import EpochOffset
    from epochguard.offsets.report import DetectedBy

    tp = TopicPartition("re", 0)
    cluster.create_topic("re", partitions=1, replication_factor=2)
    cluster.append("re", 0, [b"first-%d" % i for i in range(10)])
    with make_consumer(cluster, on_truncation="rewind", allow_auto_create_topics=False) as c:
        c.assign([tp])
        assert len(read(c, 10)) == 10
        cluster.delete_topic("re")
        time.sleep(0.3)
        c.poll(timeout_ms=300)
        cluster.create_topic("re", partitions=1, replication_factor=2)
        cluster.append("re", 0, [b"second-%d" % i for i in range(3)])
        got = read(c, 3, timeout=15)
        assert [r.value for r in got] == [b"second-%d" % i for i in range(3)]
        [rep] = c.truncation_reports()
        assert rep.detected_by is DetectedBy.TOPIC_RECREATED
        assert rep.divergence == EpochOffset(0, None) and rep.lost_count == 10


def test_topic_recreated_after_retention_passed_the_group_commit_is_reported(cluster) -> None:
    """A member starts from its group's commit, finds it below the log start (retention)
    and resets, then the topic is re-created before it reads anything: what the group had
    consumed below the commit went with the topic, and the new log's offsets start again
    there. The member reports it, although it read nothing of the old log itself."""
    from epochguard.offsets.position import EpochOffset
    from epochguard.offsets.report import DetectedBy

    tp = TopicPartition("rc", 0)
    cluster.create_topic("rc", partitions=1, replication_factor=2)
    cluster.append("rc", 0, [b"first-%d" % i for i in range(6)])
    with make_consumer(cluster, group_id="rc-group") as first:
        first.assign([tp])
        assert len(read(first, 6)) == 6
        first.commit()
    cluster.append("rc", 0, [b"first-%d" % i for i in range(6, 9)])
    cluster.delete_records("rc", 0, 9)
    with make_consumer(
        cluster, group_id="rc-group", on_truncation="rewind", allow_auto_create_topics=False
    ) as second:
        second.assign([tp])
        poll_until(second, lambda: second.position(tp) == 9)  # reset past the commit
        cluster.delete_topic("rc")
        cluster.create_topic("rc", partitions=1, replication_factor=2)
        cluster.append("rc", 0, [b"second-%d" % i for i in range(3)])
        got = read(second, 3, timeout=15)
        assert [r.value for r in got] == [b"second-%d" % i for i in range(3)]
        [rep] = second.truncation_reports()
        assert rep.detected_by is DetectedBy.TOPIC_RECREATED
        assert rep.consumed_to.offset == 6 and rep.divergence == EpochOffset(0, None)


def test_rebootstraps_when_every_broker_it_knows_is_gone(cluster) -> None:
    """Started while only broker A was up, the consumer knows no other broker. When A goes,
    it asks the bootstrap servers again (Java's metadata.recovery.strategy=rebootstrap)
    instead of retrying A forever."""
    a, b = 1, 2
    cluster.create_topic("rb", replication_factor=2)
    cluster.elect_leader("rb", 0, a)
    cluster.append("rb", 0, [b"x%d" % i for i in range(3)])
    cluster.stop_broker(b)
    cluster.stop_broker(3)
    tp = TopicPartition("rb", 0)
    with make_consumer(
        cluster,
        bootstrap_servers=cluster.all_bootstrap_servers,
        metadata_max_age_ms=300_000,
        reconnect_backoff_max_ms=200,
    ) as c:
        c.assign([tp])
        assert len(read(c, 3)) == 3  # its metadata names broker A alone
        cluster.start_broker(b)
        cluster.settle()
        while cluster.isr("rb", 0) != [a, b]:
            time.sleep(0.01)
        cluster.stop_broker(a)  # B leads now, cleanly
        assert cluster.leader("rb", 0) == b
        cluster.append("rb", 0, [b"y%d" % i for i in range(3)])
        got = read(c, 3, timeout=15)
        assert [(r.offset, r.value) for r in got] == [(3 + i, b"y%d" % i) for i in range(3)]
        assert c.truncation_reports() == []
