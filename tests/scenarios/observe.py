"""What a cluster answers on the wire, asked the same way of any ``Cluster`` implementation.

Each call finds the partition leader through Metadata v12 from a running broker and sends one
request to it, so the answers are the broker's own, not a client library's interpretation.
"""

from __future__ import annotations

from typing import Any

import attrs
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.record.memory_records import MemoryRecords

from epochguard.testing import Cluster
from epochguard.testing.apache_kafka.wire import call, error_name


@attrs.frozen
class FetchAnswer:
    error: str
    high_watermark: int
    diverging_epoch: tuple[int, int] | None  # (epoch, end offset)
    records: tuple[tuple[int, int, str], ...]  # (offset, leader epoch, value)


def _address(server: str) -> tuple[str, int]:
    host, port = server.rsplit(":", 1)
    return host, int(port)


class Observer:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def _metadata(self, topic: str) -> Any:
        req = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False,
        )
        servers = self.cluster.bootstrap_servers.split(",")
        return call(_address(servers[0]), req, MetadataResponse, 12)

    def leader_and_epoch(self, topic: str, partition: int) -> tuple[tuple[str, int], int]:
        meta = self._metadata(topic)
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
        for t in meta.topics:
            for p in t.partitions:
                if t.name == topic and p.partition_index == partition:
                    return brokers[p.leader_id], p.leader_epoch
        raise LookupError(f"{topic}-{partition} not in metadata")

    def metadata_epoch(self, topic: str, partition: int) -> int:
        return self.leader_and_epoch(topic, partition)[1]

    def offset_for_leader_epoch(
        self, topic: str, partition: int, epoch: int, current_leader_epoch: int = -1
    ) -> tuple[str, int, int]:
        leader, _ = self.leader_and_epoch(topic, partition)
        part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
            partition=partition, current_leader_epoch=current_leader_epoch, leader_epoch=epoch
        )
        req = OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=[
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[part])
            ],
        )
        p = call(leader, req, OffsetForLeaderEpochResponse, 4).topics[0].partitions[0]
        return error_name(p.error_code), p.leader_epoch, p.end_offset

    def offset_fetch(self, group: str, topic: str, partition: int) -> tuple[str, int, int]:
        """(error, committed offset, committed leader epoch) from the group's coordinator
        (FindCoordinator v3, OffsetFetch v7: the last single-group versions)."""
        servers = self.cluster.bootstrap_servers.split(",")
        found = call(
            _address(servers[0]),
            FindCoordinatorRequest(key=group, key_type=0),
            FindCoordinatorResponse,
            3,
        )
        if found.error_code:
            return error_name(found.error_code), -1, -1
        req = OffsetFetchRequest(
            group_id=group,
            topics=[
                OffsetFetchRequest.OffsetFetchRequestTopic(
                    name=topic, partition_indexes=[partition]
                )
            ],
            require_stable=False,
        )
        resp = call((found.host, found.port), req, OffsetFetchResponse, 7)
        if resp.error_code:
            return error_name(resp.error_code), -1, -1
        p = resp.topics[0].partitions[0]
        return error_name(p.error_code), p.committed_offset, p.committed_leader_epoch

    def list_offsets(self, topic: str, partition: int, timestamp: int) -> tuple[str, int, int]:
        leader, _ = self.leader_and_epoch(topic, partition)
        part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
        )
        req = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])],
        )
        p = call(leader, req, ListOffsetsResponse, 6).topics[0].partitions[0]
        return error_name(p.error_code), p.offset, p.leader_epoch

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        current_leader_epoch: int = -1,
        last_fetched_epoch: int = -1,
    ) -> FetchAnswer:
        """Fetch v12 (topic names, ``LastFetchedEpoch``) from the leader, no waiting."""
        leader, _ = self.leader_and_epoch(topic, partition)
        part = FetchRequest.FetchTopic.FetchPartition(
            partition=partition,
            current_leader_epoch=current_leader_epoch,
            fetch_offset=offset,
            last_fetched_epoch=last_fetched_epoch,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        req = FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])],
            forgotten_topics_data=[],
            rack_id="",
        )
        p = call(leader, req, FetchResponse, 12).responses[0].partitions[0]
        diverging = None
        if p.diverging_epoch is not None and p.diverging_epoch.epoch >= 0:
            diverging = (p.diverging_epoch.epoch, p.diverging_epoch.end_offset)
        records: list[tuple[int, int, str]] = []
        raw = p.records
        if raw:
            batches = MemoryRecords(bytes(raw))
            while (batch := batches.next_batch()) is not None:
                epoch = batch.leader_epoch
                for r in batch:
                    records.append((r.offset, epoch, (r.value or b"").decode()))
        return FetchAnswer(error_name(p.error_code), p.high_watermark, diverging, tuple(records))
