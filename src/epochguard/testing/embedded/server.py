"""The network side: one asyncio loop in a background thread, one TCP listener per broker.

Frames are a 4-byte big-endian size and a request (header + body) decoded with kafka-python's
request classes; responses are encoded with its response classes. Requests on one connection
are handled one at a time and answered in order, as a Kafka broker does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import socket
import ssl
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsResponse

from epochguard._log import get_logger
from epochguard.testing import ports
from epochguard.testing.embedded.fetch_frame import (
    fetch_response_parts,
    join_stored_batches,
    write_parts,
)
from epochguard.testing.embedded.handlers import REGISTRY, RequestContext, load_all
from epochguard.testing.embedded.security import PLAINTEXT, SASL_SSL, SSL, Connection
from epochguard.testing.embedded.state import ClusterState

log = get_logger("epochguard.testing.embedded")

T = TypeVar("T")

API_VERSIONS = 18
UNSUPPORTED_VERSION = 35
MAX_FRAME_BYTES = 100 * 1024 * 1024
_HEADER = struct.Struct(">hhi")
SASL_HANDSHAKE = 17
FAILED_AUTHENTICATION_DELAY_S = 0.1
SASL_AUTHENTICATE = 36
# What a SASL connection may send before it has authenticated (as Kafka's authenticator).
_BEFORE_AUTHENTICATION = {API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE}


def _bound_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def bind_listener_socket(host: str, port: int, owned: set[int]) -> socket.socket:
    """A socket bound (not listening) to ``port``, or when it is 0 to a free port *below*
    the ephemeral range, reserved for the cluster (``owned``) until it closes.

    The socket stays bound while its broker is stopped (:func:`stop_listening`), so a
    restart listens on the same port: nothing else can bind it meanwhile, and an ephemeral
    port would not be handed to a client's connection either. Ports below the ephemeral
    range, reserved by lock files (:mod:`epochguard.testing.ports`), also keep the other
    clusters of this and other processes from choosing the same one."""
    if port:
        return _bound_socket(host, port)
    for candidate in ports.candidates():
        if not ports.reserve(candidate):
            continue
        try:
            sock = _bound_socket(host, candidate)
        except OSError as exc:
            ports.release([candidate])
            if exc.errno != errno.EADDRINUSE:
                raise
            continue
        owned.add(candidate)
        return sock
    # No room below the ephemeral range: a port the kernel picks, bound again by number, as
    # only a port bound by number stays bound when listening stops (Linux).
    with _bound_socket(host, 0) as probe:
        return _bound_socket(host, probe.getsockname()[1])


def _listening(sock: socket.socket) -> bool:
    option = getattr(socket, "SO_ACCEPTCONN", None)
    if option is None:
        return True
    return bool(sock.getsockopt(socket.SOL_SOCKET, option))


def stop_listening(sock: socket.socket) -> socket.socket:
    """End listening on ``sock`` and keep its port bound: connections are refused, as at a
    dead broker's address, and no other socket can bind the port (SO_REUSEADDR off: a
    bound socket without it conflicts with every other bind of its address). Returns the
    socket that holds the port now."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    with contextlib.suppress(OSError):
        # Linux ends a listen on shutdown(SHUT_RD), resetting the connections not yet
        # accepted; the socket stays bound to its port.
        sock.shutdown(socket.SHUT_RD)
    if not _listening(sock):
        return sock
    # Elsewhere: close it and bind the port again, not listening (best effort).
    host, port = sock.getsockname()[:2]
    sock.close()
    held = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        held.bind((host, port))
    except BaseException:
        held.close()
        raise
    return held


def _no_delay(writer: asyncio.StreamWriter) -> None:
    """TCP_NODELAY on an accepted connection, as Kafka sets it. asyncio sets it only on a
    socket made with ``proto=IPPROTO_TCP`` (the listener's is 0); without it, the last
    partial segment of an answer written while the client has not yet acknowledged the
    previous one waited for the client's delayed ACK (40 ms): a Metadata request sent
    right behind another one was answered 40 ms late."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def serve_on(callback: Any, sock: socket.socket, **kw: Any) -> asyncio.Server:
    """Listen on the bound ``sock`` (SO_REUSEADDR on again, so that the connections of the
    broker's previous run, in TIME_WAIT, do not stand in the way). The server gets a
    duplicate: closing the server leaves ``sock`` and its port to the caller."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return await asyncio.start_server(callback, sock=sock.dup(), **kw)


def api_versions_error_response(correlation_id: int) -> bytes:
    """KIP-511: a v0 response with UNSUPPORTED_VERSION naming only ApiVersions' own range, as
    Kafka's ApiVersionsRequest.getErrorResponse does (the client retries at a version in it
    and learns the rest from that answer; franz-go takes another path when given them all)."""
    entry = REGISTRY[API_VERSIONS]
    resp = ApiVersionsResponse(
        version=0,
        error_code=UNSUPPORTED_VERSION,
        api_keys=[
            ApiVersionsResponse.ApiVersion(
                version=0,
                api_key=API_VERSIONS,
                min_version=entry.min_version,
                max_version=entry.max_version,
            )
        ],
    )
    resp.with_header(correlation_id=correlation_id)
    data: bytes = resp.encode(header=True, framed=True)
    return data


def _null_field(value: Any, struct: Any, version: int) -> str | None:
    """The first field of a decoded request that is null where the schema does not allow
    it at ``version`` (its dotted name), or None. kafka-python decodes a -1 length as None
    whatever the schema says; Kafka's parser rejects it."""
    for field in struct.fields.values():
        if not field.for_version_q(version):
            continue
        item = getattr(value, field.name, None)
        if item is None:
            # Only strings and arrays have a null on the wire (kafka-python also gives None
            # for the zero uuid, which is not a null).
            nullable_kind = field.is_array() or field.type_str in ("string", "bytes")
            if nullable_kind and not field.nullable_for_version_q(version):
                return str(field.name)
            continue
        if field.is_struct():
            inner = _null_field(item, field, version)
        elif field.is_struct_array():
            inner = next(
                (n for n in (_null_field(x, field, version) for x in item) if n is not None),
                None,
            )
        else:
            continue
        if inner is not None:
            return f"{field.name}.{inner}"
    return None


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class EmbeddedServer:
    """Owns the event loop thread and the listeners of every broker of ``state``."""

    def __init__(self, state: ClusterState) -> None:
        load_all()
        self.state = state
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name="epochguard-embedded-cluster", daemon=True
        )
        self._servers: dict[int, asyncio.Server] = {}
        self._secured_servers: dict[int, list[asyncio.Server]] = {}
        self._conns: dict[int, set[asyncio.StreamWriter]] = {}
        self._tasks: dict[int, set[asyncio.Task[Any]]] = {}
        self._closed = False
        self._ports: set[int] = set()
        # (broker, listener) -> its socket, bound from the broker's first start to the
        # cluster's close, listening while the broker runs.
        self._sockets: dict[tuple[int, str], socket.socket] = {}
        state.loop = self.loop

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    # -- lifecycle (test thread) -----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        for broker_id in sorted(self.state.brokers):
            self.call(self.start_listener(broker_id))

    def close(self) -> None:
        if self._closed or not self._thread.is_alive():
            self._closed = True
            return
        self._closed = True
        for broker_id in list(self._servers):
            self.call(self.stop_listener(broker_id))
        self.call(self._cancel_tasks())
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        ports.release(self._ports)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    def call(self, work: Awaitable[T] | Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``work`` (a coroutine or a plain callable) on the loop and wait for it."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("EmbeddedServer.call from the loop thread would deadlock")

        async def runner() -> T:
            if callable(work):
                return work()
            return await work

        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(runner(), self.loop)
        return fut.result(timeout)

    async def _cancel_tasks(self, broker_id: int | None = None) -> None:
        tasks = [t for b, ts in self._tasks.items() if broker_id in (None, b) for t in ts]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    # -- listeners (loop thread) -----------------------------------------------------------

    async def start_listener(self, broker_id: int) -> None:
        broker = self.state.brokers[broker_id]

        def on_connect_to(
            listener: str,
        ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
            async def on_connect(
                reader: asyncio.StreamReader, writer: asyncio.StreamWriter
            ) -> None:
                task = asyncio.current_task()
                tasks = self._tasks.setdefault(broker_id, set())
                if task is not None:
                    tasks.add(task)
                try:
                    await self._serve(broker_id, reader, writer, Connection(listener))
                except asyncio.CancelledError:
                    # Stopping a broker cancels its connections; ending normally keeps
                    # asyncio's stream callback from logging the cancellation as an error.
                    writer.close()
                finally:
                    if task is not None:
                        tasks.discard(task)

            return on_connect

        server = await serve_on(
            on_connect_to(PLAINTEXT), self._socket(broker_id, PLAINTEXT, broker.port)
        )
        broker.port = server.sockets[0].getsockname()[1]
        self._servers[broker_id] = server
        self._conns.setdefault(broker_id, set())
        security = self.state.security
        secured = []
        try:
            for listener in security.listeners:
                tls = security.ssl_context if listener in (SSL, SASL_SSL) else None
                sock = self._socket(broker_id, listener, broker.listener_ports.get(listener, 0))
                extra = await serve_on(on_connect_to(listener), sock, ssl=tls)
                secured.append(extra)
                broker.listener_ports[listener] = extra.sockets[0].getsockname()[1]
        finally:
            self._secured_servers[broker_id] = secured
        log.info(
            "broker_listening",
            broker=broker_id,
            host=broker.host,
            port=broker.port,
            **{listener.lower(): port for listener, port in broker.listener_ports.items()},
        )

    def _socket(self, broker_id: int, listener: str, port: int) -> socket.socket:
        """The bound socket of the broker's ``listener`` at ``port`` (0: a free port): the
        one it held while stopped, or a new one when it moves (its old port is let go)."""
        key = (broker_id, listener)
        held = self._sockets.get(key)
        if held is not None:
            held_port: int = held.getsockname()[1]
            if port == held_port:
                return held
            del self._sockets[key]
            held.close()
            if held_port in self._ports:
                self._ports.discard(held_port)
                ports.release([held_port])
        sock = bind_listener_socket(self.state.brokers[broker_id].host, port, self._ports)
        self._sockets[key] = sock
        return sock

    async def stop_listener(self, broker_id: int) -> None:
        """Stop serving: the broker's listeners stop listening (their ports stay bound, so
        connecting is refused, as at a dead broker) and its connections close."""
        server = self._servers.pop(broker_id, None)
        if server is None:
            return
        server.close()
        for extra in self._secured_servers.pop(broker_id, []):
            extra.close()
        for (owner, listener), sock in list(self._sockets.items()):
            if owner == broker_id:
                self._sockets[owner, listener] = stop_listening(sock)
        for writer in list(self._conns.get(broker_id, ())):
            writer.close()
        self._conns[broker_id] = set()
        await self._cancel_tasks(broker_id)

    def drop_connections(self, broker_id: int) -> None:
        for writer in list(self._conns.get(broker_id, ())):
            writer.close()

    # -- connections -----------------------------------------------------------------------

    async def _serve(
        self,
        broker_id: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: Connection,
    ) -> None:
        if self._servers.get(broker_id) is None:
            writer.close()  # accepted just before the listener stopped
            return
        conns = self._conns.setdefault(broker_id, set())
        conns.add(writer)
        _no_delay(writer)
        # The next frame's size is read while a request is handled, so that a client that
        # goes away is noticed during a long poll (Fetch max_wait_ms can be hours): Kafka
        # closes such a connection and drops its request, and so does this server.
        next_head: asyncio.Task[bytes] | None = None
        dispatch: asyncio.Task[bool] | None = None
        try:
            while True:
                head = await (next_head or reader.readexactly(4))
                next_head = None
                size = int.from_bytes(head, "big", signed=True)
                if not _HEADER.size <= size <= MAX_FRAME_BYTES:
                    log.warning("malformed_frame", broker=broker_id, size=size)
                    return
                payload = await reader.readexactly(size)
                hold = self.state.faults.take_hold(broker_id, _HEADER.unpack_from(payload)[0])
                if hold > 0:
                    # A slow network: the request arrives late but before anything the client
                    # sent after it, its close included, so it is handled whatever the client
                    # did meanwhile.
                    await asyncio.sleep(hold)
                    if not await self._dispatch(broker_id, payload, writer, conn):
                        return
                    continue
                dispatch = asyncio.ensure_future(self._dispatch(broker_id, payload, writer, conn))
                # A dispatch cancelled below can still end with the reset that closed the
                # connection (its drain failed before the cancel arrived): retrieved, or
                # asyncio prints "Task exception was never retrieved".
                dispatch.add_done_callback(_retrieve)
                next_head = asyncio.ensure_future(reader.readexactly(4))
                await asyncio.wait({dispatch, next_head}, return_when=asyncio.FIRST_COMPLETED)
                if not dispatch.done() and next_head.exception() is not None:
                    return  # the client closed (or broke) the connection mid-request
                ok = await dispatch
                dispatch = None
                if not ok:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("connection_failed", broker=broker_id)
        finally:
            for task in (dispatch, next_head):
                if task is None:
                    continue
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    # Retrieved: a client that closed (the next header cut short) is no news,
                    # and asyncio would print "Task exception was never retrieved".
                    task.exception()
            conns.discard(writer)
            writer.close()

    async def _dispatch(
        self, broker_id: int, payload: bytes, writer: asyncio.StreamWriter, conn: Connection
    ) -> bool:
        """Handle one request; False closes the connection."""
        api_key, version, correlation_id = _HEADER.unpack_from(payload)
        if not conn.authenticated and api_key not in _BEFORE_AUTHENTICATION:
            log.warning(
                "request_before_authentication",
                broker=broker_id,
                listener=conn.listener,
                api_key=api_key,
            )
            return False
        entry = REGISTRY.get(api_key)
        if entry is None:
            # A Kafka broker cannot parse an unknown API and closes the connection.
            log.warning("unknown_api", broker=broker_id, api_key=api_key, api_version=version)
            return False
        low, high = self.state.api_versions(api_key, entry.min_version, entry.max_version)
        if not low <= version <= high:
            if api_key == API_VERSIONS:
                writer.write(api_versions_error_response(correlation_id))
                await writer.drain()
                return True
            log.warning(
                "unsupported_version", broker=broker_id, api_key=api_key, api_version=version
            )
            return False
        try:
            request = entry.request_class.decode(payload, version=version, header=True)
        except Exception as e:
            log.warning(
                "malformed_request",
                broker=broker_id,
                api_key=api_key,
                api_version=version,
                error=repr(e),
            )
            return False
        struct = getattr(request, "_struct", None)
        null = None if struct is None else _null_field(request, struct, version)
        if null is not None:
            log.warning(
                "malformed_request",
                broker=broker_id,
                api_key=api_key,
                api_version=version,
                error=f"{null} is null",
            )
            return False
        self.state.request_counts[api_key, version] += 1
        client_id = getattr(request.header, "client_id", None)
        self.state.request_counts_by_client[client_id, api_key] += 1
        traced = self.state.request_trace
        trace: dict[str, Any] | None = None
        if traced is not None:
            trace = {"at": time.time(), "client": client_id, "api": api_key, "broker": broker_id}
            max_wait = getattr(request, "max_wait_ms", None)
            if api_key == 1 and max_wait is not None:
                trace["max_wait_ms"] = max_wait
            traced.append(trace)
        self.state.request_bytes[api_key] += len(payload) + 4  # with the size prefix
        faults = self.state.faults
        if faults.take_disconnect(broker_id, api_key):
            return False
        header: Any = request.header
        ctx = RequestContext(
            self.state,
            broker_id,
            api_key,
            version,
            correlation_id,
            getattr(header, "client_id", None),
            conn,
        )
        try:
            response = await entry.handler(ctx, request)
        except Exception:
            log.exception("handler_failed", broker=broker_id, api_key=api_key, api_version=version)
            return False
        if response is None:
            return True
        if trace is not None:
            trace["answered"] = time.time()
            if isinstance(response, FetchResponse):
                trace["errors"] = _fetch_errors(response)
        delay = faults.take_delay(broker_id, api_key)
        if delay > 0:
            await asyncio.sleep(delay)
        if faults.take_drop(broker_id, api_key):
            return True
        if not self.state.brokers[broker_id].alive:
            return False
        parts = (
            fetch_response_parts(response, version, correlation_id)
            if isinstance(response, FetchResponse)
            else None
        )
        if parts is not None:
            await write_parts(writer, parts)
        else:
            if isinstance(response, FetchResponse):
                join_stored_batches(response)
            response.with_header(correlation_id=correlation_id)
            writer.write(response.encode(header=True, framed=True))
        await writer.drain()
        if conn.close_after_response:
            # Kafka delays closing a connection that failed authentication
            # (connection.failed.authentication.delay.ms, 100 ms): a client reads the error
            # response before it sees the connection end.
            await asyncio.sleep(FAILED_AUTHENTICATION_DELAY_S)
            return False
        return True


def _fetch_errors(response: Any) -> list[int]:
    """A Fetch answer's error codes, the top-level one first, then each partition's (-1 for
    a partition that names a diverging epoch): what a request trace shows of an answer."""
    codes = [int(response.error_code or 0)]
    for topic in response.responses:
        for p in topic.partitions:
            diverging = getattr(p, "diverging_epoch", None)
            codes.append(-1 if diverging is not None and diverging.epoch >= 0 else p.error_code)
    return codes
