"""ConsumerGroupHeartbeat v0-v1 (KIP-848): membership, assignment and fencing of
``group.protocol=consumer`` members, by ``testing/embedded/consumer_groups.py``.

A group id is either classic or KIP-848, as in Kafka: a heartbeat for a classic group with
members is GROUP_ID_NOT_FOUND; an empty classic group (offsets only) becomes a consumer
group and keeps its offsets.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from epochguard._errors import ErrorCode
from epochguard.consumer.group_messages import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from epochguard.testing.embedded.consumer_groups import (
    ConsumerGroup,
    ConsumerGroupCoordinator,
    HeartbeatRequest,
    TopicInfo,
    consumer_coordinator,
    install_consumer_coordinator,
)
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import (
    CLIENT_HOST,
    TICK_SECONDS,
    coordinator,
    coordinator_error,
    now_ms,
)
from epochguard.testing.embedded.state import ClusterState


def topics_of(cluster: ClusterState) -> dict[str, TopicInfo]:
    return {t.name: TopicInfo(t.topic_id, len(t.partitions)) for t in cluster.topics.values()}


def running_coordinator(cluster: ClusterState) -> ConsumerGroupCoordinator:
    """The cluster's KIP-848 coordinator, with its session/rebalance timer running."""
    existing = consumer_coordinator(cluster)
    if existing is not None and existing.ticking:
        return existing
    coord = install_consumer_coordinator(cluster)
    coord.ticking = True
    loop = asyncio.get_running_loop()

    def tick() -> None:
        if consumer_coordinator(cluster) is not coord:
            return
        coord.tick(now_ms(), topics_of(cluster))
        loop.call_later(TICK_SECONDS, tick)

    loop.call_later(TICK_SECONDS, tick)
    return coord


def _classic_conflict(ctx: RequestContext, group_id: str) -> int:
    classic = coordinator(ctx.cluster)
    group = classic.groups.get(group_id)
    if group is None:
        return ErrorCode.NONE
    if group.members:
        return ErrorCode.GROUP_ID_NOT_FOUND
    # An empty classic group holds offsets only: the consumer group takes them over.
    coord = running_coordinator(ctx.cluster)
    target = coord.groups.setdefault(group_id, ConsumerGroup(group_id))
    target.offsets.update(group.offsets)
    del classic.groups[group_id]
    return ErrorCode.NONE


@handler(ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, 0, 1)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ConsumerGroupHeartbeatResponse
    v = ctx.version
    error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    if not error:
        error = _classic_conflict(ctx, request.group_id)
    if error:
        message = (
            f"Group {request.group_id} is not a consumer group."
            if error == ErrorCode.GROUP_ID_NOT_FOUND
            else None
        )
        return R(
            version=v,
            throttle_time_ms=0,
            error_code=error,
            error_message=message,
            member_id=None,
            member_epoch=-1,
            heartbeat_interval_ms=0,
            assignment=None,
        )
    owned = None
    if request.topic_partitions is not None:
        owned = frozenset((t.topic_id, p) for t in request.topic_partitions for p in t.partitions)
    result = running_coordinator(ctx.cluster).heartbeat(
        HeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            subscribed_topic_names=None
            if request.subscribed_topic_names is None
            else tuple(request.subscribed_topic_names),
            subscribed_topic_regex=request.subscribed_topic_regex if v >= 1 else None,
            server_assignor=request.server_assignor,
            owned=owned,
            client_id=ctx.client_id or "",
            client_host=CLIENT_HOST,
            version=v,
        ),
        topics_of(ctx.cluster),
        now_ms(),
    )
    assignment = None
    if result.assignment is not None:
        by_topic: dict[uuid.UUID, list[int]] = {}
        for tid, p in sorted(result.assignment):
            by_topic.setdefault(tid, []).append(p)
        assignment = R.Assignment(
            topic_partitions=[
                R.Assignment.TopicPartitions(topic_id=tid, partitions=ps)
                for tid, ps in by_topic.items()
            ]
        )
    return R(
        version=v,
        throttle_time_ms=0,
        error_code=result.error,
        error_message=result.message,
        member_id=result.member_id,
        member_epoch=result.member_epoch,
        heartbeat_interval_ms=result.heartbeat_interval_ms,
        assignment=assignment,
    )
