"""DeleteGroups v0-v2: removes groups without members, with their committed offsets."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator, coordinator_error


@handler(DeleteGroupsRequest, DeleteGroupsResponse, 0, 2)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DeleteGroupsResponse
    v = ctx.version
    injected = ctx.injected_error()
    coord = coordinator(ctx.cluster)
    results = []
    for gid in request.groups_names:
        error = injected or coordinator_error(ctx, gid) or coord.delete_group(gid)
        results.append(R.DeletableGroupResult(version=v, group_id=gid, error_code=error))
    return R(version=v, throttle_time_ms=0, results=results)
