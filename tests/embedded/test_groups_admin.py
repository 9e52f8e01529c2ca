"""Group administration through kafka-python's and confluent-kafka's admin clients."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, TopicPartition
from kafka.structs import OffsetAndMetadata

from epochguard.testing import EmbeddedCluster

from .test_groups_clients import ALL, PARTITIONS, TOPIC, KpMember, wait_until

pytestmark = pytest.mark.timeout(60)


def error_name(e: Any) -> str:
    return str(e.__name__ if isinstance(e, type) else type(e).__name__)


@pytest.fixture
def admin(cluster: EmbeddedCluster) -> Any:
    cluster.create_topic(TOPIC, partitions=PARTITIONS)
    a = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    yield a
    a.close()


def test_kafka_python_admin_group_lifecycle(cluster: EmbeddedCluster, admin: Any) -> None:
    tps = [TopicPartition(TOPIC, p) for p in range(2)]
    errors = admin.alter_group_offsets(
        "offline", {tps[0]: OffsetAndMetadata(5, "a", 2), tps[1]: OffsetAndMetadata(6, "b", 3)}
    )
    assert {tp: error_name(e) for tp, e in errors.items()} == {tps[0]: "NoError", tps[1]: "NoError"}
    got = admin.list_group_offsets({"offline": None})["offline"]
    assert {tp: (o.offset, o.metadata, o.leader_epoch) for tp, o in got.items()} == {
        tps[0]: (5, "a", 2),
        tps[1]: (6, "b", 3),
    }

    member = KpMember(cluster, "kp")
    try:
        wait_until(lambda: member.assigned == ALL)
        groups = {g["group_id"]: g for g in admin.list_groups()}
        assert groups["g"]["protocol_type"] == "consumer"
        assert "offline" in groups
        described = admin.describe_groups(["g"])["g"]
        assert described["group_state"] == "Stable"
        assert [m["client_id"] for m in described["members"]] == ["kp"]
        # An active member subscribes to the topic: its offsets cannot be deleted.
        member.call(lambda c: c.commit({tps[0]: OffsetAndMetadata(1, "", 0)}))
        res = admin.delete_group_offsets("g", [tps[0]])
        assert error_name(res[tps[0]]) == "GroupSubscribedToTopicError"
        deleted = admin.delete_groups(["g", "offline", "nobody"])
        assert deleted == {
            "g": "NonEmptyGroupError",
            "offline": "OK",
            "nobody": "GroupIdNotFoundError",
        }
    finally:
        member.close()
    assert error_name(admin.delete_group_offsets("g", [tps[0]])[tps[0]]) == "NoError"
    assert admin.list_group_offsets({"g": None})["g"] == {}
    assert "offline" not in {g["group_id"] for g in admin.list_groups()}


def test_confluent_admin_lists_describes_and_reads_offsets(
    cluster: EmbeddedCluster, admin: Any
) -> None:
    admin.alter_group_offsets("offline", {TopicPartition(TOPIC, 1): OffsetAndMetadata(7, "", 4)})
    member = KpMember(cluster, "kp")
    a = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
    try:
        wait_until(lambda: member.assigned == ALL)
        listed = a.list_consumer_groups(request_timeout=10).result()
        assert {g.group_id for g in listed.valid} == {"g", "offline"}
        described = a.describe_consumer_groups(["g"], request_timeout=10)["g"].result()
        assert described.state.name == "STABLE"
        assert [m.client_id for m in described.members] == ["kp"]
        assert {
            (tp.topic, tp.partition) for tp in described.members[0].assignment.topic_partitions
        } == ALL
        fut = a.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("offline", [CTopicPartition(TOPIC, 1)])],
            request_timeout=10,
        )["offline"]
        [tp] = fut.result().topic_partitions
        assert (tp.offset, tp.leader_epoch) == (7, 4)
    finally:
        member.close()
