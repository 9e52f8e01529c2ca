"""Produce v3-v9: acks 0 (no response), 1 and all (-1, honouring min.insync.replicas)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition
from epochguard.testing.embedded.partition_log import InvalidRecordBatchError


@handler(ProduceRequest, ProduceResponse, 3, 9)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ProduceResponse
    T = R.TopicProduceResponse
    P = T.PartitionProduceResponse
    v = ctx.version
    acks = request.acks
    cluster = ctx.cluster
    injected = ctx.injected_error()
    topics = []
    for td in request.topic_data:
        parts = []
        for pd in td.partition_data:
            error, base, start = 0, -1, -1
            local = local_partition(ctx, td.name, pd.index)
            if injected:
                error = injected
            elif acks not in (0, 1, -1):
                error = ErrorCode.INVALID_REQUIRED_ACKS
            elif isinstance(local, int):
                error = local
            elif pd.records is None or len(pd.records) == 0:
                error = ErrorCode.CORRUPT_MESSAGE
            else:
                p = local.state
                topic = cluster.topics[td.name]
                current = p.leader == ctx.broker_id and p.leader_epoch == local.view.leader_epoch
                if acks == -1 and current and len(p.isr) < topic.min_insync_replicas:
                    error = ErrorCode.NOT_ENOUGH_REPLICAS
                else:
                    try:
                        base, _ = cluster.append(
                            p, ctx.broker_id, pd.records, local.view.leader_epoch
                        )
                    except InvalidRecordBatchError:
                        error = ErrorCode.CORRUPT_MESSAGE
                    else:
                        start = local.log.log_start_offset
                        if acks == -1 and not current:
                            # A stale leader has no followers fetching from it.
                            error = ErrorCode.REQUEST_TIMED_OUT
            parts.append(
                P(
                    version=v,
                    index=pd.index,
                    error_code=error,
                    base_offset=base,
                    log_append_time_ms=-1,
                    log_start_offset=start,
                    record_errors=[],
                    error_message=None,
                )
            )
        topics.append(T(version=v, name=td.name, partition_responses=parts))
    if acks == 0:
        return None
    return R(version=v, responses=topics, throttle_time_ms=0)
