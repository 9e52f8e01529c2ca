"""A group coordinator whose metadata lags a topic's deletion and re-creation files a commit
by name under the id its view gives the name (the deleted topic's) and drops it once it
applies the deletion: the known limit in docs/reliability.md, pinned here. Group commits go
by name (the position's topic id in the commit's metadata): by id, Kafka's coordinator would
also refuse for good a position in a topic deleted meanwhile, and the next owner would find
nothing to compare with (see ``membership.commit_topic_ids``)."""

from __future__ import annotations

import zlib

import pytest
from kafka.structs import TopicPartition

from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "flap"
TP = TopicPartition(TOPIC, 0)
#: How late the coordinator learns of the deletion and the re-creation.
DELAY_S = 2.0


def _coordinator(cluster: EmbeddedCluster, group: str) -> int:
    # The EmbeddedCluster hashes a group onto a live broker (find_coordinator.py).
    ids = cluster.broker_ids
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


def test_a_commit_by_name_is_deleted_with_the_topic_the_coordinator_learns_of_late(
    cluster: EmbeddedCluster,
) -> None:
    """A commit by name is filed under the id the lagging coordinator gives the name (the
    deleted topic's) and gone once it applies the deletion."""
    group, up_to_date = _recreated_under_a_lagging_coordinator(cluster)
    with make_consumer(cluster, bootstrap_servers=up_to_date, group_id=group) as first:
        first.assign([TP])
        first.commit({TP: 5})
        assert first.committed(TP) == 5  # the coordinator still names the deleted topic
    cluster.settle()
    with make_consumer(cluster, bootstrap_servers=up_to_date, group_id=group) as nxt:
        nxt.assign([TP])
        assert nxt.committed(TP) is None
