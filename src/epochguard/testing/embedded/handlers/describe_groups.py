"""DescribeGroups v0-v5: state, protocol and members (assignments once the group is Stable)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.consumer_groups import consumer_coordinator
from epochguard.testing.embedded.groups import GroupState
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator, coordinator_error

# kafka-python encodes None as Kafka's "not requested" marker (INT32_MIN).
OPERATIONS_UNKNOWN = None


@handler(DescribeGroupsRequest, DescribeGroupsResponse, 0, 5)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DescribeGroupsResponse
    G = R.DescribedGroup
    M = G.DescribedGroupMember
    v = ctx.version
    injected = ctx.injected_error()
    coord = coordinator(ctx.cluster)
    modern = consumer_coordinator(ctx.cluster)
    out = []
    for gid in request.groups:
        error = injected or coordinator_error(ctx, gid)
        if not error and modern is not None and gid in modern.groups:
            # Kafka 4.3.1: "Group <id> is not a classic group." (ConsumerGroupDescribe is
            # the API for these).
            error = ErrorCode.GROUP_ID_NOT_FOUND
        d = None if error else coord.describe(gid)
        if d is None:
            # Kafka describes an unknown group as Dead, without an error, before v6.
            out.append(
                G(
                    version=v,
                    error_code=error,
                    group_id=gid,
                    group_state=GroupState.DEAD.value,
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=OPERATIONS_UNKNOWN,
                )
            )
            continue
        members = [
            M(
                version=v,
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata,
                member_assignment=m.assignment,
            )
            for m in d.members
        ]
        out.append(
            G(
                version=v,
                error_code=0,
                group_id=d.group_id,
                group_state=d.state.value,
                protocol_type=d.protocol_type,
                protocol_data=d.protocol_name,
                members=members,
                authorized_operations=OPERATIONS_UNKNOWN,
            )
        )
    return R(version=v, throttle_time_ms=0, groups=out)
