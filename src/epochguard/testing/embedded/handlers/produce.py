"""Produce v3-v9: acks 0 (no response), 1 and all (-1, honouring min.insync.replicas).

In a Raft-term cluster (``raft.py``) an acks=all write is flushed by the leader and the
followers that have it, and times out unless a majority of the replicas has it.

A batch of a producer epoch older than the partition's is refused (INVALID_PRODUCER_EPOCH),
and a transactional batch must belong to its producer's open transaction on that partition
(KIP-890's verification: INVALID_TXN_STATE otherwise)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition
from epochguard.testing.embedded.handlers._txn_common import transaction_coordinator
from epochguard.testing.embedded.partition_log import (
    CONTROL_FLAG,
    TRANSACTIONAL_FLAG,
    InvalidRecordBatchError,
    PartitionLog,
    batch_producers,
)


def _producer_error(
    ctx: RequestContext, log: PartitionLog, tp: tuple[str, int], records: Any
) -> int:
    """Kafka's producer-state checks for the batches of one partition."""
    if records is None:
        return ErrorCode.NONE
    try:
        headers = batch_producers(records)
    except InvalidRecordBatchError:
        return ErrorCode.CORRUPT_MESSAGE
    for attributes, producer_id, producer_epoch in headers:
        if producer_id < 0:
            continue
        if attributes & CONTROL_FLAG:
            return ErrorCode.INVALID_REQUEST  # only coordinators write markers
        entry = log.producer(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if attributes & TRANSACTIONAL_FLAG:
            error = transaction_coordinator(ctx.cluster).produce_error(
                producer_id, producer_epoch, tp
            )
            if error:
                return error
    return ErrorCode.NONE


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
                producer_error = _producer_error(ctx, local.log, (td.name, pd.index), pd.records)
                if producer_error:
                    error = producer_error
                elif acks == -1 and current and len(p.isr) < topic.min_insync_replicas:
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
                        elif acks == -1 and cluster.raft is not None:
                            cluster.flush_acknowledged(p)
                            if local.log.high_watermark <= base:
                                error = ErrorCode.REQUEST_TIMED_OUT  # no majority has it
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
