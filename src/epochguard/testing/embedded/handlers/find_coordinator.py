"""FindCoordinator v0-v5: the single ``key`` form (v0-v3) and batched ``coordinator_keys`` (v4+).

Groups (key type 0) and transactional ids (key type 1) hash onto a live broker; with no live
broker the answer is COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator_broker

KEY_TYPES = (0, 1)


def _lookup(
    ctx: RequestContext,
    key: str,
    key_type: int,
    injected: int,
) -> tuple[int, int, str, int, str | None]:
    """``(error, node_id, host, port, message)`` for one key."""
    if injected:
        return injected, -1, "", -1, None
    if key_type not in KEY_TYPES:
        return ErrorCode.INVALID_REQUEST, -1, "", -1, f"unsupported key type {key_type}"
    b = coordinator_broker(ctx.cluster, key)
    if b is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1, "no broker is running"
    return 0, b.node_id, b.host, ctx.port_of(b), None


@handler(FindCoordinatorRequest, FindCoordinatorResponse, 0, 5)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = FindCoordinatorResponse
    v = ctx.version
    injected = ctx.injected_error()
    key_type = request.key_type if v >= 1 else 0
    if v < 4:
        err, node, host, port, msg = _lookup(ctx, request.key, key_type, injected)
        return R(
            version=v,
            throttle_time_ms=0,
            error_code=err,
            error_message=msg,
            node_id=node,
            host=host,
            port=port,
        )
    coordinators = []
    for key in request.coordinator_keys:
        err, node, host, port, msg = _lookup(ctx, key, key_type, injected)
        coordinators.append(
            R.Coordinator(
                version=v,
                key=key,
                node_id=node,
                host=host,
                port=port,
                error_code=err,
                error_message=msg,
            )
        )
    return R(version=v, throttle_time_ms=0, coordinators=coordinators)
