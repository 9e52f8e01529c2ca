"""ConsumerGroupDescribe v0-v1 (KIP-848): group and assignment epochs, every member's
current and target assignment. An unknown group (or a classic one) is GROUP_ID_NOT_FOUND."""

from __future__ import annotations

import uuid
from typing import Any

from epochguard._errors import ErrorCode
from epochguard.consumer.group_messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
)
from epochguard.testing.embedded.consumer_groups import consumer_coordinator
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator_error

#: KIP-1099 MemberType of a member that speaks the consumer protocol.
MEMBER_TYPE_CONSUMER = 1
#: "Not requested" (Java's Integer.MIN_VALUE).
OPERATIONS_NOT_REQUESTED = -(2**31)


@handler(ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, 0, 1)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ConsumerGroupDescribeResponse
    G = R.DescribedGroup
    M = G.Member
    A = M.Assignment
    v = ctx.version
    injected = ctx.injected_error()
    coord = consumer_coordinator(ctx.cluster)
    names = {t.topic_id: t.name for t in ctx.cluster.topics.values()}

    def assignment(parts: frozenset[tuple[uuid.UUID, int]]) -> Any:
        by_topic: dict[uuid.UUID, list[int]] = {}
        for tid, p in sorted(parts):
            by_topic.setdefault(tid, []).append(p)
        return A(
            topic_partitions=[
                A.TopicPartitions(topic_id=tid, topic_name=names.get(tid, ""), partitions=ps)
                for tid, ps in by_topic.items()
            ]
        )

    out = []
    for gid in request.group_ids:
        error = injected or coordinator_error(ctx, gid)
        d = None if error or coord is None else coord.describe(gid)
        if d is None:
            code = error or ErrorCode.GROUP_ID_NOT_FOUND
            out.append(
                G(
                    error_code=code,
                    error_message=None if error else f"Group {gid} not found.",
                    group_id=gid,
                    group_state="Dead",
                    group_epoch=-1,
                    assignment_epoch=-1,
                    assignor_name="",
                    members=[],
                    authorized_operations=OPERATIONS_NOT_REQUESTED,
                )
            )
            continue
        out.append(
            G(
                error_code=0,
                error_message=None,
                group_id=gid,
                group_state=d.state,
                group_epoch=d.group_epoch,
                assignment_epoch=d.assignment_epoch,
                assignor_name=d.assignor,
                members=[
                    M(
                        member_id=m.member_id,
                        instance_id=m.instance_id,
                        rack_id=m.rack_id,
                        member_epoch=m.member_epoch,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        subscribed_topic_names=list(m.subscribed_topic_names),
                        # Kafka 4.3.1 describes "no regex" as "", not null.
                        subscribed_topic_regex=m.subscribed_topic_regex or "",
                        assignment=assignment(m.assignment),
                        target_assignment=assignment(m.target_assignment),
                        member_type=MEMBER_TYPE_CONSUMER,
                    )
                    for m in d.members
                ],
                authorized_operations=OPERATIONS_NOT_REQUESTED,
            )
        )
    return R(version=v, throttle_time_ms=0, groups=out)
