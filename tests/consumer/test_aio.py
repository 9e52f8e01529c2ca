"""AIOEpochConsumer on the EmbeddedCluster: the asyncio driver of the engine EpochConsumer
drives with threads. Same staging as test_truncation.py (offsets 0..9 replicated, 10..14 on
the old leader only, an unclean election appends 8 records at 10..17)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.structs import TopicPartition

from epochguard import AIOEpochConsumer, EpochConsumer
from epochguard.consumer import LogTruncationError, aio
from epochguard.consumer.records import ConsumerRecord
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, aread, consumer_config, diverge, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())  # type: ignore[arg-type]


def test_no_thread_serves_the_connections(cluster: EmbeddedCluster) -> None:
    """Every socket is served from the event loop: starting the consumer starts no thread
    (kafka-python's IO thread is not there, heartbeats are tasks)."""
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"a", b"b"])

    async def main() -> None:
        before = set(threading.enumerate())
        async with AIOEpochConsumer(
            "t", **consumer_config(cluster, group_id="g", heartbeat_interval_ms=50)
        ) as c:
            got = await aread(c, 2)
            assert [r.value for r in got] == [b"a", b"b"]
            assert set(threading.enumerate()) - before == set()

    _run(main)


def test_a_stopped_heartbeat_never_acts_on_an_answer_it_was_awaiting(
    cluster: EmbeddedCluster,
) -> None:
    """Stopping a background step (heartbeats, before a join) ends it even while it awaits an
    answer, as the threaded driver's join does: an answer arriving after it is not acted on
    (a heartbeat's stale refusal asked for another rebalance after the join). A step that
    stops its own heartbeats (one that leaves the group) carries on."""
    from kafka.future import Future

    from epochguard.consumer.effects import Await, Signal, Step
    from epochguard.consumer.membership import Heartbeats

    async def main() -> None:
        async with AIOEpochConsumer(**consumer_config(cluster)) as c:
            io = c._io
            assert io is not None
            acted: list[str] = []
            answer: Future = Future()
            beats = Heartbeats(io.spawn, "test-heartbeats")

            def beat(_stop: Signal) -> Step[None]:
                yield Await(answer, 5.0)
                acted.append("answer applied")

            beats.start(beat)
            await asyncio.sleep(0)  # the task starts and awaits the answer
            beats.stop()
            answer.success(None)
            for _ in range(3):
                await asyncio.sleep(0)
            assert acted == [] and not beats.running

            own: Future = Future()

            def leaving(_stop: Signal) -> Step[None]:
                beats.stop()  # as leave() from the heartbeat step itself
                yield Await(own, 5.0)
                acted.append("left")

            beats.start(leaving)
            await asyncio.sleep(0)
            own.success(None)
            for _ in range(3):
                await asyncio.sleep(0)
            assert acted == ["left"]

    _run(main)


def test_group_consume_commit_and_lookups(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=3)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
    for i in range(100):
        producer.send("t", b"v%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    tp1 = TopicPartition("t", 1)

    async def main() -> None:
        async with AIOEpochConsumer("t", **consumer_config(cluster, group_id="g")) as c:
            got = await aread(c, 100)
            assert sorted(int(r.value[1:]) for r in got) == list(range(100))
            assert c.assignment() == {TP0, tp1}
            assert await c.position(TP0) == 50
            assert await c.position_with_epoch(TP0) == EpochOffset(50, 0)
            await c.commit()
            assert await c.committed(TP0) == 50
            assert await c.committed_with_epoch(tp1) == EpochOffset(50, 0)
            assert await c.end_offsets([TP0]) == {TP0: 50}
            assert await c.beginning_offsets([TP0]) == {TP0: 0}
            assert c.highwater(TP0) == 50 and c.last_stable_offset(TP0) == 50
            stamp = c.last_poll_timestamp(TP0)
            assert stamp is not None and abs(stamp / 1000 - time.time()) < 60
            assert await c.topics() >= {"t"}
            assert c.partitions_for_topic("t") == {0, 1}
            assert c.partitions_for_topic("nope") is None
            # seek_to_committed puts back the committed position with its epoch.
            c.seek(TP0, 3)
            assert await c.position(TP0) == 3
            assert await c.seek_to_committed(TP0) == {TP0: 50}
            assert await c.position_with_epoch(TP0) == EpochOffset(50, 0)

        # A new member of the group starts from the commit (with its epoch).
        async with AIOEpochConsumer("t", **consumer_config(cluster, group_id="g")) as c2:
            deadline = time.monotonic() + 20
            while TP0 not in c2.assignment():  # the join goes on across reads
                assert time.monotonic() < deadline, "never assigned"
                assert await c2.getmany(timeout_ms=300) == {}
            assert await c2.getmany(timeout_ms=300) == {}
            assert await c2.position_with_epoch(TP0) == EpochOffset(50, 0)

    _run(main)


def test_raise_policy_reports_the_truncation_exactly(cluster: EmbeddedCluster) -> None:
    reports: list[TruncationReport] = []

    async def main() -> None:
        config = consumer_config(
            cluster, on_truncation="raise", on_truncation_report=reports.append
        )
        async with AIOEpochConsumer(**config) as c:
            old, new = setup_topic(cluster)
            c.assign([TP0])
            assert [r.offset for r in await aread(c, 10)] == list(range(10))
            diverge(cluster, old, new)
            assert [r.offset for r in await aread(c, 5)] == list(range(10, 15))
            unclean_elect(cluster, old, new)
            with pytest.raises(LogTruncationError) as info:
                await aread(c, 1, timeout=10)
            err = info.value
            assert err.truncation_offsets() == {TP0: EpochOffset(10, 0)}
            assert err.truncations[TP0].lost_count == 5
            # aiokafka code catches it as aiokafka's own OffsetOutOfRangeError.
            from aiokafka.errors import OffsetOutOfRangeError

            assert isinstance(err, OffsetOutOfRangeError)
            assert await c.getmany(timeout_ms=300) == {}  # stopped until a seek
            c.seek(TP0, err.truncation_offsets()[TP0])
            got = await aread(c, 8)
            assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]

    _run(main)
    assert len(reports) == 1 and reports[0].divergence == EpochOffset(10, 0)


def test_cancelled_getmany_loses_and_repeats_nothing(cluster: EmbeddedCluster) -> None:
    """getmany cancelled again and again by timeouts shorter than its own, while records
    keep arriving: every record is delivered exactly once, in order."""
    cluster.create_topic("t", partitions=1, replication_factor=1)
    total = 400

    async def main() -> None:
        async with AIOEpochConsumer(**consumer_config(cluster, fetch_max_wait_ms=50)) as c:
            c.assign([TP0])
            loop = asyncio.get_running_loop()
            feeder = loop.run_in_executor(
                None,
                lambda: [
                    (
                        cluster.append("t", 0, [b"%d" % i for i in range(k, k + 20)]),
                        time.sleep(0.01),
                    )
                    for k in range(0, total, 20)
                ],
            )
            got: list[ConsumerRecord] = []
            deadline = time.monotonic() + 30
            cancelled = 0
            while len(got) < total and time.monotonic() < deadline:
                try:
                    batch = await asyncio.wait_for(c.getmany(timeout_ms=1000, max_records=7), 0.003)
                except TimeoutError:
                    cancelled += 1
                    continue
                for records in batch.values():
                    got += records
            await feeder
            assert cancelled > 0
            assert [r.offset for r in got] == list(range(total))
            assert await c.position(TP0) == total

    _run(main)


def _fetches_seen(cluster: EmbeddedCluster) -> int:
    return sum(n for (api_key, _v), n in cluster.requests_seen().items() if api_key == 1)


def test_the_next_fetch_goes_out_before_the_application_awaits_again(
    cluster: EmbeddedCluster,
) -> None:
    """A read that returns buffered records sends the fetch for what follows before it
    returns: the broker gets it while the application is still busy (here: blocking the loop
    outright), not only once the buffers run dry and the consumer waits."""
    cluster.create_topic("t", partitions=1, replication_factor=1)
    for k in range(4):
        cluster.append("t", 0, [b"%d" % (k * 10 + i) for i in range(10)])

    async def main() -> None:
        # Fetches of one batch each (a broker returns at least one whole batch).
        async with AIOEpochConsumer(**consumer_config(cluster, max_partition_fetch_bytes=1)) as c:
            c.assign([TP0])
            got = await aread(c, 1)
            assert got[0].offset == 0
            # From here the loop does not turn until the assertion.
            deadline = time.monotonic() + 10
            while _fetches_seen(cluster) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _fetches_seen(cluster) >= 2
            rest = await aread(c, 39)
            assert [r.offset for r in got + rest] == list(range(40))

    _run(main)


def test_reading_at_full_speed_still_gives_the_loop_turns(cluster: EmbeddedCluster) -> None:
    """An application that reads buffered records one at a time and awaits nothing else
    still lets the loop's other tasks run: reads give the loop a turn now and then."""
    cluster.create_topic("t", partitions=1, replication_factor=1)
    total = 3000
    for k in range(0, total, 500):
        cluster.append("t", 0, [b"v%d" % i for i in range(k, k + 500)])

    async def main() -> None:
        async with AIOEpochConsumer(**consumer_config(cluster)) as c:
            c.assign([TP0])
            got: list[ConsumerRecord] = []
            while not got:
                for records in (await c.getmany(timeout_ms=100, max_records=1)).values():
                    got += records
            turns = 0

            async def other_task() -> None:
                nonlocal turns
                while True:
                    await asyncio.sleep(0)
                    turns += 1

            other = asyncio.create_task(other_task())
            await asyncio.sleep(0)  # started
            turns = 0
            started = time.monotonic()
            while len(got) < total:
                for records in (await c.getmany(max_records=1)).values():
                    got += records
            took = time.monotonic() - started
            other.cancel()
            assert [r.value for r in got] == [b"v%d" % i for i in range(total)]
            # Every record came from one fetch answer, so no read waited: without the turns
            # reads give, the other task would not have run once. (3,000 reads take well
            # over ten intervals.)
            assert took > 10 * aio.YIELD_INTERVAL_S
            assert turns >= 5

    _run(main)


@contextlib.contextmanager
def _ten_records_in_each(partitions: int) -> Iterator[tuple[EmbeddedCluster, list[TopicPartition]]]:
    """One broker, topic ``t`` with ``partitions`` partitions of ten records each."""
    parts = [TopicPartition("t", p) for p in range(partitions)]
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("t", partitions=partitions, replication_factor=1)
        for tp in parts:
            cluster.append("t", tp.partition, [b"%d-%d" % (tp.partition, i) for i in range(10)])
        yield cluster, parts


def _assign_from_the_start(c: AIOEpochConsumer, parts: list[TopicPartition]) -> None:
    c.assign(parts)
    for tp in parts:
        c.seek(tp, 0)


def test_a_read_decodes_one_budget_of_a_large_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer for many partitions is decoded over several reads, one decode budget each
    (the loop turns in between): the read that waited for it applies the budget once, not
    once on waking and again before it returns."""
    monkeypatch.setattr(aio, "DECODE_BUDGET_BYTES", 1)  # one partition a read
    with _ten_records_in_each(4) as (cluster, parts):

        async def main() -> None:
            async with AIOEpochConsumer(**consumer_config(cluster)) as c:
                _assign_from_the_start(c, parts)
                reads: list[dict[TopicPartition, list[ConsumerRecord]]] = []
                while sum(len(rs) for got in reads for rs in got.values()) < 40:
                    got = await c.getmany(timeout_ms=5000, max_records=1000)
                    assert got
                    reads.append(got)
                assert [len(got) for got in reads] == [1, 1, 1, 1]
                assert sorted(tp for got in reads for tp in got) == parts

        _run(main)


def test_a_lookup_leaves_buffered_answers_to_the_reads(
    monkeypatch: pytest.MonkeyPatch, mocker: Any
) -> None:
    """``end_offsets()`` (a service's lag check), ``position()`` and the other lookups wait
    for their own answers only: fetched records waiting undecoded stay so for the reads.
    Decoding them there held the loop for every buffered answer, and a lookup waited on
    nothing while any remained."""
    monkeypatch.setattr(aio, "DECODE_BUDGET_BYTES", 1)  # one partition a read
    with _ten_records_in_each(8) as (cluster, parts):

        async def main() -> None:
            async with AIOEpochConsumer(**consumer_config(cluster)) as c:
                _assign_from_the_start(c, parts)
                first = await c.getmany(timeout_ms=5000, max_records=1000)
                assert [len(records) for records in first.values()] == [10]
                fetcher = c._engine.fetcher  # type: ignore[union-attr]
                assert fetcher._undecoded, "the answer's other partitions wait undecoded"
                waiting = len(fetcher._undecoded)
                decoded = mocker.spy(fetcher, "_decode_from")
                assert await c.end_offsets(parts) == dict.fromkeys(parts, 10)
                [read] = first
                assert await c.position(read) == 10
                assert decoded.call_count == 0 and len(fetcher._undecoded) == waiting
                got = {read: 10}
                while sum(got.values()) < 80:
                    for tp, records in (await c.getmany(timeout_ms=5000)).items():
                        got[tp] = got.get(tp, 0) + len(records)
                assert got == dict.fromkeys(parts, 10)

        _run(main)


def test_position_settles_a_recreated_topic_without_a_read() -> None:
    """A position from a deleted incarnation of its topic is settled by a topic probe (a
    fetch whose records are never decoded) before validation: ``position()`` applies the
    probe's answer itself rather than leaving it, with the undecoded answers, to a read."""
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("t", partitions=1, replication_factor=1)
        cluster.append("t", 0, [b"old-%d" % i for i in range(10)])
        old_id = cluster.topic_id("t")
        cluster.delete_topic("t")
        cluster.create_topic("t", partitions=1, replication_factor=1)
        cluster.append("t", 0, [b"new-%d" % i for i in range(10)])

        async def main() -> None:
            async with AIOEpochConsumer(**consumer_config(cluster)) as c:
                c.assign([TP0])
                c.seek(TP0, EpochOffset(5, 0, topic_id=old_id))
                position = await asyncio.wait_for(c.position_with_epoch(TP0), 3)
                assert position == EpochOffset(0, None)
                [report] = c.truncation_reports()
                assert report.detected_by.value == "topic_recreated"

        _run(main)


def test_a_pattern_subscribed_while_topics_waits_keeps_asking_for_every_topic(
    cluster: EmbeddedCluster,
) -> None:
    """``topics()`` asks for every topic of the cluster while it waits; a pattern subscribed
    meanwhile (another task) needs them for good: a topic created afterwards is matched."""
    cluster.create_topic("a-1", partitions=1, replication_factor=1)

    async def main() -> None:
        async with AIOEpochConsumer(**consumer_config(cluster)) as c:
            listing = asyncio.create_task(c.topics())
            await asyncio.sleep(0)  # topics() waits for its metadata
            c.subscribe(pattern="a-.*")
            assert "a-1" in await listing
            cluster.create_topic("a-2", partitions=1, replication_factor=1)
            cluster.append("a-2", 0, [b"new"])
            deadline = time.monotonic() + 10
            got: list[bytes] = []
            while not got and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=200)
                got = [r.value for tp, rs in batch.items() if tp.topic == "a-2" for r in rs]
            assert got == [b"new"]

    _run(main)


def test_the_loop_turns_between_applying_answers_and_sending_what_they_call_for(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applying a metadata answer over 1,000 partitions takes milliseconds, and so does
    planning the fetches it makes possible: the loop's other tasks get a turn in between."""
    from epochguard.consumer.fetcher import Fetcher

    cluster.create_topic("t", partitions=1, replication_factor=1)
    cluster.append("t", 0, [b"v"])
    order: list[str] = []
    apply_metadata, send_requests = Fetcher._on_metadata, Fetcher.send_requests

    def slow_metadata(self: Fetcher, *args: Any) -> None:
        apply_metadata(self, *args)
        until = time.monotonic() + 2 * aio.YIELD_INTERVAL_S  # as a large answer would
        while time.monotonic() < until:
            pass
        order.append("metadata")

    def sending(self: Fetcher, now: float) -> float:
        order.append("send")
        return send_requests(self, now)

    monkeypatch.setattr(Fetcher, "_on_metadata", slow_metadata)
    monkeypatch.setattr(Fetcher, "send_requests", sending)

    async def main() -> None:
        async def ticker() -> None:
            while True:
                order.append("tick")
                await asyncio.sleep(0)

        async with AIOEpochConsumer(**consumer_config(cluster)) as c:
            c.assign([TP0])
            tick = asyncio.create_task(ticker())
            got = await aread(c, 1)
            tick.cancel()
            assert [r.value for r in got] == [b"v"]
        applied = [i for i, what in enumerate(order) if what == "metadata"]
        assert applied
        for i in applied:
            after = order[i + 1 :]
            if "send" in after:
                assert "tick" in after[: after.index("send")], order

    _run(main)


def test_a_task_waiting_on_a_timer_runs_right_after_a_long_step(
    cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``asyncio.sleep(0)`` queues the reader's wake-up before the callbacks of the timers
    that came due while it ran: after a long step a task waiting on a timer would wait for
    the reader's next step too. The turn after a long step lets it run first."""
    from epochguard.consumer.fetcher import Fetcher

    cluster.create_topic("t", partitions=1, replication_factor=1)
    cluster.append("t", 0, [b"v"])
    order: list[str] = []
    apply_undecoded, fetched_records = Fetcher._apply_undecoded, Fetcher.fetched_records

    def slow_apply(self: Fetcher, *args: Any) -> None:
        apply_undecoded(self, *args)
        until = time.monotonic() + 2 * aio.LONG_STEP_S  # as an answer over 1,000 partitions
        while time.monotonic() < until:
            pass
        order.append("applied")

    def handing_out(self: Fetcher, *args: Any) -> Any:
        order.append("hand out")
        return fetched_records(self, *args)

    monkeypatch.setattr(Fetcher, "_apply_undecoded", slow_apply)
    monkeypatch.setattr(Fetcher, "fetched_records", handing_out)

    async def main() -> None:
        async def ticker() -> None:
            while True:
                order.append("tick")
                await asyncio.sleep(0.0005)  # due during the long step

        async with AIOEpochConsumer(**consumer_config(cluster)) as c:
            c.assign([TP0])
            tick = asyncio.create_task(ticker())
            got = await aread(c, 1)
            tick.cancel()
            assert [r.value for r in got] == [b"v"]
        applied = [i for i, what in enumerate(order) if what == "applied"]
        assert applied
        for i in applied:
            after = order[i + 1 :]
            assert "tick" in after[: after.index("hand out")], order

    _run(main)


def test_a_new_member_gets_its_first_record_from_getone(cluster: EmbeddedCluster) -> None:
    """getone() waits up to a minute per read: the join (whose first JoinGroup every new
    member has refused with MEMBER_ID_REQUIRED) goes on within it."""
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"first"])

    async def main() -> None:
        # Defaults but these: the quick test settings' short backoffs and metadata age wake
        # a waiting read on their own.
        async with AIOEpochConsumer(
            "t",
            bootstrap_servers=cluster.bootstrap_servers,
            group_id="getone",
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
        ) as c:
            record = await asyncio.wait_for(c.getone(), 20)
            assert record.value == b"first"

    _run(main)


class _AsyncListener:
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await asyncio.sleep(0)
        self.events.append(("revoked", set(revoked)))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await asyncio.sleep(0)
        self.events.append(("assigned", set(assigned)))


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_asyncio_and_threaded_members_share_a_group(
    cluster: EmbeddedCluster, protocol: str
) -> None:
    """An AIOEpochConsumer and an EpochConsumer in one group: the partitions are split, each
    record is read once, and the asyncio member's async listener is awaited."""
    cluster.create_topic("t", partitions=4, replication_factor=1)
    for p in range(4):
        cluster.append("t", p, [b"%d-%d" % (p, i) for i in range(25)])
    extra = (
        {"group_protocol": "consumer"}
        if protocol == "consumer"
        else {"heartbeat_interval_ms": 100, "session_timeout_ms": 6000}
    )
    config = consumer_config(cluster, group_id="mixed", enable_auto_commit=True, **extra)
    listener = _AsyncListener()
    seen: list[bytes] = []
    stop = threading.Event()

    def threaded() -> None:
        with EpochConsumer("t", **config) as c:
            while not stop.is_set():
                for records in c.poll(timeout_ms=50).values():
                    seen.extend(r.value for r in records)

    async def main() -> None:
        thread = threading.Thread(target=threaded, daemon=True)
        thread.start()
        async with AIOEpochConsumer(**config) as c:
            c.subscribe(["t"], listener=listener)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for records in (await c.getmany(timeout_ms=100)).values():
                    seen.extend(r.value for r in records)
                owned = c.assignment()
                if len(seen) >= 100 and owned and len(owned) < 4:
                    break
            assert 0 < len(c.assignment()) < 4
        stop.set()
        thread.join(10)

    _run(main)
    assert sorted(seen) == sorted(b"%d-%d" % (p, i) for p in range(4) for i in range(25))
    assert any(kind == "assigned" and parts for kind, parts in listener.events)


def test_an_eager_rebalance_never_holds_getmany_past_its_timeout(
    cluster: EmbeddedCluster,
) -> None:
    """The coordinator holds a JoinGroup until every member has rejoined: getmany(timeout_ms)
    returns on time meanwhile (as aiokafka's), so one task can await three members of a
    group in turn through a rebalance."""
    cluster.create_topic("t", partitions=4, replication_factor=2)
    cfg = consumer_config(
        cluster,
        group_id="one-task",
        session_timeout_ms=6000,
        heartbeat_interval_ms=200,
        max_poll_interval_ms=30000,
    )

    async def main() -> None:
        members = [AIOEpochConsumer("t", **cfg) for _ in range(3)]
        longest = 0.0

        async def settled(consumers: list[AIOEpochConsumer]) -> bool:
            nonlocal longest
            for c in consumers:
                t0 = time.monotonic()
                await c.getmany(timeout_ms=100)
                longest = max(longest, time.monotonic() - t0)
            sizes = [len(c.assignment()) for c in consumers]
            return sum(sizes) == 4 and min(sizes) > 0

        try:
            for c in members:
                await c.start()
            for group in (members[:2], members):
                deadline = time.monotonic() + 20
                while not await settled(group):
                    assert time.monotonic() < deadline, "the group did not settle"
            assert sorted(len(c.assignment()) for c in members) == [1, 1, 2]
            assert longest < 5.0, f"a getmany(timeout_ms=100) took {longest:.1f} s"
        finally:
            for c in members:
                await c.stop()

    _run(main)
