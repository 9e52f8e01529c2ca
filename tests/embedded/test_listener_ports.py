"""A stopped broker keeps its ports bound, not listening: connecting is refused, as at a dead
broker's address, nothing else can take the port, and the broker starts again on it."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient

from epochguard.testing import EmbeddedCluster, ports
from epochguard.testing.embedded.security import SASL_PLAINTEXT

pytestmark = pytest.mark.timeout(60)


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _connect(port: int) -> None:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()


def _bind_elsewhere(port: int, reuse_address: bool) -> socket.socket:
    """Another socket binding ``port``, as another process starting a server there would."""
    other = socket.socket()
    try:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(reuse_address))
        other.bind(("127.0.0.1", port))
    except BaseException:
        other.close()
        raise
    return other


def _topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


@pytest.fixture
def sasl_cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=2, sasl_users={"alice": "secret"}) as c:
        yield c


@pytest.mark.parametrize("reuse_address", [False, True], ids=["plain-bind", "SO_REUSEADDR"])
def test_a_stopped_broker_keeps_its_port_and_starts_again_on_it(
    cluster: EmbeddedCluster, reuse_address: bool
) -> None:
    cluster.create_topic("t")
    port = _port(cluster.broker_address(2))
    # Connections the broker closes when it stops leave sockets in TIME_WAIT on its port:
    # they must not keep it from listening again.
    assert "t" in _topics(cluster.broker_address(2))
    cluster.stop_broker(2)
    with pytest.raises(ConnectionRefusedError):
        _connect(port)
    with pytest.raises(OSError) as taken:
        _bind_elsewhere(port, reuse_address).close()
    assert taken.value.errno == errno.EADDRINUSE
    cluster.start_broker(2)
    assert cluster.broker_address(2) == f"127.0.0.1:{port}"
    assert "t" in _topics(cluster.broker_address(2))
    # And again: the cycle does not wear the reservation out.
    cluster.stop_broker(2)
    with pytest.raises(ConnectionRefusedError):
        _connect(port)
    cluster.start_broker(2)
    _connect(port)


def test_every_listener_of_a_stopped_broker_keeps_its_port(sasl_cluster: EmbeddedCluster) -> None:
    sasl_port = _port(sasl_cluster.listener_bootstrap_servers(SASL_PLAINTEXT).split(",")[1])
    sasl_cluster.stop_broker(2)
    with pytest.raises(ConnectionRefusedError):
        _connect(sasl_port)
    with pytest.raises(OSError) as taken:
        _bind_elsewhere(sasl_port, reuse_address=True).close()
    assert taken.value.errno == errno.EADDRINUSE
    sasl_cluster.start_broker(2)
    assert _port(sasl_cluster.listener_bootstrap_servers(SASL_PLAINTEXT).split(",")[1]) == (
        sasl_port
    )
    _connect(sasl_port)


def test_a_broker_moved_to_a_new_port_lets_its_old_port_go(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    old = _port(cluster.broker_address(3))
    cluster.stop_broker(3)
    cluster.start_broker(3, port=0)
    new = _port(cluster.broker_address(3))
    assert new != old
    assert "t" in _topics(f"127.0.0.1:{new}")
    with pytest.raises(ConnectionRefusedError):
        _connect(old)
    _bind_elsewhere(old, reuse_address=False).close()
    # Its reservation among the clusters of the machine is let go too.
    assert ports.reserve(old)
    ports.release([old])
    # The new port is held while the broker is stopped, as the first was.
    cluster.stop_broker(3)
    with pytest.raises(OSError) as taken:
        _bind_elsewhere(new, reuse_address=True).close()
    assert taken.value.errno == errno.EADDRINUSE
    cluster.start_broker(3)
    assert _port(cluster.broker_address(3)) == new


def test_closing_the_cluster_lets_a_stopped_brokers_port_go() -> None:
    with EmbeddedCluster(brokers=2) as c:
        port = _port(c.broker_address(2))
        c.stop_broker(2)
    _bind_elsewhere(port, reuse_address=False).close()


def test_accepted_connections_have_tcp_nodelay(cluster: EmbeddedCluster) -> None:
    # As Kafka's: without it, an answer's last partial segment waited for the client's
    # delayed ACK (40 ms) whenever the client had not yet acknowledged the previous answer.
    import time

    host, _, port = cluster.bootstrap_servers.split(",")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5):
        server = cluster._server
        deadline = time.monotonic() + 5
        socks: list[socket.socket] = []
        while not socks and time.monotonic() < deadline:
            socks = cluster._call(
                lambda: [
                    w.get_extra_info("socket") for conns in server._conns.values() for w in conns
                ]
            )
            time.sleep(0.01)
        assert socks
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in socks)
