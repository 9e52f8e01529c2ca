"""The EmbeddedCluster under a fuzzed stream of client frames: random bytes, valid headers
with garbage bodies, huge or negative length prefixes, unknown API keys and versions. It
must never crash: every bad connection is closed on its own (no handler exception), and a
well-behaved client is served afterwards."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.handlers import load_all

from ..embedded.wire import Wire
from .conftest import fuzz

REGISTRY = load_all()
KNOWN = sorted(REGISTRY)


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=1) as c:
        c.create_topic("ok", partitions=1, replication_factor=1)
        c.append("ok", 0, [b"v-%d" % i for i in range(5)])
        yield c


def _header(draw: st.DrawFn) -> bytes:
    """A request header: a registered API at a supported version, or anything."""
    if draw(st.booleans()):
        key = draw(st.sampled_from(KNOWN))
        e = REGISTRY[key]
        version = draw(st.integers(e.min_version, e.max_version) | st.integers(-(2**15), 2**15 - 1))
    else:
        key = draw(st.integers(-(2**15), 2**15 - 1))
        version = draw(st.integers(-(2**15), 2**15 - 1))
    client = draw(st.binary(max_size=12))
    client_len = draw(st.sampled_from([len(client), len(client), -1, 2**15 - 1]))
    head = struct.pack(">hhih", key, version, draw(st.integers(-(2**31), 2**31 - 1)), client_len)
    tags = draw(st.sampled_from([b"", b"\x00", b"\x01\x00\x00", b"\xff\xff\xff\xff\x0f"]))
    return head + client + tags


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["raw", "header", "header", "size"]))
        if kind == "raw":
            out += draw(st.binary(max_size=64))
            continue
        if kind == "size":
            # A size alone: huge, negative, below a header, or larger than what follows.
            out += struct.pack(
                ">i", draw(st.sampled_from([2**31 - 1, 100 * 1024 * 1024, -1, -(2**31), 0, 3]))
            )
            out += draw(st.binary(max_size=16))
            continue
        payload = _header(draw) + draw(
            st.binary(max_size=80)
            | st.sampled_from([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00" * 40])
        )
        size = len(payload) + draw(st.sampled_from([0, 0, 0, -1, 1, 1000]))
        out += struct.pack(">i", size) + payload
    return out


def _send_and_drain(cluster: EmbeddedCluster, data: bytes) -> None:
    host, port = cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            s.sendall(data)
            # End of input: the broker answers what it can and closes; waiting for that
            # close (not a timer) is what makes each example deterministic.
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass


def _well_behaved(cluster: EmbeddedCluster) -> None:
    w = Wire(cluster.bootstrap_servers.split(",")[0])
    try:
        r = w.call(ApiVersionsRequest(version=0), ApiVersionsResponse)
        assert r.error_code == 0 and r.api_keys
    finally:
        w.close()


class _Crashes(logging.Handler):
    """Errors the cluster logs: a handler or connection that failed with an exception."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@fuzz(150)
@given(data=_frames())
def test_cluster_survives_fuzzed_frames(cluster: EmbeddedCluster, data: bytes) -> None:
    crashes = _Crashes()
    logger = logging.getLogger("epochguard.testing.embedded")
    logger.addHandler(crashes)
    try:
        _send_and_drain(cluster, data)
        _well_behaved(cluster)
    finally:
        logger.removeHandler(crashes)
    assert crashes.seen == []


def test_a_consumer_reads_after_the_fuzzing(cluster: EmbeddedCluster) -> None:
    for data in (
        b"\xff" * 64,
        struct.pack(">i", 2**31 - 1) + b"x",
        struct.pack(">ihhi", 8, 9999, 0, 1),
    ):
        _send_and_drain(cluster, data)
    with EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
    ) as c:
        c.assign([TopicPartition("ok", 0)])
        got: list[bytes] = []
        for _ in range(100):
            got += [r.value for recs in c.poll(timeout_ms=100).values() for r in recs]
            if len(got) >= 5:
                break
        assert got == [b"v-%d" % i for i in range(5)]


def test_client_gone_during_a_long_poll_closes_the_connection(cluster: EmbeddedCluster) -> None:
    """Found by the fuzzer: a Fetch v4 with max_wait_ms 16777216 (4.6 hours), then the
    client shuts its side. The broker must drop the request and close, not hold the
    connection for the whole wait (``_send_and_drain`` waits for that close)."""
    frame = (
        b"\x00\x00\x00\x1f\x00\x01\x00\x04\x00\x00\x00\x00\xff\xff\x00\x00\x00\x00\x01\x00"
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    )
    _send_and_drain(cluster, frame)
    _well_behaved(cluster)
