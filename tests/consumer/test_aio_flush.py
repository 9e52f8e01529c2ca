"""``AIOEpochConsumer``'s connections are stepped after each read only when a request waits
to go out: reading what the sockets hold, and the selector's timers, are left to the loop's
own turns (the reads give it one every ``YIELD_INTERVAL_S``)."""

from __future__ import annotations

import asyncio
import selectors
import socket
from typing import Any

import pytest

from epochguard.consumer.aio import _LoopIO
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

        def flush() -> None:
            turns.clear()
            io.flush()
            outcome.append("turned" if turns else "skipped")

        flush()  # nothing ready
        peer.send(b"x")
        flush()  # a socket is readable: the loop's turn reads it
        ours.recv(1)
        net._scheduled.clear()
        net.call_later(0, lambda: None)
        flush()  # a timer is due: the loop's call for it runs it
        net._scheduled.clear()
        net._ready.append(object())
        flush()  # a request waits to go out: always
        net._ready.clear()
    finally:
        net._selector.unregister(ours)
        ours.close()
        peer.close()
        io.close()
    return outcome


def test_flush_turns_the_selector_only_for_requests_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome: Any = asyncio.run(_flushes(monkeypatch))
    assert outcome == ["skipped", "skipped", "skipped", "turned"]
