"""Differential: OffsetCommit and OffsetFetch by topic id (v10, KIP-848) on real Kafka and on
the EmbeddedCluster give the same answers: the versions the brokers offer, UNKNOWN_TOPIC_ID
for an id the coordinator does not know (a deleted topic's included), a commit by id read
back by id and by name, an id that does not match the commit answered "no commit", and a
re-created topic's commits gone with the deleted one; and a member's commit to a group the
coordinator does not have, answered GROUP_ID_NOT_FOUND from v9 on. Then EpochConsumer's
commits by id across a re-creation (membership.CommitNaming) on the real brokers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kafka.protocol.consumer import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.structs import TopicPartition

from epochguard import EpochConsumer
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.testing import EmbeddedCluster, produce
from epochguard.testing.apache_kafka import ApacheKafkaCluster

from ..embedded.wire import Wire

pytestmark = pytest.mark.timeout(180)

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
UNKNOWN_TOPIC_OR_PARTITION, ILLEGAL_GENERATION, GROUP_ID_NOT_FOUND, UNKNOWN_TOPIC_ID = (
    3,
    22,
    69,
    100,
)


def _max_versions(w: Wire) -> dict[int, int]:
    resp = w.call(
        ApiVersionsRequest(
            version=3, client_software_name="epochguard-test", client_software_version="0"
        ),
        ApiVersionsResponse,
    )
    assert resp.error_code == 0
    return {k.api_key: k.max_version for k in resp.api_keys if k.api_key in (8, 9)}


def _topic_id(w: Wire, topic: str) -> uuid.UUID:
    deadline = time.monotonic() + 30
    while True:
        resp = w.call(
            MetadataRequest(
                version=12,
                topics=[MetadataRequest.MetadataRequestTopic(version=12, name=topic)],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            MetadataResponse,
        )
        (t,) = resp.topics
        if t.error_code == 0 and t.topic_id.int != 0:
            return t.topic_id
        assert time.monotonic() < deadline, f"no id for {topic}"
        time.sleep(0.1)


def _coordinator(w: Wire, group: str) -> int:
    deadline = time.monotonic() + 30
    while True:
        resp = w.call(
            FindCoordinatorRequest(version=4, key_type=0, coordinator_keys=[group]),
            FindCoordinatorResponse,
        )
        (c,) = resp.coordinators
        if c.error_code == 0:
            return int(c.node_id)
        assert time.monotonic() < deadline, f"no coordinator for {group}"
        time.sleep(0.2)


def _commit(
    w: Wire,
    version: int,
    group: str,
    topic: str,
    tid: uuid.UUID,
    parts: dict[int, int],
    generation: int = -1,
) -> dict[int, int]:
    """Each partition's error (Kafka lists the partitions it refuses itself first)."""
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    P = T.OffsetCommitRequestPartition
    resp = w.call(
        OffsetCommitRequest(
            version=version,
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id="" if generation < 0 else "member",
            group_instance_id=None,
            topics=[
                T(
                    version=version,
                    name=topic,
                    topic_id=tid,
                    partitions=[
                        P(
                            version=version,
                            partition_index=p,
                            committed_offset=o,
                            committed_leader_epoch=0,
                            committed_metadata="m",
                        )
                        for p, o in parts.items()
                    ],
                )
            ],
        ),
        OffsetCommitResponse,
    )
    (t,) = resp.topics
    if version >= 10:
        assert t.topic_id == tid  # the answer names the topic as the request did
    return {p.partition_index: p.error_code for p in t.partitions}


def _fetch(w: Wire, version: int, group: str, topic: str, tid: uuid.UUID) -> tuple[int, int, int]:
    """(committed offset, committed epoch, error) of partition 0."""
    if version < 8:
        OFT = OffsetFetchRequest.OffsetFetchRequestTopic
        r = w.call(
            OffsetFetchRequest(
                version=version,
                group_id=group,
                topics=[OFT(version=version, name=topic, partition_indexes=[0])],
                require_stable=False,
            ),
            OffsetFetchResponse,
        )
        assert r.error_code == 0
        (p,) = r.topics[0].partitions
        return (p.committed_offset, p.committed_leader_epoch, p.error_code)
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    r = w.call(
        OffsetFetchRequest(
            version=version,
            require_stable=False,
            groups=[
                G(
                    version=version,
                    group_id=group,
                    member_id=None,
                    member_epoch=-1,
                    topics=[
                        G.OffsetFetchRequestTopics(
                            version=version, name=topic, topic_id=tid, partition_indexes=[0]
                        )
                    ],
                )
            ],
        ),
        OffsetFetchResponse,
    )
    (g,) = r.groups
    assert g.error_code == 0
    (t,) = g.topics
    if version >= 10:
        assert t.topic_id == tid
    (p,) = t.partitions
    return (p.committed_offset, p.committed_leader_epoch, p.error_code)


def _eventually(probe: Callable[[], Any], want: Any, timeout: float = 30.0) -> Any:
    """``probe()`` once it answers ``want`` (Kafka's coordinator drops a deleted topic's
    offsets a moment after its metadata forgot the topic), or its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _observe(
    address: Callable[[int], str],
    any_broker: str,
    create: Callable[[str], None],
    delete: Callable[[str], None],
    run_id: str,
) -> dict[str, Any]:
    topic, group = f"byid-{run_id}", f"byid-group-{run_id}"
    seen: dict[str, Any] = {}
    w = Wire(any_broker)
    try:
        seen["max_versions"] = _max_versions(w)
        create(topic)
        tid = _topic_id(w, topic)
        c = Wire(address(_coordinator(w, group)))
        # Another group id may hash to another coordinator.
        missing = f"{group}-none"
        m = Wire(address(_coordinator(w, missing)))
    finally:
        w.close()
    try:
        stranger = uuid.uuid4()
        seen["commit_unknown_id"] = _commit(c, 10, group, topic, stranger, {0: 1})
        seen["commit_by_id"] = _commit(c, 10, group, topic, tid, {0: 7, 5: 1})
        seen["fetch_by_id"] = _fetch(c, 10, group, topic, tid)
        seen["fetch_by_name"] = _fetch(c, 7, group, topic, tid)
        seen["fetch_v9_by_name"] = _fetch(c, 9, group, topic, tid)
        seen["fetch_unknown_id"] = _fetch(c, 10, group, topic, stranger)[2]
        # A member's commit (a generation) to a group the coordinator does not have.
        for v in (8, 9, 10):
            seen[f"missing_group_v{v}"] = _commit(m, v, missing, topic, tid, {0: 1}, 1)

        delete(topic)
        create(topic)
        w = Wire(any_broker)
        try:
            new_tid = _topic_id(w, topic)
        finally:
            w.close()
        assert new_tid != tid
        gone = (-1, -1, 0)
        seen["recreated_fetch_by_id"] = _eventually(
            lambda: _fetch(c, 10, group, topic, new_tid), gone
        )
        seen["recreated_fetch_by_name"] = _fetch(c, 7, group, topic, new_tid)
        seen["commit_deleted_id"] = _eventually(
            lambda: _commit(c, 10, group, topic, tid, {0: 3}), {0: UNKNOWN_TOPIC_ID}
        )
        # A commit by name is filed under the id the coordinator's metadata gives the name.
        seen["commit_by_name"] = _commit(c, 9, group, topic, tid, {0: 4})
        seen["new_fetch_by_id"] = _fetch(c, 10, group, topic, new_tid)
        seen["old_fetch_by_id"] = _fetch(c, 10, group, topic, tid)[2]
    finally:
        c.close()
        m.close()
    return seen


EXPECTED = {
    "max_versions": {OFFSET_COMMIT: 10, OFFSET_FETCH: 10},
    "commit_unknown_id": {0: UNKNOWN_TOPIC_ID},
    "commit_by_id": {0: 0, 5: UNKNOWN_TOPIC_OR_PARTITION},
    "fetch_by_id": (7, 0, 0),
    "fetch_by_name": (7, 0, 0),
    "fetch_v9_by_name": (7, 0, 0),
    "fetch_unknown_id": UNKNOWN_TOPIC_ID,
    "missing_group_v8": {0: ILLEGAL_GENERATION},
    "missing_group_v9": {0: GROUP_ID_NOT_FOUND},
    "missing_group_v10": {0: GROUP_ID_NOT_FOUND},
    "recreated_fetch_by_id": (-1, -1, 0),
    "recreated_fetch_by_name": (-1, -1, 0),
    "commit_deleted_id": {0: UNKNOWN_TOPIC_ID},
    "commit_by_name": {0: 0},
    "new_fetch_by_id": (4, 0, 0),
    "old_fetch_by_id": UNKNOWN_TOPIC_ID,
}


def test_offsets_by_topic_id_answer_alike(cluster: ApacheKafkaCluster) -> None:
    run_id = uuid.uuid4().hex[:8]
    real = _observe(
        cluster.broker_address,
        cluster.broker_address(cluster.broker_ids[0]),
        lambda t: cluster.create_topic(t, partitions=1, replication_factor=3),
        cluster.delete_topic,
        run_id,
    )
    with EmbeddedCluster(brokers=3) as embedded:
        emulated = _observe(
            embedded.broker_address,
            embedded.broker_address(embedded.broker_ids[0]),
            lambda t: embedded.create_topic(t, partitions=1, replication_factor=3),
            embedded.delete_topic,
            run_id,
        )
    assert real == EXPECTED
    assert emulated == real


def test_commits_by_id_keep_a_deleted_incarnation_s_position_on_real_kafka(
    cluster: ApacheKafkaCluster,
) -> None:
    """EpochConsumer on Kafka 4.3.1: a commit of its position goes by topic id and reads
    back; after the topic is deleted and re-created, the consumer's commit of its position
    in the deleted incarnation (made before it noticed) is refused by id, a leader names the
    new id, and the commit goes by name, so the next session reports the re-creation."""
    topic = f"by-id-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    produce(cluster, topic, [f"old-{i}" for i in range(8)])
    settings: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "group_id": f"by-id-{topic}",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 100,
        "allow_auto_create_topics": False,
    }

    def read(consumer: EpochConsumer, n: int) -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n}"
            for recs in consumer.poll(timeout_ms=100, max_records=n - len(got)).values():
                got += [r.value for r in recs]
        return got

    # Metadata asked once: the consumer does not learn of the re-creation before it commits.
    with EpochConsumer(**settings, metadata_max_age_ms=300_000) as first:
        first.assign([tp])
        assert read(first, 5) == [f"old-{i}".encode() for i in range(5)]
        assert first.position_with_epoch(tp).topic_id is not None
        first.commit()
        assert first.committed(tp) == 5
        cluster.delete_topic(topic)
        cluster.create_topic(topic, partitions=1, replication_factor=3)
        produce(cluster, topic, [f"new-{i}" for i in range(3)])
        first.commit()  # offset 5 of the deleted incarnation
    with EpochConsumer(**settings, on_truncation="rewind") as nxt:
        nxt.assign([tp])
        assert read(nxt, 3) == [f"new-{i}".encode() for i in range(3)]
        [rep] = nxt.truncation_reports()
        assert rep.detected_by is DetectedBy.TOPIC_RECREATED
        assert rep.divergence == EpochOffset(0, None) and rep.lost_count == 5
