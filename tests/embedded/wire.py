"""A minimal blocking Kafka-protocol client for tests that inspect raw responses."""

from __future__ import annotations

import socket
import struct
from typing import Any

from epochguard.testing import EmbeddedCluster


class Wire:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation_id = 0

    @classmethod
    def to(cls, cluster: EmbeddedCluster, broker: int) -> Wire:
        return cls(cluster.broker_address(broker))

    def send(self, request: Any) -> None:
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id="wire-test")
        self.sock.sendall(request.encode(header=True, framed=True))

    def receive(self, response_class: Any, version: int) -> Any:
        size = struct.unpack(">i", self._read(4))[0]
        payload = self._read(size)
        return response_class[version].decode(payload, header=True)

    def call(self, request: Any, response_class: Any) -> Any:
        self.send(request)
        return self.receive(response_class, request.API_VERSION)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()
