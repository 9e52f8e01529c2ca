"""ListOffsets v1-v7: earliest (-2), latest (-1), max timestamp (-3, v7) and by timestamp,
with leader epochs and current-leader-epoch fencing. Under read_committed (isolation level 1,
v2+) consumers see up to the last stable offset instead of the high watermark."""

from __future__ import annotations

from typing import Any

import kafka.errors as Errors
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.record.default_records import DefaultRecordBatch

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition
from epochguard.testing.embedded.partition_log import PartitionLog

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3  # v7+ (KIP-734)
DEBUGGING_REPLICA_ID = -2
READ_COMMITTED = 1


def _by_timestamp(log: PartitionLog, timestamp: int, upper: int) -> tuple[int, int, int]:
    """(timestamp, offset, epoch) of the first record at or after ``timestamp``."""
    for raw in log.batches_from(log.log_start_offset):
        batch = DefaultRecordBatch(raw)
        if batch.base_offset >= upper:
            break
        if batch.max_timestamp < timestamp:
            continue
        try:
            for rec in batch:
                if rec.offset >= upper:
                    break
                if rec.offset >= log.log_start_offset and rec.timestamp >= timestamp:
                    return rec.timestamp, rec.offset, batch.leader_epoch
        except Errors.UnsupportedCodecError:
            # No codec library here (snappy): answer at batch granularity; the client
            # skips the batch's earlier records itself.
            return (
                batch.max_timestamp,
                max(batch.base_offset, log.log_start_offset),
                batch.leader_epoch,
            )
    return -1, -1, -1


def _max_timestamp(log: PartitionLog, upper: int) -> tuple[int, int, int]:
    """(timestamp, offset, epoch) of the record with the largest timestamp (first on ties)."""
    best: tuple[int, int, int] = (-1, -1, -1)
    for raw in log.batches_from(log.log_start_offset):
        batch = DefaultRecordBatch(raw)
        if batch.base_offset >= upper:
            break
        if batch.max_timestamp <= best[0]:
            continue
        try:
            for rec in batch:
                if log.log_start_offset <= rec.offset < upper and rec.timestamp > best[0]:
                    best = (rec.timestamp, rec.offset, batch.leader_epoch)
        except Errors.UnsupportedCodecError:
            best = (batch.max_timestamp, batch.base_offset, batch.leader_epoch)
    return best


@handler(ListOffsetsRequest, ListOffsetsResponse, 1, 7)
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
            local = local_partition(
                ctx,
                t.name,
                rp.partition_index,
                rp.current_leader_epoch,
                require_leader=request.replica_id != DEBUGGING_REPLICA_ID,
            )
            if injected or isinstance(local, int):
                parts.append(
                    P(
                        version=v,
                        partition_index=rp.partition_index,
                        error_code=injected or local,
                        timestamp=-1,
                        offset=-1,
                        leader_epoch=-1,
                    )
                )
                continue
            log = local.log
            # Consumers see up to the high watermark; the debugging id (-2) and replicas see
            # the whole local log, as Kafka answers without an isolation level for them.
            if request.replica_id != -1:
                upper = log.log_end_offset
            elif v >= 2 and request.isolation_level == READ_COMMITTED:
                upper = log.last_stable_offset
            else:
                upper = log.high_watermark
            if rp.timestamp == LATEST:
                ts, off, epoch = -1, upper, local.view.leader_epoch
            elif rp.timestamp == EARLIEST:
                off = log.log_start_offset
                ts, epoch = -1, log.epoch_for_offset(off)
            elif rp.timestamp == MAX_TIMESTAMP and v >= 7:
                ts, off, epoch = _max_timestamp(log, upper)
            else:
                ts, off, epoch = _by_timestamp(log, rp.timestamp, upper)
            if ctx.cluster.raft is not None and off >= 0:
                # A Raft-term broker names its current term whatever the query (Redpanda).
                epoch = local.view.leader_epoch
            parts.append(
                P(
                    version=v,
                    partition_index=rp.partition_index,
                    error_code=0,
                    timestamp=ts,
                    offset=off,
                    leader_epoch=epoch,
                )
            )
        topics.append(T(version=v, name=t.name, partitions=parts))
    return R(version=v, throttle_time_ms=0, topics=topics)
