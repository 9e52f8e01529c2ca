"""Error codes and the leader/epoch checks shared by the partition-level handlers."""

from __future__ import annotations

import attrs

from epochguard.testing.embedded.handlers import RequestContext
from epochguard.testing.embedded.partition_log import PartitionLog
from epochguard.testing.embedded.state import PartitionState, PartitionView

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
NOT_CONTROLLER = 41
COORDINATOR_NOT_AVAILABLE = 15
NOT_ENOUGH_REPLICAS = 19
INVALID_REQUIRED_ACKS = 21
TOPIC_AUTHORIZATION_FAILED = 29
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REQUEST = 42
INVALID_CONFIG = 40
POLICY_VIOLATION = 44
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
ELECTION_NOT_NEEDED = 84
PREFERRED_LEADER_NOT_AVAILABLE = 80
ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
UNKNOWN_TOPIC_ID = 100
INCONSISTENT_TOPIC_ID = 103


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
        return UNKNOWN_TOPIC_OR_PARTITION
    pv = tv.partitions.get(partition)
    p = t.partitions.get(partition)
    if pv is None or p is None:
        return UNKNOWN_TOPIC_OR_PARTITION
    if ctx.broker_id not in pv.replicas:
        return NOT_LEADER_OR_FOLLOWER
    if current_leader_epoch >= 0:
        if current_leader_epoch < pv.leader_epoch:
            return FENCED_LEADER_EPOCH
        if current_leader_epoch > pv.leader_epoch:
            return UNKNOWN_LEADER_EPOCH
    if require_leader and pv.leader != ctx.broker_id:
        return NOT_LEADER_OR_FOLLOWER
    return Local(p, pv, p.logs[ctx.broker_id])
