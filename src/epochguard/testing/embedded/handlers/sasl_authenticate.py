"""SaslAuthenticate: one token round of the mechanism chosen by SaslHandshake."""

from __future__ import annotations

from typing import Any

from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse

from epochguard._errors import ErrorCode
from epochguard._log import get_logger
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.security import SaslFailure

log = get_logger("epochguard.testing.embedded")


@handler(SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = SaslAuthenticateResponse
    conn = ctx.conn
    if not conn.needs_sasl or conn.principal is not None:
        conn.close_after_response = True
        return R(
            version=ctx.version,
            error_code=ErrorCode.ILLEGAL_SASL_STATE,
            error_message="Unexpected SaslAuthenticate request",
            auth_bytes=b"",
        )
    try:
        answer = conn.authenticate(bytes(request.auth_bytes))
    except SaslFailure as e:
        log.info("sasl_authentication_failed", broker=ctx.broker_id, mechanism=conn.mechanism)
        # Kafka sends the error, then closes: the client must not retry on this connection.
        conn.close_after_response = True
        return R(
            version=ctx.version,
            error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
            error_message=str(e),
            auth_bytes=b"",
        )
    if conn.principal is not None:
        log.info(
            "sasl_authenticated",
            broker=ctx.broker_id,
            mechanism=conn.mechanism,
            principal=conn.principal,
        )
    return R(version=ctx.version, error_code=0, error_message=None, auth_bytes=answer)
