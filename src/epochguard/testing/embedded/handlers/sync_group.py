"""SyncGroup v0-v5: followers wait until the leader hands in the assignment."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import SyncGroupRequest, SyncGroupResponse

from epochguard.testing.embedded.groups import SyncRequest, SyncResult
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import (
    coordinator,
    coordinator_error,
    held,
    now_ms,
)


def _response(v: int, r: SyncResult) -> Any:
    return SyncGroupResponse(
        version=v,
        throttle_time_ms=0,
        error_code=r.error_code,
        protocol_type=r.protocol_type,
        protocol_name=r.protocol_name,
        assignment=r.assignment,
    )


@handler(SyncGroupRequest, SyncGroupResponse, 0, 5)
async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.version
    error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    if error:
        return _response(v, SyncResult(error))
    req = SyncRequest(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        assignments=tuple((a.member_id, bytes(a.assignment)) for a in request.assignments),
        group_instance_id=request.group_instance_id if v >= 3 else None,
        protocol_type=request.protocol_type if v >= 5 else None,
        protocol_name=request.protocol_name if v >= 5 else None,
    )
    coord = coordinator(ctx.cluster)
    result: SyncResult = await held(lambda respond: coord.sync(req, now_ms(), respond))
    return _response(v, result)
