"""KIP-714 message classes: GetTelemetrySubscriptions (API 71) and PushTelemetry (API 72).

kafka-python 3.0 names these API keys but has no classes for them; as for KIP-848's
(``epochguard.consumer.group_messages``), the definitions are JSON files in Kafka's
message-spec format next to this module, written from KIP-714. Only ``consumer/wire.py``
and the embedded broker's handlers use these classes directly.
"""

from __future__ import annotations

import sys
from typing import Any

from kafka.protocol.api_message import ApiMessage

__all__ = [
    "GetTelemetrySubscriptionsRequest",
    "GetTelemetrySubscriptionsResponse",
    "PushTelemetryRequest",
    "PushTelemetryResponse",
]

_HERE: Any = sys.modules[__name__]


class GetTelemetrySubscriptionsRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class GetTelemetrySubscriptionsResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class PushTelemetryRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class PushTelemetryResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass
