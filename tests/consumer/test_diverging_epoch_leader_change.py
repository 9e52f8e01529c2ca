"""Unclean leader changes on the EmbeddedCluster, both drivers: a new leader that answered
Fetch v12+ before is not asked OffsetForLeaderEpoch; the fetch's DivergingEpoch finds the
truncation, with the report a consumer validating by OffsetForLeaderEpoch (Fetch v11) gets."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from epochguard import AIOEpochConsumer, EpochConsumer
from epochguard.offsets.report import DetectedBy, TruncationReport
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, consumer_config, setup_topic

pytestmark = pytest.mark.timeout(120)

OFFSET_FOR_LEADER_EPOCH = 23


def _wait_isr(cluster: EmbeddedCluster, brokers: set[int]) -> None:
    deadline = time.monotonic() + 20
    while set(cluster.isr("t", 0)) != brokers:
        assert time.monotonic() < deadline, f"ISR {cluster.isr('t', 0)}, wanted {brokers}"
        time.sleep(0.01)


def _validations(cluster: EmbeddedCluster, client_id: str) -> int:
    return sum(
        n
        for (cid, api), n in cluster.requests_by_client().items()
        if cid == client_id and api == OFFSET_FOR_LEADER_EPOCH
    )


class Schedule:
    """Two unclean changes, A -> B -> A. Each: the follower is stopped, the leader alone takes
    ``LOST`` records that the consumers read, the leader is stopped and the follower elected
    uncleanly, and it takes ``NEW`` records at the same offsets; the old leader comes back."""

    LOST, NEW = 3, 4

    def __init__(self, cluster: EmbeddedCluster) -> None:
        self.cluster = cluster
        self.leader, self.follower = setup_topic(cluster, kept=5)
        self.end = 5

    def before(self) -> int:
        """The follower stops and the leader takes the records about to be lost; returns
        the offset the consumers must read to."""
        c = self.cluster
        c.stop_broker(self.follower)
        _wait_isr(c, {self.leader})
        c.append("t", 0, [b"lost-%d" % i for i in range(self.LOST)], batch_size=1)
        self.end += self.LOST
        return self.end

    def change(self) -> None:
        c = self.cluster
        c.stop_broker(self.leader)
        c.start_broker(self.follower)
        c.elect_leader("t", 0, self.follower, unclean=True)
        c.append("t", 0, [b"new-%d" % i for i in range(self.NEW)], batch_size=1)
        self.end += self.NEW - self.LOST
        c.start_broker(self.leader)
        _wait_isr(c, {self.leader, self.follower})
        self.leader, self.follower = self.follower, self.leader


async def _run(
    cluster: EmbeddedCluster, consumers: dict[str, Any], poll: Callable[[Any], Awaitable[None]]
) -> dict[str, list[TruncationReport]]:
    """Both consumers through the schedule; their reports, and OffsetForLeaderEpoch requests
    of the second change by client id, checked here."""
    sched = Schedule(cluster)

    async def until(cond: Callable[[Any], Any]) -> None:
        deadline = time.monotonic() + 20
        for c in consumers.values():
            while not await _value(cond(c)):
                assert time.monotonic() < deadline, "consumer did not get there in time"
                await poll(c)

    for c in consumers.values():
        c.assign([TP0])
    for change in range(2):
        end = sched.before()
        await until(lambda c, end=end: _offset(c, end))
        seen = {cid: _validations(cluster, cid) for cid in consumers}
        sched.change()
        await until(lambda c, n=change + 1: len(c.truncation_reports()) == n)
        if change == 1:
            # The new leader (the first leader again) answered v12+ fetches before.
            asked = {cid: _validations(cluster, cid) - seen[cid] for cid in consumers}
            assert asked == {"fetch-v17": 0, "fetch-v11": 1}
    return {cid: c.truncation_reports() for cid, c in consumers.items()}


async def _value(x: Any) -> Any:
    return await x if inspect.isawaitable(x) else x


async def _offset(c: Any, end: int) -> bool:
    pos = await _value(c.position_with_epoch(TP0))
    return pos is not None and pos.offset == end


def _check(reports: dict[str, list[TruncationReport]]) -> None:
    by_fetch, by_request = reports["fetch-v17"], reports["fetch-v11"]
    # Validated by OffsetForLeaderEpoch, after metadata named the new epoch or after a broker
    # that knows it refused a fetch (FENCED_LEADER_EPOCH; the old leader is back as a
    # follower within milliseconds): which comes first is the machine's timing.
    assert {r.detected_by for r in by_request} <= {DetectedBy.METADATA, DetectedBy.FENCED}
    # The first change goes to a broker the consumer never fetched from: validated the old
    # way; the second to one that answered v12+: by the fetch.
    assert by_fetch[1].detected_by is DetectedBy.DIVERGING_EPOCH
    assert [(r.lost_from, r.lost_to) for r in by_fetch] == [(5, 8), (9, 12)]
    for a, b in zip(by_fetch, by_request, strict=True):
        assert attrs.evolve(a, detected_by=b.detected_by) == b


def test_threads_driver(cluster: EmbeddedCluster) -> None:
    consumers = {
        cid: EpochConsumer(**consumer_config(cluster, client_id=cid, max_fetch_version=v))
        for cid, v in (("fetch-v17", 17), ("fetch-v11", 11))
    }

    async def poll(c: EpochConsumer) -> None:
        c.poll(timeout_ms=20)

    try:
        reports = asyncio.run(_run(cluster, consumers, poll))
    finally:
        for c in consumers.values():
            c.close()
    _check(reports)


def test_asyncio_driver(cluster: EmbeddedCluster) -> None:
    async def main() -> dict[str, list[TruncationReport]]:
        consumers = {
            cid: AIOEpochConsumer(**consumer_config(cluster, client_id=cid, max_fetch_version=v))
            for cid, v in (("fetch-v17", 17), ("fetch-v11", 11))
        }
        for c in consumers.values():
            await c.start()

        async def poll(c: AIOEpochConsumer) -> None:
            await c.getmany(timeout_ms=20)

        try:
            return await _run(cluster, consumers, poll)
        finally:
            for c in consumers.values():
                await c.stop()

    _check(asyncio.run(main()))


def test_a_fetch_below_the_log_start_is_out_of_range_before_any_divergence(
    cluster: EmbeddedCluster,
) -> None:
    """Kafka's Partition.readRecords: a fetch offset below the log start is answered
    OFFSET_OUT_OF_RANGE even when its LastFetchedEpoch diverges (the consumer then validates
    and resets, rather than rewinding to a divergence point that is gone)."""
    from tests.embedded.test_protocol import OFFSET_OUT_OF_RANGE, diverged_cluster, fetch

    _old, new = diverged_cluster(cluster)
    cluster.elect_leader("t", 0, new)  # epoch 3: no record
    cluster.elect_leader("t", 0, new)  # epoch 4
    cluster.append("t", 0, [b"e4"] * 3)
    assert cluster.epoch_cache("t", 0, new) == [(0, 0), (2, 10), (4, 13)]
    # Last fetched epoch 3, unknown to the leader: the largest epoch below it, 2, ends at 13.
    (p,) = fetch(cluster, new, "t", [(0, 4, 11, 3)])
    assert (p.error_code, p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (0, 2, 13)
    cluster.delete_records("t", 0, 12)
    assert cluster.log_start_offset("t", 0, new) == 12
    (p,) = fetch(cluster, new, "t", [(0, 4, 11, 3)])
    assert p.error_code == OFFSET_OUT_OF_RANGE
