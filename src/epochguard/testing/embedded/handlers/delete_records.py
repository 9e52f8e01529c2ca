"""DeleteRecords v0-v2: advances the leader's log start offset (followers learn it by fetching)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition


@handler(DeleteRecordsRequest, DeleteRecordsResponse, 0, 2)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DeleteRecordsResponse
    T = R.DeleteRecordsTopicResult
    P = T.DeleteRecordsPartitionResult
    v = ctx.version
    injected = ctx.injected_error()
    topics = []
    for t in request.topics:
        parts = []
        for rp in t.partitions:
            local = local_partition(ctx, t.name, rp.partition_index)
            low, error = -1, injected
            if not error and isinstance(local, int):
                error = local
            elif not error and not isinstance(local, int):
                hw = local.log.high_watermark
                offset = hw if rp.offset == -1 else rp.offset
                if offset < 0 or offset > hw:
                    error = ErrorCode.OFFSET_OUT_OF_RANGE
                else:
                    low = ctx.cluster.delete_records(t.name, rp.partition_index, offset)
            parts.append(
                P(
                    version=v,
                    partition_index=rp.partition_index,
                    low_watermark=low,
                    error_code=error,
                )
            )
        topics.append(T(version=v, name=t.name, partitions=parts))
    return R(version=v, throttle_time_ms=0, topics=topics)
