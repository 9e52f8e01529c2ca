"""Consumer groups of real clients against the embedded coordinator, over TCP.

kafka-python 3.0.12, librdkafka (confluent-kafka) and aiokafka 0.14, alone and mixed in one
group. Session timeouts are small and rebalances complete as soon as every member rejoined,
so each test takes a few seconds at most.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
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
GROUP_TIMEOUTS = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "max_poll_interval_ms": 10000,
}
RDK_TIMEOUTS = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "max.poll.interval.ms": 10000,
}


@pytest.fixture
def api_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[tuple[str | None, int, int]]]:
    """Records (client id, api key, version) of every request the cluster handles."""
    seen: set[tuple[str | None, int, int]] = set()

    def wrap(entry: ApiEntry) -> ApiEntry:
        async def spy(ctx: RequestContext, request: Any) -> Any:
            seen.add((ctx.client_id, ctx.api_key, ctx.version))
            return await entry.handler(ctx, request)

        return ApiEntry(
            spy, entry.min_version, entry.max_version, entry.request_class, entry.response_class
        )

    for key, entry in list(REGISTRY.items()):
        monkeypatch.setitem(REGISTRY, key, wrap(entry))
    yield seen


def versions(log: set[tuple[str | None, int, int]], client: str, api_key: int) -> set[int]:
    return {v for c, k, v in log if c == client and k == api_key}


class KpMember:
    """A kafka-python group member polling in its own thread.

    kafka-python 3.0.12 drops a JoinGroup/SyncGroup result that completes while no poll() is
    waiting for it (it sends a fresh JoinGroup instead; as the leader that starts another
    rebalance). Polling continuously from a dedicated thread keeps that window tiny; every
    other call on the consumer is marshalled onto the same thread (it is not thread-safe).
    """

    def __init__(self, cluster: EmbeddedCluster, client_id: str, **extra: Any) -> None:
        self._config = dict(
            bootstrap_servers=cluster.bootstrap_servers,
            group_id="g",
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **GROUP_TIMEOUTS,
            **extra,
        )
        self._calls: queue.Queue[tuple[Callable[[KafkaConsumer], Any], Future[Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._assigned: set[tuple[str, int]] = set()
        self._started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name=f"kp-{client_id}", daemon=True)
        self._thread.start()
        self._started.result(timeout=20)

    @property
    def assigned(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._assigned)

    def _run(self) -> None:
        try:
            consumer = KafkaConsumer(TOPIC, **self._config)
            # Know the topic before the first JoinGroup: otherwise the leader assigns nothing,
            # rejoins as soon as metadata arrives, and each extra round trip is another
            # chance for the race above.
            deadline = time.monotonic() + 20
            while not consumer.partitions_for_topic(TOPIC):
                assert time.monotonic() < deadline, "no metadata for the topic"
                time.sleep(0.05)
        except BaseException as e:
            self._started.set_exception(e)
            return
        self._started.set_result(None)
        try:
            while not self._stop.is_set():
                consumer.poll(timeout_ms=100)
                with self._lock:
                    self._assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
                self._run_calls(consumer)
        finally:
            self._run_calls(consumer)
            consumer.close()

    def _run_calls(self, consumer: KafkaConsumer) -> None:
        while True:
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                fut.set_result(fn(consumer))
            except BaseException as e:
                fut.set_exception(e)

    def call(self, fn: Callable[[KafkaConsumer], Any]) -> Any:
        fut: Future[Any] = Future()
        self._calls.put((fn, fut))
        return fut.result(timeout=30)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive()


class RdkMember:
    """A librdkafka group member that tracks its assignment through rebalance callbacks."""

    def __init__(self, cluster: EmbeddedCluster, client_id: str, strategy: str) -> None:
        self.assigned: set[tuple[str, int]] = set()
        self.incremental = strategy == "cooperative-sticky"
        self.consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "group.id": "g",
                "client.id": client_id,
                "partition.assignment.strategy": strategy,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 0,
                **RDK_TIMEOUTS,
            }
        )
        self.consumer.subscribe([TOPIC], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _c: Any, parts: list[CTopicPartition]) -> None:
        got = {(p.topic, p.partition) for p in parts}
        # Cooperative (KIP-429) callbacks carry only the partitions added or removed.
        self.assigned = self.assigned | got if self.incremental else got

    def _on_revoke(self, _c: Any, parts: list[CTopicPartition]) -> None:
        lost = {(p.topic, p.partition) for p in parts}
        self.assigned = self.assigned - lost if self.incremental else set()

    def poll(self) -> None:
        m = self.consumer.poll(0.05)
        err = None if m is None else m.error()
        assert err is None or err.code() < 0, err

    def close(self) -> None:
        self.consumer.close()


def wait_until(
    cond: Callable[[], bool], pollers: list[Callable[[], None]] | None = None, seconds: float = 30.0
) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        for p in pollers or []:
            p()
        if not pollers:
            time.sleep(0.02)


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
    topic: EmbeddedCluster, api_log: set[tuple[str | None, int, int]]
) -> None:
    cluster = topic
    a = KpMember(cluster, "kp-a")
    b: KpMember | None = None
    try:
        wait_until(lambda: a.assigned == ALL)
        b = KpMember(cluster, "kp-b")
        wait_until(lambda: owned_once(a.assigned, b.assigned))  # type: ignore[union-attr]
        assert len(a.assigned) == len(b.assigned) == 2

        # Commit through the group (generation checked) with an epoch, read it back.
        tp = TopicPartition(*sorted(b.assigned)[0])
        epoch = cluster.leader_epoch(TOPIC, tp.partition)
        b.call(lambda c: c.commit({tp: OffsetAndMetadata(3, "from-b", epoch)}))
        assert a.call(lambda c: c.committed(tp)) == 3
        got = a.call(lambda c: c.committed(tp, metadata=True))
        assert (got.offset, got.metadata, got.leader_epoch) == (3, "from-b", epoch)

        b.close()
        b = None
        wait_until(lambda: a.assigned == ALL)
    finally:
        a.close()
        if b is not None:
            b.close()
    assert max(versions(api_log, "kp-a", 11)) == 7  # JoinGroup: KIP-394 path
    assert max(versions(api_log, "kp-b", 9)) >= 5  # OffsetFetch with leader epochs
    assert versions(api_log, "kp-b", 13) == {5}  # LeaveGroup batch form


def test_confluent_group_commits_epochs(
    topic: EmbeddedCluster, api_log: set[tuple[str | None, int, int]]
) -> None:
    cluster = topic
    a = RdkMember(cluster, "rdk-a", "roundrobin")
    b: RdkMember | None = None
    try:
        wait_until(lambda: a.assigned == ALL, [a.poll])
        b = RdkMember(cluster, "rdk-b", "roundrobin")
        wait_until(
            lambda: owned_once(a.assigned, b.assigned),  # type: ignore[union-attr]
            [a.poll, b.poll],
        )
        assert a.assigned == {(TOPIC, 0), (TOPIC, 2)} or b.assigned == {(TOPIC, 0), (TOPIC, 2)}

        _, p = sorted(a.assigned)[0]
        epoch = cluster.leader_epoch(TOPIC, p)
        a.consumer.commit(
            offsets=[CTopicPartition(TOPIC, p, 11, leader_epoch=epoch)], asynchronous=False
        )
        got = b.consumer.committed([CTopicPartition(TOPIC, p)], timeout=10)
        assert [(x.offset, x.leader_epoch, x.error) for x in got] == [(11, epoch, None)]
        missing = b.consumer.committed([CTopicPartition(TOPIC, (p + 1) % PARTITIONS)], timeout=10)
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


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_mixed_kafka_python_and_librdkafka_group(topic: EmbeddedCluster, strategy: str) -> None:
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    cluster = topic
    assignor = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "cooperative-sticky": CooperativeStickyAssignor,
    }[strategy]
    kp = KpMember(cluster, "kp", partition_assignment_strategy=[assignor])
    rdk: RdkMember | None = None
    try:
        wait_until(lambda: kp.assigned == ALL)
        rdk = RdkMember(cluster, "rdk", strategy)
        wait_until(
            lambda: owned_once(kp.assigned, rdk.assigned),  # type: ignore[union-attr]
            [rdk.poll],
        )
        # As Kafka, the group names its protocol only while Stable: a cooperative group can
        # be in its second round when the partitions are already split.
        wait_until(
            lambda: (
                cluster.call(lambda: cluster.state.groups.describe("g")).state.value == "Stable"
            ),
            [rdk.poll],
        )
        described = cluster.call(lambda: cluster.state.groups.describe("g"))
        assert described.protocol_name == strategy
        assert {m.client_id for m in described.members} == {"kp", "rdk"}
        rdk.close()
        rdk = None
        wait_until(lambda: kp.assigned == ALL)
    finally:
        kp.close()
        if rdk is not None:
            rdk.close()


def test_aiokafka_group_member_with_kafka_python(
    topic: EmbeddedCluster,
    api_log: set[tuple[str | None, int, int]],
) -> None:
    cluster = topic
    kp = KpMember(cluster, "kp")

    async def run() -> tuple[set[tuple[str, int]], int | None]:
        aio = AIOKafkaConsumer(
            TOPIC,
            bootstrap_servers=cluster.bootstrap_servers,
            group_id="g",
            client_id="aio",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        await aio.start()
        try:
            async with asyncio.timeout(30):
                while True:
                    await aio.getmany(timeout_ms=50)
                    mine = {(tp.topic, tp.partition) for tp in aio.assignment()}
                    if owned_once(mine, kp.assigned):
                        break
            tp = ATopicPartition(TOPIC, sorted(mine)[0][1])
            await aio.commit({tp: AOffsetAndMetadata(9, "aio")})
            committed = await aio.committed(tp)
        finally:
            await aio.stop()
        return mine, committed

    try:
        wait_until(lambda: kp.assigned == ALL)
        mine, committed = asyncio.run(run())
        assert committed == 9
        assert len(mine) == 2
        wait_until(lambda: kp.assigned == ALL)
        tp = TopicPartition(TOPIC, sorted(mine)[0][1])
        assert kp.call(lambda c: c.committed(tp)) == 9
    finally:
        kp.close()
    assert versions(api_log, "aio", 11)  # JoinGroup
    assert versions(api_log, "aio", 13)  # LeaveGroup on stop()
    # aiokafka has no KIP-320: its commits carry no leader epoch (OffsetCommit < v6).
    assert max(versions(api_log, "aio", 8)) < 6


def test_kafka_python_assign_commit_is_a_simple_commit(topic: EmbeddedCluster) -> None:
    """assign() users commit with generation -1 and no member: stored, epoch kept."""
    cluster = topic
    c = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers, group_id="simple", enable_auto_commit=False
    )
    try:
        tp = TopicPartition(TOPIC, 1)
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(4, "", 0)})
        got = c.committed(tp, metadata=True)
        assert (got.offset, got.leader_epoch) == (4, 0)
    finally:
        c.close()
    rdk = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "simple", "log_level": 0}
    )
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
        proto = JoinGroupRequest.JoinGroupRequestProtocol(version=3, name="range", metadata=b"")
        j = w.call(
            JoinGroupRequest(
                version=3,
                group_id="g",
                session_timeout_ms=6000,
                rebalance_timeout_ms=60000,
                member_id="",
                protocol_type="consumer",
                protocols=[proto],
            ),
            JoinGroupResponse,
        )
        assert j.error_code == 0
        s = w.call(
            SyncGroupRequest(
                version=3,
                group_id="g",
                generation_id=j.generation_id,
                member_id=j.member_id,
                group_instance_id=None,
                assignments=[],
            ),
            SyncGroupResponse,
        )
        assert s.error_code == 0
        started = time.monotonic()
        kp = KpMember(cluster, "kp")
        try:
            wait_until(lambda: kp.assigned == ALL, seconds=20)
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

    a = KpMember(cluster, "kp-a", group_instance_id="static-a")
    b = KpMember(cluster, "kp-b")
    a2: KpMember | None = None
    try:
        wait_until(lambda: owned_once(a.assigned, b.assigned))
        before_a, before_b, gen = a.assigned, b.assigned, generation()
        a.close()  # a static member sends no LeaveGroup
        a2 = KpMember(cluster, "kp-a", group_instance_id="static-a")
        wait_until(lambda: bool(a2.assigned))
        time.sleep(1.0)  # two heartbeat intervals: b would have been told to rejoin
        assert a2.assigned == before_a
        assert b.assigned == before_b
        assert generation() == gen, "a static member's restart keeps the generation"
    finally:
        b.close()
        if a2 is not None:
            a2.close()


@pytest.mark.parametrize("client", ["kafka-python", "librdkafka"])
def test_group_survives_its_coordinator_broker_stopping(
    topic: EmbeddedCluster, client: str
) -> None:
    """Truncation scenarios stop brokers: the group moves to another broker with its members
    and offsets, and the members keep consuming and committing."""
    from epochguard.testing.embedded.handlers._group_common import coordinator_broker

    cluster = topic

    def coordinator_id() -> int:
        b = cluster.call(lambda: coordinator_broker(cluster.state, "g"))
        assert b is not None
        return int(b.node_id)

    tp = TopicPartition(TOPIC, 0)
    if client == "kafka-python":
        kp = KpMember(cluster, "kp")
        assigned: Callable[[], set[tuple[str, int]]] = lambda: kp.assigned  # noqa: E731
        pollers: list[Callable[[], None]] = []

        def commit(offset: int) -> None:
            kp.call(lambda c: c.commit({tp: OffsetAndMetadata(offset, "", 0)}))

        close = kp.close
    else:
        rdk = RdkMember(cluster, "rdk", "range")
        assigned = lambda: rdk.assigned  # noqa: E731
        pollers = [rdk.poll]

        def commit(offset: int) -> None:
            rdk.consumer.commit(
                offsets=[CTopicPartition(TOPIC, 0, offset, leader_epoch=0)], asynchronous=False
            )

        close = rdk.close
    try:
        wait_until(lambda: assigned() == ALL, pollers)
        commit(1)
        before = coordinator_id()
        gen = cluster.call(lambda: cluster.state.groups.groups["g"].generation_id)
        cluster.stop_broker(before)
        assert coordinator_id() != before
        # Heartbeats reach the new coordinator; no rebalance is needed for that.
        deadline = time.monotonic() + 20
        while True:
            try:
                commit(2)
                break
            except Exception:
                assert time.monotonic() < deadline
                for p in pollers:
                    p()
                time.sleep(0.1)
        wait_until(lambda: assigned() == ALL, pollers)
        state = cluster.call(
            lambda: (
                cluster.state.groups.groups["g"].generation_id,
                cluster.state.groups.fetch_offsets("g", [("t", 0)]),
            )
        )
        assert state[0] == gen
        assert state[1][("t", 0)].offset == 2
    finally:
        close()


def test_kafka_python_drops_a_join_result_that_arrives_between_polls(
    topic: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured kafka-python 3.0.12 behaviour that group tests must work around (see
    KpMember): when poll() times out while JoinGroup is in flight and the response arrives
    before the next poll(), that next poll sends a new JoinGroup instead of using it."""
    cluster = topic
    joins: list[str] = []
    entry = REGISTRY[11]

    async def slow_join(ctx: RequestContext, request: Any) -> Any:
        if request.member_id:
            joins.append(request.member_id)
            await asyncio.sleep(0.3)
        return await entry.handler(ctx, request)

    monkeypatch.setitem(
        REGISTRY,
        11,
        ApiEntry(
            slow_join,
            entry.min_version,
            entry.max_version,
            entry.request_class,
            entry.response_class,
        ),
    )
    c = KafkaConsumer(
        TOPIC,
        bootstrap_servers=cluster.bootstrap_servers,
        group_id="g",
        enable_auto_commit=False,
        **GROUP_TIMEOUTS,
    )
    try:
        wait_until(lambda: bool(c.partitions_for_topic(TOPIC)))
        wait_until(lambda: bool(joins), [lambda: c.poll(timeout_ms=50)], seconds=10)
        time.sleep(1.0)  # the held JoinGroup completes while nobody polls
        wait_until(lambda: bool(c.assignment()), [lambda: c.poll(timeout_ms=1000)], seconds=10)
    finally:
        c.close()
    # The same member joined twice: the first, completed, JoinGroup was thrown away.
    assert len(joins) == 2 and joins[0] == joins[1], joins


def test_injected_not_coordinator_is_retried_by_clients(topic: EmbeddedCluster) -> None:
    """Fault rules reach the group APIs: a NOT_COORDINATOR on OffsetCommit sends
    kafka-python and librdkafka back to FindCoordinator, and the retried commit lands."""
    cluster = topic
    tp = TopicPartition(TOPIC, 2)
    c = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers, group_id="k", enable_auto_commit=False
    )
    try:
        c.assign([tp])
        cluster.faults.inject_error(8, 16, count=1)
        c.commit({tp: OffsetAndMetadata(6, "", 0)})
        assert c.committed(tp) == 6
    finally:
        c.close()
    cluster.faults.inject_error(8, 16, count=1)
    r = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "r", "log_level": 0})
    try:
        r.commit(offsets=[CTopicPartition(TOPIC, 2, 8, leader_epoch=0)], asynchronous=False)
        [got] = r.committed([CTopicPartition(TOPIC, 2)], timeout=10)
        assert (got.offset, got.leader_epoch) == (8, 0)
    finally:
        r.close()
    # Each client sent its commit twice: the first one got the injected error.
    commits = sum(n for (key, _), n in cluster.requests_seen().items() if key == 8)
    assert commits == 4
    stored = cluster.call(
        lambda: (
            cluster.state.groups.fetch_offsets("k", [(TOPIC, 2)]),
            cluster.state.groups.fetch_offsets("r", [(TOPIC, 2)]),
        )
    )
    assert stored[0][(TOPIC, 2)].offset == 6 and stored[1][(TOPIC, 2)].offset == 8
