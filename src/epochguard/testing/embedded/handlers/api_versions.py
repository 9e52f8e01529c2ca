"""ApiVersions: advertises exactly the registry, within the cluster's version caps (a
Raft-term cluster serves Fetch and OffsetForLeaderEpoch up to Redpanda's versions); KIP-511
errors are sent by the server."""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from epochguard.testing.embedded.handlers import REGISTRY, RequestContext, handler


@handler(ApiVersionsRequest, ApiVersionsResponse, 0, 3)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ApiVersionsResponse
    return R(
        version=ctx.version,
        error_code=ctx.injected_error(),
        api_keys=[
            R.ApiVersion(version=ctx.version, api_key=k, min_version=low, max_version=high)
            for k, e in sorted(REGISTRY.items())
            for low, high in [ctx.cluster.api_versions(k, e.min_version, e.max_version)]
        ],
        throttle_time_ms=0,
    )
