"""AddOffsetsToTxn v0-v3: a producer adds a group's offsets to its open transaction."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import AddOffsetsToTxnRequest, AddOffsetsToTxnResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._txn_common import (
    fenced_for_version,
    transaction_coordinator,
    txn_coordinator_error,
    wall_ms,
)

FENCED_FROM_VERSION = 2


@handler(AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3)
async def handle(ctx: RequestContext, request: Any) -> Any:
    error = ctx.injected_error() or txn_coordinator_error(ctx, request.transactional_id)
    if not error:
        error = transaction_coordinator(ctx.cluster).add_offsets(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.group_id,
            wall_ms(),
        )
    return AddOffsetsToTxnResponse(
        version=ctx.version,
        throttle_time_ms=0,
        error_code=fenced_for_version(error, ctx.version, FENCED_FROM_VERSION),
    )
