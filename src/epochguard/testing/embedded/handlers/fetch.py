"""Fetch v4-v16 for consumers: long poll, leader-epoch fencing, KIP-595 DivergingEpoch.

v7+ keeps KIP-227 incremental fetch sessions (``fetch_sessions.py``); v13+ addresses topics by
id (UNKNOWN_TOPIC_ID for an id this broker does not know); v16 adds the KIP-951 leader hints
(``current_leader`` and ``node_endpoints``). Records are the stored batch bytes, never
re-encoded.

Every answer carries the replica's last stable offset. Under read_committed (isolation level
1) records stop at it and the answer lists the aborted transactions overlapping the records
from the fetch offset to the log end, as Kafka's transaction index lookup does on a small
log (an empty list when no records are returned).
"""

from __future__ import annotations

import time
from typing import Any

import attrs
from kafka.protocol.consumer import FetchRequest, FetchResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.fetch_frame import StoredBatches
from epochguard.testing.embedded.fetch_sessions import FetchTarget, SessionError, TopicKey
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._common import (
    Local,
    local_partition,
)
from epochguard.testing.embedded.state import MetadataImage

_EMPTY = b""
READ_COMMITTED = 1


@attrs.frozen
class _Answer:
    target: FetchTarget
    data: Any  # FetchResponse PartitionData
    size: int
    urgent: bool  # an error or a diverging epoch: answer without waiting


def _topic_name(view: MetadataImage, key: TopicKey) -> str | None:
    if isinstance(key, str):
        return key
    # Topic ids (v13+): a recreated topic's old id is unknown, not the new topic.
    tv = view.topic_by_id(key)
    return tv.name if tv is not None else None


def _answer(
    ctx: RequestContext,
    view: MetadataImage,
    target: FetchTarget,
    injected: int,
    budget: int,
    client_rack: str | None,
    read_committed: bool,
) -> _Answer:
    P = FetchResponse.FetchableTopicResponse.PartitionData
    v = ctx.version
    hw = lso = start = -1
    records: bytes | StoredBatches = _EMPTY
    aborted: list[Any] | None = [] if read_committed else None
    diverging = None
    name = _topic_name(view, target.topic)
    if name is not None and target.resolved_name is None:
        target.resolved_name = name
    preferred = -1
    local: Local | int
    if name is None and target.resolved_name is not None:
        # A session partition whose topic id no longer resolves (Kafka's session cache
        # resolved it when the partition joined): the topic was re-created under the same
        # name, a log with another id, or is gone.
        recreated = target.resolved_name in view.topics
        local = (
            ErrorCode.INCONSISTENT_TOPIC_ID if recreated else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
    elif name is None:
        local = ErrorCode.UNKNOWN_TOPIC_ID
    else:
        # KIP-392: from v11 on (client metadata present) a follower serves consumers too,
        # up to its own high watermark.
        local = local_partition(
            ctx,
            name,
            target.partition,
            target.current_leader_epoch,
            require_leader=client_rack is None,
        )
    error = injected or (local if isinstance(local, int) else 0)
    if not error and name is not None and not isinstance(local, int):
        log = local.log
        hw = log.high_watermark
        lso = log.last_stable_offset
        upper = lso if read_committed else hw
        start = log.log_start_offset
        offset = target.fetch_offset
        last_epoch = target.last_fetched_epoch if v >= 12 else -1
        if last_epoch >= 0:
            # KIP-595: the broker compares the client's last fetched epoch itself.
            epoch, end = log.end_offset_for_epoch(last_epoch)
            if epoch < 0 or end < 0:
                error = ErrorCode.OFFSET_OUT_OF_RANGE
            elif offset < log.log_start_offset:
                # Kafka's Partition.readRecords: below the log start is out of range,
                # whether or not the epochs diverge.
                error = ErrorCode.OFFSET_OUT_OF_RANGE
            elif epoch < last_epoch or end < offset:
                diverging = P.EpochEndOffset(version=v, epoch=epoch, end_offset=end)
        leading = local.view.leader == ctx.broker_id
        if not error and diverging is None and client_rack is not None and leading:
            chosen = ctx.cluster.preferred_read_replica(local.state, client_rack, offset)
            if chosen is not None:
                preferred = chosen
        if error or diverging is not None or preferred >= 0:
            pass  # a preferred read replica comes without records, as from Kafka
        elif offset < log.log_start_offset or offset > log.log_end_offset:
            error = ErrorCode.OFFSET_OUT_OF_RANGE
        elif offset < upper and (budget > 0 or budget == -1):
            # KIP-74: the first partition with data gets at least one whole batch.
            limit = (
                target.partition_max_bytes
                if budget == -1
                else min(target.partition_max_bytes, budget)
            )
            batches = log.read_batches(offset, max(limit, 1), upper=upper)
            faults = ctx.cluster.faults
            if faults.corrupts(ctx.broker_id, name, target.partition):
                records = faults.corrupt_records(
                    ctx.broker_id, name, target.partition, b"".join(batches)
                )
            elif batches:
                records = StoredBatches(batches)
            if aborted is not None and batches:
                aborted = [
                    P.AbortedTransaction(
                        version=v, producer_id=a.producer_id, first_offset=a.first_offset
                    )
                    for a in log.aborted_transactions(offset, log.log_end_offset)
                ]
    if error:
        hw = lso = start = -1  # as Kafka: offsets are unknown with an error
        aborted = None
    data = P(
        version=v,
        partition_index=target.partition,
        error_code=error,
        high_watermark=hw,
        last_stable_offset=lso,
        log_start_offset=start,
        aborted_transactions=aborted,
        preferred_read_replica=preferred,
        records=records,
    )
    if v >= 12:
        if diverging is not None:
            data.diverging_epoch = diverging
        if name is not None and error:
            pv = view.partition(name, target.partition)
            if pv is not None and pv.leader >= 0:
                data.current_leader = P.LeaderIdAndEpoch(
                    version=v, leader_id=pv.leader, leader_epoch=pv.leader_epoch
                )
    urgent = bool(error) or diverging is not None or preferred >= 0
    return _Answer(target, data, len(records), urgent)


def _must_send(answer: _Answer) -> bool:
    """Kafka's rule for including a partition in an incremental response."""
    t = answer.target
    d = answer.data
    return (
        answer.size > 0
        or answer.urgent
        or d.high_watermark != t.sent_high_watermark
        or d.log_start_offset != t.sent_log_start_offset
    )


def request_rack(ctx: RequestContext, request: Any) -> str | None:
    """The consumer's rack for KIP-392 (``""``: none given), ``None`` when only leaders serve
    it: below v11 (as Kafka), and on a cluster made without ``replica_selector`` (Kafka
    would let a follower serve v11+; this cluster keeps its leader-only answers there)."""
    if ctx.version < 11 or ctx.cluster.replica_selector is None:
        return None
    return str(getattr(request, "rack_id", "") or "")


def _build(
    ctx: RequestContext,
    request: Any,
    targets: list[FetchTarget],
    incremental: bool,
    injected: int,
    max_bytes: int,
) -> tuple[list[_Answer], int, bool]:
    """One pass: (answers to send, record bytes, whether to answer at once)."""
    view = ctx.cluster.brokers[ctx.broker_id].view
    client_rack = request_rack(ctx, request)
    read_committed = request.isolation_level == READ_COMMITTED
    total = 0
    urgent = False
    answers = []
    for target in targets:
        budget = -1 if total == 0 else max_bytes - total
        answer = _answer(ctx, view, target, injected, budget, client_rack, read_committed)
        if incremental and not _must_send(answer):
            continue
        answers.append(answer)
        total += answer.size
        urgent = urgent or answer.urgent
    return answers, total, urgent


def _targets(request: Any, v: int) -> tuple[list[FetchTarget], list[tuple[TopicKey, int]]]:
    targets = []
    for ft in request.topics:
        key: TopicKey = ft.topic_id if v >= 13 else ft.topic
        for fp in ft.partitions:
            targets.append(
                FetchTarget(
                    key,
                    fp.partition,
                    fp.current_leader_epoch if v >= 9 else -1,
                    fp.fetch_offset,
                    fp.last_fetched_epoch if v >= 12 else -1,
                    fp.partition_max_bytes,
                )
            )
    forgotten: list[tuple[TopicKey, int]] = []
    if v >= 7:
        for ff in request.forgotten_topics_data:
            key = ff.topic_id if v >= 13 else ff.topic
            forgotten += [(key, p) for p in ff.partitions]
    return targets, forgotten


def _response(ctx: RequestContext, answers: list[_Answer], session_id: int) -> Any:
    R = FetchResponse
    T = R.FetchableTopicResponse
    v = ctx.version
    grouped: dict[TopicKey, list[Any]] = {}
    for a in answers:
        grouped.setdefault(a.target.topic, []).append(a.data)
    topics = [
        T(version=v, topic_id=key, partitions=parts)
        if v >= 13
        else T(version=v, topic=key, partitions=parts)
        for key, parts in grouped.items()
    ]
    response = R(
        version=v, throttle_time_ms=0, error_code=0, session_id=session_id, responses=topics
    )
    leaders = {
        a.data.current_leader.leader_id
        for a in answers
        if v >= 12 and a.data.current_leader is not None and a.data.current_leader.leader_id >= 0
    }
    if v >= 16 and leaders:
        # KIP-951: tell the client where the leaders it was pointed to are.
        response.node_endpoints = [
            R.NodeEndpoint(
                version=v, node_id=b.node_id, host=b.host, port=ctx.port_of(b), rack=b.rack
            )
            for b in ctx.cluster.brokers.values()
            if b.node_id in leaders and b.alive
        ]
    return response


@handler(FetchRequest, FetchResponse, 4, 16)
async def handle(ctx: RequestContext, request: Any) -> Any:
    v = ctx.version
    broker = ctx.cluster.brokers[ctx.broker_id]
    requested, forgotten = _targets(request, v)
    session = None
    targets, incremental = requested, False
    if v >= 7:
        try:
            session, targets, incremental = broker.fetch_sessions.open(
                request.session_id,
                request.session_epoch,
                requested,
                forgotten,
                create=ctx.cluster.fetch_sessions_enabled,
                uses_topic_ids=v >= 13,
            )
        except SessionError as e:
            return FetchResponse(
                version=v, throttle_time_ms=0, error_code=e.error_code, session_id=0, responses=[]
            )
    injected = ctx.injected_error()
    deadline = time.monotonic() + max(0, request.max_wait_ms) / 1000.0
    while True:
        answers, total, urgent = _build(
            ctx, request, targets, incremental, injected, request.max_bytes
        )
        remaining = deadline - time.monotonic()
        if urgent or total >= max(1, request.min_bytes) or remaining <= 0 or not broker.alive:
            break
        await ctx.cluster.wait_for_data(remaining)
    served = sum(a.size for a in answers)
    if served:
        ctx.cluster.consumer_fetch_bytes[ctx.broker_id] += served
    if session is not None:
        for a in answers:
            a.target.sent_high_watermark = a.data.high_watermark
            a.target.sent_log_start_offset = a.data.log_start_offset
            if incremental and a.size > 0:
                session.served(a.target)
    return _response(ctx, answers, session.session_id if session is not None else 0)
