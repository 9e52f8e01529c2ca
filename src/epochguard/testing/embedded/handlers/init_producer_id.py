"""InitProducerId v0-v4: producer ids for idempotent producers, and for transactional ids the
coordinator's id and epoch (each call bumps the epoch and fences older instances; KIP-360's
producer id and epoch from v3)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._txn_common import (
    fenced_for_version,
    transaction_coordinator,
    txn_coordinator_error,
    wall_ms,
)

#: PRODUCER_FENCED is answered from this version on (KIP-588).
FENCED_FROM_VERSION = 4


@handler(InitProducerIdRequest, InitProducerIdResponse, 0, 4)
async def handle(ctx: RequestContext, request: Any) -> Any:
    error = ctx.injected_error()
    pid, epoch = -1, -1
    txn_id = request.transactional_id
    if error:
        pass
    elif txn_id is None:
        pid, epoch = ctx.cluster.next_producer_id(), 0
    else:
        error = txn_coordinator_error(ctx, txn_id)
        if not error:
            result = transaction_coordinator(ctx.cluster).init_producer_id(
                txn_id,
                request.transaction_timeout_ms,
                wall_ms(),
                request.producer_id if ctx.version >= 3 else -1,
                request.producer_epoch if ctx.version >= 3 else -1,
            )
            error = fenced_for_version(result.error, ctx.version, FENCED_FROM_VERSION)
            pid, epoch = result.producer_id, result.producer_epoch
    return InitProducerIdResponse(
        version=ctx.version,
        throttle_time_ms=0,
        error_code=error,
        producer_id=pid,
        producer_epoch=epoch,
    )
