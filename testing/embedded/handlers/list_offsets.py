"""ListOffsets v1-v6: earliest (-2), latest (-1) and by timestamp, with leader epochs."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.record.default_records import DefaultRecordBatch

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition
from epochguard.testing.embedded.partition_log import PartitionLog

LATEST = -1
EARLIEST = -2
DEBUGGING_REPLICA_ID = -2


def _by_timestamp(log: PartitionLog, timestamp: int, upper: int) -> tuple[int, int, int]:
    """(timestamp, offset, epoch) of the first record at or after ``timestamp``."""
    for raw in log.batches_from(log.log_start_offset):
        batch = DefaultRecordBatch(raw)
        if batch.base_offset >= upper:
            break
        if batch.max_timestamp < timestamp:
            continue
        for rec in batch:
            if rec.offset >= upper:
                break
            if rec.offset >= log.log_start_offset and rec.timestamp >= timestamp:
                return rec.timestamp, rec.offset, batch.leader_epoch
    return -1, -1, -1


@handler(ListOffsetsRequest, ListOffsetsResponse, 1, 6)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ListOffsetsResponse
    T = R.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    v = ctx.version
    injected = ctx.injected_error()
    topics = []
    for t in request.topics:
        parts = []
        for rp in t.partitions:
            local = local_partition(ctx, t.name, rp.partition_index, rp.current_leader_epoch,
                                    require_leader=request.replica_id != DEBUGGING_REPLICA_ID)
            if injected or isinstance(local, int):
                parts.append(P(version=v, partition_index=rp.partition_index,
                               error_code=injected or local, timestamp=-1, offset=-1,
                               leader_epoch=-1))
                continue
            log = local.log
            upper = log.high_watermark if request.replica_id < 0 else log.log_end_offset
            if rp.timestamp == LATEST:
                ts, off, epoch = -1, upper, local.view.leader_epoch
            elif rp.timestamp == EARLIEST:
                off = log.log_start_offset
                ts, epoch = -1, log.epoch_for_offset(off)
            else:
                ts, off, epoch = _by_timestamp(log, rp.timestamp, upper)
            parts.append(P(version=v, partition_index=rp.partition_index, error_code=0,
                           timestamp=ts, offset=off, leader_epoch=epoch))
        topics.append(T(version=v, name=t.name, partitions=parts))
    return R(version=v, throttle_time_ms=0, topics=topics)
