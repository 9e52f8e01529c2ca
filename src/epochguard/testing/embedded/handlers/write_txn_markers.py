"""WriteTxnMarkers v1-v2: markers written by a client on partitions this broker leads.

Kafka's coordinator sends it to partition leaders; admin tools send it too, to abort a
hanging transaction (KIP-664: ``kafka-transactions.sh abort``, kafka-python's
``KafkaAdminClient.abort_transaction``). The EmbeddedCluster's own coordinator writes its
markers in-process; this handler serves the admin path, with Kafka's checks (producer epoch,
coordinator epoch, leadership, min.insync.replicas)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import WriteTxnMarkersRequest, WriteTxnMarkersResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition


@handler(WriteTxnMarkersRequest, WriteTxnMarkersResponse, 1, 2)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = WriteTxnMarkersResponse
    M = R.WritableTxnMarkerResult
    T = M.WritableTxnMarkerTopicResult
    P = T.WritableTxnMarkerPartitionResult
    v = ctx.version
    injected = ctx.injected_error()
    results = []
    for marker in request.markers:
        topics = []
        for t in marker.topics:
            parts = []
            for index in t.partition_indexes:
                local = local_partition(ctx, t.name, index)
                if isinstance(local, int):
                    error = injected or local
                elif injected:
                    error = injected
                else:
                    error = ctx.cluster.append_txn_marker(
                        local.state,
                        ctx.broker_id,
                        local.view.leader_epoch,
                        marker.producer_id,
                        marker.producer_epoch,
                        bool(marker.transaction_result),
                        marker.coordinator_epoch,
                    )
                parts.append(P(version=v, partition_index=index, error_code=error))
            topics.append(T(version=v, name=t.name, partitions=parts))
        results.append(M(version=v, producer_id=marker.producer_id, topics=topics))
    return R(version=v, markers=results)
