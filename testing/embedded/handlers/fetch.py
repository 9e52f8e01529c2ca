"""Fetch v4-v12 for consumers: long poll, leader-epoch fencing, KIP-595 DivergingEpoch.

Fetch sessions (KIP-227) are not kept: every response has session id 0, which tells the
client to send full fetch requests. Records are the stored batch bytes, never re-encoded.
"""

from __future__ import annotations

import time
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import (
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    local_partition,
)

FETCH_SESSION_ID_NOT_FOUND = 70
_EMPTY = b""


def _build(ctx: RequestContext, request: Any, injected: int) -> tuple[list[Any], int, bool]:
    """One pass over the requested partitions: (topic responses, bytes, any error)."""
    R = FetchResponse
    T = R.FetchableTopicResponse
    P = T.PartitionData
    v = ctx.version
    total = 0
    budget = request.max_bytes
    errors = False
    topics = []
    for ft in request.topics:
        parts = []
        for fp in ft.partitions:
            hw = lso = start = -1
            records = _EMPTY
            diverging = None
            leader_id, leader_epoch = -1, -1
            local = local_partition(ctx, ft.topic, fp.partition, fp.current_leader_epoch)
            error = injected or (local if isinstance(local, int) else 0)
            if not error and not isinstance(local, int):
                log = local.log
                hw = lso = log.high_watermark
                start = log.log_start_offset
                offset = fp.fetch_offset
                last_epoch = fp.last_fetched_epoch if v >= 12 else -1
                if last_epoch >= 0:
                    # KIP-595: the broker compares the client's last fetched epoch itself.
                    epoch, end = log.end_offset_for_epoch(last_epoch)
                    if epoch < 0 or end < 0:
                        error = OFFSET_OUT_OF_RANGE
                    elif epoch < last_epoch or end < offset:
                        diverging = P.EpochEndOffset(version=v, epoch=epoch, end_offset=end)
                if error or diverging is not None:
                    pass
                elif offset < log.log_start_offset or offset > log.log_end_offset:
                    error = OFFSET_OUT_OF_RANGE
                elif offset < hw:
                    limit = min(fp.partition_max_bytes, budget - total)
                    if limit > 0 or total == 0:
                        records = log.read(offset, max(limit, 1), upper=hw)
                        total += len(records)
            if error == NOT_LEADER_OR_FOLLOWER or (error and not isinstance(local, int)):
                view = ctx.cluster.brokers[ctx.broker_id].view.partition(ft.topic, fp.partition)
                if view is not None:
                    leader_id, leader_epoch = view.leader, view.leader_epoch
            errors = errors or bool(error) or diverging is not None
            part = P(version=v, partition_index=fp.partition, error_code=error,
                     high_watermark=hw, last_stable_offset=lso, log_start_offset=start,
                     aborted_transactions=None, preferred_read_replica=-1, records=records)
            if v >= 12:
                if diverging is not None:
                    part.diverging_epoch = diverging
                if leader_id >= 0:
                    part.current_leader = P.LeaderIdAndEpoch(version=v, leader_id=leader_id,
                                                             leader_epoch=leader_epoch)
            parts.append(part)
        topics.append(T(version=v, topic=ft.topic, partitions=parts))
    return topics, total, errors


@handler(FetchRequest, FetchResponse, 4, 12)
async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.version
    if v >= 7 and request.session_id != 0:
        return FetchResponse(version=v, throttle_time_ms=0,
                             error_code=FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    injected = ctx.injected_error()
    deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000.0
    while True:
        topics, total, errors = _build(ctx, request, injected)
        remaining = deadline - time.monotonic()
        if errors or total >= max(1, request.min_bytes) or remaining <= 0:
            break
        if not ctx.cluster.brokers[ctx.broker_id].alive:
            break
        await ctx.cluster.wait_for_data(remaining)
    return FetchResponse(version=v, throttle_time_ms=0, error_code=0, session_id=0,
                         responses=topics)
