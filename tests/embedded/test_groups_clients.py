"""Consumer groups of real clients against the embedded coordinator, over TCP.

kafka-python 3.0.12, librdkafka (confluent-kafka) and aiokafka 0.14, alone and mixed in one
group. Session timeouts are small and rebalances complete as soon as every member rejoined,
so each test takes a few seconds at most.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata as AOffsetAndMetadata
from aiokafka.structs import TopicPartition as ATopicPartition
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.handlers import REGISTRY, ApiEntry, RequestContext

pytestmark = pytest.mark.timeout(90)

TOPIC = "t"
PARTITIONS = 4
ALL = {(TOPIC, p) for p in range(PARTITIONS)}
GROUP_TIMEOUTS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
                  "max_poll_interval_ms": 10000}
RDK_TIMEOUTS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                "max.poll.interval.ms": 10000}


@pytest.fixture
def api_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[tuple[str | None, int, int]]]:
    """Records (client id, api key, version) of every request the cluster handles."""
    seen: set[tuple[str | None, int, int]] = set()

    def wrap(entry: ApiEntry) -> ApiEntry:
        async def spy(ctx: RequestContext, request: Any) -> Any:
            seen.add((ctx.client_id, ctx.api_key, ctx.version))
            return await entry.handler(ctx, request)

        return ApiEntry(spy, entry.min_version, entry.max_version, entry.request_class,
                        entry.response_class)

    for key, entry in list(REGISTRY.items()):
        monkeypatch.setitem(REGISTRY, key, wrap(entry))
    yield seen


def versions(log: set[tuple[str | None, int, int]], client: str, api_key: int) -> set[int]:
    return {v for c, k, v in log if c == client and k == api_key}


def kp_consumer(cluster: EmbeddedCluster, client_id: str, **extra: Any) -> KafkaConsumer:
    return KafkaConsumer(TOPIC, bootstrap_servers=cluster.bootstrap_servers, group_id="g",
                         client_id=client_id, enable_auto_commit=False,
                         auto_offset_reset="earliest", **GROUP_TIMEOUTS, **extra)


class RdkMember:
    """A librdkafka group member that tracks its assignment through rebalance callbacks."""

    def __init__(self, cluster: EmbeddedCluster, client_id: str, strategy: str) -> None:
        self.assigned: set[tuple[str, int]] = set()
        self.consumer = Consumer({
            "bootstrap.servers": cluster.bootstrap_servers, "group.id": "g",
            "client.id": client_id, "partition.assignment.strategy": strategy,
            "enable.auto.commit": False, "auto.offset.reset": "earliest", "log_level": 0,
            **RDK_TIMEOUTS})
        self.consumer.subscribe([TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _c: Any, parts: list[CTopicPartition]) -> None:
        self.assigned = {(p.topic, p.partition) for p in parts}

    def _on_revoke(self, _c: Any, _parts: list[CTopicPartition]) -> None:
        self.assigned = set()

    def poll(self) -> None:
        m = self.consumer.poll(0.05)
        assert m is None or not m.error() or m.error().code() < 0, m.error()

    def close(self) -> None:
        self.consumer.close()


def kp_assigned(c: KafkaConsumer) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in c.assignment()}


def wait_until(cond: Callable[[], bool], pollers: list[Callable[[], None]],
               seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        for p in pollers:
            p()


def owned_once(*assignments: set[tuple[str, int]]) -> bool:
    union: set[tuple[str, int]] = set()
    for a in assignments:
        if not a or union & a:
            return False
        union |= a
    return union == ALL


@pytest.fixture
def topic(cluster: EmbeddedCluster) -> EmbeddedCluster:
    cluster.create_topic(TOPIC, partitions=PARTITIONS)
    return cluster


def test_kafka_python_two_members_rebalance_join_and_leave(
        topic: EmbeddedCluster, api_log: set[tuple[str | None, int, int]]) -> None:
    cluster = topic
    a = kp_consumer(cluster, "kp-a")
    b: KafkaConsumer | None = None
    try:
        wait_until(lambda: kp_assigned(a) == ALL, [lambda: a.poll(50)])
        b = kp_consumer(cluster, "kp-b")
        wait_until(lambda: owned_once(kp_assigned(a), kp_assigned(b)),  # type: ignore[union-attr]
                   [lambda: a.poll(50), lambda: b.poll(50)])  # type: ignore[union-attr]
        assert len(kp_assigned(a)) == len(kp_assigned(b)) == 2

        # Commit through the group (generation checked) with an epoch, read it back.
        tp = next(TopicPartition(t, p) for t, p in kp_assigned(b))
        epoch = cluster.leader_epoch(TOPIC, tp.partition)
        b.commit({tp: OffsetAndMetadata(3, "from-b", epoch)})
        assert a.committed(tp) == 3
        got = a._coordinator.fetch_committed_offsets([tp])[tp]
        assert (got.offset, got.metadata, got.leader_epoch) == (3, "from-b", epoch)

        b.close()
        b = None
        wait_until(lambda: kp_assigned(a) == ALL, [lambda: a.poll(50)])
    finally:
        a.close()
        if b is not None:
            b.close()
    assert max(versions(api_log, "kp-a", 11)) == 7  # JoinGroup: KIP-394 path
    assert max(versions(api_log, "kp-b", 9)) >= 5  # OffsetFetch with leader epochs
    assert versions(api_log, "kp-b", 13) == {5}  # LeaveGroup batch form


def test_confluent_group_commits_epochs(topic: EmbeddedCluster,
                                        api_log: set[tuple[str | None, int, int]]) -> None:
    cluster = topic
    a = RdkMember(cluster, "rdk-a", "roundrobin")
    b: RdkMember | None = None
    try:
        wait_until(lambda: a.assigned == ALL, [a.poll])
        b = RdkMember(cluster, "rdk-b", "roundrobin")
        wait_until(lambda: owned_once(a.assigned, b.assigned),  # type: ignore[union-attr]
                   [a.poll, b.poll])  # type: ignore[union-attr]
        assert a.assigned == {(TOPIC, 0), (TOPIC, 2)} or b.assigned == {(TOPIC, 0), (TOPIC, 2)}

        _, p = sorted(a.assigned)[0]
        epoch = cluster.leader_epoch(TOPIC, p)
        a.consumer.commit(offsets=[CTopicPartition(TOPIC, p, 11, leader_epoch=epoch)],
                          asynchronous=False)
        got = b.consumer.committed([CTopicPartition(TOPIC, p)], timeout=10)
        assert [(x.offset, x.leader_epoch, x.error) for x in got] == [(11, epoch, None)]
        missing = b.consumer.committed([CTopicPartition(TOPIC, (p + 1) % PARTITIONS)],
                                       timeout=10)
        assert missing[0].offset < 0  # OFFSET_INVALID: nothing committed

        b.close()
        b = None
        wait_until(lambda: a.assigned == ALL, [a.poll])
    finally:
        a.close()
        if b is not None:
            b.close()
    assert max(versions(api_log, "rdk-a", 8)) >= 6  # OffsetCommit with leader epochs
    assert max(versions(api_log, "rdk-b", 9)) >= 5


@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
def test_mixed_kafka_python_and_librdkafka_group(topic: EmbeddedCluster, strategy: str) -> None:
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    cluster = topic
    assignor = RangePartitionAssignor if strategy == "range" else RoundRobinPartitionAssignor
    kp = kp_consumer(cluster, "kp", partition_assignment_strategy=[assignor])
    rdk: RdkMember | None = None
    try:
        wait_until(lambda: kp_assigned(kp) == ALL, [lambda: kp.poll(50)])
        rdk = RdkMember(cluster, "rdk", strategy)
        wait_until(lambda: owned_once(kp_assigned(kp), rdk.assigned),  # type: ignore[union-attr]
                   [lambda: kp.poll(50), rdk.poll])  # type: ignore[union-attr]
        described = cluster.call(lambda: cluster.state.groups.describe("g"))
        assert described.protocol_name == strategy
        rdk.close()
        rdk = None
        wait_until(lambda: kp_assigned(kp) == ALL, [lambda: kp.poll(50)])
    finally:
        kp.close()
        if rdk is not None:
            rdk.close()


def test_aiokafka_group_member_with_kafka_python(topic: EmbeddedCluster,
                                                 api_log: set[tuple[str | None, int, int]],
                                                 ) -> None:
    cluster = topic
    kp = kp_consumer(cluster, "kp")

    async def run() -> tuple[set[tuple[str, int]], int | None]:
        aio = AIOKafkaConsumer(TOPIC, bootstrap_servers=cluster.bootstrap_servers,
                               group_id="g", client_id="aio", enable_auto_commit=False,
                               auto_offset_reset="earliest", session_timeout_ms=6000,
                               heartbeat_interval_ms=500)
        await aio.start()
        try:
            async with asyncio.timeout(30):
                while True:
                    # kafka-python's poll blocks this loop briefly; keep it short.
                    kp.poll(20)
                    await aio.getmany(timeout_ms=50)
                    mine = {(tp.topic, tp.partition) for tp in aio.assignment()}
                    if owned_once(mine, kp_assigned(kp)):
                        break
            tp = ATopicPartition(TOPIC, sorted(mine)[0][1])
            await aio.commit({tp: AOffsetAndMetadata(9, "aio")})
            committed = await aio.committed(tp)
        finally:
            await aio.stop()
        return mine, committed

    try:
        mine, committed = asyncio.run(run())
        assert committed == 9
        assert len(mine) == 2
        wait_until(lambda: kp_assigned(kp) == ALL, [lambda: kp.poll(50)])
        p = sorted(mine)[0][1]
        assert kp.committed(TopicPartition(TOPIC, p)) == 9
    finally:
        kp.close()
    assert versions(api_log, "aio", 11)  # JoinGroup
    assert versions(api_log, "aio", 13)  # LeaveGroup on stop()


def test_kafka_python_assign_commit_is_a_simple_commit(topic: EmbeddedCluster) -> None:
    """assign() users commit with generation -1 and no member: stored, epoch kept."""
    cluster = topic
    c = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id="simple",
                      enable_auto_commit=False)
    try:
        tp = TopicPartition(TOPIC, 1)
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(4, "", 0)})
        got = c._coordinator.fetch_committed_offsets([tp])[tp]
        assert (got.offset, got.leader_epoch) == (4, 0)
    finally:
        c.close()
    rdk = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "simple",
                    "log_level": 0})
    try:
        got2 = rdk.committed([CTopicPartition(TOPIC, 1)], timeout=10)
        assert [(x.offset, x.leader_epoch) for x in got2] == [(4, 0)]
    finally:
        rdk.close()


@pytest.mark.slow
def test_silent_member_is_expelled_after_session_timeout(topic: EmbeddedCluster) -> None:
    """A member that stops heartbeating (no LeaveGroup) holds a rebalance only until its
    session expires; then the joining kafka-python consumer gets every partition."""
    from kafka.protocol.consumer import (
        JoinGroupRequest,
        JoinGroupResponse,
        SyncGroupRequest,
        SyncGroupResponse,
    )

    from epochguard.testing.embedded.handlers._group_common import coordinator_broker

    from .wire import Wire

    cluster = topic
    coord = cluster.call(lambda: coordinator_broker(cluster.state, "g"))
    assert coord is not None
    w = Wire.to(cluster, coord.node_id)
    try:
        proto = JoinGroupRequest.JoinGroupRequestProtocol(version=3, name="range",
                                                          metadata=b"")
        j = w.call(JoinGroupRequest(version=3, group_id="g", session_timeout_ms=6000,
                                    rebalance_timeout_ms=60000, member_id="",
                                    protocol_type="consumer", protocols=[proto]),
                   JoinGroupResponse)
        assert j.error_code == 0
        s = w.call(SyncGroupRequest(version=3, group_id="g", generation_id=j.generation_id,
                                    member_id=j.member_id, group_instance_id=None,
                                    assignments=[]), SyncGroupResponse)
        assert s.error_code == 0
        started = time.monotonic()
        kp = kp_consumer(cluster, "kp")
        try:
            wait_until(lambda: kp_assigned(kp) == ALL, [lambda: kp.poll(50)], seconds=20)
        finally:
            kp.close()
        waited = time.monotonic() - started
        # Held by the silent member until its 6 s session ran out; the 20 s bound above is
        # well below the 60 s rebalance timeout, so the session expiry is what released it.
        assert waited > 5.0, waited
        members = cluster.call(lambda: set(cluster.state.groups.groups["g"].members))
        assert j.member_id not in members
    finally:
        w.close()


def test_kafka_python_static_member_restart_does_not_rebalance(topic: EmbeddedCluster) -> None:
    cluster = topic

    def generation() -> int:
        return int(cluster.call(lambda: cluster.state.groups.groups["g"].generation_id))

    a = kp_consumer(cluster, "kp-a", group_instance_id="static-a")
    b = kp_consumer(cluster, "kp-b")
    a2: KafkaConsumer | None = None
    try:
        wait_until(lambda: owned_once(kp_assigned(a), kp_assigned(b)),
                   [lambda: a.poll(50), lambda: b.poll(50)])
        before_a, before_b, gen = kp_assigned(a), kp_assigned(b), generation()
        a.close()  # a static member sends no LeaveGroup
        a2 = kp_consumer(cluster, "kp-a", group_instance_id="static-a")
        wait_until(lambda: bool(kp_assigned(a2)),  # type: ignore[union-attr]
                   [lambda: a2.poll(50), lambda: b.poll(50)])  # type: ignore[union-attr]
        for _ in range(10):
            b.poll(50)
        assert kp_assigned(a2) == before_a
        assert kp_assigned(b) == before_b
        assert generation() == gen, "a static member's restart keeps the generation"
    finally:
        b.close()
        if a2 is not None:
            a2.close()
