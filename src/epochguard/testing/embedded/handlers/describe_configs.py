"""DescribeConfigs v1-v4 for topics (their configs with defaults) and brokers (empty)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.state import DEFAULT_TOPIC_CONFIG

TOPIC = 2
BROKER = 4
DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5


@handler(DescribeConfigsRequest, DescribeConfigsResponse, 1, 4)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DescribeConfigsResponse
    T = R.DescribeConfigsResult
    C = T.DescribeConfigsResourceResult
    v = ctx.version
    injected = ctx.injected_error()
    results = []
    for res in request.resources:
        configs = []
        error = injected
        if not error and res.resource_type == TOPIC:
            t = ctx.cluster.topics.get(res.resource_name)
            if t is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                keys = res.configuration_keys
                for name in sorted(t.config):
                    if keys is not None and name not in keys:
                        continue
                    value = t.config[name]
                    is_default = DEFAULT_TOPIC_CONFIG.get(name) == value
                    configs.append(
                        C(
                            version=v,
                            name=name,
                            value=value,
                            read_only=False,
                            config_source=DEFAULT_CONFIG if is_default else DYNAMIC_TOPIC_CONFIG,
                            is_sensitive=False,
                            synonyms=[],
                            config_type=0,
                            documentation=None,
                        )
                    )
        results.append(
            T(
                version=v,
                error_code=error,
                error_message=None,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=configs,
            )
        )
    return R(version=v, throttle_time_ms=0, results=results)
