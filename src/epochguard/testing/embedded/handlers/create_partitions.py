"""CreatePartitions v0-3: grow a topic."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import CreatePartitionsRequest, CreatePartitionsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.state import ControllerUnavailableError, EmbeddedClusterError


@handler(CreatePartitionsRequest, CreatePartitionsResponse, 0, 3)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = CreatePartitionsResponse
    v = ctx.version
    injected = ctx.injected_error()
    results = []
    for t in request.topics:
        error, message = injected, None
        if not error and t.name not in ctx.cluster.topics:
            error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {t.name}"
        elif not error and not request.validate_only:
            assignments = [list(a.broker_ids) for a in t.assignments] if t.assignments else None
            try:
                ctx.cluster.create_partitions(t.name, t.count, assignments)
            except ControllerUnavailableError as e:
                error, message = ErrorCode.REQUEST_TIMED_OUT, str(e)
            except EmbeddedClusterError as e:
                error, message = ErrorCode.INVALID_PARTITIONS, str(e)
        results.append(
            R.CreatePartitionsTopicResult(
                version=v, name=t.name, error_code=error, error_message=message
            )
        )
    return R(version=v, throttle_time_ms=0, results=results)
