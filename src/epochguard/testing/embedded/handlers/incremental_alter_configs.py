"""IncrementalAlterConfigs v0-1 for topic configs (SET and DELETE)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers.create_topics import KNOWN_CONFIGS

TOPIC = 2
SET = 0
DELETE = 1


@handler(IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, 0, 1)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = IncrementalAlterConfigsResponse
    v = ctx.version
    injected = ctx.injected_error()
    results = []
    for res in request.resources:
        error, message = injected, None
        changes: dict[str, str | None] = {}
        if error:
            pass
        elif res.resource_type != TOPIC:
            error, message = ErrorCode.INVALID_REQUEST, "only topic configs are modelled"
        elif res.resource_name not in ctx.cluster.topics:
            error, message = (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"unknown topic {res.resource_name}",
            )
        else:
            for c in res.configs:
                if c.name not in KNOWN_CONFIGS:
                    error, message = ErrorCode.INVALID_CONFIG, f"unknown config {c.name}"
                elif c.config_operation == SET:
                    changes[c.name] = c.value
                elif c.config_operation == DELETE:
                    changes[c.name] = None
                else:
                    error, message = ErrorCode.INVALID_REQUEST, "APPEND/SUBTRACT are not supported"
        if not error and not request.validate_only:
            ctx.cluster.set_topic_config(res.resource_name, changes)
        results.append(
            R.AlterConfigsResourceResponse(
                version=v,
                error_code=error,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return R(version=v, throttle_time_ms=0, responses=results)
