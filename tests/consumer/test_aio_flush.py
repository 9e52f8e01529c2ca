"""``AIOEpochConsumer``'s connections are stepped after each read only when there is
something to do: a request waiting to go out, a timer due, or a socket ready."""

from __future__ import annotations

import asyncio
import selectors
import socket
from typing import Any

import pytest

from epochguard.consumer.aio import _FLUSH_INTERVAL_S, _LoopIO
from epochguard.consumer.client import BrokerClient


async def _flushes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    client = BrokerClient({"bootstrap_servers": "127.0.0.1:9"}, io_thread=False)
    io = _LoopIO(client, asyncio.get_running_loop())
    net = client.selector
    turns: list[str] = []
    outcome: list[str] = []
    monkeypatch.setattr(net, "poll", lambda timeout_ms=None, future=None: turns.append("turn"))
    ours, peer = socket.socketpair()
    try:
        net._selector.register(ours, selectors.EVENT_READ, None)

        def flush_long_after() -> None:
            turns.clear()
            io._stepped_at -= 2 * _FLUSH_INTERVAL_S
            io.flush()
            outcome.append("turned" if turns else "skipped")

        flush_long_after()  # nothing ready
        peer.send(b"x")
        flush_long_after()  # a socket is readable
        ours.recv(1)
        net._scheduled.clear()
        net.call_later(0, lambda: None)
        flush_long_after()  # a timer is due
        net._scheduled.clear()
        turns.clear()
        io.flush()  # stepped just now: not again within the interval
        outcome.append("turned" if turns else "skipped")
        net._ready.append(object())
        io.flush()  # a request waits to go out: always
        outcome.append("turned" if turns else "skipped")
        net._ready.clear()
    finally:
        net._selector.unregister(ours)
        ours.close()
        peer.close()
        io.close()
    return outcome


def test_flush_turns_the_selector_only_when_something_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome: Any = asyncio.run(_flushes(monkeypatch))
    assert outcome == ["skipped", "turned", "turned", "skipped", "turned"]


async def _flushes_with_a_watched_socket(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    client = BrokerClient({"bootstrap_servers": "127.0.0.1:9"}, io_thread=False)
    io = _LoopIO(client, asyncio.get_running_loop())
    turns: list[str] = []
    monkeypatch.setattr(
        client.selector, "poll", lambda timeout_ms=None, future=None: turns.append("turn")
    )
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    reads: list[bytes] = []
    outcome: list[str] = []
    try:
        io.add_reader(ours.fileno(), lambda: reads.append(ours.recv(16)))

        def flush_long_after() -> None:
            reads.clear()
            turns.clear()
            io._stepped_at -= 2 * _FLUSH_INTERVAL_S
            io.flush()
            outcome.append(f"read {b''.join(reads)!r}" if reads else "nothing read")
            if turns:
                outcome.append("turned")

        flush_long_after()  # nothing ready
        peer.send(b"x")
        flush_long_after()  # the socket is readable: read, without a turn of the selector
        io.remove_reader(ours.fileno())
        peer.send(b"y")
        flush_long_after()  # no longer watched: neither read nor turned
        assert ours.fileno() not in asyncio.get_running_loop()._selector.get_map()  # type: ignore[attr-defined]
    finally:
        ours.close()
        peer.close()
        io.close()
    return outcome


def test_flush_reads_a_socket_the_loop_watches_without_turning_the_selector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome = asyncio.run(_flushes_with_a_watched_socket(monkeypatch))
    assert outcome == ["nothing read", "read b'x'", "nothing read"]


async def _flush_with_a_failing_reader() -> list[str]:
    client = BrokerClient({"bootstrap_servers": "127.0.0.1:9"}, io_thread=False)
    io = _LoopIO(client, asyncio.get_running_loop())
    ours, peer = socket.socketpair()
    calls: list[str] = []

    def failing() -> None:
        calls.append("read")
        raise RuntimeError("reader broke")

    try:
        io.add_reader(ours.fileno(), failing)
        peer.send(b"x")
        io._stepped_at -= 2 * _FLUSH_INTERVAL_S
        io.flush()  # runs as a read returns: must not raise over the records it returns
        calls.append("flushed")
    finally:
        io.remove_reader(ours.fileno())
        ours.close()
        peer.close()
        io.close()
    return calls


def test_a_reader_failing_in_flush_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="epochguard.consumer"):
        calls = asyncio.run(_flush_with_a_failing_reader())
    assert calls == ["read", "flushed"]
    assert "connection_read_failed" in caplog.text and "reader broke" in caplog.text
