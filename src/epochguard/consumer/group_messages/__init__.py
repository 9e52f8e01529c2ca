"""KIP-848 message classes: ConsumerGroupHeartbeat (API 68) and ConsumerGroupDescribe (API 69).

kafka-python 3.0 has no classes for these APIs. Its protocol layer builds a message class
from a JSON definition in Kafka's message-spec format (compact strings and arrays, tagged
fields, nullable structs), so the definitions here are JSON files next to this module,
written from KIP-848 (and KIP-1082, KIP-1099) and checked against bytes that Kafka 4.3.1
brokers send and accept (``tests/consumer/test_group_messages.py``). Only
``consumer/wire.py`` and the embedded broker's handlers use these classes directly.
"""

from __future__ import annotations

import sys
from typing import Any

from kafka.protocol.api_message import ApiMessage

__all__ = [
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
]

_HERE: Any = sys.modules[__name__]


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass


class ConsumerGroupDescribeResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    pass
