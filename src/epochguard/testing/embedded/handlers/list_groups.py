"""ListGroups v0-v5: the groups this broker coordinates (state filter v4+, type filter v5+).

Classic groups and KIP-848 (``consumer`` type) groups are both listed, as Kafka 4 does; both
carry the protocol type ``consumer``."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse

from epochguard.testing.embedded.consumer_groups import consumer_coordinator
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator, coordinator_error

CLASSIC = "classic"
CONSUMER = "consumer"


@handler(ListGroupsRequest, ListGroupsResponse, 0, 5)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ListGroupsResponse
    v = ctx.version
    injected = ctx.injected_error()
    if injected:
        return R(version=v, throttle_time_ms=0, error_code=injected, groups=[])
    states = {s.lower() for s in request.states_filter} if v >= 4 else set()
    types = {t.lower() for t in request.types_filter} if v >= 5 else set()
    found = [
        (d.group_id, d.protocol_type, d.state.value, CLASSIC)
        for d in coordinator(ctx.cluster).list_groups()
    ]
    modern = consumer_coordinator(ctx.cluster)
    if modern is not None:
        found += [(g.group_id, CONSUMER, g.state(), CONSUMER) for g in modern.groups.values()]
    listed = []
    for group_id, protocol_type, state, group_type in found:
        if coordinator_error(ctx, group_id):
            continue
        if states and state.lower() not in states:
            continue
        if types and group_type not in types:
            continue
        listed.append(
            R.ListedGroup(
                version=v,
                group_id=group_id,
                protocol_type=protocol_type,
                group_state=state,
                group_type=group_type,
            )
        )
    return R(version=v, throttle_time_ms=0, error_code=0, groups=listed)
