"""Raw protocol answers of the embedded cluster, checked field by field over TCP."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.records import build_batch

from .wire import Wire

pytestmark = pytest.mark.timeout(30)

FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
NOT_LEADER_OR_FOLLOWER = 6
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3


def fetch_request(
    topic: str,
    parts: list[tuple[int, int, int, int]],
    version: int = 12,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
) -> Any:
    """``parts``: (partition, current_leader_epoch, fetch_offset, last_fetched_epoch)."""
    FT = FetchRequest.FetchTopic
    FP = FT.FetchPartition
    return FetchRequest(
        version=version,
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=50_000_000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            FT(
                version=version,
                topic=topic,
                partitions=[
                    FP(
                        version=version,
                        partition=p,
                        current_leader_epoch=cle,
                        fetch_offset=off,
                        last_fetched_epoch=lfe,
                        log_start_offset=-1,
                        partition_max_bytes=1_000_000,
                    )
                    for p, cle, off, lfe in parts
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def fetch(
    cluster: EmbeddedCluster,
    broker: int,
    topic: str,
    parts: list[tuple[int, int, int, int]],
    **kw: Any,
) -> list[Any]:
    w = Wire.to(cluster, broker)
    try:
        resp = w.call(fetch_request(topic, parts, **kw), FetchResponse)
    finally:
        w.close()
    (t,) = resp.responses
    return list(t.partitions)


def oflE(
    cluster: EmbeddedCluster, broker: int, topic: str, partition: int, current: int, epoch: int
) -> Any:
    R = OffsetForLeaderEpochRequest
    T = R.OffsetForLeaderTopic
    req = R(
        version=4,
        replica_id=-1,
        topics=[
            T(
                version=4,
                topic=topic,
                partitions=[
                    T.OffsetForLeaderPartition(
                        version=4,
                        partition=partition,
                        current_leader_epoch=current,
                        leader_epoch=epoch,
                    )
                ],
            )
        ],
    )
    w = Wire.to(cluster, broker)
    try:
        resp = w.call(req, OffsetForLeaderEpochResponse)
    finally:
        w.close()
    return resp.topics[0].partitions[0]


def diverged_cluster(cluster: EmbeddedCluster) -> tuple[int, int]:
    """Epoch 0: offsets 0..9 everywhere, 10..14 on the old leader only; then an unclean
    election (epoch 2) of the follower, which appends 3 records. Returns (old, new) leader."""
    cluster.create_topic("t", replication_factor=2)
    old = cluster.leader("t", 0)
    assert old is not None
    new = next(b for b in cluster.replicas("t", 0) if b != old)
    cluster.append("t", 0, [b"%d" % i for i in range(10)], batch_size=2)
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"lost"] * 5, batch_size=1)
    cluster.stop_broker(old)
    cluster.start_broker(new)
    cluster.elect_leader("t", 0, new, unclean=True)
    cluster.append("t", 0, [b"new"] * 3)
    return old, new


def test_api_versions_advertises_registry_and_answers_unsupported_with_error_35(
    cluster: EmbeddedCluster,
) -> None:
    w = Wire.to(cluster, 1)
    resp = w.call(
        ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1"),
        ApiVersionsResponse,
    )
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert resp.error_code == 0
    assert keys[0] == (3, 9) and keys[1] == (4, 16) and keys[23] == (2, 4)
    assert keys[3] == (0, 13) and keys[18] == (0, 3)
    # A version above ours: header v0 and a v0 body with error 35 naming only ApiVersions'
    # own range, as Kafka answers (KIP-511; the client asks again at a version in it).
    w.send_raw(struct.pack(">ihhi", 10, 18, 99, 77) + struct.pack(">h", -1))
    size = struct.unpack(">i", w._read(4))[0]
    payload = w._read(size)
    assert struct.unpack_from(">i", payload)[0] == 77
    body = ApiVersionsResponse.decode(payload[4:], version=0)
    assert body.error_code == 35
    assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys} == {18: keys[18]}
    w.close()


def test_garbage_and_unknown_apis_close_only_that_connection(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    bad = Wire.to(cluster, 1)
    bad.send_raw(b"\xff\xff\xff\xf0garbage")  # negative size
    assert bad.closed_by_peer()
    bad = Wire.to(cluster, 1)
    bad.send_raw(struct.pack(">ihhi", 8, 999, 0, 1))  # unknown API key
    assert bad.closed_by_peer()
    bad = Wire.to(cluster, 1)
    bad.send_raw(struct.pack(">ihhi", 12, 1, 12, 1) + b"\x00\x05ab")  # truncated Fetch
    assert bad.closed_by_peer()
    bad = Wire.to(cluster, 1)
    bad.send_raw(struct.pack(">ihhi", 8, 1, 2, 1))  # Fetch v2: below our minimum
    assert bad.closed_by_peer()
    # The cluster still serves everyone else.
    w = Wire.to(cluster, 1)
    resp = w.call(
        MetadataRequest(
            version=12,
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
        MetadataResponse,
    )
    assert [t.name for t in resp.topics] == ["t"]
    w.close()


def test_requests_are_counted_per_client_id_and_api(cluster: EmbeddedCluster) -> None:
    metadata = MetadataRequest(
        version=12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    w = Wire.to(cluster, 2)
    for _ in range(3):
        w.call(metadata, MetadataResponse)
    w.close()
    garbage = Wire.to(cluster, 1)
    garbage.send_raw(struct.pack(">ihhi", 8, 3, 12, 1))  # cut short: never decoded
    assert garbage.closed_by_peer()
    counts = cluster.requests_by_client()
    assert counts[("wire-test", 3)] == 3  # tests/embedded/wire.py's client id, Metadata
    assert {client for client, _api in counts} == {"wire-test"}
    assert sum(counts.values()) == sum(cluster.requests_seen().values())


def test_requests_are_traced_with_their_times_once_asked(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    leader = cluster.leader("t", 0)
    assert leader is not None
    other = next(b for b in cluster.broker_ids if b != leader)
    fetch(cluster, leader, "t", [(0, 0, 0, -1)])  # before tracing: not in the trace
    assert cluster.request_trace() == []
    cluster.trace_requests()
    cluster.append("t", 0, [b"a"])
    before = time.time()
    (ok,) = fetch(cluster, leader, "t", [(0, 0, 0, -1)], max_wait_ms=200)
    (refused,) = fetch(cluster, other, "t", [(0, 0, 0, -1)], max_wait_ms=200)
    trace = cluster.request_trace()
    assert [(e["client"], e["api"], e["broker"]) for e in trace] == [
        ("wire-test", 1, leader),
        ("wire-test", 1, other),
    ]
    assert all(e["max_wait_ms"] == 200 for e in trace)
    assert before <= trace[0]["at"] <= trace[0]["answered"] <= trace[1]["at"]
    # the top-level error, then each partition's
    assert trace[0]["errors"] == [0, ok.error_code] == [0, 0]
    assert trace[1]["errors"] == [0, refused.error_code] and refused.error_code != 0


def test_metadata_has_epochs_topic_ids_and_per_broker_views(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=3)
    leader = cluster.leader("t", 0)
    assert leader is not None
    other = next(b for b in cluster.broker_ids if b != leader)
    stale = next(b for b in cluster.broker_ids if b not in (leader, other))
    cluster.set_metadata_delay(stale, 0.5)
    cluster.elect_leader("t", 0, other)

    def view(broker: int) -> Any:
        w = Wire.to(cluster, broker)
        resp = w.call(
            MetadataRequest(
                version=12,
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            MetadataResponse,
        )
        w.close()
        (t,) = resp.topics
        assert str(t.topic_id) == cluster.topic_id("t")
        return next(p for p in t.partitions if p.partition_index == 0)

    fresh = view(other)
    assert (fresh.leader_id, fresh.leader_epoch) == (other, 1)
    old = view(stale)
    assert (old.leader_id, old.leader_epoch) == (leader, 0)
    deadline = time.monotonic() + 5
    while view(stale).leader_epoch != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert view(stale).leader_id == other


def test_fetch_fencing_and_leadership_errors(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=3)
    cluster.append("t", 0, [b"a", b"b"])
    leader = cluster.leader("t", 0)
    assert leader is not None
    follower = next(b for b in cluster.broker_ids if b != leader)
    cluster.elect_leader("t", 0, leader)  # clean re-election: epoch 1
    assert cluster.leader_epoch("t", 0) == 1
    (p,) = fetch(cluster, leader, "t", [(0, 0, 0, -1)])
    assert p.error_code == FENCED_LEADER_EPOCH
    (p,) = fetch(cluster, leader, "t", [(0, 2, 0, -1)])
    assert p.error_code == UNKNOWN_LEADER_EPOCH
    (p,) = fetch(cluster, follower, "t", [(0, 1, 0, -1)])
    assert p.error_code == NOT_LEADER_OR_FOLLOWER
    assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (leader, 1)
    (p,) = fetch(cluster, leader, "t", [(0, 1, 0, -1)])
    assert p.error_code == 0 and p.high_watermark == 2 and len(p.records) > 0
    (p,) = fetch(cluster, leader, "t", [(0, -1, 3, -1)])
    assert p.error_code == OFFSET_OUT_OF_RANGE
    (p,) = fetch(cluster, leader, "t", [(0, -1, 2, -1)])  # at the end: empty, no error
    assert p.error_code == 0 and len(p.records) == 0


def test_fetch_answers_every_requested_partition(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    cluster.append("t", 0, [b"x"])
    leader = cluster.leader("t", 0)
    assert leader is not None
    parts = fetch(cluster, leader, "t", [(0, -1, 0, -1), (7, -1, 0, -1)])
    assert [(p.partition_index, p.error_code) for p in parts] == [
        (0, 0),
        (7, UNKNOWN_TOPIC_OR_PARTITION),
    ]


def test_fetch_long_poll_waits_for_data(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    leader = cluster.leader("t", 0)
    assert leader is not None
    t0 = time.monotonic()
    (p,) = fetch(cluster, leader, "t", [(0, -1, 0, -1)], max_wait_ms=300)
    assert time.monotonic() - t0 >= 0.25 and len(p.records) == 0
    w = Wire.to(cluster, leader)
    w.send(fetch_request("t", [(0, -1, 0, -1)], max_wait_ms=10_000))
    time.sleep(0.1)
    cluster.append("t", 0, [b"wake"])
    t1 = time.monotonic()
    resp = w.receive(FetchResponse, 12)
    assert time.monotonic() - t1 < 5
    assert resp.responses[0].partitions[0].high_watermark == 1
    w.close()


def no_divergence(p: Any) -> bool:
    return p.diverging_epoch is None or p.diverging_epoch.end_offset == -1


def test_fetch_diverging_epoch_v12(cluster: EmbeddedCluster) -> None:
    _, new = diverged_cluster(cluster)
    # Consumer read 0..14 under epoch 0; the new leader's epoch-0 data ends at 10.
    (p,) = fetch(cluster, new, "t", [(0, 2, 15, 0)])
    assert p.error_code == 0 and len(p.records) == 0
    assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (0, 10)
    # Epoch 1 had no leader writing: the largest epoch <= 1 is 0, which ends at 10.
    (p,) = fetch(cluster, new, "t", [(0, 2, 12, 1)])
    assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (0, 10)
    (p,) = fetch(cluster, new, "t", [(0, 2, 10, 0)])  # exactly at the divergence: fine
    assert p.error_code == 0 and no_divergence(p) and len(p.records) > 0
    (p,) = fetch(cluster, new, "t", [(0, 2, 11, 2)])
    assert p.error_code == 0 and no_divergence(p)
    # An epoch newer than any the leader knows: Kafka answers OFFSET_OUT_OF_RANGE.
    (p,) = fetch(cluster, new, "t", [(0, 2, 0, 5)])
    assert p.error_code == OFFSET_OUT_OF_RANGE


def test_offset_for_leader_epoch_semantics(cluster: EmbeddedCluster) -> None:
    old, new = diverged_cluster(cluster)
    assert cluster.epoch_cache("t", 0, new) == [(0, 0), (2, 10)]
    e = oflE(cluster, new, "t", 0, 2, 0)
    assert (e.error_code, e.leader_epoch, e.end_offset) == (0, 0, 10)
    e = oflE(cluster, new, "t", 0, 2, 1)  # largest epoch <= 1 is 0
    assert (e.error_code, e.leader_epoch, e.end_offset) == (0, 0, 10)
    e = oflE(cluster, new, "t", 0, 2, 2)
    assert (e.error_code, e.leader_epoch, e.end_offset) == (0, 2, 13)
    e = oflE(cluster, new, "t", 0, -1, 7)
    assert (e.error_code, e.leader_epoch, e.end_offset) == (0, -1, -1)
    assert oflE(cluster, new, "t", 0, 1, 0).error_code == FENCED_LEADER_EPOCH
    assert oflE(cluster, new, "t", 0, 3, 0).error_code == UNKNOWN_LEADER_EPOCH
    cluster.start_broker(old)
    assert oflE(cluster, old, "t", 0, 2, 0).error_code == NOT_LEADER_OR_FOLLOWER


def test_list_offsets_with_epochs(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=3)
    cluster.append("t", 0, [b"a"], timestamp_ms=1_000)
    cluster.append("t", 0, [b"b", b"c"], timestamp_ms=2_000)
    leader = cluster.leader("t", 0)
    assert leader is not None
    cluster.elect_leader("t", 0, leader)
    cluster.append("t", 0, [b"d"], timestamp_ms=3_000)
    cluster.delete_records("t", 0, 1)

    def lo(ts: int, current: int = 1) -> tuple[int, int, int]:
        R = ListOffsetsRequest
        T = R.ListOffsetsTopic
        req = R(
            version=7,
            replica_id=-1,
            isolation_level=0,
            topics=[
                T(
                    version=7,
                    name="t",
                    partitions=[
                        T.ListOffsetsPartition(
                            version=7, partition_index=0, current_leader_epoch=current, timestamp=ts
                        )
                    ],
                )
            ],
        )
        w = Wire.to(cluster, leader)
        p = w.call(req, ListOffsetsResponse).topics[0].partitions[0]
        w.close()
        return p.error_code, p.offset, p.leader_epoch

    assert lo(-2) == (0, 1, 0)
    assert lo(-1) == (0, 4, 1)
    assert lo(1_500) == (0, 1, 0)
    assert lo(2_500) == (0, 3, 1)
    assert lo(9_000) == (0, -1, -1)
    assert lo(-3) == (0, 3, 1)  # the record with the largest timestamp
    assert lo(-1, current=0)[0] == FENCED_LEADER_EPOCH


def test_list_offsets_debug_replica_id_reads_any_replica_log_end(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=2, config={"min.insync.replicas": "2"})
    leader, follower = cluster.replicas("t", 0)
    cluster.append("t", 0, [b"a", b"b"])
    cluster.stop_broker(follower)
    cluster.append("t", 0, [b"c"])  # below min ISR: not committed (KIP-966)
    assert cluster.high_watermark("t", 0) == 2

    def latest(broker: int, replica_id: int) -> tuple[int, int]:
        R = ListOffsetsRequest
        T = R.ListOffsetsTopic
        req = R(
            version=7,
            replica_id=replica_id,
            isolation_level=0,
            topics=[
                T(
                    version=7,
                    name="t",
                    partitions=[
                        T.ListOffsetsPartition(
                            version=7, partition_index=0, current_leader_epoch=-1, timestamp=-1
                        )
                    ],
                )
            ],
        )
        w = Wire.to(cluster, broker)
        p = w.call(req, ListOffsetsResponse).topics[0].partitions[0]
        w.close()
        return p.error_code, p.offset

    assert latest(leader, -1) == (0, 2)  # a consumer: the high watermark
    assert latest(leader, -2) == (0, 3)  # debugging: the log end offset
    cluster.start_broker(follower)
    assert latest(follower, -2) == (0, 3)  # a follower answers for its own log
    assert latest(follower, -1)[0] == NOT_LEADER_OR_FOLLOWER


def test_produce_acks_zero_gets_no_response_and_min_isr(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=3, config={"min.insync.replicas": "3"})
    leader = cluster.leader("t", 0)
    assert leader is not None

    def produce(acks: int) -> Any:
        T = ProduceRequest.TopicProduceData
        return ProduceRequest(
            version=9,
            transactional_id=None,
            acks=acks,
            timeout_ms=1000,
            topic_data=[
                T(
                    version=9,
                    name="t",
                    partition_data=[
                        T.PartitionProduceData(version=9, index=0, records=build_batch([b"x"]))
                    ],
                )
            ],
        )

    w = Wire.to(cluster, leader)
    w.send(produce(0))
    resp = w.call(produce(-1), ProduceResponse)  # answered first: acks=0 had no response
    assert w.correlation_id == 2
    p = resp.responses[0].partition_responses[0]
    assert (p.error_code, p.base_offset) == (0, 1)
    follower = next(b for b in cluster.broker_ids if b != leader)
    cluster.stop_broker(follower)
    p = w.call(produce(-1), ProduceResponse).responses[0].partition_responses[0]
    assert p.error_code == 19  # NOT_ENOUGH_REPLICAS
    p = w.call(produce(1), ProduceResponse).responses[0].partition_responses[0]
    assert (p.error_code, p.base_offset) == (0, 2)
    w.close()


def test_a_failing_handler_closes_only_its_connection(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epochguard.testing.embedded import handlers

    entry = handlers.REGISTRY[23]

    async def broken(ctx: Any, request: Any) -> Any:
        raise RuntimeError("boom")

    cluster.create_topic("t")
    monkeypatch.setitem(
        handlers.REGISTRY,
        23,
        handlers.ApiEntry(
            broken, entry.min_version, entry.max_version, entry.request_class, entry.response_class
        ),
    )
    w = Wire.to(cluster, 1)
    R = OffsetForLeaderEpochRequest
    w.send(R(version=4, replica_id=-1, topics=[]))
    assert w.closed_by_peer()
    monkeypatch.setitem(handlers.REGISTRY, 23, entry)
    leader = cluster.leader("t", 0)
    assert leader is not None
    assert oflE(cluster, leader, "t", 0, 0, 0).end_offset == 0


def test_describe_topic_partitions_reports_elr(cluster: EmbeddedCluster) -> None:
    from kafka.protocol.admin import (
        DescribeTopicPartitionsRequest,
        DescribeTopicPartitionsResponse,
    )

    cluster.create_topic("t", replication_factor=2)
    first, second = cluster.replicas("t", 0)
    third = next(b for b in cluster.broker_ids if b not in (first, second))
    cluster.stop_broker(second)
    cluster.stop_broker(first)
    req = DescribeTopicPartitionsRequest(
        version=0,
        topics=[DescribeTopicPartitionsRequest.TopicRequest(version=0, name="t")],
        response_partition_limit=100,
        cursor=None,
    )
    w = Wire.to(cluster, third)
    try:
        (t,) = w.call(req, DescribeTopicPartitionsResponse).topics
    finally:
        w.close()
    (p,) = t.partitions
    assert (p.leader_id, p.leader_epoch, list(p.isr_nodes)) == (-1, 1, [])
    assert list(p.eligible_leader_replicas) == [first] == list(p.last_known_elr)
    assert str(t.topic_id) == cluster.topic_id("t")
