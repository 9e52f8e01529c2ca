"""Group coordinator APIs over TCP at explicit versions (raw requests, kafka-python schemas)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from epochguard._errors import ErrorCode
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.handlers._group_common import coordinator_broker

from .wire import Wire

pytestmark = pytest.mark.timeout(30)

OCT = OffsetCommitRequest.OffsetCommitRequestTopic
OCP = OCT.OffsetCommitRequestPartition


def find_coordinator(
    cluster: EmbeddedCluster, key: str, version: int = 3, via: int | None = None
) -> Any:
    if via is None:
        via = next(b for b in cluster.broker_ids if cluster.is_running(b))
    w = Wire.to(cluster, via)
    try:
        return w.call(
            FindCoordinatorRequest(version=version, key=key, key_type=0, coordinator_keys=[key]),
            FindCoordinatorResponse,
        )
    finally:
        w.close()


def coordinator_of(cluster: EmbeddedCluster, group: str) -> int:
    r = find_coordinator(cluster, group)
    assert r.error_code == 0
    return int(r.node_id)


def to_coordinator(cluster: EmbeddedCluster, group: str) -> Wire:
    return Wire.to(cluster, coordinator_of(cluster, group))


def commit(
    w: Wire,
    group: str,
    topic: str,
    parts: dict[int, tuple[int, int]],
    version: int = 8,
    generation: int = -1,
    member: str = "",
    topic_id: uuid.UUID | None = None,
) -> dict[int, int]:
    req = OffsetCommitRequest(
        version=version,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[
            OCT(
                version=version,
                name=topic,
                topic_id=topic_id,
                partitions=[
                    OCP(
                        version=version,
                        partition_index=p,
                        committed_offset=o,
                        committed_leader_epoch=e,
                        committed_metadata=f"m{p}",
                    )
                    for p, (o, e) in parts.items()
                ],
            )
        ],
    )
    resp = w.call(req, OffsetCommitResponse)
    return {p.partition_index: p.error_code for t in resp.topics for p in t.partitions}


def fetch_v7(w: Wire, version: int, group: str, topic: str | None, parts: list[int]) -> Any:
    OFT = OffsetFetchRequest.OffsetFetchRequestTopic
    topics = None if topic is None else [OFT(version=version, name=topic, partition_indexes=parts)]
    return w.call(
        OffsetFetchRequest(version=version, group_id=group, topics=topics, require_stable=False),
        OffsetFetchResponse,
    )


def test_find_coordinator_single_and_batched_forms(cluster: EmbeddedCluster) -> None:
    old = find_coordinator(cluster, "g1", version=3)
    assert old.error_code == 0
    assert old.node_id in cluster.broker_ids
    assert f"{old.host}:{old.port}" == cluster.broker_address(old.node_id)
    w = Wire.to(cluster, cluster.broker_ids[-1])
    keys = [f"g{i}" for i in range(12)]
    new = w.call(
        FindCoordinatorRequest(version=4, key_type=0, coordinator_keys=keys),
        FindCoordinatorResponse,
    )
    w.close()
    by_key = {c.key: (c.error_code, c.node_id) for c in new.coordinators}
    assert by_key["g1"] == (0, old.node_id), "every broker agrees on the coordinator"
    assert set(by_key) == set(keys)
    assert len({n for _, n in by_key.values()}) > 1, "groups spread over brokers"


def test_coordinator_moves_off_a_stopped_broker_and_none_when_all_down(
    cluster: EmbeddedCluster,
) -> None:
    first = coordinator_of(cluster, "g")
    w = to_coordinator(cluster, "g")
    assert commit(w, "g", "t", {}, version=8) == {}
    w.close()
    cluster.stop_broker(first)
    second = coordinator_of(cluster, "g")
    assert second != first
    for b in cluster.broker_ids:
        if b != first:
            cluster.stop_broker(b)
    cluster.start_broker(first)
    assert coordinator_of(cluster, "g") == first
    cluster.stop_broker(first)
    assert cluster.call(lambda: coordinator_broker(cluster.state, "g")) is None


def test_not_coordinator_on_other_brokers(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    coord = coordinator_of(cluster, "g")
    other = next(b for b in cluster.broker_ids if b != coord)
    w = Wire.to(cluster, other)
    try:
        assert commit(w, "g", "t", {0: (1, 0)}) == {0: ErrorCode.NOT_COORDINATOR}
        r = fetch_v7(w, 7, "g", "t", [0])
        assert r.error_code == ErrorCode.NOT_COORDINATOR
        hb = w.call(
            HeartbeatRequest(
                version=4, group_id="g", generation_id=1, member_id="m", group_instance_id=None
            ),
            HeartbeatResponse,
        )
        assert hb.error_code == ErrorCode.NOT_COORDINATOR
    finally:
        w.close()


def test_commit_and_fetch_epochs_across_versions(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=3)
    w = to_coordinator(cluster, "g")
    try:
        assert commit(w, "g", "t", {0: (10, 4), 1: (20, 5)}) == {0: 0, 1: 0}
        # v1: no epoch field; v5-v7: committed_leader_epoch.
        for version in (1, 2, 4, 5, 6, 7):
            r = fetch_v7(w, version, "g", "t", [0, 1, 2])
            got = {
                p.partition_index: (p.committed_offset, p.error_code)
                for p in r.topics[0].partitions
            }
            assert got == {0: (10, 0), 1: (20, 0), 2: (-1, 0)}
            if version >= 5:
                epochs = {
                    p.partition_index: p.committed_leader_epoch for p in r.topics[0].partitions
                }
                assert epochs == {0: 4, 1: 5, 2: -1}
                assert r.topics[0].partitions[0].metadata == "m0"
        # v2+: topics=None lists every committed partition.
        everything = fetch_v7(w, 6, "g", None, [])
        assert sorted(
            (t.name, p.partition_index, p.committed_leader_epoch)
            for t in everything.topics
            for p in t.partitions
        ) == [("t", 0, 4), ("t", 1, 5)]
        # Commit v2-v5 carry no epoch: it is stored as -1.
        assert commit(w, "g", "t", {2: (30, 9)}, version=5) == {2: 0}
        r = fetch_v7(w, 7, "g", "t", [2])
        assert r.topics[0].partitions[0].committed_leader_epoch == -1
        assert commit(w, "g", "nope", {0: (1, 1)}) == {0: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert commit(w, "g", "t", {7: (1, 1)}) == {7: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    finally:
        w.close()


def test_offset_fetch_v8_batched_groups(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2)
    # Pick two groups with the same coordinator so one request can ask for both.
    coord = coordinator_of(cluster, "a")
    other = next(n for n in (f"b{i}" for i in range(100)) if coordinator_of(cluster, n) == coord)
    w = Wire.to(cluster, coord)
    try:
        commit(w, "a", "t", {0: (1, 11)})
        commit(w, other, "t", {1: (2, 22)})
        Grp = OffsetFetchRequest.OffsetFetchRequestGroup
        GT = Grp.OffsetFetchRequestTopics
        for version in (8, 9):
            req = OffsetFetchRequest(
                version=version,
                require_stable=False,
                groups=[
                    Grp(
                        version=version,
                        group_id="a",
                        member_id=None,
                        member_epoch=-1,
                        topics=[GT(version=version, name="t", partition_indexes=[0, 1])],
                    ),
                    Grp(
                        version=version,
                        group_id=other,
                        member_id=None,
                        member_epoch=-1,
                        topics=None,
                    ),
                ],
            )
            r = w.call(req, OffsetFetchResponse)
            got = {
                grp.group_id: (
                    grp.error_code,
                    sorted(
                        (p.partition_index, p.committed_offset, p.committed_leader_epoch)
                        for t in grp.topics
                        for p in t.partitions
                    ),
                )
                for grp in r.groups
            }
            assert got == {"a": (0, [(0, 1, 11), (1, -1, -1)]), other: (0, [(1, 2, 22)])}
    finally:
        w.close()


def test_offset_commit_and_fetch_v10_by_topic_id(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    tid = uuid.UUID(cluster.topic_id("t"))
    w = to_coordinator(cluster, "g")
    try:
        req = OffsetCommitRequest(
            version=10,
            group_id="g",
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=[
                OCT(
                    version=10,
                    topic_id=tid,
                    partitions=[
                        OCP(
                            version=10,
                            partition_index=0,
                            committed_offset=7,
                            committed_leader_epoch=3,
                            committed_metadata=None,
                        )
                    ],
                )
            ],
        )
        resp = w.call(req, OffsetCommitResponse)
        assert resp.topics[0].topic_id == tid
        assert resp.topics[0].partitions[0].error_code == 0
        Grp = OffsetFetchRequest.OffsetFetchRequestGroup
        r = w.call(
            OffsetFetchRequest(
                version=10,
                require_stable=False,
                groups=[
                    Grp(
                        version=10,
                        group_id="g",
                        member_id=None,
                        member_epoch=-1,
                        topics=[
                            Grp.OffsetFetchRequestTopics(
                                version=10, topic_id=tid, partition_indexes=[0]
                            )
                        ],
                    )
                ],
            ),
            OffsetFetchResponse,
        )
        t = r.groups[0].topics[0]
        assert t.topic_id == tid
        assert (t.partitions[0].committed_offset, t.partitions[0].committed_leader_epoch) == (7, 3)
    finally:
        w.close()


def test_deleted_topic_drops_offsets(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    w = to_coordinator(cluster, "g")
    try:
        commit(w, "g", "t", {0: (5, 0)})
        cluster.delete_topic("t")
        cluster.create_topic("t")
        r = fetch_v7(w, 7, "g", "t", [0])
        assert (
            r.topics[0].partitions[0].committed_offset,
            r.topics[0].partitions[0].committed_leader_epoch,
        ) == (-1, -1)
        assert fetch_v7(w, 7, "g", None, []).topics == []
    finally:
        w.close()


def test_a_coordinator_that_has_not_learnt_the_topic_still_returns_the_commit(
    cluster: EmbeddedCluster,
) -> None:
    # Found by the chaos schedules (tests/chaos): a restarted coordinator with late metadata
    # answered "no commit", and the restarted consumer re-read from the log start. Kafka's
    # coordinator answers from its offsets store, whatever its metadata cache holds.
    cluster.create_topic("t")
    coord = coordinator_of(cluster, "g")
    w = Wire.to(cluster, coord)
    try:
        assert commit(w, "g", "t", {0: (5, 0)}) == {0: 0}
    finally:
        w.close()
    cluster.set_metadata_delay(coord, 5.0)
    cluster.stop_broker(coord)
    cluster.start_broker(coord)
    assert cluster.broker_view("t", 0, coord) is None  # the restarted broker lags
    w = Wire.to(cluster, coord)
    try:
        r = fetch_v7(w, 7, "g", "t", [0])
        p = r.topics[0].partitions[0]
        assert (p.committed_offset, p.committed_leader_epoch, p.error_code) == (5, 0, 0)
    finally:
        w.close()


def join_request(version: int, member_id: str = "", instance: str | None = None) -> Any:
    P = JoinGroupRequest.JoinGroupRequestProtocol
    return JoinGroupRequest(
        version=version,
        group_id="g",
        session_timeout_ms=6000,
        rebalance_timeout_ms=6000,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=[P(version=version, name="range", metadata=b"meta")],
        reason=None,
    )


@pytest.mark.parametrize("version", [0, 3, 4, 5, 7, 9])
def test_join_sync_heartbeat_leave_round_trip(cluster: EmbeddedCluster, version: int) -> None:
    w = to_coordinator(cluster, "g")
    try:
        r = w.call(join_request(version), JoinGroupResponse)
        if version >= 4:
            assert r.error_code == ErrorCode.MEMBER_ID_REQUIRED
            r = w.call(join_request(version, r.member_id), JoinGroupResponse)
        assert r.error_code == 0
        assert (r.generation_id, r.protocol_name, r.leader) == (1, "range", r.member_id)
        assert [(m.member_id, m.metadata) for m in r.members] == [(r.member_id, b"meta")]
        member = r.member_id
        sv = min(version, 5)
        SA = SyncGroupRequest.SyncGroupRequestAssignment
        s = w.call(
            SyncGroupRequest(
                version=sv,
                group_id="g",
                generation_id=1,
                member_id=member,
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[SA(version=sv, member_id=member, assignment=b"mine")],
            ),
            SyncGroupResponse,
        )
        assert (s.error_code, s.assignment) == (0, b"mine")
        hv = min(version, 4)
        hb = w.call(
            HeartbeatRequest(
                version=hv, group_id="g", generation_id=1, member_id=member, group_instance_id=None
            ),
            HeartbeatResponse,
        )
        assert hb.error_code == 0
        lv = min(version, 5)
        MI = LeaveGroupRequest.MemberIdentity
        members = (
            []
            if lv < 3
            else [
                MI(version=lv, member_id=m, group_instance_id=None, reason=None)
                for m in (member, "ghost")
            ]
        )
        leave = w.call(
            LeaveGroupRequest(version=lv, group_id="g", member_id=member, members=members),
            LeaveGroupResponse,
        )
        assert leave.error_code == 0
        if lv >= 3:
            assert [(m.member_id, m.error_code) for m in leave.members] == [
                (member, 0),
                ("ghost", ErrorCode.UNKNOWN_MEMBER_ID),
            ]
        hb = w.call(
            HeartbeatRequest(
                version=hv, group_id="g", generation_id=1, member_id=member, group_instance_id=None
            ),
            HeartbeatResponse,
        )
        assert hb.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    finally:
        w.close()


def test_describe_and_list_groups(cluster: EmbeddedCluster) -> None:
    coord = coordinator_of(cluster, "g")
    w = Wire.to(cluster, coord)
    try:
        r = w.call(join_request(3), JoinGroupResponse)
        member = r.member_id
        d = w.call(
            DescribeGroupsRequest(
                version=5, groups=["g", "unknown"], include_authorized_operations=False
            ),
            DescribeGroupsResponse,
        )
        by_id = {x.group_id: x for x in d.groups}
        assert by_id["g"].group_state == "CompletingRebalance"
        assert [m.member_id for m in by_id["g"].members] == [member]
        assert by_id["g"].members[0].client_id == "wire-test"
        assert (by_id["unknown"].error_code, by_id["unknown"].group_state) == (0, "Dead")
        for version in (0, 4, 5):
            lg = w.call(
                ListGroupsRequest(version=version, states_filter=[], types_filter=[]),
                ListGroupsResponse,
            )
            assert [(x.group_id, x.protocol_type) for x in lg.groups] == [("g", "consumer")]
        stable = w.call(ListGroupsRequest(version=4, states_filter=["Stable"]), ListGroupsResponse)
        assert stable.groups == []
    finally:
        w.close()
    other = next(b for b in cluster.broker_ids if b != coord)
    w = Wire.to(cluster, other)
    try:
        lg = w.call(ListGroupsRequest(version=3), ListGroupsResponse)
        assert lg.groups == [], "a broker lists only the groups it coordinates"
    finally:
        w.close()


def test_committed_epoch_reveals_truncation_after_unclean_election(
    cluster: EmbeddedCluster,
) -> None:
    """The KIP-320 chain a restarted consumer follows: OffsetFetch gives (offset, epoch), and
    OffsetForLeaderEpoch(epoch) on the new leader shows the log now ends before it."""
    from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

    from .test_protocol import diverged_cluster

    _, new = diverged_cluster(cluster)  # offsets 10..14 of epoch 0 exist only on `old`
    # The consumer had read up to offset 15 under epoch 0 (before the election) and committed.
    w = to_coordinator(cluster, "g")
    try:
        assert commit(w, "g", "t", {0: (15, 0)}) == {0: 0}
        r = fetch_v7(w, 7, "g", "t", [0])
    finally:
        w.close()
    committed = r.topics[0].partitions[0]
    assert (committed.committed_offset, committed.committed_leader_epoch) == (15, 0)

    R = OffsetForLeaderEpochRequest
    T = R.OffsetForLeaderTopic
    current = cluster.leader_epoch("t", 0)
    w = Wire.to(cluster, new)
    try:
        resp = w.call(
            R(
                version=4,
                replica_id=-1,
                topics=[
                    T(
                        version=4,
                        topic="t",
                        partitions=[
                            T.OffsetForLeaderPartition(
                                version=4,
                                partition=0,
                                current_leader_epoch=current,
                                leader_epoch=committed.committed_leader_epoch,
                            )
                        ],
                    )
                ],
            ),
            OffsetForLeaderEpochResponse,
        )
    finally:
        w.close()
    p = resp.topics[0].partitions[0]
    assert p.error_code == 0
    assert (p.leader_epoch, p.end_offset) == (0, 10)
    assert p.end_offset < committed.committed_offset, "the committed position was truncated"
