"""TxnOffsetCommit v0-v3: offsets held by the group until the producer's transaction ends.

From v3 the request carries the consumer's group metadata and is fenced as a member's commit
(KIP-447): in a classic group by generation and member id, in a KIP-848 group by member id and
member epoch. A transaction that did not add the group (AddOffsetsToTxn) is refused."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import TxnOffsetCommitRequest, TxnOffsetCommitResponse

from epochguard.testing.embedded.consumer_groups import consumer_coordinator
from epochguard.testing.embedded.groups import NO_GENERATION, NO_MEMBER_ID, CommittedOffset
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import (
    coordinator,
    coordinator_error,
    now_ms,
)
from epochguard.testing.embedded.handlers._txn_common import transaction_coordinator


@handler(TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 3)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = TxnOffsetCommitResponse
    T = R.TxnOffsetCommitResponseTopic
    P = T.TxnOffsetCommitResponsePartition
    v = ctx.version
    view = ctx.cluster.brokers[ctx.broker_id].view
    offsets: dict[tuple[str, int], CommittedOffset] = {}
    for t in request.topics:
        tv = view.topics.get(t.name)
        for p in t.partitions:
            offsets[(t.name, p.partition_index)] = CommittedOffset(
                offset=p.committed_offset,
                leader_epoch=p.committed_leader_epoch if v >= 2 else -1,
                metadata=p.committed_metadata,
                commit_timestamp_ms=now_ms(),
                topic_id=tv.topic_id if tv is not None else None,
            )
    error = ctx.injected_error() or coordinator_error(ctx, request.group_id)
    if not error:
        error = transaction_coordinator(ctx.cluster).offset_commit_error(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
    modern = consumer_coordinator(ctx.cluster)
    if error:
        results = dict.fromkeys(offsets, error)
    elif modern is not None and request.group_id in modern.groups:
        # A KIP-848 group: the metadata's generation is the member epoch.
        results = modern.txn_commit_offsets(
            request.group_id,
            request.producer_id,
            request.generation_id if v >= 3 else NO_GENERATION,
            request.member_id if v >= 3 else NO_MEMBER_ID,
            request.group_instance_id if v >= 3 else None,
            offsets,
        )
    else:
        results = coordinator(ctx.cluster).txn_commit_offsets(
            request.group_id,
            request.producer_id,
            request.generation_id if v >= 3 else NO_GENERATION,
            request.member_id if v >= 3 else NO_MEMBER_ID,
            request.group_instance_id if v >= 3 else None,
            offsets,
        )
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), code in results.items():
        by_topic.setdefault(topic, []).append(
            P(version=v, partition_index=partition, error_code=code)
        )
    return R(
        version=v,
        throttle_time_ms=0,
        topics=[T(version=v, name=name, partitions=parts) for name, parts in by_topic.items()],
    )
