"""ElectLeaders v0-v2: preferred (0) and unclean (1) elections, as Kafka's controller runs them.

Preferred elects the first replica if it is alive and in the ISR. Unclean only acts on a
partition without a leader, electing a live ISR (or ELR) member if any, else the first live
replica. A Raft-term cluster transfers leadership to the preferred replica if it can win the
vote, and has no unclean elections.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import ElectLeadersRequest, ElectLeadersResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler
from epochguard.testing.embedded.state import ClusterState, EmbeddedClusterError

PREFERRED = 0
UNCLEAN = 1


def elect(cluster: ClusterState, topic: str, partition: int, election_type: int) -> int:
    """Run one election; returns the Kafka error code for the partition."""
    t = cluster.topics.get(topic)
    if t is None or partition not in t.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    p = t.partitions[partition]
    if election_type == PREFERRED:
        preferred = p.replicas[0]
        if p.leader == preferred:
            return ErrorCode.ELECTION_NOT_NEEDED
        if not cluster.brokers[preferred].alive or preferred not in p.isr:
            return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
        try:
            cluster.elect_leader(topic, partition, preferred, unclean=False)
        except EmbeddedClusterError:
            return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE  # Raft: it would lose the vote
        return 0
    if p.leader is not None:
        return ErrorCode.ELECTION_NOT_NEEDED
    if not cluster.elect_any_leader(p):
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    cluster.publish()
    return 0


@handler(ElectLeadersRequest, ElectLeadersResponse, 0, 2)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = ElectLeadersResponse
    T = R.ReplicaElectionResult
    P = T.PartitionResult
    v = ctx.version
    cluster = ctx.cluster
    election_type = int(request.election_type) if v >= 1 else PREFERRED
    injected = ctx.injected_error()
    if request.topic_partitions is None:
        wanted = [(t.name, sorted(t.partitions)) for t in cluster.topics.values()]
    else:
        wanted = [(tp.topic, list(tp.partitions)) for tp in request.topic_partitions]
    results = []
    for topic, parts in wanted:
        out = []
        for idx in parts:
            error = injected or elect(cluster, topic, idx, election_type)
            out.append(P(version=v, partition_id=idx, error_code=error, error_message=None))
        results.append(T(version=v, topic=topic, partition_result=out))
    return R(version=v, throttle_time_ms=0, error_code=0, replica_election_results=results)
