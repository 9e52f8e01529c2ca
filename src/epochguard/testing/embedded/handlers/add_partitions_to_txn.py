"""AddPartitionsToTxn v0-v3: a producer adds partitions to its open transaction.

v4+ (the brokers' batched form, KIP-890) is not served."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import AddPartitionsToTxnRequest, AddPartitionsToTxnResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._txn_common import (
    fenced_for_version,
    transaction_coordinator,
    txn_coordinator_error,
    wall_ms,
)

FENCED_FROM_VERSION = 2


@handler(AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 3)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = AddPartitionsToTxnResponse
    T = R.AddPartitionsToTxnTopicResult
    P = T.AddPartitionsToTxnPartitionResult
    v = ctx.version
    txn_id = request.v3_and_below_transactional_id
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    error = ctx.injected_error() or txn_coordinator_error(ctx, txn_id)
    if error:
        results = dict.fromkeys(wanted, error)
    else:
        results = transaction_coordinator(ctx.cluster).add_partitions(
            txn_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            wanted,
            wall_ms(),
        )
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), code in results.items():
        by_topic.setdefault(topic, []).append(
            P(
                version=v,
                partition_index=partition,
                partition_error_code=fenced_for_version(code, v, FENCED_FROM_VERSION),
            )
        )
    return R(
        version=v,
        throttle_time_ms=0,
        results_by_topic_v3_and_below=[
            T(version=v, name=name, results_by_partition=parts) for name, parts in by_topic.items()
        ],
    )
