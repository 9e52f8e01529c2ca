"""Error codes and the leader/epoch checks shared by the partition-level handlers."""

from __future__ import annotations

import attrs

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext
from epochguard.testing.embedded.partition_log import PartitionLog
from epochguard.testing.embedded.state import PartitionState, PartitionView


@attrs.frozen
class Local:
    """The partition as this broker serves it: controller state, its view and its replica."""

    state: PartitionState
    view: PartitionView
    log: PartitionLog


def local_partition(
    ctx: RequestContext,
    topic: str,
    partition: int,
    current_leader_epoch: int = -1,
    require_leader: bool = True,
) -> Local | int:
    """This broker's replica of ``topic``-``partition`` or the error code Kafka would give.

    Like Kafka's ``Partition.getLocalLog``: the client's current leader epoch is checked
    against this broker's own (possibly stale) view first, then leadership.
    """
    t = ctx.cluster.topics.get(topic)
    tv = ctx.cluster.brokers[ctx.broker_id].view.topics.get(topic)
    if t is None or tv is None or tv.topic_id != t.topic_id:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    pv = tv.partitions.get(partition)
    p = t.partitions.get(partition)
    if pv is None or p is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if ctx.broker_id not in pv.replicas:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if current_leader_epoch >= 0:
        if current_leader_epoch < pv.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if current_leader_epoch > pv.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
    if require_leader and pv.leader != ctx.broker_id:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return Local(p, pv, p.logs[ctx.broker_id])
