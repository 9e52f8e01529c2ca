"""Glue between the sans-IO group coordinator and the asyncio server.

The coordinator object lives in ``ClusterState.groups``, created on first use; a repeating loop
timer drives its session and rebalance timeouts. The coordinator of a group is a live broker
chosen by a stable hash of the group id, so it moves when that broker stops (clients then get
NOT_COORDINATOR and look it up again, as with a real ``__consumer_offsets`` leader change).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from typing import TypeVar

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.groups import GroupCoordinator
from epochguard.testing.embedded.handlers import RequestContext
from epochguard.testing.embedded.state import BrokerState, ClusterState

TICK_SECONDS = 0.05
CLIENT_HOST = "/127.0.0.1"

T = TypeVar("T")


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def coordinator(cluster: ClusterState) -> GroupCoordinator:
    """The cluster's group coordinator, installed (with its timer) on first use."""
    existing = cluster.groups
    if isinstance(existing, GroupCoordinator):
        return existing
    coord = GroupCoordinator()
    cluster.groups = coord
    loop = asyncio.get_running_loop()

    def tick() -> None:
        if cluster.groups is not coord:
            return
        coord.tick(now_ms())
        loop.call_later(TICK_SECONDS, tick)

    loop.call_later(TICK_SECONDS, tick)
    return coord


def coordinator_broker(cluster: ClusterState, key: str) -> BrokerState | None:
    """The live broker coordinating ``key`` (a group or transactional id), None if none."""
    alive = sorted(cluster.alive_brokers(), key=lambda b: b.node_id)
    if not alive:
        return None
    return alive[zlib.crc32(key.encode()) % len(alive)]


def coordinator_error(ctx: RequestContext, group_id: str) -> int:
    """NOT_COORDINATOR when this broker does not coordinate ``group_id`` (0 when it does)."""
    b = coordinator_broker(ctx.cluster, group_id)
    if b is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return ErrorCode.NONE if b.node_id == ctx.broker_id else ErrorCode.NOT_COORDINATOR


async def held(start: Callable[[Callable[[T], None]], None]) -> T:
    """Run a coordinator call that answers through a callback, possibly much later."""
    fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def respond(result: T) -> None:
        if not fut.done():
            fut.set_result(result)

    start(respond)
    return await fut
