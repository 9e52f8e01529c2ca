"""Metadata v0-v13 from this broker's own (possibly stale) view, with epochs and topic ids.

An injected REBOOTSTRAP_REQUIRED is answered as Kafka 4 does (KIP-1102): a v13+ answer
with that top-level error and nothing else."""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.state import TopicView

ZERO_UUID = uuid.UUID(int=0)


@handler(MetadataRequest, MetadataResponse, 0, 13)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = MetadataResponse
    T = R.MetadataResponseTopic
    P = T.MetadataResponsePartition
    v = ctx.version
    cluster = ctx.cluster
    view = cluster.brokers[ctx.broker_id].view
    injected = ctx.injected_error()
    if injected == ErrorCode.REBOOTSTRAP_REQUIRED:
        if v >= 13:
            return R(
                version=v,
                throttle_time_ms=0,
                brokers=[],
                cluster_id=cluster.cluster_id,
                controller_id=-1,
                topics=[],
                error_code=injected,
            )
        injected = 0  # no top-level error before v13: answered as usual

    wanted: list[tuple[str | None, uuid.UUID | None]]
    if request.topics is None or (v == 0 and not request.topics):
        wanted = [(name, None) for name in sorted(view.topics)]
    else:
        wanted = []
        for t in request.topics:
            tid = getattr(t, "topic_id", None) if v >= 10 else None
            name = t.name
            wanted.append((name, tid if tid not in (None, ZERO_UUID) else None))

    allow_create = request.allow_auto_topic_creation if v >= 4 else True
    if cluster.auto_create_topics and allow_create and cluster.controller_available:
        for name, tid in wanted:
            if name is not None and tid is None and name not in cluster.topics:
                cluster.create_topic(name, cluster.default_partitions, min(3, len(cluster.brokers)))
        view = cluster.brokers[ctx.broker_id].view

    topics = []
    for name, tid in wanted:
        tv: TopicView | None
        if name is None and tid is not None:
            tv = view.topic_by_id(tid)
            missing_error = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            tv = view.topics.get(name) if name is not None else None
            missing_error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if tv is None:
            topics.append(
                T(
                    version=v,
                    error_code=missing_error,
                    name=name,
                    topic_id=tid or ZERO_UUID,
                    is_internal=False,
                    partitions=[],
                )
            )
            continue
        parts = []
        for idx in sorted(tv.partitions):
            pv = tv.partitions[idx]
            err = injected or (ErrorCode.LEADER_NOT_AVAILABLE if pv.leader < 0 else 0)
            parts.append(
                P(
                    version=v,
                    error_code=err,
                    partition_index=idx,
                    leader_id=pv.leader,
                    leader_epoch=pv.leader_epoch,
                    replica_nodes=list(pv.replicas),
                    isr_nodes=list(pv.isr),
                    offline_replicas=list(pv.offline),
                )
            )
        topics.append(
            T(
                version=v,
                error_code=0,
                name=tv.name,
                topic_id=tv.topic_id,
                is_internal=False,
                partitions=parts,
            )
        )

    brokers = [
        R.MetadataResponseBroker(
            version=v, node_id=b.node_id, host=b.host, port=ctx.port_of(b), rack=b.rack
        )
        for b in sorted(cluster.brokers.values(), key=lambda b: b.node_id)
        if b.alive
    ]
    return R(
        version=v,
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=cluster.cluster_id,
        controller_id=cluster.active_controller,
        topics=topics,
        error_code=0,
    )
