"""Group commits name a topic by id (OffsetCommit v10) across a topic's deletion and
re-creation, on the EmbeddedCluster:

- a coordinator whose metadata lags the re-creation refuses the new incarnation's id until
  it knows it, and then keeps the commit; by name (an offset given without a topic id) it
  files it under the deleted id and drops it when it applies the deletion (the known limit
  in docs/reliability.md);
- a position in the deleted incarnation, committed by a consumer that has not noticed the
  re-creation (its close-commit), is refused by id for good: a partition leader names
  another id, and the commit goes by name, with the deleted id in its metadata, so the next
  session reports the re-creation (``membership.CommitNaming``);
- a commit of the new incarnation is still found when the group moves to a coordinator
  that knows only the deleted one (it reads its offsets store by name)."""

from __future__ import annotations

import zlib

import pytest
from kafka.structs import TopicPartition

from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer, read

pytestmark = pytest.mark.timeout(60)

TOPIC = "flap"
TP = TopicPartition(TOPIC, 0)
#: How late the coordinator learns of the deletion and the re-creation.
DELAY_S = 2.0


def _coordinator(cluster: EmbeddedCluster, group: str, live: list[int] | None = None) -> int:
    # The EmbeddedCluster hashes a group onto a live broker (find_coordinator.py).
    ids = sorted(cluster.broker_ids if live is None else live)
    return ids[zlib.crc32(group.encode()) % len(ids)]


def _recreated_under_a_lagging_coordinator(cluster: EmbeddedCluster) -> tuple[str, str]:
    """The group (coordinated by a broker that learns of the re-creation ``DELAY_S`` late)
    and bootstrap servers that know the new topic at once."""
    cluster.create_topic(TOPIC, replication_factor=2)
    cluster.append(TOPIC, 0, [b"old-%d" % i for i in range(3)])
    # The lagging broker holds no replica: a replica in the ISR that never learns of the
    # new topic would hold its high watermark back.
    replicas = cluster.replicas(TOPIC, 0)
    (lagging,) = [b for b in cluster.broker_ids if b not in replicas]
    group = next(f"g-{i}" for i in range(50) if _coordinator(cluster, f"g-{i}") == lagging)
    cluster.set_metadata_delay(lagging, DELAY_S)
    cluster.delete_topic(TOPIC)
    cluster.create_topic(TOPIC, replication_factor=2)
    cluster.append(TOPIC, 0, [b"new-%d" % i for i in range(10)])
    up_to_date = ",".join(cluster.broker_address(b) for b in cluster.broker_ids if b != lagging)
    return group, up_to_date


def test_a_commit_survives_a_coordinator_that_learns_of_the_re_creation_late(
    cluster: EmbeddedCluster,
) -> None:
    """The position read in the new incarnation is committed by its id: refused until the
    coordinator knows the id (the partition leader names that same id, so the commit waits
    by id), then kept once the coordinator has applied the deletion too."""
    group, up_to_date = _recreated_under_a_lagging_coordinator(cluster)
    with make_consumer(cluster, bootstrap_servers=up_to_date, group_id=group) as first:
        first.assign([TP])
        got = read(first, 6, max_records=6)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(6)]
        first.commit()
        assert first.committed(TP) == 6
    cluster.settle()
    with make_consumer(
        cluster, bootstrap_servers=up_to_date, group_id=group, on_truncation="rewind"
    ) as nxt:
        nxt.assign([TP])
        assert nxt.committed(TP) == 6
        got = read(nxt, 4)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(6, 10)]
        assert nxt.truncation_reports() == []


def test_a_commit_by_name_is_deleted_with_the_topic_the_coordinator_learns_of_late(
    cluster: EmbeddedCluster,
) -> None:
    """An offset given as an int names no topic id, so it goes by name: filed under the id
    the lagging coordinator gives the name (the deleted topic's) and gone once it applies
    the deletion (the known limit in docs/reliability.md)."""
    group, up_to_date = _recreated_under_a_lagging_coordinator(cluster)
    with make_consumer(cluster, bootstrap_servers=up_to_date, group_id=group) as first:
        first.assign([TP])
        first.commit({TP: 5})
        assert first.committed(TP) == 5  # the coordinator still names the deleted topic
    cluster.settle()
    with make_consumer(cluster, bootstrap_servers=up_to_date, group_id=group) as nxt:
        nxt.assign([TP])
        assert nxt.committed(TP) is None


def test_a_close_commit_of_a_deleted_incarnation_tells_the_next_session(
    cluster: EmbeddedCluster,
) -> None:
    """A consumer reads, the topic is deleted and re-created, and the consumer commits its
    position (in the deleted incarnation) and closes before it notices. By id the
    coordinator refuses that for good, and Kafka deleted the group's earlier commits with the
    topic: the next session would start from the reset policy and report nothing. The leader
    names the new id, so the commit goes by name, and the next session reports the records
    its predecessor read of the deleted incarnation."""
    cluster.create_topic(TOPIC, replication_factor=2)
    cluster.append(TOPIC, 0, [b"old-%d" % i for i in range(8)])
    group = "closing"
    # Metadata asked once: the consumer does not learn of the re-creation before it closes.
    with make_consumer(cluster, group_id=group, metadata_max_age_ms=60_000) as first:
        first.assign([TP])
        got = read(first, 5, max_records=5)
        assert [r.value for r in got] == [b"old-%d" % i for i in range(5)]
        first.commit()
        cluster.delete_topic(TOPIC)
        cluster.create_topic(TOPIC, replication_factor=2)
        cluster.append(TOPIC, 0, [b"new-%d" % i for i in range(3)])
        first.commit()  # the closing commit: offset 5 of the deleted incarnation
    with make_consumer(
        cluster, group_id=group, on_truncation="rewind", allow_auto_create_topics=False
    ) as nxt:
        nxt.assign([TP])
        got = read(nxt, 3, timeout=15)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(3)]
        [rep] = nxt.truncation_reports()
        assert rep.detected_by is DetectedBy.TOPIC_RECREATED
        assert rep.divergence == EpochOffset(0, None) and rep.lost_count == 5


def test_a_commit_of_the_new_incarnation_outlives_a_move_to_a_coordinator_that_lags(
    cluster: EmbeddedCluster,
) -> None:
    """The coordinator's broker stops after a commit of the new incarnation, and the group
    moves to a broker that has not learnt of the re-creation yet (the EmbeddedCluster moves
    a group at once; in KRaft the broker would apply the re-creation first). Kafka's
    coordinator reads its offsets store by name, so the next session resumes at the commit;
    with none it would start from the reset policy and read again, unreported, what was
    committed."""
    cluster.create_topic(TOPIC, replication_factor=2)
    cluster.append(TOPIC, 0, [b"old-%d" % i for i in range(3)])
    replicas = cluster.replicas(TOPIC, 0)
    (lagging,) = [b for b in cluster.broker_ids if b not in replicas]
    group, first = next(
        (g, c)
        for g in (f"g-{i}" for i in range(200))
        for c in [_coordinator(cluster, g)]
        if c != lagging
        and _coordinator(cluster, g, [b for b in cluster.broker_ids if b != c]) == lagging
    )
    (survivor,) = [b for b in replicas if b != first]
    cluster.set_metadata_delay(lagging, 20.0)
    cluster.delete_topic(TOPIC)
    cluster.create_topic(TOPIC, replication_factor=2)
    assert cluster.replicas(TOPIC, 0) == replicas
    cluster.append(TOPIC, 0, [b"new-%d" % i for i in range(10)])
    up_to_date = ",".join(cluster.broker_address(b) for b in replicas)
    with make_consumer(cluster, bootstrap_servers=up_to_date, group_id=group) as reader:
        reader.assign([TP])
        got = read(reader, 6, max_records=6)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(6)]
        reader.commit()
        assert reader.committed(TP) == 6
    cluster.stop_broker(first)
    lagging_view = cluster.call(lambda: cluster.state.broker(lagging).view.topics[TOPIC])
    assert str(lagging_view.topic_id) != cluster.topic_id(TOPIC)  # still the deleted topic
    with make_consumer(
        cluster,
        bootstrap_servers=cluster.broker_address(survivor),
        group_id=group,
        on_truncation="rewind",
    ) as nxt:
        nxt.assign([TP])
        assert nxt.committed(TP) == 6
        got = read(nxt, 4)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(6, 10)]
        assert nxt.truncation_reports() == []
