"""The plaintext transport reads large fetch responses in big chunks, correctly."""

from __future__ import annotations

import socket

import pytest
from kafka.errors import KafkaConnectionError
from kafka.structs import TopicPartition

from epochguard.consumer import client
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer, read


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
    assert [r.value for r in got] == values
    assert [r.offset for r in got] == list(range(len(values)))


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
        def recv_from(self, sock: socket.socket) -> int:
            return len(sock.recv(4096))

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
