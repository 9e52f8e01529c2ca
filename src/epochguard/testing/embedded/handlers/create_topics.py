"""CreateTopics v2-v7 (accepted by any broker, as KRaft brokers forward to the controller)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.state import ControllerUnavailableError, EmbeddedClusterError

KNOWN_CONFIGS = frozenset(
    {
        "min.insync.replicas",
        "unclean.leader.election.enable",
        "cleanup.policy",
        "retention.ms",
        "retention.bytes",
        "max.message.bytes",
        "message.timestamp.type",
        "segment.bytes",
        "compression.type",
    }
)


@handler(CreateTopicsRequest, CreateTopicsResponse, 2, 7)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = CreateTopicsResponse
    T = R.CreatableTopicResult
    v = ctx.version
    cluster = ctx.cluster
    injected = ctx.injected_error()
    results = []
    for t in request.topics:
        nparts = t.num_partitions if t.num_partitions != -1 else cluster.default_partitions
        rf = t.replication_factor if t.replication_factor != -1 else min(3, len(cluster.brokers))
        configs = {c.name: c.value for c in t.configs}
        assignments = {a.partition_index: list(a.broker_ids) for a in t.assignments} or None
        error, message = injected, None
        if error:
            pass
        elif t.name in cluster.topics:
            error, message = ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{t.name}' already exists."
        elif not t.name or len(t.name) > 249:
            error, message = ErrorCode.INVALID_REQUEST, "invalid topic name"
        elif assignments is None and nparts < 1:
            error, message = (
                ErrorCode.INVALID_PARTITIONS,
                "Number of partitions must be larger than 0.",
            )
        elif assignments is None and not 1 <= rf <= len(cluster.brokers):
            error, message = (
                ErrorCode.INVALID_REPLICATION_FACTOR,
                (
                    f"Replication factor: {rf} larger than available brokers: "
                    f"{len(cluster.brokers)}."
                ),
            )
        elif set(configs) - KNOWN_CONFIGS:
            unknown = sorted(set(configs) - KNOWN_CONFIGS)
            error, message = ErrorCode.INVALID_CONFIG, f"Unknown configs {unknown}"
        topic_id = None
        if not error and not request.validate_only:
            try:
                state = cluster.create_topic(t.name, nparts, rf, configs, assignments)
            except ControllerUnavailableError as e:
                error, message = ErrorCode.REQUEST_TIMED_OUT, str(e)
            except EmbeddedClusterError as e:
                error, message = ErrorCode.INVALID_REQUEST, str(e)
            else:
                topic_id = state.topic_id
                nparts = len(state.partitions)
                rf = len(next(iter(state.partitions.values())).replicas)
        result = T(
            version=v,
            name=t.name,
            error_code=error,
            error_message=message,
            topic_config_error_code=0,
            num_partitions=-1 if error else nparts,
            replication_factor=-1 if error else rf,
            configs=[],
        )
        if topic_id is not None:
            result.topic_id = topic_id
        results.append(result)
    return R(version=v, throttle_time_ms=0, topics=results)
