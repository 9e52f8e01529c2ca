"""EndTxn v0-v4: commit or abort the open transaction (markers to every partition of it).

v5 (KIP-890's epoch bump on every EndTxn) is not served, so clients use the classic
protocol."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import EndTxnRequest, EndTxnResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._txn_common import (
    fenced_for_version,
    transaction_coordinator,
    txn_coordinator_error,
    wall_ms,
)

FENCED_FROM_VERSION = 2


@handler(EndTxnRequest, EndTxnResponse, 0, 4)
async def handle(ctx: RequestContext, request: Any) -> Any:
    error = ctx.injected_error() or txn_coordinator_error(ctx, request.transactional_id)
    if not error:
        error = transaction_coordinator(ctx.cluster).end_transaction(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            bool(request.committed),
            wall_ms(),
        )
    return EndTxnResponse(
        version=ctx.version,
        throttle_time_ms=0,
        error_code=fenced_for_version(error, ctx.version, FENCED_FROM_VERSION),
    )
