"""LeaveGroup v0-v5: one member (v0-v2) or a batch of members by id or instance id (v3+)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import LeaveGroupRequest, LeaveGroupResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import (
    coordinator,
    coordinator_error,
    now_ms,
)


@handler(LeaveGroupRequest, LeaveGroupResponse, 0, 5)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = LeaveGroupResponse
    v = ctx.version
    if v >= 3:
        wanted = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        wanted = [(request.member_id, None)]
    error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    if error:
        return R(version=v, throttle_time_ms=0, error_code=error, members=[])
    results = coordinator(ctx.cluster).leave(request.group_id, wanted, now_ms())
    if v < 3:
        return R(version=v, throttle_time_ms=0, error_code=results[0].error_code)
    members = [
        R.MemberResponse(
            version=v,
            member_id=r.member_id,
            group_instance_id=r.group_instance_id,
            error_code=r.error_code,
        )
        for r in results
    ]
    return R(version=v, throttle_time_ms=0, error_code=0, members=members)
