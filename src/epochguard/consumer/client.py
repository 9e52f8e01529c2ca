"""The I/O layer: kafka-python's connection manager on its own IO thread.

What we reuse from kafka-python: ``NetworkSelector`` (event loop on a daemon IO thread),
``KafkaConnectionManager`` / ``KafkaConnection`` (bootstrap, ApiVersions negotiation per
broker, reconnect backoff, request timeouts, SSL and SASL), and the protocol classes.
What we do not reuse: its ``ClusterMetadata`` partition view (it lets older leader epochs
replace newer ones) — the consumer keeps its own metadata and only lends kafka-python the
broker addresses.

Where the connections are served: on kafka-python's IO thread (``EpochConsumer``), or
stepped by an asyncio event loop (``AIOEpochConsumer``, with ``io_thread=False``: see
:mod:`epochguard.consumer.aio`). Requests are sent from the consumer's strand; their futures
complete where the connections are served. Every epoch decision happens on the consumer's
strand (the engine's steps).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import random
import selectors
import ssl
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import kafka.errors as kerrors
from kafka.future import Future
from kafka.net.inet import create_connection
from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector
from kafka.net.transport import KafkaTCPTransport
from kafka.protocol.frame import KafkaBytes
from kafka.protocol.parser import KafkaProtocol

from epochguard._log import get_logger
from epochguard.consumer import wire
from epochguard.consumer.effects import Await, Step, run_blocking
from epochguard.consumer.errors import SslAuthenticationError
from epochguard.consumer.rebootstrap import MetadataRecovery, RebootstrapReason

__all__ = ["BrokerClient", "is_refusal"]

log = get_logger("epochguard.consumer")

#: Connection errors that retrying cannot fix: bootstrap stops at the first one and raises it
#: (as Java's client does), instead of retrying until the bootstrap timeout.
FATAL_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    kerrors.SaslAuthenticationFailedError,
    kerrors.UnsupportedSaslMechanismError,
    kerrors.IllegalSaslStateError,
    kerrors.AuthorizationError,
    SslAuthenticationError,
)

#: Config keys passed through to kafka-python's connection layer unchanged.
PASSTHROUGH_KEYS = (
    "bootstrap_servers",
    "client_id",
    "request_timeout_ms",
    "reconnect_backoff_ms",
    "reconnect_backoff_max_ms",
    "max_in_flight_requests_per_connection",
    "receive_message_max_bytes",
    "connections_max_idle_ms",
    "socket_connection_setup_timeout_ms",
    "socket_connection_setup_timeout_max_ms",
    "security_protocol",
    "ssl_context",
    "ssl_check_hostname",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_password",
    "ssl_crlfile",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_kerberos_name",
    "sasl_kerberos_service_name",
    "sasl_kerberos_domain_name",
    "sasl_oauth_token_provider",
    "proxy_url",
    "api_version",
    "metadata_max_age_ms",
    "client_dns_lookup",
)


#: Bytes per ``recv`` of a plaintext connection read through kafka-python's parser
#: (:data:`KAFKA_PYTHON_IO_ENV`). kafka-python reads 4 KiB at a time: 256 system calls (and
#: as many Python-level appends) per 1 MiB fetch response, measured at about 10% of 1
#: KB-record throughput on the IO thread, which shares the GIL with poll().
RECV_CHUNK = 256 * 1024
#: A frame of at least this size is read straight into its own buffer, to its last byte;
#: smaller frames go through the reusable scratch buffer (one read may then complete several
#: of them and start the next).
DIRECT_READ_MIN = 64 * 1024
#: Bytes of what follows the frame under way (or, between frames, in all) that a read into
#: the scratch buffer takes at most: several small frames at once, little of a large one's
#: start to copy out (a read of ``RECV_CHUNK`` there copied a quarter of every 1 MiB Fetch
#: answer twice).
HEAD_READ = 4 * 1024
_FETCH_API_KEY = 1
#: Fetch frames from this size on are read into buffers kept for reuse; at most this many
#: per connection (the frame being decoded and the next answer, which arrives meanwhile).
#: The C library's allocator (glibc's) maps every allocation of 32 MiB or more afresh from
#: the system and unmaps it when freed, faulting each page in again on every frame;
#: smaller ones come from its heap once one as large was freed, so pooling those would
#: only keep it from learning that (measured slower at 1 KB x 8 partitions).
_POOL_MIN = 32 * 1024 * 1024
_POOL_BUFFERS = 2
#: CPython's reference count (what tells a pooled buffer is free); elsewhere, no pool.
_getrefcount: Callable[[Any], int] | None = getattr(sys, "getrefcount", None)


def _zeroed_bytearray(n: int, huge_pages: bool = True) -> bytearray:
    return bytearray(n)


def _load_unfilled() -> Callable[[int, bool], bytearray]:
    try:
        from epochguard.consumer import _crecords
    except ImportError:  # no C extension: zeroed buffers
        return _zeroed_bytearray
    # An extension built from older sources (an in-place build not redone) lacks it.
    unfilled: Callable[[int, bool], bytearray] = getattr(
        _crecords, "unfilled_bytearray", _zeroed_bytearray
    )
    return unfilled


#: A new Fetch frame's buffer, ``(size, huge_pages)``: not zeroed first (the C extension's;
#: the socket fills all of it before anything reads it), else zeroed.
_new_frame_buffer = _load_unfilled()
#: Set (to anything but ``0``) to read responses through kafka-python's own parser (with
#: ``RECV_CHUNK`` reads), as before the lean path: for comparisons, and a way out should the
#: lean path ever misread a broker. Read when a connection is made.
KAFKA_PYTHON_IO_ENV = "EPOCHGUARD_KAFKA_PYTHON_IO"
#: Fetch v12+ answers carry response header v1 (correlation id, then tagged fields).
_FETCH_FLEXIBLE_VERSION = 12


class LoopReads(Protocol):
    """An event loop that watches sockets for reads (the asyncio driver's)."""

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None: ...

    def remove_reader(self, fd: int) -> None: ...


class _LeanParser(KafkaProtocol):  # type: ignore[misc]
    """kafka-python's protocol state machine with the receive side replaced.

    kafka-python stages every response in a ``KafkaBytes`` (a copy per received chunk),
    decodes it into objects and copies each records section out again; the profile put
    that at ~60% of the IO thread at 1 KB records. Here each frame gets one buffer that
    the socket fills directly (``recv_into``); Fetch frames are handed on undecoded as
    :class:`wire.FetchFrame` (records are memoryviews into the frame, decoded in place by
    ``records.decode_records``). Every other API still goes through kafka-python's decoder.
    """

    def _lean_init(self) -> None:
        # A read into it takes at most a small frame's rest and HEAD_READ bytes past it.
        self._scratch = bytearray(DIRECT_READ_MIN + HEAD_READ)
        self._scratch_view = memoryview(self._scratch)
        self._head = bytearray(4)
        self._head_filled = 0
        self._frame: memoryview | KafkaBytes | None = None
        self._frame_view: memoryview | None = None
        # Buffers of Fetch frames, reused once their frames are no longer referred to.
        self._pool: list[bytearray] = []
        self._filled = 0
        self._ready: list[tuple[int, Any]] = []
        #: Large new frame buffers on huge pages (see ``unfilled_bytearray``): off where a
        #: read's time is bounded (:attr:`_LargeReadTransport.read_budget_bytes`, the event
        #: loop's reads), as one huge page's fault can take longer than the whole read.
        self.huge_pages = True

    def receive_bytes(self, data: Any) -> list[tuple[int, Any]]:
        """Feed ``data`` (any bytes-like; empty from the lean transport, which fills the
        frames itself) and return the responses completed so far."""
        if data:
            self._feed(memoryview(data))
        ready, self._ready = self._ready, []
        return ready

    def recv_from(self, sock: Any, most: int | None = None) -> int:
        """One ``recv_into`` from ``sock`` (of at most ``most`` bytes) into the current
        frame or the scratch buffer; the byte count (0: the peer closed). Raises what the
        socket raises."""
        frame_view = self._frame_view
        if frame_view is not None and len(frame_view) >= DIRECT_READ_MIN:
            end = len(frame_view) if most is None else min(len(frame_view), self._filled + most)
            n: int = sock.recv_into(frame_view[self._filled : end])
            self._filled += n
            if self._filled == len(frame_view):
                self._frame_done()
            return n
        # A small frame's rest and the head of the next one at most: a large frame after
        # it is then read into its own buffer.
        take = HEAD_READ if frame_view is None else len(frame_view) - self._filled + HEAD_READ
        if most is not None and most < take:
            take = most
        n = sock.recv_into(self._scratch_view[:take])
        if n:
            self._feed(self._scratch_view[:n])
        return n

    def _feed(self, chunk: memoryview) -> None:
        i = 0
        n = len(chunk)
        while i < n:
            frame_view = self._frame_view
            if frame_view is None:
                take = min(4 - self._head_filled, n - i)
                self._head[self._head_filled : self._head_filled + take] = chunk[i : i + take]
                self._head_filled += take
                i += take
                if self._head_filled < 4:
                    return
                self._head_filled = 0
                self._start_frame(int.from_bytes(self._head, "big", signed=True))
                frame_view = self._frame_view
                assert frame_view is not None
            else:
                take = min(len(frame_view) - self._filled, n - i)
                frame_view[self._filled : self._filled + take] = chunk[i : i + take]
                self._filled += take
                i += take
            if self._filled == len(frame_view):
                self._frame_done()

    def _start_frame(self, size: int) -> None:
        self._validate_frame_size(size)
        header = self.in_flight_requests[0] if self.in_flight_requests else None
        if header is not None and header.request_api_key == _FETCH_API_KEY:
            view = self._fetch_buffer(size)
            self._frame = view
            self._frame_view = view
        else:
            frame = KafkaBytes(size)
            self._frame = frame
            self._frame_view = memoryview(frame)
        self._filled = 0

    def _fetch_buffer(self, size: int) -> memoryview:
        """A view of ``size`` bytes to read a Fetch frame into: a buffer of an earlier
        frame that nothing refers to any more, else a new one.

        A new buffer of a large frame costs more than reading into it (its pages faulted
        in: ~50 ms for 50 MiB, see :data:`_POOL_MIN`); a reused one is warm. A buffer is
        free once every view of it is gone: the frame's partitions are decoded (records
        copy their keys and values out, none refers to the frame) and no prefetch keeps
        its answer. Each view holds a reference to the buffer, so its reference count
        tells."""
        pool = self._pool
        if size < _POOL_MIN or _getrefcount is None:
            return memoryview(_new_frame_buffer(size, self.huge_pages))
        for i in range(len(pool)):
            buf = pool[i]
            # The pool's reference, ``buf`` and the call's own: nothing else holds it.
            if _getrefcount(buf) == 3:
                if len(buf) >= size:
                    return memoryview(buf)[:size]
                # Too small: a new one in its place (what the connection's frames need
                # now), this one freed.
                pool[i] = buf = _new_frame_buffer(size, self.huge_pages)
                return memoryview(buf)
        buf = _new_frame_buffer(size, self.huge_pages)
        if len(pool) < _POOL_BUFFERS:
            pool.append(buf)
        else:
            # Every pooled buffer is in use: this one takes the place of the smallest if it
            # is larger (that one is freed once its views are gone), so the pool holds what
            # the large frames need.
            smallest = min(range(len(pool)), key=lambda j: len(pool[j]))
            if len(pool[smallest]) < size:
                pool[smallest] = buf
        return memoryview(buf)

    def _frame_done(self) -> None:
        frame = self._frame
        self._frame = self._frame_view = None
        self._filled = 0
        assert frame is not None
        if isinstance(frame, KafkaBytes):
            frame.seek(0)
            self._ready.append(self._process_response(frame))
        else:
            self._ready.append(self._fetch_response(frame))

    def _fetch_response(self, frame: memoryview) -> tuple[int, wire.FetchFrame]:
        header = self.in_flight_requests.popleft()
        if len(frame) < 4:
            raise kerrors.KafkaProtocolError(f"Fetch response frame of {len(frame)} bytes")
        correlation_id = int.from_bytes(frame[:4], "big", signed=True)
        if correlation_id != header.correlation_id:
            raise kerrors.CorrelationIdError(
                f"Correlation IDs do not match: sent {header.correlation_id}, recv {correlation_id}"
            )
        view = frame
        pos = 4
        version = int(header.request_api_version)
        try:
            if version >= _FETCH_FLEXIBLE_VERSION:
                pos = wire.skip_tagged_fields(view, pos)
        except (IndexError, kerrors.KafkaProtocolError) as exc:
            raise wire.MalformedFetchResponse(f"Fetch response header: {exc}") from None
        return correlation_id, wire.FetchFrame(version, view[pos:])


class _LargeReadTransport(KafkaTCPTransport):  # type: ignore[misc]
    """kafka-python's plaintext transport, reading with ``recv_into`` straight into
    :class:`_LeanParser`'s frame buffers, and writing a request at once when nothing waits
    to be written before it."""

    #: Bytes one read of the socket takes at most (None: all it holds), set by the
    #: connection manager (:attr:`_ConnectionManager.read_budget_bytes`).
    read_budget_bytes: int | None = None
    #: Set by the connection manager (:attr:`_ConnectionManager.loop_reads`): an event loop
    #: watches the socket and calls :meth:`_read_ready`, instead of a task of the selector
    #: that waits on it.
    loop_reads: LoopReads | None = None
    #: The socket's descriptor while ``loop_reads`` watches it, else -1.
    _loop_fd = -1

    def write(self, data: Any) -> None:
        # kafka-python queues every write for a task that first waits for the socket to be
        # writable: three turns of its selector (and an epoll registration each way) per
        # request. As asyncio's transports do, the socket is tried first; only what it does
        # not take is queued (and a failing socket is left to that task, which closes the
        # connection with the error).
        sock = self._sock
        if (
            data
            and sock is not None
            and self._write
            and not self._closed
            and not self._writing
            and not self._write_buffer
        ):
            try:
                sent = sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                sent = 0  # the queued write meets the error again and reports it
            if sent:
                self.last_write = time.monotonic()
                sensors = self._protocol._sensors if self._protocol is not None else None
                if sensors:
                    sensors.bytes_sent.record(sent)
                if sent == len(data):
                    return
                data = memoryview(data)[sent:]
        super().write(data)

    async def _read_from_sock(self) -> None:
        protocol = self._protocol
        if (
            protocol is not None
            and type(protocol.parser) is KafkaProtocol
            and os.environ.get(KAFKA_PYTHON_IO_ENV, "") in ("", "0")
        ):
            # kafka-python builds its parser in connection_made(), just before this task
            # first runs, and no byte has been received yet: its send side (correlation
            # ids, requests in flight) is kept, its receive side replaced.
            protocol.parser.__class__ = _LeanParser
            protocol.parser._lean_init()
            protocol.parser.huge_pages = self.read_budget_bytes is None
        loop_reads = self.loop_reads
        if loop_reads is not None and self._loop_fd >= 0:
            return  # the loop watches the socket already
        if (
            loop_reads is not None
            and protocol is not None
            and isinstance(protocol.parser, _LeanParser)
            and self._read
            and not self._closed
            and self._sock is not None
        ):
            # kafka-python's wait registers the socket with its selector and removes it
            # again for every read, and each read is a turn of that selector inside a turn
            # of the loop; the loop watching the socket itself does neither.
            self._loop_fd = self._sock.fileno()
            loop_reads.add_reader(self._loop_fd, self._read_ready)
            return
        while self._read and not self._closed:
            await self._net.wait_read(self._sock)
            parser = self._protocol.parser
            if not isinstance(parser, _LeanParser):  # not ours: kafka-python's reading
                received, err = self._sock_recv()
                n = len(received)
            else:
                received = b""
                n, err = self._recv_frames(parser)
            if err is not None:
                self.abort(error=err)
                return
            self.last_read = time.monotonic()
            sensors = self._protocol._sensors
            if sensors:
                sensors.bytes_received.record(n)
            try:
                self._protocol.data_received(received)
            except kerrors.KafkaProtocolError as exc:
                self.abort(error=exc)
                return

    def _read_ready(self) -> None:
        """The loop found the socket readable (:attr:`loop_reads`): one read of the loop
        of :meth:`_read_from_sock`."""
        protocol = self._protocol
        if not self._read or self._closed or self._sock is None or protocol is None:
            self._stop_loop_reads()
            return
        n, err = self._recv_frames(protocol.parser)
        if err is not None:
            self.abort(error=err)
            return
        self.last_read = time.monotonic()
        sensors = protocol._sensors
        if sensors:
            sensors.bytes_received.record(n)
        try:
            protocol.data_received(b"")
        except kerrors.KafkaProtocolError as exc:
            self.abort(error=exc)
        except Exception as exc:
            # In the selector's task the connection would stop reading (its requests then
            # time out); the loop would call again for the same bytes. Closed instead: its
            # requests fail now and the next one reconnects.
            log.warning("connection_read_failed", error=plain_error(exc))
            self.abort(error=kerrors.KafkaConnectionError(exc))

    def _stop_loop_reads(self) -> None:
        fd, self._loop_fd = self._loop_fd, -1
        if fd >= 0 and self.loop_reads is not None:
            self.loop_reads.remove_reader(fd)

    def pause_reading(self) -> None:
        self._stop_loop_reads()
        super().pause_reading()

    def _close(self, error: Any = None) -> None:
        # Before the socket is closed: its descriptor may be reused at once.
        self._stop_loop_reads()
        super()._close(error)

    def _recv_frames(self, parser: _LeanParser) -> tuple[int, Exception | None]:
        budget = self.read_budget_bytes
        total = 0
        while True:
            if budget is not None and total >= budget:
                # The rest waits in the socket: its connection's next read (the selector
                # finds it readable at once) takes it after the loop's other callbacks.
                return total, None
            try:
                n = parser.recv_from(self._sock, None if budget is None else budget - total)
            except (BlockingIOError, InterruptedError):
                return total, None
            except kerrors.KafkaProtocolError as exc:
                return total, exc
            except Exception as exc:  # as kafka-python: the connection is closed with it
                # Answers completed before the error are handed over first (see _sock_recv);
                # the socket reports the error again on the next read.
                return total, None if total else kerrors.KafkaConnectionError(exc)
            if not n:
                if total:
                    return total, None
                return total, kerrors.KafkaConnectionError("socket disconnected")
            total += n

    def _sock_recv(self) -> tuple[bytes, Exception | None]:
        chunks: list[bytes] = []
        err: Exception | None = None
        while True:
            try:
                data = self._sock.recv(RECV_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except Exception as exc:  # as kafka-python: the connection is closed with it
                err = kerrors.KafkaConnectionError(exc)
                break
            if not data:
                err = kerrors.KafkaConnectionError("socket disconnected")
                break
            chunks.append(data)
        if chunks and err is not None:
            # The caller aborts on an error without looking at the data, and a broker that
            # answers and then closes (a failed SASL login: Kafka sends the error, then drops
            # the connection) would lose its answer. Hand the bytes over now; the closed socket
            # is readable again at once and reports the error on the next call.
            return b"".join(chunks), None
        return b"".join(chunks), err


#: Refused connection attempts in a row, to every bootstrap server, after which bootstrap
#: stops waiting: nothing listens there (a second attempt, after the reconnect backoff,
#: tells a broker that is just starting from an address that is wrong).
BOOTSTRAP_REFUSALS = 2

_REFUSED = f"{errno.ECONNREFUSED} {errno.errorcode[errno.ECONNREFUSED]}"


def _servers_text(servers: Any) -> str:
    """``bootstrap_servers`` (text or a list) as text."""
    return servers if isinstance(servers, str) else ",".join(str(s) for s in servers)


def plain_error(exc: BaseException | None) -> str | None:
    """An error for a log field or a message: its class and its text (kafka's errors
    print their class name themselves)."""
    if exc is None:
        return None
    text, name = str(exc), type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"


def is_refusal(exc: BaseException) -> bool:
    """The connection attempt was refused: nothing listens at that address."""
    # kafka-python reports a refused connect() as KafkaConnectionError("111 ECONNREFUSED").
    return isinstance(exc, kerrors.KafkaConnectionError) and exc.args == (_REFUSED,)


@attrs.frozen
class NodeLoad:
    """What :func:`least_loaded_node` knows of one learned broker."""

    node_id: Any
    #: A connection is up and not throttled.
    connected: bool
    #: Requests in flight on that connection.
    in_flight: int
    #: Reconnects to it are backing off (or its connection is throttled): not a candidate.
    backing_off: bool
    #: When its connection was last lost or a connection attempt to it last failed
    #: (``time.monotonic()``), since it last connected; ``None``: not since then.
    failed_at: float | None


def least_loaded_node(loads: list[NodeLoad]) -> Any:
    """The broker a request for any broker (metadata) goes to, or ``None``: a connected one
    with nothing in flight; else one without a connection that has not failed since it
    last connected (no long poll to queue behind); else the connected one with the fewest
    requests in flight; else the one whose failure is the oldest. A broker whose connection
    was just lost (it was stopped) is thus the last choice, not a random one: asking it
    costs a refused connection and the metadata backoff. ``loads`` in the order to break
    ties in (shuffled by the caller)."""
    fresh = busy = failed = None
    for load in loads:
        if load.backing_off:
            continue
        if load.connected:
            if load.in_flight == 0:
                return load.node_id
            if busy is None or load.in_flight < busy.in_flight:
                busy = load
        elif load.failed_at is None:
            if fresh is None:
                fresh = load
        elif failed is None or load.failed_at < (failed.failed_at or 0.0):
            failed = load
    for choice in (fresh, busy, failed):
        if choice is not None:
            return choice.node_id
    return None


class _ConnectionManager(KafkaConnectionManager):  # type: ignore[misc]
    """kafka-python's manager with larger plaintext reads, remembering the last error a
    connection attempt failed with and the refusals in a row per broker (kafka-python only
    logs them and retries)."""

    last_connection_error: BaseException | None = None
    #: Bytes one read of a plaintext connection takes at most before the connections'
    #: other work (and, under asyncio, the loop's other callbacks) runs; None: all the
    #: socket holds.
    read_budget_bytes: int | None = None
    #: Where plaintext connections' reads are watched from (an event loop), if not from
    #: the selector (:attr:`_LargeReadTransport.loop_reads`).
    loop_reads: LoopReads | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusals: dict[Any, int] = {}
        #: The last connection failure retrying cannot fix (a certificate that does not
        #: verify, a refused login), with any broker, until the consumer raises it.
        self.fatal_error: BaseException | None = None
        #: The error the last failed connection attempt to each broker ended with.
        self.connection_errors: dict[Any, BaseException] = {}
        #: Per broker: when its connection was last lost or an attempt failed, since it
        #: last connected (``least_loaded_node`` asks such a broker last).
        self.failed_at: dict[Any, float] = {}

    def get_connection(self, node_id: Any, *args: Any, **kwargs: Any) -> Any:
        known = node_id in self._conns
        # The consumer's own metadata (consumer/metadata.py) decides when to ask, and its
        # answers carry the brokers' addresses here too. kafka-python would add a request
        # for every broker's address each time a connection is lost: one more Metadata
        # request on every leader change.
        if len(args) < 3:  # not given in place: (timeout_ms, pop_on_close, refresh_...)
            kwargs.setdefault("refresh_metadata_on_err", False)
        # kafka-python's bootstrap gives its first connection the whole bootstrap timeout to
        # set up: a half-open address (accepts, never answers) then takes all of it, and the
        # other addresses are never tried. A set-up is bounded by its own timeout instead.
        if not args and kwargs.get("timeout_ms") is not None:
            kwargs["timeout_ms"] = min(
                kwargs["timeout_ms"], self.socket_connection_setup_timeout_ms(node_id)
            )
        conn = super().get_connection(node_id, *args, **kwargs)
        if not known:
            conn.init_future.add_callback(functools.partial(self._connected, node_id))
            conn.init_future.add_errback(functools.partial(self._connection_failed, node_id))
            conn.close_future.add_errback(functools.partial(self._connection_lost, node_id))
        return conn

    def send(self, request: Any, node_id: Any = None, request_timeout_ms: Any = None) -> Any:
        """kafka-python's, except that a request's timeout holds while it waits behind its
        connection's handshake too. kafka-python closes a connection whose request times out
        in flight, but a request made while the handshake (ApiVersions, SASL) is on its way
        waits in a buffer until the connection's set-up timeout
        (``socket_connection_setup_timeout_ms``): behind a handshake a half-open link
        swallowed, a heartbeat or a commit would wait that long, past a short session."""
        if node_id is None:
            node_id = self.least_loaded_node()
        future = super().send(request, node_id, request_timeout_ms)
        conn = self._conns.get(node_id)
        if conn is not None and conn.initializing and not future.is_done:
            if request_timeout_ms is None:
                request_timeout_ms = self.config["request_timeout_ms"]

            def overdue() -> None:
                self._handshake_overdue(node_id, conn, future)

            self._net.call_later(request_timeout_ms / 1000, overdue)
        return future

    def _handshake_overdue(self, node_id: Any, conn: Any, future: Any) -> None:
        if not future.is_done and conn.initializing and self._conns.get(node_id) is conn:
            log.info("connection_dropped", node=str(node_id), reason="handshake_unanswered")
            conn.close(kerrors.KafkaTimeoutError("no answer to the connection's handshake"))

    def _connected(self, node_id: Any, _value: Any) -> None:
        self.refusals.pop(node_id, None)
        self.failed_at.pop(node_id, None)

    def _connection_lost(self, node_id: Any, _exc: BaseException) -> None:
        self.failed_at[node_id] = time.monotonic()

    def least_loaded_node(self) -> Any:
        """kafka-python's choice, except that a broker that failed since it last connected
        comes last (see :func:`least_loaded_node`)."""
        loads = []
        for broker in self.cluster.brokers():
            node = broker.node_id
            conn = self._conns.get(node)
            paused = conn is not None and conn.paused
            loads.append(
                NodeLoad(
                    node,
                    connected=conn is not None and conn.connected and not paused,
                    in_flight=len(conn.in_flight_requests) if conn is not None else 0,
                    backing_off=paused or self.connection_delay(node) > 0,
                    failed_at=self.failed_at.get(node),
                )
            )
        random.shuffle(loads)
        return least_loaded_node(loads)

    def _connection_failed(self, node_id: Any, exc: BaseException) -> None:
        self.failed_at[node_id] = time.monotonic()
        self.last_connection_error = exc
        if isinstance(exc, FATAL_CONNECTION_ERRORS):
            log.error("connection_failed_for_good", node=str(node_id), error=str(exc))
            self.fatal_error = exc
        self.connection_errors[node_id] = exc
        if is_refusal(exc):
            self.refusals[node_id] = self.refusals.get(node_id, 0) + 1
        else:
            self.refusals.pop(node_id, None)

    def every_bootstrap_server_refuses(self) -> bool:
        brokers = self.cluster.bootstrap_brokers()
        return bool(brokers) and all(
            self.refusals.get(b.node_id, 0) >= BOOTSTRAP_REFUSALS for b in brokers
        )

    async def _build_transport(self, node: Any, timeout_at: float | None = None) -> Any:
        try:
            transport = await super()._build_transport(node, timeout_at=timeout_at)
        except kerrors.KafkaConnectionError as exc:
            # kafka-python wraps every handshake failure alike and retries it; a certificate
            # that does not verify will not verify on the next attempt either.
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise SslAuthenticationError(
                    f"TLS handshake with {node.host}:{node.port} failed: "
                    f"{cause.verify_message or cause}"
                ) from cause
            raise
        # Only the exact plaintext class: SSL transports read through their own wrapper.
        if type(transport) is KafkaTCPTransport:
            transport.__class__ = _LargeReadTransport
            transport.read_budget_bytes = self.read_budget_bytes
            transport.loop_reads = self.loop_reads
        return transport


class _Selector(selectors.DefaultSelector):
    """The platform's selector, whose lookup of a file object it does not hold raises a bare
    ``KeyError``. kafka-python registers a connection's socket afresh for every read it
    waits for, after such a lookup; the standard error message formats the socket's repr
    (two system calls and string formatting per wait, a tenth of a fetch's round trip)."""

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        if self.get_map() is None:
            raise RuntimeError("Selector is closed")
        impl: Any = self  # _BaseSelectorImpl's table, which typeshed leaves out
        try:
            key: selectors.SelectorKey = impl._fd_to_key[impl._fileobj_lookup(fileobj)]
        except KeyError:
            raise KeyError(fileobj) from None
        return key


def _coordinator_node_id(broker_id: int) -> str:
    """The node id of the coordinator's own connection to ``broker_id`` (kafka-python's
    ``ClusterMetadata.add_coordinator``)."""
    return f"coordinator-{broker_id}"


class BrokerClient:
    """Thread-safe request sending to broker ids; responses arrive as kafka ``Future``s."""

    def __init__(
        self,
        config: dict[str, Any],
        io_thread: bool = True,
        read_budget_bytes: int | None = None,
    ) -> None:
        cfg = {k: config[k] for k in PASSTHROUGH_KEYS if k in config and config[k] is not None}
        if isinstance(cfg.get("api_version"), str):
            cfg["api_version"] = tuple(int(p) for p in str(cfg["api_version"]).split("."))
        self._net: Any = NetworkSelector(selector=_Selector)
        self._manager: Any = _ConnectionManager(self._net, **cfg)
        self._manager.read_budget_bytes = read_budget_bytes
        self._closed = False
        self._lock = threading.Lock()
        self.io_thread = io_thread
        # Read and changed only where the connections are served (the IO thread, or the
        # asyncio loop): the rebootstrap decision, the broker addresses last applied.
        self._recovery = MetadataRecovery(
            str(config.get("metadata_recovery_strategy", "rebootstrap")),
            float(config.get("metadata_recovery_rebootstrap_trigger_ms", 300000)) / 1000,
        )
        self._addresses: dict[int, tuple[str, int]] = {}
        # Every broker's last address, also of brokers the last answer left out (down):
        # where probe() looks whether one is back.
        self._last_addresses: dict[int, tuple[str, int]] = {}
        # A recovery the "none" strategy declined, already logged (until the next answer).
        self._declined: RebootstrapReason | None = None
        #: Called (where the connections are served) after each rebootstrap: a driver
        #: wakes up to ask for metadata at once. Must be thread-safe and quick.
        self.rebootstrap_listeners: list[Callable[[], None]] = []
        #: Without the IO thread: called after each request is handed to the connections,
        #: so the driver can put it on the wire now instead of at its next wait (a fetch
        #: sent ahead would otherwise wait for the answer before it to be decoded).
        self.on_send: Callable[[], None] | None = None
        #: Without the IO thread: ``send_directly(send)`` calls ``send()`` (which puts a
        #: request on its connection) and returns its result when the calling thread may
        #: use the connections now (it serves them and is not inside a turn of their
        #: selector), else returns ``None`` and the request is handed over as usual.
        self.send_directly: Callable[[Callable[[], Any]], Any] | None = None
        if io_thread:
            self._net.start()

    @property
    def selector(self) -> Any:
        """kafka-python's ``NetworkSelector`` (a driver without the IO thread steps it)."""
        return self._net

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def manager(self) -> Any:
        return self._manager

    def bootstrap(self, timeout_ms: float) -> None:
        """Connect to a bootstrap server and learn the brokers (blocking, bounded)."""
        run_blocking(self.bootstrap_step(timeout_ms))

    def bootstrap_step(self, timeout_ms: float) -> Step[None]:
        """Connect to a bootstrap server and learn the brokers (bounded).

        Raises the connection error itself when retrying cannot help (authentication,
        authorization, an unsupported SASL mechanism, every bootstrap server refusing the
        connection), and otherwise a timeout that names the last error seen."""
        fut = self._manager.call_soon(self._manager.bootstrap_async, timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000 + 1.0
        manager = self._manager
        while not fut.is_done:
            remaining = deadline - time.monotonic()
            fatal = isinstance(manager.last_connection_error, FATAL_CONNECTION_ERRORS)
            if fatal or remaining <= 0 or manager.every_bootstrap_server_refuses():
                break
            # Its outcome is read below, with the last connection error.
            with contextlib.suppress(Exception):
                yield Await(fut, min(0.05, remaining))
        if fut.is_done and fut.exception is None:
            # The brokers bootstrap named, as the first metadata answer would name them.
            self._addresses = {
                int(b.node_id): (str(b.host), int(b.port)) for b in manager.cluster.brokers()
            }
            return
        error = manager.last_connection_error
        if isinstance(error, FATAL_CONNECTION_ERRORS):
            raise self._bootstrap_error(error)
        if not fut.is_done and manager.every_bootstrap_server_refuses():
            raise self._bootstrap_error(
                kerrors.KafkaConnectionError(
                    f"every bootstrap server refused the connection ({_REFUSED})"
                )
            )
        servers = self._manager.config["bootstrap_servers"]
        raise kerrors.KafkaTimeoutError(
            f"could not bootstrap from {servers} within {timeout_ms:.0f} ms"
            + (f"; last connection error: {error!r}" if error is not None else "")
        )

    def _bootstrap_error(self, error: BaseException) -> BaseException:
        servers = self._manager.config["bootstrap_servers"]
        log.error("bootstrap_failed", bootstrap_servers=servers, error=repr(error))
        # kafka's errors print their class name first; the new error prints it once.
        reason = error.args[0] if len(error.args) == 1 else str(error)
        message = f"cannot connect to {servers}: {reason}"
        try:
            return type(error)(message)
        except Exception:  # an error class with another signature: keep the original
            return error

    def send(self, node_id: int | str | None, request: Any, timeout_ms: float | None = None) -> Any:
        """Send ``request`` to ``node_id`` (``None``: least loaded broker); returns a Future."""
        if self._closed:
            return Future().failure(kerrors.KafkaConnectionError("client closed"))
        direct = self.send_directly
        if direct is not None and node_id is not None:
            manager = self._manager
            conn = manager._conns.get(node_id)
            # An established connection takes the request at once, from the thread that
            # serves it: what the task below would end up doing one turn of the selector
            # later (and a wake-up of the selector earlier), without the task, its two
            # futures and the coroutine. A connection being set up, a broker backing off or
            # with a refused login go the usual way.
            if (
                conn is not None
                and not conn.initializing
                and node_id not in manager._auth_failures
                and manager.connection_delay(node_id) <= 0
            ):
                future = direct(functools.partial(conn.send_request, request, timeout_ms))
                if future is not None:
                    return future

        async def _send() -> Any:
            node = self._any_node(time.monotonic()) if node_id is None else node_id
            # A refused login stays the error (kafka-python keeps it per broker), before
            # the backoff it caused.
            self._manager.maybe_raise_auth_failure(node)
            delay = self._manager.connection_delay(node)
            if delay > 0:
                # kafka-python's own error names only the broker id.
                error = self._manager.connection_errors.get(node)
                raise kerrors.NodeNotReadyError(
                    f"broker {node} is backing off its reconnects for {delay:.2f}s"
                    + (f" (last connection error: {plain_error(error)})" if error else "")
                )
            if self._manager.cluster.broker_metadata(node) is None:
                # A broker id we learned from a coordinator or leader before kafka-python's
                # broker list had it: refresh that list once, then try.
                try:
                    await self._manager.cluster.refresh_metadata()
                except kerrors.KafkaError as exc:
                    raise kerrors.NodeNotReadyError(f"broker {node} unknown: {exc}") from exc
            return await self._manager.send(request, node, request_timeout_ms=timeout_ms)

        return self._hand_over(_send)

    def _hand_over(self, task: Callable[[], Any]) -> Any:
        try:
            future = self._manager.call_soon(task)
        except RuntimeError as exc:  # the selector is closed
            return Future().failure(kerrors.KafkaConnectionError(str(exc)))
        if self.on_send is not None:
            self.on_send()
        return future

    @staticmethod
    def wait(future: Any, timeout_s: float) -> Any:
        """Block until ``future`` completes (bounded) and return its value or raise."""
        event = threading.Event()
        future.add_both(lambda _v: event.set())
        if not event.wait(max(0.0, timeout_s)):
            raise kerrors.KafkaTimeoutError(f"no answer within {timeout_s:.1f}s")
        if future.exception is not None:
            raise future.exception
        return future.value

    def request(self, node_id: int | str | None, request: Any, timeout_s: float) -> Any:
        return self.wait(self.send(node_id, request, timeout_s * 1000), timeout_s + 0.5)

    def coordinator_node(self, group_id: str, answer: Any) -> Any:
        """The node id of a connection of its own to the coordinator a FindCoordinator
        ``answer`` names, for ``group_id``'s requests. A broker answers one connection's
        requests in order, so on the fetch connection a commit or a heartbeat would wait
        behind the long-poll Fetch in flight (up to ``fetch_max_wait_ms``). Java and
        kafka-python keep the coordinator on a connection of its own for the same reason."""
        return self._manager.cluster.add_coordinator(answer, "group", group_id)

    def send_metadata(self, request: Any) -> Any:
        """Send a Metadata request to any broker (to the bootstrap servers after a
        rebootstrap); returns a Future of the answer.

        Where the answer arrives, its brokers are lent to kafka-python's connection manager
        and the rebootstrap decision learns of it, before the Future completes."""
        if self._closed:
            return Future().failure(kerrors.KafkaConnectionError("client closed"))

        async def _send() -> Any:
            self._recovery.on_metadata_sent(time.monotonic())
            node = self._any_node(time.monotonic())
            response = await self._manager.send(request, node)
            self._on_metadata_answer(node, response)
            return response

        return self._hand_over(_send)

    def probe(self, node_id: int) -> Any:
        """Connect to ``node_id`` at its last known address (also when the last Metadata
        answer left it out) and close the connection at once: no request, only whether
        something listens there. Returns a Future: ``True``, or the connection error
        (:func:`is_refusal` tells a refusal)."""
        address = self._last_addresses.get(node_id)
        if self._closed or address is None:
            return Future().failure(kerrors.NodeNotReadyError(f"broker {node_id} unknown"))
        manager = self._manager

        async def _probe() -> bool:
            setup_s = manager.config["socket_connection_setup_timeout_ms"] / 1000
            timeout_at = time.monotonic() + setup_s
            sock = await create_connection(
                self._net,
                address[0],
                address[1],
                manager.config["socket_options"],
                proxy_url=manager.config["proxy_url"],
                timeout_at=timeout_at,
            )
            sock.close()
            return True

        return self._hand_over(_probe)

    @property
    def rebootstraps(self) -> int:
        """Rebootstraps made so far."""
        return self._recovery.rebootstraps

    # ---------------------------------------------- where the connections are served

    def _any_node(self, now: float) -> Any:
        """The broker a request for any broker goes to: the least loaded learned broker, or a
        bootstrap server after a rebootstrap. Rebootstraps first when that is due."""
        recovery = self._recovery
        node = None if recovery.rebootstrapping else self._manager.least_loaded_node()
        reachable = node is not None or (
            recovery.rebootstrapping and self._ready_bootstrap_server() is not None
        )
        reason = recovery.decide(now, reachable=reachable)
        if reason is not None:
            self._rebootstrap(reason, now)
            node = None
        elif not recovery.enabled:
            self._log_declined(recovery.due(now, reachable=reachable))
        if node is None and recovery.rebootstrapping:
            node = self._ready_bootstrap_server()
        if node is None:
            raise kerrors.NodeNotReadyError(self._unreachable_message())
        return node

    def _ready_bootstrap_server(self) -> str | None:
        ready = [
            b.node_id
            for b in self._manager.cluster.bootstrap_brokers()
            if self._manager.connection_delay(b.node_id) <= 0
        ]
        return random.choice(ready) if ready else None

    def take_fatal_error(self) -> BaseException | None:
        """The connection failure retrying cannot fix seen since the last call, if any: a
        broker's certificate that does not verify or a refused login, on any broker (kafka-
        python only logs those and reconnects with backoff, for ever)."""
        manager: _ConnectionManager = self._manager
        error, manager.fatal_error = manager.fatal_error, None
        return error

    def _rebootstrap(self, reason: RebootstrapReason, now: float) -> None:
        """Forget the learned brokers for finding the cluster: requests for any broker go to
        the bootstrap servers until an answer names the brokers again. Connections to
        learned brokers are left alone (a live one keeps serving its fetch session and the
        group); those to the bootstrap servers are made anew, resolving their names again."""
        manager = self._manager
        self._recovery.on_rebootstrap(now)
        for server in manager.cluster.bootstrap_brokers():
            manager.close(server.node_id)
            manager.reset_backoff(server.node_id)
        log.info(
            "rebootstrap",
            reason=reason.value,
            bootstrap_servers=_servers_text(manager.config["bootstrap_servers"]),
            known_brokers=sorted(self._addresses),
            last_connection_error=plain_error(manager.last_connection_error),
        )
        for listener in list(self.rebootstrap_listeners):
            listener()

    def _log_declined(self, reason: RebootstrapReason | None) -> None:
        """Strategy "none": say once per episode why a rebootstrap would have been made."""
        if reason is None or reason is self._declined:
            return
        self._declined = reason
        log.warning(
            "rebootstrap_disabled",
            reason=reason.value,
            known_brokers=sorted(self._addresses),
            last_connection_error=plain_error(self._manager.last_connection_error),
        )

    def _unreachable_message(self) -> str:
        if self._recovery.rebootstrapping:
            servers = _servers_text(self._manager.config["bootstrap_servers"])
            where = f"no bootstrap server ({servers})"
        else:
            where = f"no known broker ({sorted(self._addresses)})"
        message = f"{where} is reachable: each is down or backing off its reconnects"
        error = self._manager.last_connection_error
        if error is not None:
            message += f"; last connection error: {plain_error(error)}"
        if not self._recovery.enabled:
            message += (
                "; metadata_recovery_strategy='none' does not ask the bootstrap servers again"
            )
        return message

    def _on_metadata_answer(self, node: Any, response: Any) -> None:
        required = wire.metadata_requires_rebootstrap(response)
        self._recovery.on_metadata_answer(time.monotonic(), rebootstrap_required=required)
        if required:
            log.info(
                "rebootstrap_requested",
                node=node,
                metadata_recovery_strategy=self._recovery.strategy,
            )
            return
        self._declined = None
        self._apply_brokers(response)

    def _apply_brokers(self, response: Any) -> None:
        """Lend the answer's broker addresses to kafka-python's connection manager. A broker
        now at another address is connected to there at once: its connection to the old
        address is closed and the reconnect backoff it earned there forgotten."""
        addresses = wire.broker_addresses(response)
        if not addresses:
            return
        manager = self._manager
        for node_id, address in addresses.items():
            before = self._addresses.get(node_id)
            if before is not None and before != address:
                log.info(
                    "broker_moved",
                    node=node_id,
                    old_address=f"{before[0]}:{before[1]}",
                    address=f"{address[0]}:{address[1]}",
                )
                manager.close(node_id)
                manager.reset_backoff(node_id)
                # The coordinator's own connection too, unless a FindCoordinator answer
                # already named the new address (asked of a bootstrap server before this
                # answer came): that connection is the group's, and closing it would make
                # the member join again.
                coordinator = _coordinator_node_id(node_id)
                known = manager.cluster.broker_metadata(coordinator)
                if known is not None and (known.host, known.port) != address:
                    manager.close(coordinator)
                    manager.reset_backoff(coordinator)
        self._addresses = addresses
        self._last_addresses.update(addresses)
        manager.cluster.update_metadata(response)

    # -------------------------------------------------------------------------------

    def broker_known(self, node_id: int) -> bool:
        return self._manager.cluster.broker_metadata(node_id) is not None

    def connection_failed(self, node_id: int) -> bool:
        """True while kafka-python is backing off reconnecting to ``node_id``."""
        return bool(self._manager.connection_delay(node_id) > 0)

    def close_step(self, timeout_s: float = 5.0) -> Step[None]:
        """Close every connection (a driver without the IO thread: its selector is closed
        by that driver after)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            fut = self._manager.call_soon(self._manager.close)
            yield Await(fut, max(0.1, min(2.0, timeout_s)))
        except Exception as exc:  # closing must not fail
            log.debug("client_close_error", error=repr(exc))

    def close(self, timeout_s: float = 5.0) -> None:
        """Close every connection and stop the IO thread; never blocks longer than
        ``timeout_s``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout_s
        try:
            fut = self._manager.call_soon(self._manager.close)
            self.wait(fut, max(0.1, min(2.0, deadline - time.monotonic())))
        except Exception as exc:  # closing must not fail
            log.debug("client_close_error", error=repr(exc))
        try:
            self._net.stop(timeout_ms=max(100, (deadline - time.monotonic()) * 1000))
        except Exception as exc:
            log.debug("client_stop_error", error=repr(exc))
        try:
            self._net.close()
        except Exception as exc:
            log.debug("client_selector_close_error", error=repr(exc))
