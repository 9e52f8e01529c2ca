"""The kafka-python-compatible surface: lookups, pause/resume, iteration, pattern groups."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from kafka.errors import IllegalStateError
from kafka.structs import OffsetAndTimestamp, TopicPartition

from epochguard.consumer import ConsumerClosedError, EpochConsumer
from epochguard.offsets.position import EpochOffset

from .conftest import make_consumer, poll_until, read

pytestmark = pytest.mark.timeout(60)


def _topic(cluster: Any, name: str = "api", parts: int = 2, n: int = 5) -> list[TopicPartition]:
    cluster.create_topic(name, partitions=parts, replication_factor=2)
    for p in range(parts):
        cluster.append(
            name, p, [b"%d-%d" % (p, i) for i in range(n)], timestamp_ms=1000 + p, batch_size=1
        )
    return [TopicPartition(name, p) for p in range(parts)]


def test_offset_lookups_and_metadata(cluster: Any) -> None:
    tps = _topic(cluster)
    cluster.append("api", 0, [b"late"], timestamp_ms=5000)
    with make_consumer(cluster) as c:
        assert c.partitions_for_topic("api") == {0, 1}
        assert "api" in c.topics()
        assert c.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0}
        assert c.end_offsets(tps) == {tps[0]: 6, tps[1]: 5}
        found = c.offsets_for_times({tps[0]: 2000, tps[1]: 99999})
        assert found[tps[0]] == OffsetAndTimestamp(5, 5000, 0)
        assert found[tps[1]] is None
        assert c.assignment() == set()


def test_pause_resume_seek_and_positions(cluster: Any) -> None:
    tps = _topic(cluster)
    with make_consumer(cluster) as c:
        c.assign(tps)
        c.pause(tps[1])
        assert c.paused() == {tps[1]}
        got = read(c, 5)
        assert {r.partition for r in got} == {0}
        assert c.poll(timeout_ms=200) == {}
        c.resume(tps[1])
        assert [r.offset for r in read(c, 5) if r.partition == 1] == list(range(5))
        c.seek(tps[0], 2)
        assert c.position(tps[0]) == 2
        assert [r.offset for r in read(c, 3)] == [2, 3, 4]
        c.seek_to_beginning(tps[0])
        assert c.position_with_epoch(tps[0]) == EpochOffset(0, None)  # no record before 0
        c.seek_to_end()
        assert c.position(tps[0]) == 5 and c.position(tps[1]) == 5
        with pytest.raises(IllegalStateError):
            c.seek(TopicPartition("other", 0), 1)
        with pytest.raises(ValueError):
            c.seek(tps[0], -3)


def test_iteration_stops_after_consumer_timeout(cluster: Any) -> None:
    tps = _topic(cluster, parts=1)
    with make_consumer(cluster, consumer_timeout_ms=500) as c:
        c.assign(tps)
        t0 = time.monotonic()
        values = [r.value for r in c]
        assert values == [b"0-%d" % i for i in range(5)]
        assert time.monotonic() - t0 < 5


def test_pattern_subscription_commit_async_and_closed_errors(cluster: Any) -> None:
    _topic(cluster, "pat-a", parts=1)
    _topic(cluster, "pat-b", parts=1)
    _topic(cluster, "other", parts=1)
    done: list[Any] = []
    c = make_consumer(
        cluster, group_id="pattern", heartbeat_interval_ms=200, session_timeout_ms=6000
    )
    c.subscribe(pattern="^pat-")
    got = read(c, 10)
    assert {r.topic for r in got} == {"pat-a", "pat-b"} and len(got) == 10
    assert c.subscription() == {"pat-a", "pat-b"}
    c.commit_async(callback=lambda offsets, exc: done.append((offsets, exc)))
    poll_until(c, lambda: bool(done))
    assert done[0][1] is None
    assert c.committed_with_epoch(TopicPartition("pat-a", 0)) == EpochOffset(5, 0)
    c.close()
    with pytest.raises(ConsumerClosedError):
        c.poll()


def test_fetch_max_wait_ms_zero_reads_new_records_as_they_come(cluster: Any) -> None:
    """0 is valid (Java: atLeast(0); kafka-python accepts it): the broker answers at once
    and the consumer keeps asking; records appended later still arrive, each once."""
    tps = _topic(cluster, "nowait", parts=1, n=3)
    with make_consumer(cluster, fetch_max_wait_ms=0) as c:
        c.assign(tps)
        got = read(c, 3)
        for i in range(3, 6):
            cluster.append("nowait", 0, [b"0-%d" % i])
            got += read(c, 1)
        assert [r.value for r in got] == [b"0-%d" % i for i in range(6)]
        assert c.metrics(raw=True)["fetch_requests"] > 3


def test_bootstrap_succeeds_past_a_refusing_server(cluster: Any) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: that server refuses every connection
    for servers in (
        f"127.0.0.1:{port},{cluster.bootstrap_servers}",
        f"{cluster.bootstrap_servers},127.0.0.1:{port}",
    ):
        consumer = EpochConsumer(bootstrap_servers=servers, bootstrap_timeout_ms=30_000)
        try:
            assert consumer.topics() is not None
        finally:
            consumer.close(autocommit=False)


def test_bootstrap_moves_on_from_a_server_that_never_answers(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A half-open bootstrap address (accepts, never answers) costs one connection set-up
    timeout, not the whole bootstrap timeout: the next attempt tries another address."""
    import kafka.net.manager

    silent = socket.socket()  # accepts connections (the kernel's backlog), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    silent_port = silent.getsockname()[1]
    picks: list[int] = []
    real_choice = kafka.net.manager.random.choice

    def silent_first(items: Any) -> Any:
        # kafka-python picks a bootstrap address at random: the silent one goes first.
        ports = [getattr(item, "port", None) for item in items]
        if silent_port not in ports:
            return real_choice(items)  # another caller of random.choice
        pick = real_choice([b for b in items if b.port == silent_port] if not picks else items)
        picks.append(pick.port)
        return pick

    monkeypatch.setattr(kafka.net.manager.random, "choice", silent_first)
    try:
        servers = f"127.0.0.1:{silent_port},{cluster.bootstrap_servers}"
        consumer = EpochConsumer(
            bootstrap_servers=servers,
            bootstrap_timeout_ms=120_000,
            socket_connection_setup_timeout_ms=300,
            socket_connection_setup_timeout_max_ms=600,
        )
        try:
            assert consumer.topics() is not None
        finally:
            consumer.close(autocommit=False)
    finally:
        silent.close()
    assert picks[0] == silent_port and picks[-1] != silent_port, picks
