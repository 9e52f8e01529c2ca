"""DescribeTopicPartitions v0 (KIP-966): partitions with eligible leader replicas."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers.metadata import ZERO_UUID


@handler(DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, 0, 0)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DescribeTopicPartitionsResponse
    T = R.DescribeTopicPartitionsResponseTopic
    P = T.DescribeTopicPartitionsResponsePartition
    v = ctx.version
    view = ctx.cluster.brokers[ctx.broker_id].view
    names = [t.name for t in request.topics] or sorted(view.topics)
    start = request.cursor
    limit = max(1, request.response_partition_limit)
    topics = []
    remaining = limit
    next_cursor = None
    for name in sorted(names) if not request.topics else names:
        if start is not None and name < start.topic_name:
            continue
        tv = view.topics.get(name)
        if tv is None:
            topics.append(
                T(
                    version=v,
                    error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    name=name,
                    topic_id=ZERO_UUID,
                    is_internal=False,
                    partitions=[],
                )
            )
            continue
        parts = []
        for idx in sorted(tv.partitions):
            if start is not None and name == start.topic_name and idx < start.partition_index:
                continue
            if remaining == 0:
                next_cursor = R.Cursor(version=v, topic_name=name, partition_index=idx)
                break
            pv = tv.partitions[idx]
            parts.append(
                P(
                    version=v,
                    error_code=ErrorCode.LEADER_NOT_AVAILABLE if pv.leader < 0 else 0,
                    partition_index=idx,
                    leader_id=pv.leader,
                    leader_epoch=pv.leader_epoch,
                    replica_nodes=list(pv.replicas),
                    isr_nodes=list(pv.isr),
                    eligible_leader_replicas=list(pv.elr),
                    last_known_elr=list(pv.last_known_elr),
                    offline_replicas=list(pv.offline),
                )
            )
            remaining -= 1
        topics.append(
            T(
                version=v,
                error_code=0,
                name=name,
                topic_id=tv.topic_id,
                is_internal=False,
                partitions=parts,
            )
        )
        if next_cursor is not None:
            break
    return R(version=v, throttle_time_ms=0, topics=topics, next_cursor=next_cursor)
