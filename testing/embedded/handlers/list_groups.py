"""ListGroups v0-v5: the groups this broker coordinates (state filter v4+, type filter v5+)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator, coordinator_error

GROUP_TYPE = "classic"


@handler(ListGroupsRequest, ListGroupsResponse, 0, 5)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ListGroupsResponse
    v = ctx.version
    injected = ctx.injected_error()
    if injected:
        return R(version=v, throttle_time_ms=0, error_code=injected, groups=[])
    states = {s.lower() for s in request.states_filter} if v >= 4 else set()
    types = {t.lower() for t in request.types_filter} if v >= 5 else set()
    listed = []
    for d in coordinator(ctx.cluster).list_groups():
        if coordinator_error(ctx, d.group_id):
            continue
        if states and d.state.value.lower() not in states:
            continue
        if types and GROUP_TYPE not in types:
            continue
        listed.append(
            R.ListedGroup(
                version=v,
                group_id=d.group_id,
                protocol_type=d.protocol_type,
                group_state=d.state.value,
                group_type=GROUP_TYPE,
            )
        )
    return R(version=v, throttle_time_ms=0, error_code=0, groups=listed)
