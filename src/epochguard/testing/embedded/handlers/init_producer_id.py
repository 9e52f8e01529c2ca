"""InitProducerId: hands out producer ids so idempotent producers (the default) work.

Transactions are not supported: a transactional id gets a producer id too, but the
transaction APIs are not advertised.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from epochguard.testing.embedded.handlers import RequestContext, handler


@handler(InitProducerIdRequest, InitProducerIdResponse, 0, 4)
async def handle(ctx: RequestContext, request: Any) -> Any:
    error = ctx.injected_error()
    pid = -1 if error else ctx.cluster.next_producer_id()
    epoch = -1 if error else 0
    return InitProducerIdResponse(
        version=ctx.version,
        throttle_time_ms=0,
        error_code=error,
        producer_id=pid,
        producer_epoch=epoch,
    )
