"""ListTransactions v0-v2 (KIP-664): the transactional ids this broker coordinates, filtered
by state, producer id, running time (v1) and id pattern (v2, a full-match regular
expression)."""

from __future__ import annotations

import re
from typing import Any

from kafka.protocol.admin import ListTransactionsRequest, ListTransactionsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator_broker
from epochguard.testing.embedded.handlers._txn_common import transaction_coordinator, wall_ms
from epochguard.testing.embedded.transactions import TxnState

_STATES = {s.value for s in TxnState}


@handler(ListTransactionsRequest, ListTransactionsResponse, 0, 2)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ListTransactionsResponse
    v = ctx.version
    error = ctx.injected_error()
    states = set(request.state_filters or [])
    pids = set(request.producer_id_filters or [])
    duration = request.duration_filter if v >= 1 else -1
    pattern = request.transactional_id_pattern if v >= 2 else None
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error:
        error = error or ErrorCode.INVALID_REQUEST
        regex = None
    listed = []
    if not error:
        now = wall_ms()
        for txn in transaction_coordinator(ctx.cluster).transactions.values():
            owner = coordinator_broker(ctx.cluster, txn.transactional_id)
            if owner is None or owner.node_id != ctx.broker_id:
                continue
            if states and txn.state.value not in states:
                continue
            if pids and txn.producer_id not in pids:
                continue
            if duration >= 0 and (txn.start_ms < 0 or now - txn.start_ms < duration):
                continue
            if regex is not None and not regex.fullmatch(txn.transactional_id):
                continue
            listed.append(
                R.TransactionState(
                    version=v,
                    transactional_id=txn.transactional_id,
                    producer_id=txn.producer_id,
                    transaction_state=txn.state.value,
                )
            )
    return R(
        version=v,
        throttle_time_ms=0,
        error_code=error,
        unknown_state_filters=sorted(states - _STATES),
        transaction_states=listed,
    )
