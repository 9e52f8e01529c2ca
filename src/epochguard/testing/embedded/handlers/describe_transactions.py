"""DescribeTransactions v0 (KIP-664): state, timeout, start time, producer id and epoch and
partitions of transactional ids this broker coordinates."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._txn_common import (
    transaction_coordinator,
    txn_coordinator_error,
)


@handler(DescribeTransactionsRequest, DescribeTransactionsResponse, 0, 0)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DescribeTransactionsResponse
    S = R.TransactionState
    v = ctx.version
    injected = ctx.injected_error()
    coord = transaction_coordinator(ctx.cluster)
    out = []
    for txn_id in request.transactional_ids:
        error = injected or txn_coordinator_error(ctx, txn_id)
        txn = None if error else coord.describe(txn_id)
        if not error and txn is None:
            error = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        if error or txn is None:
            out.append(
                S(
                    version=v,
                    error_code=error,
                    transactional_id=txn_id,
                    transaction_state="",
                    transaction_timeout_ms=0,
                    transaction_start_time_ms=-1,
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=[],
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(txn.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out.append(
            S(
                version=v,
                error_code=0,
                transactional_id=txn_id,
                transaction_state=txn.state.value,
                transaction_timeout_ms=txn.timeout_ms,
                transaction_start_time_ms=txn.start_ms,
                producer_id=txn.producer_id,
                producer_epoch=txn.producer_epoch,
                topics=[
                    S.TopicData(version=v, topic=name, partitions=parts)
                    for name, parts in by_topic.items()
                ],
            )
        )
    return R(version=v, throttle_time_ms=0, transaction_states=out)
