"""OffsetCommit v2-v10: committed offsets with leader epochs (v6+) and metadata.

Generation and member are checked like Kafka's classic groups; generation -1 with no member
id is a "simple" commit (``assign()`` users), allowed while the group has no members. v10
names topics by id.
"""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.consumer_groups import consumer_coordinator
from epochguard.testing.embedded.groups import (
    CommittedOffset,
    TopicPartition,
)
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import (
    coordinator,
    coordinator_error,
    now_ms,
)


@handler(OffsetCommitRequest, OffsetCommitResponse, 2, 10)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = OffsetCommitResponse
    T = R.OffsetCommitResponseTopic
    P = T.OffsetCommitResponsePartition
    v = ctx.version
    view = ctx.cluster.brokers[ctx.broker_id].view
    group_error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    now = now_ms()

    errors: dict[tuple[int, int], int] = {}
    names: dict[int, tuple[str, uuid.UUID | None]] = {}
    valid: dict[TopicPartition, CommittedOffset] = {}
    keys: dict[TopicPartition, tuple[int, int]] = {}
    for ti, t in enumerate(request.topics):
        tv = view.topic_by_id(t.topic_id) if v >= 10 else view.topics.get(t.name)
        names[ti] = (t.name if v < 10 else (tv.name if tv else ""), t.topic_id if v >= 10 else None)
        for p in t.partitions:
            key = (ti, p.partition_index)
            if group_error:
                errors[key] = group_error
            elif tv is None:
                errors[key] = (
                    ErrorCode.UNKNOWN_TOPIC_ID if v >= 10 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
            elif p.partition_index not in tv.partitions:
                errors[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                tp = (tv.name, p.partition_index)
                valid[tp] = CommittedOffset(
                    offset=p.committed_offset,
                    leader_epoch=p.committed_leader_epoch if v >= 6 else -1,
                    metadata=p.committed_metadata,
                    commit_timestamp_ms=now,
                    # The incarnation this broker knows (by id: the one asked for; by name:
                    # its view's). Kafka deletes a deleted topic's commits stored under its
                    # id when the coordinator applies the deletion, so a commit by name taken
                    # while the view lags a re-creation is not returned once it has caught
                    # up, and one by id (refused until the view knows the id) is.
                    topic_id=tv.topic_id,
                )
                keys[tp] = key
    modern = consumer_coordinator(ctx.cluster)
    if valid and modern is not None and request.group_id in modern.groups:
        # A KIP-848 group: checked by member id and member epoch (consumer_groups.py).
        results = modern.commit_offsets(
            request.group_id,
            request.generation_id_or_member_epoch,
            request.member_id,
            valid,
            now,
            v,
        )
        for tp, err in results.items():
            errors[keys[tp]] = err
    elif valid:
        results = coordinator(ctx.cluster).commit_offsets(
            request.group_id,
            request.generation_id_or_member_epoch,
            request.member_id,
            request.group_instance_id if v >= 7 else None,
            valid,
            now,
            v,
        )
        for tp, err in results.items():
            errors[keys[tp]] = err

    topics = []
    for ti, t in enumerate(request.topics):
        name, topic_id = names[ti]
        parts = [
            P(
                version=v,
                partition_index=p.partition_index,
                error_code=errors[(ti, p.partition_index)],
            )
            for p in t.partitions
        ]
        topics.append(T(version=v, name=name, topic_id=topic_id, partitions=parts))
    return R(version=v, throttle_time_ms=0, topics=topics)
