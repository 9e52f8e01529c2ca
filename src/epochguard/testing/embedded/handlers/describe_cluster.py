"""DescribeCluster v0-2: the live brokers and the active controller."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

from epochguard.testing.embedded.handlers import RequestContext, handler


@handler(DescribeClusterRequest, DescribeClusterResponse, 0, 2)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DescribeClusterResponse
    v = ctx.version
    cluster = ctx.cluster
    brokers = [
        R.DescribeClusterBroker(
            version=v,
            broker_id=b.node_id,
            host=b.host,
            port=ctx.port_of(b),
            rack=b.rack,
            is_fenced=False,
        )
        for b in sorted(cluster.brokers.values(), key=lambda b: b.node_id)
        if b.alive
    ]
    return R(
        version=v,
        throttle_time_ms=0,
        error_code=ctx.injected_error(),
        error_message=None,
        endpoint_type=1,
        cluster_id=cluster.cluster_id,
        controller_id=cluster.active_controller,
        brokers=brokers,
    )
