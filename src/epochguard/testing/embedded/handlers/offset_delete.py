"""OffsetDelete v0: drops committed offsets of topics no active member subscribes to."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator, coordinator_error


@handler(OffsetDeleteRequest, OffsetDeleteResponse, 0, 0)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = OffsetDeleteResponse
    T = R.OffsetDeleteResponseTopic
    P = T.OffsetDeleteResponsePartition
    v = ctx.version
    view = ctx.cluster.brokers[ctx.broker_id].view
    error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    if error:
        return R(version=v, error_code=error, throttle_time_ms=0, topics=[])
    known = [
        (t.name, p.partition_index)
        for t in request.topics
        for p in t.partitions
        if view.partition(t.name, p.partition_index) is not None
    ]
    error, results = coordinator(ctx.cluster).delete_offsets(request.group_id, known)
    if error:
        return R(version=v, error_code=error, throttle_time_ms=0, topics=[])
    topics = [
        T(
            version=v,
            name=t.name,
            partitions=[
                P(
                    version=v,
                    partition_index=p.partition_index,
                    error_code=results.get(
                        (t.name, p.partition_index), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    ),
                )
                for p in t.partitions
            ],
        )
        for t in request.topics
    ]
    return R(version=v, error_code=0, throttle_time_ms=0, topics=topics)
