"""The embedded brokers' side of KIP-714 client metrics: the client-metrics subscriptions an
operator set (``EmbeddedCluster.set_client_metrics``), the subscription each client instance
was handed, and every push accepted, decompressed, for tests to read
(``EmbeddedCluster.telemetry_pushes``). Served by the handler modules
``get_telemetry_subscriptions`` and ``push_telemetry``; one per cluster, in
``ClusterState.telemetry``.

As Kafka: a subscription's id follows from its content (metrics and interval), so changing
a subscription makes pushes under the old id fail with UNKNOWN_SUBSCRIPTION_ID; a client
that matches no subscription is told to push nothing and to ask again after the default
interval. Simplified: ``match`` knows ``client_id`` only; every push is accepted at any
pace (Kafka throttles pushes that come faster than the interval).
"""

from __future__ import annotations

import base64
import gzip
import re
import uuid
import zlib

import attrs

from epochguard.testing.telemetry import TelemetryPush

__all__ = [
    "DEFAULT_PUSH_INTERVAL_MS",
    "ClientMetrics",
    "ClientMetricsSubscription",
]

#: Kafka's interval for a client no subscription matches (and its ``interval.ms`` default).
DEFAULT_PUSH_INTERVAL_MS = 300_000
#: Kafka's ``telemetry.max.bytes`` default.
TELEMETRY_MAX_BYTES = 1024 * 1024
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1


@attrs.frozen
class ClientMetricsSubscription:
    metrics: tuple[str, ...]
    interval_ms: int
    #: ``client_id`` regular expression; ``None``: every client.
    client_id: str | None


@attrs.frozen
class Handed:
    """What a GetTelemetrySubscriptions answer tells a client."""

    subscription_id: int
    push_interval_ms: int
    requested_metrics: tuple[str, ...]


def kafka_uuid_text(value: uuid.UUID) -> str:
    """A UUID as Kafka's ``Uuid.toString()`` writes it (URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


class ClientMetrics:
    def __init__(self) -> None:
        self.subscriptions: dict[str, ClientMetricsSubscription] = {}
        self.pushes: list[TelemetryPush] = []

    def set(
        self, name: str, metrics: list[str], interval_ms: int, match: list[str] | None = None
    ) -> None:
        if not 100 <= interval_ms <= 3_600_000:  # Kafka's bounds for interval.ms
            raise ValueError(f"interval.ms must be 100..3600000, got {interval_ms}")
        client_id = None
        for rule in match or []:
            key, _, pattern = rule.partition("=")
            if key != "client_id":
                raise ValueError(f"the embedded cluster matches client_id only, got {rule!r}")
            re.compile(pattern)
            client_id = pattern
        self.subscriptions[name] = ClientMetricsSubscription(tuple(metrics), interval_ms, client_id)

    def delete(self, name: str) -> None:
        self.subscriptions.pop(name, None)

    def handed_to(self, client_id: str | None) -> Handed:
        matching = [
            s
            for _, s in sorted(self.subscriptions.items())
            if s.client_id is None or re.fullmatch(s.client_id, client_id or "")
        ]
        metrics: set[str] = set()
        for s in matching:
            metrics |= {"" if m == "*" else m for m in s.metrics}
        requested = ("",) if "" in metrics else tuple(sorted(metrics))
        interval = min((s.interval_ms for s in matching), default=DEFAULT_PUSH_INTERVAL_MS)
        digest = zlib.crc32(f"{interval}|{'|'.join(requested)}".encode())
        return Handed((digest & 0x7FFFFFFF) or 1, interval, requested)

    def accept(
        self,
        client_instance_id: uuid.UUID,
        client_id: str | None,
        terminating: bool,
        compression_type: int,
        data: bytes,
    ) -> None:
        if compression_type == COMPRESSION_GZIP:
            data = gzip.decompress(data)
        self.pushes.append(
            TelemetryPush(
                client_instance_id=kafka_uuid_text(client_instance_id),
                terminating=terminating,
                content_type="OTLP",
                client_id=client_id or "",
                data=data,
            )
        )
