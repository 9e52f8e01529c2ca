"""Fetch v4-v16 for consumers: long poll, leader-epoch fencing, KIP-595 DivergingEpoch.

v13+ addresses topics by id (UNKNOWN_TOPIC_ID for an id this broker does not know); v16
adds the KIP-951 leader hints (``current_leader`` and ``node_endpoints``).

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
    UNKNOWN_TOPIC_ID,
    Local,
    local_partition,
)

FETCH_SESSION_ID_NOT_FOUND = 70
_EMPTY = b""


def _build(ctx: RequestContext, request: Any,
           injected: int) -> tuple[list[Any], int, bool, set[int]]:
    """One pass over the requested partitions.

    Returns (topic responses, record bytes, whether anything needs an immediate answer,
    leader ids named in ``current_leader``).
    """
    R = FetchResponse
    T = R.FetchableTopicResponse
    P = T.PartitionData
    v = ctx.version
    total = 0
    budget = request.max_bytes
    errors = False
    topics = []
    leaders: set[int] = set()
    view = ctx.cluster.brokers[ctx.broker_id].view
    for ft in request.topics:
        parts = []
        if v >= 13:
            # Topic ids only: a recreated topic's old id is unknown, not the new topic.
            tv = view.topic_by_id(ft.topic_id)
            name = tv.name if tv is not None else None
        else:
            name = ft.topic
        for fp in ft.partitions:
            hw = lso = start = -1
            records = _EMPTY
            diverging = None
            leader_id, leader_epoch = -1, -1
            local: Local | int
            if name is None:
                local = UNKNOWN_TOPIC_ID
            else:
                local = local_partition(ctx, name, fp.partition, fp.current_leader_epoch)
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
            if name is not None and (error == NOT_LEADER_OR_FOLLOWER
                                     or (error and not isinstance(local, int))):
                pv = view.partition(name, fp.partition)
                if pv is not None:
                    leader_id, leader_epoch = pv.leader, pv.leader_epoch
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
                    leaders.add(leader_id)
            parts.append(part)
        if v >= 13:
            topics.append(T(version=v, topic_id=ft.topic_id, partitions=parts))
        else:
            topics.append(T(version=v, topic=ft.topic, partitions=parts))
    return topics, total, errors, leaders


@handler(FetchRequest, FetchResponse, 4, 16)
async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.version
    if v >= 7 and request.session_id != 0:
        return FetchResponse(version=v, throttle_time_ms=0,
                             error_code=FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    injected = ctx.injected_error()
    deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000.0
    while True:
        topics, total, errors, leaders = _build(ctx, request, injected)
        remaining = deadline - time.monotonic()
        if errors or total >= max(1, request.min_bytes) or remaining <= 0:
            break
        if not ctx.cluster.brokers[ctx.broker_id].alive:
            break
        await ctx.cluster.wait_for_data(remaining)
    response = FetchResponse(version=v, throttle_time_ms=0, error_code=0, session_id=0,
                             responses=topics)
    if v >= 16 and leaders:
        # KIP-951: tell the client where the leaders it was pointed to are.
        response.node_endpoints = [
            FetchResponse.NodeEndpoint(version=v, node_id=b.node_id, host=b.host, port=b.port,
                                       rack=b.rack)
            for b in ctx.cluster.brokers.values() if b.node_id in leaders and b.alive]
    return response
