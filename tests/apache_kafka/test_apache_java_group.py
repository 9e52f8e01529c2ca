"""The Java reference consumer as a group member beside EpochConsumer and librdkafka, on real
Kafka 4.3.1, under each group protocol (issue 13):

- a mixed group of all three reads each record exactly once through a member joining and a
  member leaving;
- a partition whose truncation one member detected (EpochConsumer with policy raise, or Java's
  LogTruncationException) is detected again by each member of the other kind that gets it
  next, from the committed offset and its leader epoch (one unclean election per protocol,
  the partition handed along EpochConsumer -> Java -> EpochConsumer, or Java -> EpochConsumer
  -> Java);
- a pattern member whose topics were deleted gives up its partitions and does not hold up
  the Java members' next rebalance (classic eager).

``FLAVOURS`` names each group protocol once: KIP-848, classic eager (range) and classic
cooperative-sticky (KIP-429; EpochConsumer with its ``CooperativeStickyAssignor``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Literal

import attrs
import kafka.errors as kerrors
import pytest
from kafka.structs import TopicPartition

from epochguard import EpochConsumer, EpochOffset, LogTruncationError
from epochguard.consumer import CooperativeStickyAssignor
from epochguard.testing import produce
from epochguard.testing.apache_kafka import ApacheKafkaCluster, JavaCommit, JavaGroupMember

from ..kip848_scenarios import Runner, member, wait
from .test_apache_unclean import B, drive_unclean_election, new_topic

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

PARTS = 4


@attrs.frozen
class Flavour:
    """One group protocol as each of the three clients spells it."""

    name: str
    protocol: str  # group.protocol: "classic" or "consumer"
    classic_assignor: str | None  # client-side, classic only: the protocol the members share

    def epoch_config(self) -> dict[str, Any]:
        if self.protocol == "consumer":
            return {"group_protocol": "consumer"}
        # The assignor classes answer to the same protocol names as Java's.
        assignor: Any
        if self.classic_assignor == "cooperative-sticky":
            assignor = CooperativeStickyAssignor
        else:
            from kafka.coordinator.assignors.range import RangePartitionAssignor

            assert self.classic_assignor == "range", self.classic_assignor
            assignor = RangePartitionAssignor
        return {
            "group_protocol": "classic",
            "partition_assignment_strategy": [assignor],
            "heartbeat_interval_ms": 500,
        }

    def librdkafka_config(self) -> dict[str, Any]:
        if self.protocol == "consumer":
            return {"group.protocol": "consumer"}
        return {
            "group.protocol": "classic",
            "partition.assignment.strategy": self.classic_assignor,
            "heartbeat.interval.ms": 500,
        }

    def java_member(
        self,
        cluster: ApacheKafkaCluster,
        group: str,
        *,
        auto_commit: bool = False,
        auto_offset_reset: Literal["earliest", "none"] = "earliest",
    ) -> JavaGroupMember:
        return cluster.java_member(
            group,
            protocol="consumer" if self.protocol == "consumer" else "classic",
            assignor=self.classic_assignor,
            auto_commit=auto_commit,
            auto_offset_reset=auto_offset_reset,
        )


KIP848 = Flavour("kip848", "consumer", None)
EAGER_RANGE = Flavour("classic-range", "classic", "range")
COOPERATIVE = Flavour("classic-cooperative-sticky", "classic", "cooperative-sticky")
FLAVOURS = [KIP848, EAGER_RANGE, COOPERATIVE]


@pytest.fixture(params=FLAVOURS, ids=lambda f: f.name)
def flavour(request: pytest.FixtureRequest) -> Flavour:
    flavour: Flavour = request.param
    return flavour


def epoch_member(
    cluster: ApacheKafkaCluster, group: str, flavour: Flavour, **kw: Any
) -> EpochConsumer:
    """The shared member, under ``flavour``'s group protocol."""
    return member(cluster, group, **{**flavour.epoch_config(), **kw})


def _produce(cluster: ApacheKafkaCluster, topic: str, first: int, last: int) -> None:
    for p in range(PARTS):
        produce(cluster, topic, [f"{p}-{i}" for i in range(first, last)], partition=p)


class _Librdkafka:
    """confluent-kafka's Consumer polled from the test thread, keeping what it reads."""

    def __init__(self, cluster: ApacheKafkaCluster, group: str, flavour: Flavour) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 200,
                **flavour.librdkafka_config(),
            }
        )
        self.records: list[tuple[int, int]] = []
        self.errors: list[str] = []

    def poll(self) -> None:
        msg = self.consumer.poll(0.1)
        if msg is None:
            return
        if msg.error() is None:
            self.records.append((msg.partition(), msg.offset()))
        else:
            self.errors.append(str(msg.error()))

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}


def _drive(
    java: JavaGroupMember | None, rd: _Librdkafka, done: Callable[[], bool], what: str
) -> None:
    """Poll the Java member and librdkafka from this thread (EpochConsumer has its own) until
    ``done``: members of a classic group must keep polling for a rebalance to finish."""
    deadline = time.monotonic() + 90
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if java is not None:
            java.poll(0, 200)
        rd.poll()


def test_mixed_group_reads_each_record_once_through_a_join_and_a_leave(
    cluster: ApacheKafkaCluster, flavour: Flavour
) -> None:
    """EpochConsumer reads everything alone; the Java member and librdkafka join, the three
    split the partitions and read what follows once; the Java member leaves (auto commit on
    close), the other two take its partitions over from its commits and read the rest once."""
    topic, group = new_topic(f"jmix-{flavour.name}"), new_topic(f"gjmix-{flavour.name}")
    cluster.create_topic(topic, partitions=PARTS)
    _produce(cluster, topic, 0, 5)
    epoch = epoch_member(
        cluster, group, flavour, enable_auto_commit=True, auto_commit_interval_ms=200
    )
    runner = Runner(epoch)
    rd = _Librdkafka(cluster, group, flavour)
    java: JavaGroupMember | None = None
    everyone = set(range(PARTS))

    def seen() -> list[tuple[int, int]]:
        java_seen = [(r.partition, r.offset) for r in (java.records if java else [])]
        return [(r.partition, r.offset) for r in runner.records] + java_seen + rd.records

    def split(*held: set[int]) -> bool:
        return all(held) and sum(map(len, held)) == PARTS and set().union(*held) == everyone

    try:
        epoch.subscribe([topic])
        runner.start()
        wait(lambda: len(runner.records) == 5 * PARTS, "EpochConsumer reads everything")
        java = flavour.java_member(cluster, group, auto_commit=True)
        java.subscribe([topic])
        rd.consumer.subscribe([topic])

        def three_way() -> bool:
            assert java is not None
            held = {tp.partition for tp in java.assignment}
            ours = {tp.partition for tp in epoch.assignment()}
            return split(ours, held, rd.partitions())

        _drive(java, rd, three_way, "a three-way split")
        _produce(cluster, topic, 5, 10)
        _drive(java, rd, lambda: len(seen()) >= 10 * PARTS, "every record once")
        assert java.records, "the Java member read its share"
        # Every record comes with its batch's leader epoch (not always 0: on a loaded machine
        # a broker can miss its session and the partition change leader meanwhile).
        for r in java.records:
            assert r.leader_epoch is not None
            assert 0 <= r.leader_epoch <= cluster.leader_epoch(topic, r.partition), r
        java.close()  # leaves; auto commit commits its positions first
        _drive(
            None,
            rd,
            lambda: split({tp.partition for tp in epoch.assignment()}, rd.partitions()),
            "a two-way split",
        )
        _produce(cluster, topic, 10, 15)
        _drive(None, rd, lambda: len(seen()) >= 15 * PARTS, "every record once")
        got = seen()
        assert len(got) == len(set(got)) == 15 * PARTS, sorted(got)
        assert rd.errors == []
        kinds = [r.kind for r in java.rebalances]
        # What the Java member's listener saw: an assignment on joining, a revocation when
        # it left (eager: also one revocation and one assignment per rebalance it lived
        # through, when librdkafka joined after it).
        assert kinds[0] == "assigned" and kinds[-1] == "revoked", java.rebalances
        assert "lost" not in kinds
    finally:
        if runner.is_alive():
            runner.finish()
        epoch.close()
        if java is not None:
            java.close()
        rd.consumer.close()


@attrs.frozen
class _Handover:
    topic: str
    group: str
    tp: TopicPartition
    first_epoch: int


@pytest.fixture
def handover(cluster: ApacheKafkaCluster, flavour: Flavour) -> Callable[..., _Handover]:
    """Drives an unclean election (test_apache_unclean's steps) with ``before`` reading
    a0..a4, d0..d2 and committing; elects B, produces b0, b1."""

    def run(before: Callable[[str, str], None], name: str) -> _Handover:
        topic, group = new_topic(f"{name}-{flavour.name}"), new_topic(f"g{name}-{flavour.name}")
        t = drive_unclean_election(cluster, topic, before_election=lambda: before(topic, group))
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        return _Handover(topic, group, TopicPartition(topic, 0), t.first_epoch)

    return run


def _epoch_detects(consumer: EpochConsumer) -> LogTruncationError:
    """Poll until LogTruncationError; reading any record first (b0, b1 taken for a
    continuation) fails."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "EpochConsumer never detected the truncation"
        try:
            got = consumer.poll(timeout_ms=100)
        except LogTruncationError as exc:
            return exc
        assert not any(got.values()), got


def _java_detects(java: JavaGroupMember, h: _Handover) -> None:
    """The Java member (auto.offset.reset=none) throws LogTruncationException at (5, e0),
    having read nothing of the new log, and keeps the partition stopped."""
    rounds = java.poll_until(lambda r: r.exception is not None, "the Java member's error")
    assert [r for rnd in rounds for r in rnd.records] == []
    exc = rounds[-1].exception
    assert exc is not None and exc.type == "LogTruncationException", exc
    assert exc.divergent_offsets == {h.tp: EpochOffset(5, h.first_epoch)}
    assert exc.fetch_offsets == {h.tp: 8}
    assert exc.java_class == "org.apache.kafka.clients.consumer.LogTruncationException"
    # Java keeps the partition stopped until the application seeks.
    assert java.poll(1, 500).records == ()


def _epoch_detects_too(consumer: EpochConsumer, h: _Handover) -> None:
    detected = _epoch_detects(consumer)
    assert detected.truncation_offsets() == {h.tp: EpochOffset(5, h.first_epoch)}
    assert detected.truncations[h.tp].lost_count == 3


def _epoch_reads(cluster: ApacheKafkaCluster, flavour: Flavour, group: str) -> EpochConsumer:
    return epoch_member(cluster, group, flavour, on_truncation="raise")


def test_truncation_is_detected_by_every_next_owner_java_or_epochconsumer(
    cluster: ApacheKafkaCluster, flavour: Flavour, handover: Callable[..., _Handover]
) -> None:
    """One unclean election, the partition handed along a chain of members of both kinds,
    each one restoring the previous owner's commit (8 under the first epoch) and detecting the
    truncation at (5, e0) before reading anything of the new log:

    - KIP-848: EpochConsumer reads a0..a4, d0..d2, commits, detects (policy raise) and
      leaves; the Java member gets the partition, throws LogTruncationException and leaves;
      a second EpochConsumer gets it and raises LogTruncationError.
    - classic eager: the Java member reads and commits (commitSync: (8, e0)), throws
      LogTruncationException and leaves; EpochConsumer gets it and raises; a second Java
      member gets it and throws again.

    The Java members use ``auto.offset.reset=none``: with a reset policy Java moves the
    position to the divergence by itself and says so only in its log (measured on Kafka
    4.3.1), so ``none`` is Java's counterpart of policy raise. A member detecting the
    truncation commits nothing, so each next owner starts from the same commit."""
    owners: list[Any] = []
    java_first = flavour.protocol == "classic"
    commits: list[Any] = []

    def read_and_commit(topic: str, group: str) -> None:
        if java_first:
            java = flavour.java_member(cluster, group, auto_offset_reset="none")
            owners.append(java)
            java.subscribe([topic])
            # A new group has no commit and policy none has nowhere to start: Java says so by
            # class; the application seeks, as one with policy none does.
            (first,) = java.poll_until(lambda r: r.exception is not None, "no offset")[-1:]
            assert first.exception is not None
            assert first.exception.type == "NoOffsetForPartitionException", first.exception
            java.seek(TopicPartition(topic, 0), 0)
            java.poll_until(lambda _r: len(java.records) >= 8, "the Java member reads 8")
            commits.append(java.commit())
        else:
            epoch = _epoch_reads(cluster, flavour, group)
            owners.append(epoch)
            epoch.subscribe([topic])
            got: list[Any] = []
            deadline = time.monotonic() + 60
            while len(got) < 8:
                assert time.monotonic() < deadline, got
                for recs in epoch.poll(timeout_ms=100).values():
                    got += recs
            epoch.commit()
            commits.append(epoch.committed_with_epoch(TopicPartition(topic, 0)))

    try:
        h = handover(read_and_commit, "chain")
        (first,) = owners
        if java_first:
            assert [(r.offset, r.leader_epoch, r.value) for r in first.records] == [
                (i, h.first_epoch, f"a{i}") for i in range(5)
            ] + [(5 + i, h.first_epoch, f"d{i}") for i in range(3)]
            assert commits == [JavaCommit({h.tp: EpochOffset(8, h.first_epoch)})]
            _java_detects(first, h)
        else:
            assert commits == [EpochOffset(8, h.first_epoch)]
            _epoch_detects_too(first, h)
        first.close()
        for kind in ("epoch", "java") if java_first else ("java", "epoch"):
            if kind == "java":
                java = flavour.java_member(cluster, h.group, auto_offset_reset="none")
                owners.append(java)
                java.subscribe([h.topic])
                _java_detects(java, h)
                assert [r.kind for r in java.rebalances] == ["assigned"]
                java.close()
            else:
                epoch = _epoch_reads(cluster, flavour, h.group)
                owners.append(epoch)
                epoch.subscribe([h.topic])
                _epoch_detects_too(epoch, h)
                epoch.close()
    finally:
        for owner in owners:
            owner.close()


def test_an_assignor_kafka_lacks_is_fatal_for_java_and_for_epochconsumer(
    cluster: ApacheKafkaCluster,
) -> None:
    """UNSUPPORTED_ASSIGNOR is fatal for both KIP-848 members: neither retries. Java 4.3.1
    throws UnsupportedAssignorException from one poll and then returns nothing (its member is
    FATAL); EpochConsumer raises UnsupportedAssignorError from every poll until close, so an
    application that swallowed the first one does not poll an empty consumer forever."""
    topic, group = new_topic("fatal"), new_topic("gfatal")
    cluster.create_topic(topic)
    with cluster.java_member(f"{group}-java", protocol="consumer", assignor="nope") as java:
        java.subscribe([topic])
        rounds = java.poll_until(lambda r: r.exception is not None, "Java's error")
        exc = rounds[-1].exception
        assert exc is not None and exc.type == "UnsupportedAssignorException", exc
        assert "nope" in (exc.message or "")
        later = java.poll(0, 1000)
        assert (later.exception, later.records, later.assignment) == (None, (), frozenset())
    epoch = epoch_member(cluster, f"{group}-epoch", KIP848, group_remote_assignor="nope")
    try:
        epoch.subscribe([topic])
        with pytest.raises(kerrors.UnsupportedAssignorError, match="nope"):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                epoch.poll(timeout_ms=100)
        member = epoch._engine.group
        assert member is not None and member._heartbeats.task is not None
        member._heartbeats.task.join(10)
        assert not member._heartbeats.running
        sent = member.heartbeats_sent
        for _ in range(2):
            with pytest.raises(kerrors.UnsupportedAssignorError, match="nope"):
                epoch.poll(timeout_ms=100)
        assert member.heartbeats_sent == sent
    finally:
        epoch.close()


def test_an_instance_id_the_java_member_holds_is_refused_to_epochconsumer(
    cluster: ApacheKafkaCluster,
) -> None:
    """The Java member joins as static member ``i1`` (KIP-848); EpochConsumer asking for the
    same instance id gets UNRELEASED_INSTANCE_ID, which is fatal: it raises
    UnreleasedInstanceIdError from every poll and stops heartbeating, and the Java member
    keeps its partitions through it (no rebalance)."""
    topic, group = new_topic("static"), new_topic("gstatic")
    cluster.create_topic(topic, partitions=2)
    instance = f"{group}-i1"
    with cluster.java_member(group, protocol="consumer", instance_id=instance) as java:
        java.subscribe([topic])
        java.poll_until(lambda r: len(r.assignment) == 2, "both partitions")
        epoch = epoch_member(cluster, group, KIP848, group_instance_id=instance)
        try:
            epoch.subscribe([topic])
            with pytest.raises(kerrors.UnreleasedInstanceIdError):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    epoch.poll(timeout_ms=100)
            member = epoch._engine.group
            assert member is not None and member._heartbeats.task is not None
            member._heartbeats.task.join(10)
            assert not member._heartbeats.running
            with pytest.raises(kerrors.UnreleasedInstanceIdError):
                # The join goes on across polls: the refusal of the next JoinGroup is raised
                # by the poll its answer reaches.
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    epoch.poll(timeout_ms=100)
            assert epoch.assignment() == set()
        finally:
            epoch.close()
        after = java.poll(0, 1000)
        assert after.rebalances == () and len(after.assignment) == 2
        assert [r.kind for r in java.rebalances] == ["assigned"] * len(java.rebalances)


class _Loop:
    """An event loop on a thread of its own for the asyncio members: the test thread drives
    the Java member, whose probe answers one command at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class _AsyncMember:
    """An AIOEpochConsumer or aiokafka member draining ``getmany`` in a task on ``loop``."""

    def __init__(self, loop: _Loop, consumer: Any) -> None:
        self._loop = loop
        self.consumer = consumer
        self.records: list[tuple[int, int]] = []
        self._stopping = False
        self._started = False
        self._task: asyncio.Task[None] | None = None

    async def _drain(self) -> None:
        while not self._stopping:
            for recs in (await self.consumer.getmany(timeout_ms=50)).values():
                self.records += [(r.partition, r.offset) for r in recs]

    async def _start(self) -> None:
        self._started = True
        await self.consumer.start()
        self._task = asyncio.create_task(self._drain())

    async def _stop(self) -> None:
        if self._stopping or not self._started:
            return
        self._stopping = True
        try:
            if self._task is not None:
                await self._task  # raises what the member raised
        finally:
            await self.consumer.stop()

    def start(self) -> None:
        self._loop.run(self._start())

    def stop(self) -> None:
        self._loop.run(self._stop())

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}


def test_asyncio_members_share_a_classic_group_with_java_and_epochconsumer(
    cluster: ApacheKafkaCluster,
) -> None:
    """EpochConsumer (threads) reads everything alone; AIOEpochConsumer, aiokafka and the Java
    member join (classic, range), the four split the partitions and read what follows once;
    the Java member and then aiokafka leave (commits first), and the remaining members take
    their partitions over from those commits and read the rest once."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor as AIORange

    from epochguard import AIOEpochConsumer

    topic, group = new_topic("aiomix"), new_topic("gaiomix")
    cluster.create_topic(topic, partitions=PARTS)
    _produce(cluster, topic, 0, 5)
    epoch = epoch_member(
        cluster, group, EAGER_RANGE, enable_auto_commit=True, auto_commit_interval_ms=200
    )
    runner = Runner(epoch)
    loop = _Loop()
    common: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "group_id": group,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": True,
        "auto_commit_interval_ms": 200,
        "heartbeat_interval_ms": 500,
        "partition_assignment_strategy": (AIORange,),
    }

    async def make(cls: Any) -> Any:
        return cls(topic, **common)  # aiokafka binds its loop on construction

    ours = _AsyncMember(loop, loop.run(make(AIOEpochConsumer)))
    theirs = _AsyncMember(loop, loop.run(make(AIOKafkaConsumer)))
    java: JavaGroupMember | None = None
    java_open = False
    everyone = set(range(PARTS))

    def seen() -> list[tuple[int, int]]:
        java_seen = [(r.partition, r.offset) for r in (java.records if java else [])]
        threaded = [(r.partition, r.offset) for r in runner.records]
        return threaded + ours.records + theirs.records + java_seen

    def split(*held: set[int]) -> bool:
        return all(held) and sum(map(len, held)) == PARTS and set().union(*held) == everyone

    def drive(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 90
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            if java is not None and java_open:
                java.poll(0, 200)
            else:
                time.sleep(0.05)

    try:
        epoch.subscribe([topic])
        runner.start()
        wait(lambda: len(runner.records) == 5 * PARTS, "EpochConsumer reads everything")
        java = EAGER_RANGE.java_member(cluster, group, auto_commit=True)
        java_open = True
        java.subscribe([topic])
        ours.start()
        theirs.start()

        def four_way() -> bool:
            assert java is not None
            held = {tp.partition for tp in java.assignment}
            mine = {tp.partition for tp in epoch.assignment()}
            return split(mine, held, ours.partitions(), theirs.partitions())

        drive(four_way, "a four-way split")
        _produce(cluster, topic, 5, 10)
        drive(lambda: len(seen()) >= 10 * PARTS, "every record once, four ways")
        assert ours.records and theirs.records and java.records, "each member read its share"
        java.close()  # leaves; auto commit commits its positions first
        java_open = False
        theirs.stop()  # aiokafka commits, then leaves
        drive(
            lambda: split({tp.partition for tp in epoch.assignment()}, ours.partitions()),
            "a two-way split",
        )
        _produce(cluster, topic, 10, 15)
        drive(lambda: len(seen()) >= 15 * PARTS, "every record once, two ways")
        time.sleep(0.3)  # nothing more arrives
        got = seen()
        assert len(got) == len(set(got)) == 15 * PARTS, sorted(got)
    finally:
        if runner.is_alive():
            runner.finish()
        epoch.close()
        if java is not None:
            java.close()
        for async_member in (ours, theirs):
            async_member.stop()
        loop.close()


@pytest.mark.parametrize("first", ["java", "asyncio"])
def test_a_truncation_is_carried_between_java_and_aioepochconsumer(
    cluster: ApacheKafkaCluster, first: str
) -> None:
    """KIP-848: one member reads a0..a4, d0..d2 and commits (8, e0) before an unclean election
    drops d0..d2; the next owner, of the other kind, restores that commit and detects the
    truncation at (5, e0) before reading anything of the new log (Java: LogTruncationException
    with auto.offset.reset=none; AIOEpochConsumer: LogTruncationError from getmany)."""
    from epochguard import AIOEpochConsumer

    loop = _Loop()
    tp_commits: list[Any] = []
    owners: list[Any] = []
    config: dict[str, Any] = {
        "group_protocol": "consumer",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "on_truncation": "raise",
        "fetch_max_wait_ms": 100,
        "metadata_max_age_ms": 500,
        "retry_backoff_ms": 50,
    }

    async def aio_reads_and_commits(topic: str, group: str) -> Any:
        c = AIOEpochConsumer(
            topic, bootstrap_servers=cluster.bootstrap_servers, group_id=group, **config
        )
        await c.start()
        try:
            got = 0
            deadline = time.monotonic() + 60
            while got < 8:
                assert time.monotonic() < deadline, got
                got += sum(len(v) for v in (await c.getmany(timeout_ms=100)).values())
            await c.commit()
            return await c.committed_with_epoch(TopicPartition(topic, 0))
        finally:
            await c.stop()

    async def aio_detects(topic: str, group: str) -> LogTruncationError:
        c = AIOEpochConsumer(
            topic, bootstrap_servers=cluster.bootstrap_servers, group_id=group, **config
        )
        await c.start()
        try:
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "AIOEpochConsumer never detected it"
                try:
                    batch = await c.getmany(timeout_ms=100)
                except LogTruncationError as exc:
                    return exc
                assert not any(batch.values()), batch
        finally:
            await c.stop()

    def read_and_commit(topic: str, group: str) -> None:
        if first == "java":
            java = KIP848.java_member(cluster, group, auto_offset_reset="none")
            owners.append(java)
            java.subscribe([topic])
            java.poll_until(lambda r: r.exception is not None, "no offset")
            java.seek(TopicPartition(topic, 0), 0)
            java.poll_until(lambda _r: len(java.records) >= 8, "the Java member reads 8")
            tp_commits.append(java.commit())
            java.close()  # leaves the group; the next owner starts from the commit
        else:
            tp_commits.append(loop.run(aio_reads_and_commits(topic, group)))

    try:
        topic, group = new_topic(f"aiocarry-{first}"), new_topic(f"gaiocarry-{first}")
        t = drive_unclean_election(
            cluster, topic, before_election=lambda: read_and_commit(topic, group)
        )
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        h = _Handover(topic, group, TopicPartition(topic, 0), t.first_epoch)
        if first == "java":
            assert tp_commits == [JavaCommit({h.tp: EpochOffset(8, h.first_epoch)})]
            detected = loop.run(aio_detects(topic, group), timeout=90)
            assert detected.truncation_offsets() == {h.tp: EpochOffset(5, h.first_epoch)}
            report = detected.truncations[h.tp]
            assert (report.lost_from, report.lost_to, report.lost_count) == (5, 8, 3)
        else:
            assert tp_commits == [EpochOffset(8, h.first_epoch)]
            java = KIP848.java_member(cluster, group, auto_offset_reset="none")
            owners.append(java)
            java.subscribe([topic])
            _java_detects(java, h)
    finally:
        for owner in owners:
            owner.close()
        loop.close()


def test_a_pattern_member_whose_topics_were_deleted_does_not_hold_up_java_members(
    cluster: ApacheKafkaCluster,
) -> None:
    """An EpochConsumer subscribed to a pattern and a Java member subscribed to another
    topic share a classic group. Once the pattern's topic is deleted the EpochConsumer joins
    with no topics and gives up its partitions; a second Java member then joins, and the
    rebalance settles without waiting the EpochConsumer's ``max_poll_interval_ms`` (300 s)
    for its JoinGroup."""
    gone, kept = new_topic("pgone"), new_topic("pkept")
    group = new_topic("gpattern")
    cluster.create_topic(gone, partitions=2)
    cluster.create_topic(kept, partitions=PARTS)
    epoch = epoch_member(cluster, group, EAGER_RANGE, max_poll_interval_ms=300_000)
    runner = Runner(epoch)
    first = EAGER_RANGE.java_member(cluster, group)
    second: JavaGroupMember | None = None
    try:
        epoch.subscribe(pattern=f"{gone}$")
        runner.start()
        first.subscribe([kept])

        def both_hold() -> bool:
            first.poll(0, 200)
            return len(epoch.assignment()) == 2 and len(first.assignment) == PARTS

        wait(both_hold, "the pattern member and the Java member hold their topics")
        cluster.delete_topic(gone)

        def gave_up() -> bool:
            first.poll(0, 200)
            return epoch.subscription() == set() and not epoch.assignment()

        wait(gave_up, "the pattern member to give up the deleted topic's partitions")
        second = EAGER_RANGE.java_member(cluster, group)
        second.subscribe([kept])
        started = time.monotonic()

        def java_split() -> bool:
            assert second is not None
            first.poll(0, 200)
            second.poll(0, 200)
            held = [len(first.assignment), len(second.assignment)]
            return min(held) > 0 and sum(held) == PARTS

        wait(java_split, "the two Java members to share the topic", timeout=60)
        assert not epoch.assignment()
        assert time.monotonic() - started < 60
    finally:
        runner.finish()
        for java in (first, second):
            if java is not None:
                java.close()
        epoch.close()
