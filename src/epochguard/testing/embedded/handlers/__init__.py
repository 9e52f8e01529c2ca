"""Handler registry: api_key -> (handler, min_version, max_version).

The contract (also in ``testing/embedded/README.md``): a handler is
``async def handle(ctx: RequestContext, request) -> response | None``. ``request`` is the
decoded kafka-python request object; the handler returns a kafka-python response object of
``ctx.version`` (the server adds the header and frames it) or None for no response (Produce
acks=0). Handlers run on the loop thread and may mutate ``ctx.cluster`` freely; they may
await (long polls) but must not block. An exception closes that connection only.

ApiVersions advertises exactly what is registered here. Another module registers more APIs
with :func:`register` at import time (``epochguard.testing.embedded.groups`` is imported
when present).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from epochguard.testing.embedded.security import PLAINTEXT, Connection
from epochguard.testing.embedded.state import BrokerState, ClusterState


@attrs.frozen
class RequestContext:
    cluster: ClusterState
    broker_id: int
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    conn: Connection = attrs.field(factory=Connection)

    def port_of(self, broker: BrokerState) -> int:
        """``broker``'s port on the listener this request came in on, as Kafka advertises."""
        advertised = broker.advertised_ports.get(self.conn.listener)
        if advertised is not None:
            return advertised
        if self.conn.listener == PLAINTEXT:
            return broker.port
        return broker.listener_ports[self.conn.listener]

    def injected_error(self) -> int:
        """Error code a fault rule wants this request answered with (0: none)."""
        return self.cluster.faults.take_error(self.broker_id, self.api_key)


Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@attrs.frozen
class ApiEntry:
    handler: Handler
    min_version: int
    max_version: int
    request_class: Any
    response_class: Any


REGISTRY: dict[int, ApiEntry] = {}
FIND_COORDINATOR = 10


def register(
    api_key: int,
    handler: Handler,
    min_version: int,
    max_version: int,
    request_class: Any,
    response_class: Any,
) -> None:
    REGISTRY[api_key] = ApiEntry(handler, min_version, max_version, request_class, response_class)


def handler(
    request_class: Any, response_class: Any, min_version: int, max_version: int
) -> Callable[[Handler], Handler]:
    """Decorator registering ``async def handle(ctx, request)`` for the request's API key."""

    def wrap(fn: Handler) -> Handler:
        register(
            int(request_class.API_KEY), fn, min_version, max_version, request_class, response_class
        )
        return fn

    return wrap


def load_all() -> dict[int, ApiEntry]:
    """Import every handler module of this package (group APIs included).

    Modules are discovered, not listed, so a new API is one new file.
    """
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return REGISTRY
