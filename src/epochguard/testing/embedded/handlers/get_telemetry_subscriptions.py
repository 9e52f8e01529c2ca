"""GetTelemetrySubscriptions v0 (KIP-714): which metrics this client should push, how often,
under which subscription id; a client asking with the zero UUID gets its instance id here."""

from __future__ import annotations

import uuid
from typing import Any

from epochguard.consumer.telemetry_messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
)
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.telemetry import (
    COMPRESSION_GZIP,
    TELEMETRY_MAX_BYTES,
)

_ZERO = uuid.UUID(int=0)


@handler(GetTelemetrySubscriptionsRequest, GetTelemetrySubscriptionsResponse, 0, 0)
async def handle(ctx: RequestContext, request: Any) -> Any:
    instance_id = request.client_instance_id
    if instance_id is None or instance_id == _ZERO:
        instance_id = uuid.uuid4()
    error = ctx.injected_error()
    handed = ctx.cluster.telemetry.handed_to(ctx.client_id)
    return GetTelemetrySubscriptionsResponse(
        version=ctx.version,
        throttle_time_ms=0,
        error_code=error,
        client_instance_id=instance_id,
        subscription_id=handed.subscription_id,
        accepted_compression_types=[COMPRESSION_GZIP],
        push_interval_ms=handed.push_interval_ms,
        telemetry_max_bytes=TELEMETRY_MAX_BYTES,
        delta_temporality=True,
        requested_metrics=list(handed.requested_metrics),
    )
