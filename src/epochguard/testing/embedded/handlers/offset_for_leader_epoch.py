"""OffsetForLeaderEpoch v2-v4: KIP-101 end offsets with current-leader-epoch fencing.

Kafka's rules answer the largest epoch at or below the one asked for and where it ends; a
Raft-term cluster (``raft.py``) echoes the requested term with where it ends, or where the
next term starts when it holds no record here (``PartitionLog.term_end_offset``)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition

DEBUGGING_REPLICA_ID = -2


@handler(OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, 2, 4)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = OffsetForLeaderEpochResponse
    T = R.OffsetForLeaderTopicResult
    P = T.EpochEndOffset
    v = ctx.version
    injected = ctx.injected_error()
    replica_id = request.replica_id if v >= 3 else -1
    topics = []
    for t in request.topics:
        parts = []
        for rp in t.partitions:
            local = local_partition(
                ctx,
                t.topic,
                rp.partition,
                rp.current_leader_epoch,
                require_leader=replica_id != DEBUGGING_REPLICA_ID,
            )
            if injected or isinstance(local, int):
                parts.append(
                    P(
                        version=v,
                        error_code=injected or local,
                        partition=rp.partition,
                        leader_epoch=-1,
                        end_offset=-1,
                    )
                )
                continue
            log = local.log
            if ctx.cluster.raft is not None:
                epoch, end = log.term_end_offset(rp.leader_epoch)
            else:
                epoch, end = log.end_offset_for_epoch(rp.leader_epoch)
            parts.append(
                P(
                    version=v,
                    error_code=0,
                    partition=rp.partition,
                    leader_epoch=epoch,
                    end_offset=end,
                )
            )
        topics.append(T(version=v, topic=t.topic, partitions=parts))
    return R(version=v, throttle_time_ms=0, topics=topics)
