"""A topic re-created while a broker's metadata lags: that broker still names the deleted
topic's id after the new one exists. A consumer whose metadata comes from it must not take
the group's commit of the new incarnation for a position in a deleted one (docs/design.md,
"Topic ids": a topic id is judged by which one a leader serves)."""

from __future__ import annotations

import time
import zlib

import pytest
from kafka.structs import TopicPartition

from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer, read

pytestmark = pytest.mark.timeout(60)

TOPIC = "flap"
TP = TopicPartition(TOPIC, 0)


def _coordinator(cluster: EmbeddedCluster, group: str) -> int:
    # The EmbeddedCluster hashes a group onto a live broker (find_coordinator.py).
    ids = cluster.broker_ids
    return ids[zlib.crc32(group.encode()) % len(ids)]


def test_a_commit_of_the_new_incarnation_is_kept_while_metadata_names_the_old_one(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic(TOPIC, replication_factor=2)
    cluster.append(TOPIC, 0, [b"old-%d" % i for i in range(3)])
    # The lagging broker holds no replica (a replica in the ISR that never learns of the new
    # topic would hold its high watermark back) and does not coordinate the group (a commit
    # it took would carry its view of the topic, the deleted one).
    replicas = cluster.replicas(TOPIC, 0)
    (lagging,) = [b for b in cluster.broker_ids if b not in replicas]
    group = next(f"g-{i}" for i in range(10) if _coordinator(cluster, f"g-{i}") != lagging)
    cluster.set_metadata_delay(lagging, 20.0)
    cluster.delete_topic(TOPIC)
    cluster.create_topic(TOPIC, replication_factor=2)
    assert cluster.replicas(TOPIC, 0) == replicas  # the same placement as before
    cluster.append(TOPIC, 0, [b"new-%d" % i for i in range(10)])
    up_to_date = ",".join(cluster.broker_address(b) for b in cluster.broker_ids if b != lagging)

    with make_consumer(
        cluster, bootstrap_servers=up_to_date, group_id=group, metadata_max_age_ms=60_000
    ) as first:
        first.assign([TP])
        got = read(first, 5, max_records=5)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(5)]
        first.commit()
        assert first.committed(TP) == 5
        assert first.truncation_reports() == []

    # Then consumers of the group one after the other, each from the commit of the one
    # before (the new id), each learning metadata from the lagging broker first (the deleted
    # topic's id, its leader and epoch) and from any broker every 100 ms after that.
    appended, committed = 10, 5
    heard = 0
    for _ in range(6):
        with make_consumer(
            cluster,
            bootstrap_servers=cluster.broker_address(lagging),
            group_id=group,
            metadata_max_age_ms=100,
            on_truncation="rewind",
        ) as member:
            member.assign([TP])
            start = member.committed(TP)
            assert start == committed  # where the one before stopped, in the new incarnation
            cluster.append(TOPIC, 0, [b"new-%d" % i for i in range(appended, appended + 5)])
            appended += 5
            got = read(member, appended - start, timeout=25)
            assert [r.value for r in got] == [b"new-%d" % i for i in range(start, appended)]
            time.sleep(0.3)  # metadata asked again meanwhile
            assert read(member, 1, timeout=0.2) == []
            assert member.truncation_reports() == []
            pos = member.position_with_epoch(TP)
            assert pos is not None and pos.offset == appended
            assert pos.topic_id == cluster.topic_id(TOPIC)
            member.commit()
            committed = appended
            m = member.metrics(raw=True)
            # Did it hear the deleted id? A fetch under it refused (UNKNOWN_TOPIC_ID from a
            # broker that knows only the new one), or a later answer naming it ignored.
            heard += m["fetch_errors"] + m["stale_metadata_ignored"] > 0
    assert heard >= 1  # the situation this test is about did arise
