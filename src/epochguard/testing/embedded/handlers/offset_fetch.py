"""OffsetFetch v1-v10: committed offsets, ``committed_leader_epoch`` from v5, batched groups
from v8, topic ids from v10.

A partition without a commit answers offset -1, epoch -1, no error. Offsets committed to an
earlier incarnation of a topic (deleted, then recreated with a new topic id) than the
coordinator's metadata view knows are not returned; a coordinator whose view does not know
the topic yet, or knows only an earlier incarnation than the commit's, returns the commit by
name, as Kafka's coordinator (it reads its offsets store only). The last happens here
because the cluster moves a group to another live broker at once, whatever that broker's
view; in KRaft a broker learns that it coordinates only after the metadata before. With
``require_stable`` (v7+, KIP-447) a partition whose offset an open transaction has committed
answers UNSTABLE_OFFSET_COMMIT.
"""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.consumer_groups import (
    ConsumerGroupCoordinator,
    consumer_coordinator,
)
from epochguard.testing.embedded.groups import CommittedOffset, GroupCoordinator
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.handlers._group_common import coordinator, coordinator_error
from epochguard.testing.embedded.state import ClusterState, MetadataImage

NO_OFFSET = CommittedOffset(offset=-1, leader_epoch=-1, metadata="")

# (name, topic id, [(partition, committed, error)])
TopicResult = tuple[str, uuid.UUID | None, list[tuple[int, CommittedOffset, int]]]


def _group_offsets(
    cluster: ClusterState,
    coord: GroupCoordinator | ConsumerGroupCoordinator,
    view: MetadataImage,
    group_id: str,
    topics: list[tuple[str | None, uuid.UUID | None, list[int]]] | None,
    require_stable: bool = False,
) -> list[TopicResult]:
    """Offsets of ``topics`` ((name, id, partitions); name None: look up the id), or of
    every partition the group committed when ``topics`` is None."""
    if topics is None:
        by_topic: dict[str, list[int]] = {}
        for tname, part in sorted(coord.fetch_offsets(group_id, None)):
            by_topic.setdefault(tname, []).append(part)
        topics = [(tname, None, parts) for tname, parts in by_topic.items()]
        only_committed = True
    else:
        only_committed = False
    out: list[TopicResult] = []
    for name, tid, parts in topics:
        tv = (
            view.topic_by_id(tid)
            if name is None and tid is not None
            else (view.topics.get(name) if name is not None else None)
        )
        if name is None and tv is None:
            out.append(("", tid, [(p, NO_OFFSET, ErrorCode.UNKNOWN_TOPIC_ID) for p in parts]))
            continue
        tname = tv.name if tv is not None else (name or "")
        stored = coord.fetch_offsets(group_id, [(tname, p) for p in parts])
        results: list[tuple[int, CommittedOffset, int]] = []
        for p in parts:
            c = stored.get((tname, p))
            # Kafka's coordinator answers from its offsets store alone: a broker that has
            # not learnt of the topic yet, or of its latest incarnation (a stale view after
            # a restart, or after the coordinator moved to it), still returns the commit, or
            # the consumer would reset and re-read what it committed.
            live = c is not None and (
                tv is None
                or c.topic_id is None
                or not cluster.older_incarnation(c.topic_id, than=tv.topic_id)
            )
            unstable = require_stable and coord.has_pending_txn_offset(group_id, (tname, p))
            if unstable:
                results.append((p, NO_OFFSET, ErrorCode.UNSTABLE_OFFSET_COMMIT))
            elif c is not None and live:
                results.append((p, c, 0))
            elif not only_committed:
                results.append((p, NO_OFFSET, 0))
        if results:
            out.append((tname, tv.topic_id if tv is not None else tid, results))
    return out


@handler(OffsetFetchRequest, OffsetFetchResponse, 1, 10)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = OffsetFetchResponse
    v = ctx.version
    view = ctx.cluster.brokers[ctx.broker_id].view
    injected = ctx.injected_error()
    classic = coordinator(ctx.cluster)
    modern = consumer_coordinator(ctx.cluster)

    def coord_of(group_id: str) -> GroupCoordinator | ConsumerGroupCoordinator:
        # KIP-848 groups keep their offsets in consumer_groups.py.
        return modern if modern is not None and group_id in modern.groups else classic

    if v < 8:
        T = R.OffsetFetchResponseTopic
        P = T.OffsetFetchResponsePartition
        error = injected or coordinator_error(ctx, request.group_id)
        wanted: list[tuple[str | None, uuid.UUID | None, list[int]]] | None
        wanted = (
            None
            if request.topics is None
            else [(t.name, None, list(t.partition_indexes)) for t in request.topics]
        )
        if error and (v >= 2 or wanted is None):
            return R(version=v, throttle_time_ms=0, topics=[], error_code=error)
        if error:
            # v1 has no top-level error: every requested partition carries it.
            res: list[TopicResult] = [
                (n or "", None, [(p, NO_OFFSET, error) for p in ps]) for n, _, ps in wanted or []
            ]
        else:
            res = _group_offsets(
                ctx.cluster,
                coord_of(request.group_id),
                view,
                request.group_id,
                wanted,
                require_stable=v >= 7 and bool(request.require_stable),
            )
        topics = [
            T(
                version=v,
                name=name,
                partitions=[
                    P(
                        version=v,
                        partition_index=p,
                        committed_offset=c.offset,
                        committed_leader_epoch=c.leader_epoch,
                        metadata=c.metadata,
                        error_code=e,
                    )
                    for p, c, e in parts
                ],
            )
            for name, _, parts in res
        ]
        return R(version=v, throttle_time_ms=0, topics=topics, error_code=0)

    G = R.OffsetFetchResponseGroup
    GT = G.OffsetFetchResponseTopics
    GP = GT.OffsetFetchResponsePartitions
    groups = []
    for g in request.groups:
        error = injected or coordinator_error(ctx, g.group_id)
        coord = coord_of(g.group_id)
        if not error and v >= 9 and isinstance(coord, ConsumerGroupCoordinator):
            error = coord.fetch_error(g.group_id, g.member_id, g.member_epoch)
        if error:
            groups.append(G(version=v, group_id=g.group_id, topics=[], error_code=error))
            continue
        wanted8: list[tuple[str | None, uuid.UUID | None, list[int]]] | None
        wanted8 = (
            None
            if g.topics is None
            else [
                (
                    t.name if v < 10 else None,
                    t.topic_id if v >= 10 else None,
                    list(t.partition_indexes),
                )
                for t in g.topics
            ]
        )
        res = _group_offsets(
            ctx.cluster,
            coord,
            view,
            g.group_id,
            wanted8,
            require_stable=bool(request.require_stable),
        )
        topics = [
            GT(
                version=v,
                name=name,
                topic_id=tid,
                partitions=[
                    GP(
                        version=v,
                        partition_index=p,
                        committed_offset=c.offset,
                        committed_leader_epoch=c.leader_epoch,
                        metadata=c.metadata,
                        error_code=e,
                    )
                    for p, c, e in parts
                ],
            )
            for name, tid, parts in res
        ]
        groups.append(G(version=v, group_id=g.group_id, topics=topics, error_code=0))
    return R(version=v, throttle_time_ms=0, groups=groups)
