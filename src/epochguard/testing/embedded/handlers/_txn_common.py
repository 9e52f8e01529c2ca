"""Glue between the sans-IO transaction coordinator and the asyncio server.

The coordinator lives in ``ClusterState.transactions``, created on first use with a repeating
loop timer that retries pending markers and aborts timed-out transactions. A transactional id
is coordinated by a live broker chosen by the same stable hash as a group id.
"""

from __future__ import annotations

import asyncio
import time

import attrs

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.consumer_groups import consumer_coordinator
from epochguard.testing.embedded.handlers import RequestContext
from epochguard.testing.embedded.handlers._group_common import coordinator, coordinator_broker
from epochguard.testing.embedded.state import ClusterState
from epochguard.testing.embedded.transactions import COORDINATOR_EPOCH, TransactionCoordinator

TICK_SECONDS = 0.1


def wall_ms() -> int:
    return int(time.time() * 1000)


@attrs.frozen
class ClusterParticipants:
    """:class:`~epochguard.testing.embedded.transactions.Participants` on a ClusterState."""

    cluster: ClusterState

    def new_producer_id(self) -> int:
        return self.cluster.next_producer_id()

    def partition_exists(self, topic: str, partition: int) -> bool:
        t = self.cluster.topics.get(topic)
        return t is not None and partition in t.partitions

    def write_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> bool:
        return self.cluster.write_txn_marker(
            topic, partition, producer_id, producer_epoch, commit, COORDINATOR_EPOCH
        )

    def end_group_transaction(self, group_id: str, producer_id: int, commit: bool) -> None:
        modern = consumer_coordinator(self.cluster)
        if modern is not None and group_id in modern.groups:
            modern.end_transaction(group_id, producer_id, commit)
        else:
            coordinator(self.cluster).end_transaction(group_id, producer_id, commit)


def transaction_coordinator(cluster: ClusterState) -> TransactionCoordinator:
    """The cluster's transaction coordinator, installed (with its timer) on first use."""
    existing = cluster.transactions
    if isinstance(existing, TransactionCoordinator):
        return existing
    coord = TransactionCoordinator(
        ClusterParticipants(cluster), max_timeout_ms=cluster.transaction_max_timeout_ms
    )
    cluster.transactions = coord
    loop = asyncio.get_running_loop()

    def tick() -> None:
        if cluster.transactions is not coord:
            return
        coord.tick(wall_ms())
        loop.call_later(TICK_SECONDS, tick)

    loop.call_later(TICK_SECONDS, tick)
    return coord


def txn_coordinator_error(ctx: RequestContext, transactional_id: str) -> int:
    """NOT_COORDINATOR when this broker does not coordinate ``transactional_id``."""
    b = coordinator_broker(ctx.cluster, transactional_id)
    if b is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return ErrorCode.NONE if b.node_id == ctx.broker_id else ErrorCode.NOT_COORDINATOR


def fenced_for_version(error: int, version: int, first_version: int) -> int:
    """PRODUCER_FENCED is INVALID_PRODUCER_EPOCH to clients older than KIP-588's versions."""
    if error == ErrorCode.PRODUCER_FENCED and version < first_version:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error
