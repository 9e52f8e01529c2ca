"""The plaintext transport reads large fetch responses in big chunks, correctly."""

from __future__ import annotations

import asyncio
import os
import selectors
import socket

import pytest
from kafka.errors import KafkaConnectionError
from kafka.structs import TopicPartition

from epochguard.consumer import client
from epochguard.testing import EmbeddedCluster

from .conftest import aread, consumer_config, make_consumer, read


@pytest.mark.timeout(60)
def test_consumer_reads_large_fetches_through_the_large_read_transport() -> None:
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("big", replication_factor=1)
        values = [b"%06d" % i + b"v" * 2000 for i in range(1500)]  # ~3 MB, > RECV_CHUNK
        cluster.append("big", 0, values, batch_size=100)
        with make_consumer(cluster, max_partition_fetch_bytes=1 << 20) as c:
            c.assign([TopicPartition("big", 0)])
            got = read(c, len(values))
            conns = c._client.manager._conns.values()
            assert conns and all(
                type(conn.transport) is client._LargeReadTransport for conn in conns
            )
            # Reads unbounded in size: large frames may go on huge pages.
            assert all(conn.transport._protocol.parser.huge_pages for conn in conns)
    assert [r.value for r in got] == values
    assert [r.offset for r in got] == list(range(len(values)))


@pytest.mark.timeout(60)
def test_the_asyncio_consumer_reads_into_small_pages() -> None:
    """The event loop's reads are bounded (``read_budget_bytes``), so a read must not meet
    a huge page's fault: measured at 9 ms for one 2 MiB page on a fragmented machine."""
    from epochguard import AIOEpochConsumer

    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("big", replication_factor=1)
        cluster.append("big", 0, [b"v" * 2000] * 200, batch_size=100)

        async def main() -> tuple[int, list[bool]]:
            async with AIOEpochConsumer(**consumer_config(cluster)) as c:
                c.assign([TopicPartition("big", 0)])
                got = await aread(c, 200)
                conns = c._client.manager._conns.values()
                assert conns and all(
                    type(conn.transport) is client._LargeReadTransport for conn in conns
                )
                return len(got), [conn.transport._protocol.parser.huge_pages for conn in conns]

        n, huge = asyncio.run(main())
    assert n == 200
    assert huge and not any(huge)


@pytest.mark.timeout(60)
def test_the_loop_watches_each_plaintext_socket_until_its_connection_closes() -> None:
    """Under asyncio a connected plaintext socket is read by the event loop itself, not
    by kafka-python's selector (which waits on it afresh for every read). A lost
    connection's descriptor leaves the loop before its socket is closed (a new connection
    may get the same number), and its successor is watched in turn."""
    from epochguard import AIOEpochConsumer

    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("t", replication_factor=1)
        cluster.append("t", 0, [b"a%d" % i for i in range(50)])

        async def watched(c: AIOEpochConsumer) -> tuple[set[int], set[int], set[int]]:
            transports = {
                conn.transport._sock.fileno(): conn.transport
                for conn in c._client.manager._conns.values()
                if conn.transport is not None and conn.transport._sock is not None
            }
            selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
            for fd, transport in transports.items():
                # The loop reads each socket for its current transport (not a stale one).
                reader = selector.get_key(fd).data[0]
                assert reader._args[0].__self__ is transport
            net_fds = {key.fd for key in c._client.selector._selector.get_map().values()}
            assert c._io is not None
            return set(transports), set(c._io._readers), net_fds

        async def main() -> list[bytes]:
            async with AIOEpochConsumer(**consumer_config(cluster)) as c:
                assert c._io is not None
                remove_reader = c._io.remove_reader

                def remove_while_open(fd: int) -> None:
                    os.fstat(fd)  # raises if the socket was closed first
                    removed.append(fd)
                    remove_reader(fd)

                removed: list[int] = []
                c._io.remove_reader = remove_while_open  # type: ignore[method-assign]
                c.assign([TopicPartition("t", 0)])
                got = await aread(c, 50)
                socks, readers, net_fds = await watched(c)
                assert socks and socks == readers
                assert not socks & net_fds
                closed = {
                    conn.transport: conn.transport._loop_fd
                    for conn in c._client.manager._conns.values()
                    if conn.transport is not None
                }
                cluster.stop_broker(1)
                cluster.start_broker(1)
                cluster.append("t", 0, [b"b%d" % i for i in range(50)])
                got += await aread(c, 50, timeout=20.0)
                socks, readers, net_fds = await watched(c)
                assert socks and socks == readers
                assert not socks & net_fds
                assert all(t._loop_fd == -1 and t._sock is None for t in closed), closed
                assert sorted(removed) == sorted(closed.values())
                return [r.value for r in got]

        values = asyncio.run(main())
    assert values == [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(50)]


def test_a_failure_handling_what_the_loop_read_closes_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An error out of the protocol's handling of an answer read from the loop closes the
    connection with it (its requests fail, the next one reconnects): left to the loop's
    exception handler, the socket would stay readable and be handled again and again."""

    class _Protocol:
        _sensors = None
        parser = None

        def data_received(self, _data: bytes) -> None:
            raise RuntimeError("handler broke")

    ours, broker = socket.socketpair()
    try:
        ours.setblocking(False)
        broker.sendall(b"x")
        transport = object.__new__(client._LargeReadTransport)
        transport._sock = ours
        transport._read = True
        transport._closed = False
        transport._protocol = _Protocol()
        transport._recv_frames = lambda parser: (1, None)  # type: ignore[method-assign]
        aborted: list[BaseException | None] = []
        transport.abort = lambda error=None: aborted.append(error)  # type: ignore[method-assign]
        with caplog.at_level("WARNING", logger="epochguard.consumer"):
            transport._read_ready()
    finally:
        ours.close()
        broker.close()
    assert len(aborted) == 1 and isinstance(aborted[0], KafkaConnectionError)
    assert "handler broke" in str(aborted[0])
    assert "connection_read_failed" in caplog.text


def test_an_answer_followed_by_a_close_is_delivered_before_the_close() -> None:
    """A broker that answers and closes at once (Kafka after a failed SASL login) must not
    lose its answer: kafka-python aborts on a read error without looking at the bytes read
    with it, so the bytes come first and the close on the next read."""
    ours, broker = socket.socketpair()
    try:
        ours.setblocking(False)
        broker.sendall(b"answer")
        broker.close()
        transport = object.__new__(client._LargeReadTransport)
        transport._sock = ours
        assert transport._sock_recv() == (b"answer", None)
        data, err = transport._sock_recv()
        assert data == b"" and isinstance(err, KafkaConnectionError)
    finally:
        ours.close()


def test_the_lean_reader_delivers_frames_completed_before_a_close() -> None:
    ours, broker = socket.socketpair()

    class Parser:
        def recv_from(self, sock: socket.socket, most: int | None = None) -> int:
            return len(sock.recv(4096 if most is None else min(most, 4096)))

    try:
        ours.setblocking(False)
        broker.sendall(b"answer")
        broker.close()
        transport = object.__new__(client._LargeReadTransport)
        transport._sock = ours
        assert transport._recv_frames(Parser()) == (6, None)  # type: ignore[arg-type]
        n, err = transport._recv_frames(Parser())  # type: ignore[arg-type]
        assert n == 0 and isinstance(err, KafkaConnectionError)
    finally:
        ours.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_certificate_refused_by_a_broker_other_than_the_bootstrap_one_reaches_poll(
    driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A certificate that does not verify will not verify on the next attempt either: on any
    broker, not only at bootstrap, poll() raises SslAuthenticationError naming the broker
    (kafka-python logs it and reconnects with backoff for ever, so the partitions it leads
    would stall without a word)."""
    import asyncio
    import ssl

    from kafka.net.manager import KafkaConnectionManager

    from epochguard.consumer import AIOEpochConsumer, EpochConsumer
    from epochguard.consumer.errors import SslAuthenticationError

    with EmbeddedCluster(brokers=2) as cluster:
        cluster.create_topic("tls", partitions=1, replication_factor=2)
        cluster.elect_leader("tls", 0, 2)
        cluster.append("tls", 0, [b"a", b"b"])
        refusing = cluster.broker_address(2)
        original = KafkaConnectionManager._build_transport

        async def handshake(self: object, node: object, timeout_at: object = None) -> object:
            if f"{node.host}:{node.port}" == refusing:  # type: ignore[attr-defined]
                try:
                    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
                    error.verify_message = "self-signed certificate in certificate chain"
                    raise error
                except ssl.SSLError as e:
                    raise KafkaConnectionError(f"Handshake failed: {e}")  # noqa: B904
            return await original(self, node, timeout_at=timeout_at)  # type: ignore[arg-type]

        monkeypatch.setattr(KafkaConnectionManager, "_build_transport", handshake)
        tp = TopicPartition("tls", 0)
        config = {
            "bootstrap_servers": cluster.broker_address(1),
            "auto_offset_reset": "earliest",
        }
        if driver == "threads":
            consumer = EpochConsumer(**config)
            try:
                consumer.assign([tp])
                with pytest.raises(SslAuthenticationError, match=refusing) as caught:
                    for _ in range(200):
                        assert not consumer.poll(timeout_ms=100)
            finally:
                consumer.close()
        else:

            async def run() -> pytest.ExceptionInfo[SslAuthenticationError]:
                aio = AIOEpochConsumer(**config)
                await aio.start()
                try:
                    aio.assign([tp])
                    with pytest.raises(SslAuthenticationError, match=refusing) as caught:
                        for _ in range(200):
                            assert not await aio.getmany(timeout_ms=100)
                    return caught
                finally:
                    await aio.stop()

            caught = asyncio.run(run())
        assert "self-signed certificate" in str(caught.value)


def test_the_selector_does_not_format_a_socket_it_does_not_hold() -> None:
    # kafka-python looks every socket up before registering it for each read it waits
    # for; the standard error message of that lookup formats the socket's repr.
    class Watched:
        def __init__(self, fd: int) -> None:
            self.fd = fd
            self.reprs = 0

        def fileno(self) -> int:
            return self.fd

        def __repr__(self) -> str:
            self.reprs += 1
            return "Watched"

    ours, theirs = socket.socketpair()
    sel = client._Selector()
    try:
        watched = Watched(ours.fileno())
        with pytest.raises(KeyError):
            sel.get_key(watched)
        assert watched.reprs == 0
        key = sel.register(watched, selectors.EVENT_READ, "data")
        assert sel.get_key(watched) is key
        assert sel.get_key(ours.fileno()) is key
    finally:
        sel.close()
        ours.close()
        theirs.close()
    with pytest.raises(RuntimeError, match="closed"):
        sel.get_key(watched)
