"""SaslHandshake v1: picks the mechanism; the tokens follow in SaslAuthenticate.

v0 (raw tokens after the handshake) is not offered, as Kafka 4 no longer does.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.security import MECHANISMS


@handler(SaslHandshakeRequest, SaslHandshakeResponse, 1, 1)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = SaslHandshakeResponse
    conn = ctx.conn
    offered = list(MECHANISMS) if conn.needs_sasl else []
    if not conn.needs_sasl or conn.mechanism is not None:
        # A broker answers a handshake on a listener without SASL, or a second one, so.
        conn.close_after_response = True
        return R(version=ctx.version, error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=offered)
    if request.mechanism not in MECHANISMS:
        conn.close_after_response = True
        return R(
            version=ctx.version, error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=offered
        )
    conn.start(request.mechanism, ctx.cluster.security)
    return R(version=ctx.version, error_code=0, mechanisms=offered)
