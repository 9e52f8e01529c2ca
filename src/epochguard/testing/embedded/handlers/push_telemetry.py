"""PushTelemetry v0 (KIP-714): a client's metrics, kept by the cluster (``telemetry_pushes``)
when the subscription id is the one this client would be handed now."""

from __future__ import annotations

import uuid
from typing import Any

from epochguard.consumer.telemetry_messages import PushTelemetryRequest, PushTelemetryResponse
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.telemetry import (
    COMPRESSION_GZIP,
    COMPRESSION_NONE,
    TELEMETRY_MAX_BYTES,
)

INVALID_REQUEST = 42
UNSUPPORTED_COMPRESSION_TYPE = 76
UNKNOWN_SUBSCRIPTION_ID = 117
TELEMETRY_TOO_LARGE = 118


@handler(PushTelemetryRequest, PushTelemetryResponse, 0, 0)
async def handle(ctx: RequestContext, request: Any) -> Any:
    metrics = ctx.cluster.telemetry
    error = ctx.injected_error()
    if error:
        return PushTelemetryResponse(version=ctx.version, throttle_time_ms=0, error_code=error)
    if request.client_instance_id in (None, uuid.UUID(int=0)):
        error = INVALID_REQUEST
    elif request.subscription_id != metrics.handed_to(ctx.client_id).subscription_id:
        error = UNKNOWN_SUBSCRIPTION_ID
    elif request.compression_type not in (COMPRESSION_NONE, COMPRESSION_GZIP):
        error = UNSUPPORTED_COMPRESSION_TYPE
    elif len(request.metrics or b"") > TELEMETRY_MAX_BYTES:
        error = TELEMETRY_TOO_LARGE
    else:
        metrics.accept(
            request.client_instance_id,
            ctx.client_id,
            bool(request.terminating),
            request.compression_type,
            bytes(request.metrics or b""),
        )
    return PushTelemetryResponse(version=ctx.version, throttle_time_ms=0, error_code=error)
