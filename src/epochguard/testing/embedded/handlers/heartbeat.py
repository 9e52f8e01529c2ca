"""Heartbeat v0-v4: REBALANCE_IN_PROGRESS tells a member to rejoin."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import HeartbeatRequest, HeartbeatResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import (
    coordinator,
    coordinator_error,
    now_ms,
)


@handler(HeartbeatRequest, HeartbeatResponse, 0, 4)
async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.version
    error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    if not error:
        error = coordinator(ctx.cluster).heartbeat(
            request.group_id,
            request.generation_id,
            request.member_id,
            request.group_instance_id if v >= 3 else None,
            now_ms(),
        )
    return HeartbeatResponse(version=v, throttle_time_ms=0, error_code=error)
