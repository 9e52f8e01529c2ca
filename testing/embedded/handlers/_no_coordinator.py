"""Fallback FindCoordinator, used only while no group coordinator registers the API.

librdkafka asks for a coordinator even with ``assign()``; answering COORDINATOR_NOT_AVAILABLE
keeps it retrying quietly while fetching works.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import COORDINATOR_NOT_AVAILABLE


@handler(FindCoordinatorRequest, FindCoordinatorResponse, 0, 4)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = FindCoordinatorResponse
    if ctx.version < 4:
        return R(version=ctx.version, error_code=COORDINATOR_NOT_AVAILABLE, node_id=-1,
                 host="", port=-1)
    keys = list(request.coordinator_keys)
    return R(version=ctx.version, coordinators=[
        R.Coordinator(version=ctx.version, key=k, node_id=-1, host="", port=-1,
                      error_code=COORDINATOR_NOT_AVAILABLE)
        for k in keys
    ])
