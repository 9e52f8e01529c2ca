"""One-shot Kafka requests over a plain socket, for the cluster's control calls.

Control calls must reach one exact broker (a follower's ``ListOffsets`` with the debugging
replica id, the leader's ``DeleteRecords``), and must not trust cached metadata across broker
restarts, so they bypass kafka-python's client and use only its protocol classes.
"""

from __future__ import annotations

import itertools
import socket
import struct
from typing import Any

import kafka.errors

_correlation = itertools.count(1)


class WireError(ConnectionError):
    """The broker could not be reached or closed the connection mid-request."""


def error_name(code: int) -> str:
    return str(kafka.errors.for_code(code).__name__)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise WireError("connection closed by broker")
        chunks += chunk
    return bytes(chunks)


def call(
    address: tuple[str, int],
    request: Any,
    response_type: Any,
    version: int,
    timeout: float = 10.0,
) -> Any:
    """Send ``request`` at ``version`` to ``address`` and return the decoded response."""
    correlation_id = next(_correlation)
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id="epochguard-testing")
    payload = request.encode(header=True, framed=True)
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.sendall(payload)
            (size,) = struct.unpack(">i", _recv_exact(sock, 4))
            body = _recv_exact(sock, size)
    except OSError as exc:
        raise WireError(f"{address[0]}:{address[1]}: {exc}") from exc
    response = response_type.decode(body, version=version, header=True)
    got = response.header.correlation_id
    if got != correlation_id:
        raise WireError(f"correlation id {got} does not match request {correlation_id}")
    return response
