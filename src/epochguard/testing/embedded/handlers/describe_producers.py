"""DescribeProducers v0 (KIP-664): the producers a partition leader has state for, with the
first offset of each one's open transaction (how a hanging transaction is found)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeProducersRequest, DescribeProducersResponse

from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import local_partition


@handler(DescribeProducersRequest, DescribeProducersResponse, 0, 0)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DescribeProducersResponse
    T = R.TopicResponse
    P = T.PartitionResponse
    S = P.ProducerState
    v = ctx.version
    injected = ctx.injected_error()
    topics = []
    for t in request.topics:
        parts = []
        for index in t.partition_indexes:
            local = local_partition(ctx, t.name, index)
            error = injected or (local if isinstance(local, int) else 0)
            producers = []
            if not error and not isinstance(local, int):
                producers = [
                    S(
                        version=v,
                        producer_id=e.producer_id,
                        producer_epoch=e.epoch,
                        last_sequence=e.last_sequence,
                        last_timestamp=e.last_timestamp,
                        coordinator_epoch=e.coordinator_epoch,
                        current_txn_start_offset=e.txn_first_offset,
                    )
                    for e in sorted(local.log.producers, key=lambda e: e.producer_id)
                ]
            parts.append(
                P(
                    version=v,
                    partition_index=index,
                    error_code=error,
                    error_message=None,
                    active_producers=producers,
                )
            )
        topics.append(T(version=v, name=t.name, partitions=parts))
    return R(version=v, throttle_time_ms=0, topics=topics)
