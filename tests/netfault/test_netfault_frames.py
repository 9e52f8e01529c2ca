"""The fault proxy's byte-level behaviour against a scripted peer (no Kafka): where a cut
lands, what a reset and a partition look like on the socket, latency's order."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from epochguard.testing.netfault import FaultProxy

pytestmark = pytest.mark.timeout(30)

BODY = bytes(range(100))


def _answer(correlation: int) -> bytes:
    payload = struct.pack(">i", correlation) + BODY
    return struct.pack(">i", len(payload)) + payload


class _Peer:
    """A broker stand-in: answers every request frame with its correlation id and BODY."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    head = _read_exactly(conn, 4)
                    request = _read_exactly(conn, struct.unpack(">i", head)[0])
                    (correlation,) = struct.unpack_from(">i", request, 4)
                    conn.sendall(_answer(correlation))
            except (ConnectionError, OSError):
                return


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _request(api_key: int, correlation: int) -> bytes:
    payload = struct.pack(">hhi", api_key, 0, correlation) + b"\x00\x00"
    return struct.pack(">i", len(payload)) + payload


def _read_until_closed(conn: socket.socket) -> tuple[bytes, str]:
    data = b""
    while True:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            return data, "reset"
        if not chunk:
            return data, "closed"
        data += chunk


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    peer = _Peer()
    with FaultProxy() as p:
        p.route(1, "127.0.0.1", peer.port)
        yield p
    peer.server.close()


def _connect(proxy: FaultProxy) -> socket.socket:
    conn = socket.create_connection(proxy.address(1), timeout=5)
    return conn


def test_answers_pass_unchanged(proxy: FaultProxy) -> None:
    with _connect(proxy) as conn:
        for correlation in range(3):
            conn.sendall(_request(1, correlation))
            assert _read_exactly(conn, 108) == _answer(correlation)


@pytest.mark.parametrize("at_byte", [0, 3, 8, 50, 107])
def test_a_cut_passes_exactly_at_byte_bytes_of_the_chosen_answer_then_resets(
    proxy: FaultProxy, at_byte: int
) -> None:
    proxy.cut_answer(1, at_byte, api_key=3)
    with _connect(proxy) as conn:
        conn.sendall(_request(1, 7))  # another API: passes whole
        assert _read_exactly(conn, 108) == _answer(7)
        # The request's header split over writes: the proxy still finds its API key.
        request = _request(3, 8)
        conn.sendall(request[:5])
        time.sleep(0.05)
        conn.sendall(request[5:])
        data, how = _read_until_closed(conn)
    assert data == _answer(8)[:at_byte]
    assert how == "reset"
    assert proxy.stats["cut"] == 1


def test_a_cut_past_the_answer_passes_it_whole_then_resets(proxy: FaultProxy) -> None:
    proxy.cut_answer(1, 10_000)
    with _connect(proxy) as conn:
        conn.sendall(_request(1, 1) + _request(1, 2))
        data, how = _read_until_closed(conn)
    assert (data, how) == (_answer(1), "reset")


def test_reset_and_blackhole(proxy: FaultProxy) -> None:
    with _connect(proxy) as conn:
        conn.sendall(_request(1, 1))
        assert _read_exactly(conn, 108) == _answer(1)
        proxy.blackhole(1)
        assert proxy.reset(1) == 1
        assert _read_until_closed(conn) == (b"", "reset")
    with _connect(proxy) as conn:
        conn.settimeout(0.5)
        conn.sendall(_request(1, 2))
        with pytest.raises(TimeoutError):
            conn.recv(1)  # accepted, never answered
    assert proxy.stats["blackholed"] == 1
    proxy.heal(1)
    with _connect(proxy) as conn:
        conn.sendall(_request(1, 3))
        assert _read_exactly(conn, 108) == _answer(3)


def test_a_partition_holds_bytes_both_ways_until_it_heals(proxy: FaultProxy) -> None:
    with _connect(proxy) as open_conn, _connect(proxy) as other:
        proxy.partition(1, seconds=0.6)
        started = time.monotonic()
        open_conn.sendall(_request(1, 1))
        with _connect(proxy) as new_conn:
            new_conn.sendall(_request(1, 2))
            assert _read_exactly(new_conn, 108) == _answer(2)
        assert _read_exactly(open_conn, 108) == _answer(1)
        assert time.monotonic() - started >= 0.5
        other.sendall(_request(1, 3))
        assert _read_exactly(other, 108) == _answer(3)


def test_latency_with_jitter_keeps_the_order(proxy: FaultProxy) -> None:
    proxy.set_latency(1, 0.05, jitter_s=0.1)
    with _connect(proxy) as conn:
        started = time.monotonic()
        conn.sendall(b"".join(_request(1, c) for c in range(20)))
        got = _read_exactly(conn, 20 * 108)
    assert got == b"".join(_answer(c) for c in range(20))
    assert time.monotonic() - started >= 0.1  # both ways


def test_bandwidth_cap(proxy: FaultProxy) -> None:
    proxy.set_bandwidth(1, 2_000)
    with _connect(proxy) as conn:
        started = time.monotonic()
        conn.sendall(b"".join(_request(1, c) for c in range(10)))  # 1,080 bytes back
        got = _read_exactly(conn, 10 * 108)
    assert got == b"".join(_answer(c) for c in range(10))
    assert time.monotonic() - started >= 0.4
