"""JoinGroup v0-v9, held open until the rebalance completes (or its timeout expires)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import JoinGroupRequest, JoinGroupResponse

from epochguard.testing.embedded.groups import JoinRequest, JoinResult
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import (
    CLIENT_HOST,
    coordinator,
    coordinator_error,
    held,
    now_ms,
)


def _response(v: int, r: JoinResult) -> Any:
    R = JoinGroupResponse
    members = [
        R.JoinGroupResponseMember(
            version=v,
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            metadata=m.metadata,
        )
        for m in r.members
    ]
    return R(
        version=v,
        throttle_time_ms=0,
        error_code=r.error_code,
        generation_id=r.generation_id,
        protocol_type=r.protocol_type,
        # Before v7 the name is not nullable.
        protocol_name=r.protocol_name if v >= 7 else (r.protocol_name or ""),
        leader=r.leader,
        skip_assignment=r.skip_assignment,
        member_id=r.member_id,
        members=members,
    )


@handler(JoinGroupRequest, JoinGroupResponse, 0, 9)
async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.version
    error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    if error:
        return _response(v, JoinResult(error, member_id=request.member_id))
    session = request.session_timeout_ms
    req = JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        session_timeout_ms=session,
        rebalance_timeout_ms=request.rebalance_timeout_ms if v >= 1 else session,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        group_instance_id=request.group_instance_id if v >= 5 else None,
        client_id=ctx.client_id or "",
        client_host=CLIENT_HOST,
        require_known_member_id=v >= 4,
        supports_skip_assignment=v >= 9,
    )
    coord = coordinator(ctx.cluster)
    result: JoinResult = await held(lambda respond: coord.join(req, now_ms(), respond))
    return _response(v, result)
