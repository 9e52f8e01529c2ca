"""Client metrics pushes (KIP-714) as a test cluster's receiver recorded them.

``ApacheKafkaCluster(telemetry_file=...)`` records the pushes its brokers accept in a file of
JSON lines (read with :func:`read_telemetry_pushes`); ``EmbeddedCluster.telemetry_pushes()``
returns them directly. Both give :class:`TelemetryPush` values.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import attrs

__all__ = ["TelemetryPush", "read_telemetry_pushes"]


@attrs.frozen
class TelemetryPush:
    """One client metrics push as the broker-side receiver recorded it."""

    client_instance_id: str
    terminating: bool
    content_type: str
    client_id: str
    #: The OTLP MetricsData bytes as the broker handed them to the receiver.
    data: bytes


def read_telemetry_pushes(path: Path) -> list[TelemetryPush]:
    """Every push recorded in ``path`` by ``ApacheKafkaCluster(telemetry_file=path)``."""
    if not path.exists():
        return []
    pushes = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        pushes.append(
            TelemetryPush(
                client_instance_id=raw["client_instance_id"],
                terminating=bool(raw["terminating"]),
                content_type=raw["content_type"],
                client_id=raw["client_id"],
                data=base64.b64decode(raw["data"]),
            )
        )
    return pushes
