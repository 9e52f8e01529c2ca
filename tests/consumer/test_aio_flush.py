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
