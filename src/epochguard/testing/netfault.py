"""A loopback fault proxy: the network between Kafka clients and brokers, made bad on purpose.

:class:`FaultProxy` listens on 127.0.0.1, one port per broker, and forwards each accepted
connection to that broker. Faults are set per broker, from any thread, and act on the bytes
in flight: added latency and jitter, a bandwidth cap, an answer cut after a chosen byte (the
connection then reset), a blackhole (new connections accepted and never answered), a reset
of every open connection, and a partition (nothing passes either way, on open and new
connections, until it heals; held bytes then flow, as TCP retransmits them).

Clients must reach every broker through the proxy, so Metadata answers have to name the
proxy's ports: :meth:`FaultProxy.attach_embedded` makes an EmbeddedCluster advertise them,
and ``ApacheKafkaCluster(fault_proxy=proxy)`` gives each broker a listener advertised at the
proxy's port (brokers replicate and the test helpers talk on their own listener, past the
proxy). Any client works: the proxy reads only the 4-byte frame sizes and the request
headers (to know which API each answer belongs to).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

from epochguard._log import get_logger

__all__ = ["FaultProxy", "FaultProxyError", "LinkFaults"]

log = get_logger("epochguard.testing.netfault")

T = TypeVar("T")

_CHUNK = 65536
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class FaultProxyError(ValueError):
    """A fault or a broker the proxy cannot apply (names the argument and the value)."""


@attrs.frozen
class LinkFaults:
    """The standing faults of one broker's link (both directions)."""

    latency_s: float = 0.0
    jitter_s: float = 0.0
    #: bytes per second each way on each connection; None: unlimited
    bandwidth_bps: int | None = None
    blackhole: bool = False
    partitioned: bool = False


@attrs.define
class _Cut:
    at_byte: int
    api_key: int | None
    count: int


class _FrameReader:
    """Follows Kafka frames in one direction of a connection, across chunk boundaries."""

    def __init__(self) -> None:
        self.head = b""  # the next frame's size and first header bytes, while incomplete
        self.left = 0  # bytes of the current frame's payload not yet seen

    def frames(self, data: bytes, head_len: int) -> list[tuple[int, int, bytes]]:
        """Positions in ``data`` where a frame's first ``head_len`` bytes (after the size)
        became known, with the frame's size and those bytes."""
        out = []
        pos = 0
        while pos < len(data):
            if self.left == 0 and len(self.head) < 4 + head_len:
                take = min(4 + head_len - len(self.head), len(data) - pos)
                self.head += data[pos : pos + take]
                pos += take
                if len(self.head) == 4 + head_len:
                    size = int.from_bytes(self.head[:4], "big")
                    out.append((pos, size, self.head[4:]))
                    self.left = max(0, size - head_len)
                    self.head = b""
                continue
            take = min(self.left, len(data) - pos)
            pos += take
            self.left -= take
        return out


class _Conn:
    """One client connection and its upstream connection."""

    def __init__(
        self, proxy: FaultProxy, broker: int, reader: asyncio.StreamReader, writer: Any
    ) -> None:
        self.proxy = proxy
        self.broker = broker
        self.client_reader = reader
        self.client_writer = writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.api_of: dict[int, int] = {}  # correlation id -> api key of requests in flight
        self.requests = _FrameReader()
        self.answers = _FrameReader()
        self.answer_stream = 0  # bytes of answers seen
        self.cut_at: int | None = None  # stream position at which to cut this connection
        self.tasks: list[asyncio.Task[Any]] = []
        self.closed = False

    # -- set-up ----------------------------------------------------------------------------

    async def serve(self) -> None:
        p = self.proxy
        to_upstream: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        if p.faults_of(self.broker).blackhole:
            p.stats["blackholed"] += 1
            await self._swallow()
            return
        self.tasks.append(asyncio.ensure_future(self._read(self.client_reader, to_upstream, True)))
        try:
            await p.healed(self.broker)
            host, port = p.upstream(self.broker)
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except (OSError, FaultProxyError) as exc:
            log.info("proxy_upstream_failed", broker=self.broker, error=repr(exc))
            self.abort()
            return
        self.upstream_writer = up_writer
        to_client: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        self.tasks += [
            asyncio.ensure_future(self._send(to_upstream, up_writer)),
            asyncio.ensure_future(self._read(up_reader, to_client, False)),
            asyncio.ensure_future(self._send(to_client, self.client_writer)),
        ]
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(self.tasks, return_when=asyncio.FIRST_EXCEPTION)
        self.abort()

    async def _swallow(self) -> None:
        """A blackholed connection: read and drop what the client sends, answer nothing."""
        try:
            while await self.client_reader.read(_CHUNK):
                pass
        except (ConnectionError, OSError):
            pass
        finally:
            self.abort()

    # -- the two directions ------------------------------------------------------------------

    async def _read(
        self,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        from_client: bool,
    ) -> None:
        clock = _Clock(self.proxy, self.broker)
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if from_client:
                    for _pos, _size, head in self.requests.frames(data, 8):
                        api_key, _version, correlation = struct.unpack(">hhi", head)
                        self.api_of[correlation] = api_key
                else:
                    data = self._answers(data)
                for piece in clock.pieces(data):
                    queue.put_nowait(piece)
                cut_done = self.cut_at is not None and self.answer_stream >= self.cut_at
                if not from_client and cut_done:
                    break
        except (ConnectionError, OSError):
            pass
        queue.put_nowait(None)

    def _answers(self, data: bytes) -> bytes:
        """Track which answer each byte belongs to; arm a cut rule when an answer starts and
        keep only the bytes before the cut."""
        start = self.answer_stream
        for pos, size, head in self.answers.frames(data, 4):
            correlation = int.from_bytes(head, "big", signed=True)
            api_key = self.api_of.pop(correlation, None)
            answer_start = start + pos - 8
            if self.cut_at is None:
                at = self.proxy.take_cut(self.broker, api_key)
                if at is not None:
                    # Past its end: the whole answer passes, the reset follows it.
                    self.cut_at = answer_start + min(at, 4 + size)
        self.answer_stream += len(data)
        if self.cut_at is not None and self.answer_stream >= self.cut_at:
            keep = max(0, self.cut_at - start)
            self.proxy.stats["cut"] += 1
            return data[:keep]
        return data

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes] | None], writer: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    if self.cut_at is not None:
                        self.reset()
                        return
                    with contextlib.suppress(OSError, RuntimeError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                release, data = item
                wait = release - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self.proxy.healed(self.broker)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return

    # -- ending ------------------------------------------------------------------------------

    def reset(self) -> None:
        """End both sides with RST (what a peer's crash or a middlebox's reset looks like)."""
        for w in (self.client_writer, self.upstream_writer):
            if w is None:
                continue
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.abort()

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in (self.client_writer, self.upstream_writer):
            if w is not None:
                w.transport.abort()
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()
        self.proxy.conns.discard(self)


class _Clock:
    """When each piece of one direction's bytes may leave: latency, jitter, bandwidth."""

    def __init__(self, proxy: FaultProxy, broker: int) -> None:
        self.proxy = proxy
        self.broker = broker
        self.loop = asyncio.get_running_loop()
        self.last_release = 0.0
        self.wire_free = 0.0  # when the capped link has sent everything before

    def pieces(self, data: bytes) -> list[tuple[float, bytes]]:
        f = self.proxy.faults_of(self.broker)
        now = self.loop.time()
        if f.bandwidth_bps is None:
            chunks = [data]
        else:  # small pieces, so that a capped stream trickles instead of arriving in bursts
            size = max(256, f.bandwidth_bps // 20)
            chunks = [data[i : i + size] for i in range(0, len(data), size)]
        out = []
        for chunk in chunks:
            sent = now
            if f.bandwidth_bps is not None:
                sent = max(self.wire_free, now) + len(chunk) / f.bandwidth_bps
                self.wire_free = sent
            delay = f.latency_s + (random.uniform(0, f.jitter_s) if f.jitter_s else 0.0)
            # Jitter never reorders bytes: TCP delivers in order.
            self.last_release = max(self.last_release, sent + delay)
            out.append((self.last_release, chunk))
        return out


class FaultProxy:
    """Loopback listeners in front of brokers, with faults set per broker.

    >>> with FaultProxy() as proxy:
    ...     proxy.attach_embedded(cluster)  # or ApacheKafkaCluster(fault_proxy=proxy)
    ...     proxy.set_latency(1, 0.2, jitter_s=0.05)
    ...     proxy.partition(2, seconds=3.0)

    Every fault method may be called from any thread. A fault with ``seconds`` ends by itself
    after that long; :meth:`heal` ends faults at once.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name="epochguard-fault-proxy", daemon=True
        )
        self._servers: dict[int, asyncio.Server] = {}
        self._ports: dict[int, int] = {}
        self._upstreams: dict[int, tuple[str, int]] = {}
        self._faults: dict[int, LinkFaults] = {}
        self._healed: dict[int, asyncio.Event] = {}
        self._cuts: dict[int, list[_Cut]] = {}
        self._timers: dict[tuple[int, str], asyncio.TimerHandle] = {}
        self.conns: set[_Conn] = set()
        self.stats: collections.Counter[str] = collections.Counter()
        #: The summed durations of the timed delaying faults set so far (latency,
        #: partitions, blackholes with ``seconds``), for deadlines that must count them.
        self.injected_delay_s = 0.0
        self._closed = False
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, work: Awaitable[T] | Callable[[], T], timeout: float = 30.0) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("FaultProxy call from its own loop thread would deadlock")

        async def runner() -> T:
            if callable(work):
                return work()
            return await work

        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(runner(), self.loop)
        return fut.result(timeout)

    # -- routes ------------------------------------------------------------------------------

    def listen(self, broker_id: int) -> tuple[str, int]:
        """Open ``broker_id``'s listener (its address is known before the broker starts)."""
        if broker_id in self._ports:
            return self.host, self._ports[broker_id]

        async def start() -> int:
            server = await asyncio.start_server(
                lambda r, w: self._accept(broker_id, r, w), self.host, 0
            )
            self._servers[broker_id] = server
            self._faults.setdefault(broker_id, LinkFaults())
            healed = self._healed.setdefault(broker_id, asyncio.Event())
            healed.set()
            port: int = server.sockets[0].getsockname()[1]
            return port

        self._ports[broker_id] = self._call(start())
        log.info("proxy_listening", broker=broker_id, port=self._ports[broker_id])
        return self.host, self._ports[broker_id]

    def route(self, broker_id: int, host: str, port: int) -> None:
        """Forward ``broker_id``'s connections to ``host:port`` (opens its listener too).
        Called again, it sends new connections to the new target (open ones stay): with an
        id no broker has, the listener plays a bootstrap name whose target changes."""
        self.listen(broker_id)
        self._upstreams[broker_id] = (host, port)

    def upstream(self, broker_id: int) -> tuple[str, int]:
        try:
            return self._upstreams[broker_id]
        except KeyError:
            raise FaultProxyError(f"no route for broker {broker_id}") from None

    def address(self, broker_id: int) -> tuple[str, int]:
        return self.host, self._ports[broker_id]

    @property
    def broker_ids(self) -> list[int]:
        return sorted(self._ports)

    @property
    def bootstrap_servers(self) -> str:
        """Every broker's proxy address, for a client's ``bootstrap_servers``."""
        return ",".join(f"{self.host}:{self._ports[b]}" for b in self.broker_ids)

    def attach_embedded(self, cluster: Any) -> None:
        """Put the proxy in front of every broker of an EmbeddedCluster, whose Metadata
        answers then name the proxy's ports (on its PLAINTEXT listener)."""
        from epochguard.testing.embedded.security import PLAINTEXT

        def advertise() -> list[tuple[int, str, int]]:
            out = []
            for b in cluster.state.brokers.values():
                out.append((b.node_id, b.host, b.port))
            return out

        for broker_id, host, port in cluster.call(advertise):
            self.route(broker_id, host, port)
        ports = dict(self._ports)

        def set_advertised() -> None:
            for b in cluster.state.brokers.values():
                b.advertised_ports[PLAINTEXT] = ports[b.node_id]

        cluster.call(set_advertised)

    # -- faults (any thread) -----------------------------------------------------------------

    def faults_of(self, broker_id: int) -> LinkFaults:
        return self._faults.get(broker_id, LinkFaults())

    def _check(self, broker_id: int) -> None:
        if broker_id not in self._ports:
            raise FaultProxyError(f"no broker {broker_id} behind this proxy ({self.broker_ids})")

    @staticmethod
    def _seconds(name: str, value: float | None) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise FaultProxyError(f"{name} must be seconds >= 0, got {value!r}")

    def _set(self, broker_id: int, name: str, seconds: float | None, **changes: Any) -> None:
        """Change ``broker_id``'s faults; with ``seconds``, undo the change after that long."""
        self._check(broker_id)
        self._seconds("seconds", seconds)

        def apply() -> None:
            f = attrs.evolve(self._faults[broker_id], **changes)
            self._faults[broker_id] = f
            event = self._healed[broker_id]
            if f.partitioned:
                event.clear()
            else:
                event.set()
            old = self._timers.pop((broker_id, name), None)
            if old is not None:
                old.cancel()
            if seconds is not None:
                undo = {k: getattr(LinkFaults(), k) for k in changes}
                self._timers[broker_id, name] = self.loop.call_later(
                    seconds, lambda: self._undo(broker_id, name, undo)
                )

        self._call(apply)
        log.info("proxy_fault", broker=broker_id, fault=name, seconds=seconds, **changes)

    def _undo(self, broker_id: int, name: str, undo: dict[str, Any]) -> None:
        self._timers.pop((broker_id, name), None)
        f = attrs.evolve(self._faults[broker_id], **undo)
        self._faults[broker_id] = f
        if not f.partitioned:
            self._healed[broker_id].set()
        log.info("proxy_fault_ended", broker=broker_id, fault=name)

    def set_latency(
        self,
        broker_id: int,
        latency_s: float,
        *,
        jitter_s: float = 0.0,
        seconds: float | None = None,
    ) -> None:
        """Delay every byte to and from ``broker_id`` by ``latency_s`` plus a uniform
        ``[0, jitter_s]`` (order kept)."""
        self._seconds("latency_s", latency_s)
        self._seconds("jitter_s", jitter_s)
        self._set(broker_id, "latency", seconds, latency_s=latency_s, jitter_s=jitter_s)
        if seconds is not None:
            self.injected_delay_s += seconds

    def set_bandwidth(
        self, broker_id: int, bytes_per_second: int | None, *, seconds: float | None = None
    ) -> None:
        """Cap each connection to ``broker_id`` at ``bytes_per_second`` each way (None: no cap)."""
        if bytes_per_second is not None and (
            isinstance(bytes_per_second, bool)
            or not isinstance(bytes_per_second, int)
            or bytes_per_second < 1
        ):
            raise FaultProxyError(f"bytes_per_second must be an int >= 1, got {bytes_per_second!r}")
        self._set(broker_id, "bandwidth", seconds, bandwidth_bps=bytes_per_second)

    def cut_answer(
        self, broker_id: int, at_byte: int, *, api_key: int | None = None, count: int = 1
    ) -> None:
        """Forward only the first ``at_byte`` bytes (size prefix included) of the next
        ``count`` answers of ``broker_id`` (to ``api_key`` requests, or any), then reset that
        connection (right after the answer when it is shorter)."""
        self._check(broker_id)
        if isinstance(at_byte, bool) or not isinstance(at_byte, int) or at_byte < 0:
            raise FaultProxyError(f"at_byte must be an int >= 0, got {at_byte!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise FaultProxyError(f"count must be an int >= 1, got {count!r}")
        cut = _Cut(at_byte, api_key, count)
        self._call(lambda: self._cuts.setdefault(broker_id, []).append(cut))
        log.info("proxy_fault", broker=broker_id, fault="cut", at_byte=at_byte, api_key=api_key)

    def take_cut(self, broker_id: int, api_key: int | None) -> int | None:
        """(Loop thread) the cut position for an answer to ``api_key`` starting now, if any."""
        for cut in self._cuts.get(broker_id, ()):
            if cut.api_key is None or cut.api_key == api_key:
                cut.count -= 1
                if cut.count == 0:
                    self._cuts[broker_id].remove(cut)
                return cut.at_byte
        return None

    def blackhole(self, broker_id: int, *, seconds: float | None = None) -> None:
        """New connections to ``broker_id`` are accepted and never answered (a half-open
        peer); open connections keep working."""
        self._set(broker_id, "blackhole", seconds, blackhole=True)
        if seconds is not None:
            self.injected_delay_s += seconds

    def partition(self, broker_id: int, *, seconds: float | None = None) -> None:
        """Nothing passes to or from ``broker_id``, on open and new connections, until it
        heals; the bytes held then flow (clients that gave up have closed theirs)."""
        self._set(broker_id, "partition", seconds, partitioned=True)
        if seconds is not None:
            self.injected_delay_s += seconds

    def reset(self, broker_id: int) -> int:
        """Reset (RST) every open connection to ``broker_id`` now; returns how many."""
        self._check(broker_id)

        def kill() -> int:
            mine = [c for c in self.conns if c.broker == broker_id]
            for c in mine:
                c.reset()
            return len(mine)

        n = self._call(kill)
        self.stats["reset"] += n
        log.info("proxy_fault", broker=broker_id, fault="reset", connections=n)
        return n

    def heal(self, broker_id: int | None = None) -> None:
        """End every fault of ``broker_id`` (every broker when None); pending cuts too."""
        ids = self.broker_ids if broker_id is None else [broker_id]

        def clear() -> None:
            for b in ids:
                self._faults[b] = LinkFaults()
                self._healed[b].set()
                self._cuts.pop(b, None)
                for key in [k for k in self._timers if k[0] == b]:
                    self._timers.pop(key).cancel()

        self._call(clear)

    def connections(self, broker_id: int | None = None) -> int:
        """Open client connections (to ``broker_id``, or to any broker)."""
        return self._call(
            lambda: sum(1 for c in self.conns if broker_id is None or c.broker == broker_id)
        )

    # -- loop side ---------------------------------------------------------------------------

    async def healed(self, broker_id: int) -> None:
        event = self._healed[broker_id]
        if not event.is_set():
            await event.wait()

    async def _accept(self, broker_id: int, reader: asyncio.StreamReader, writer: Any) -> None:
        conn = _Conn(self, broker_id, reader, writer)
        self.conns.add(conn)
        self.stats["accepted"] += 1
        try:
            await conn.serve()
        except asyncio.CancelledError:
            conn.abort()
        except Exception:
            log.exception("proxy_connection_failed", broker=broker_id)
            conn.abort()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            for server in self._servers.values():
                server.close()
            for c in list(self.conns):
                c.abort()
            for timer in self._timers.values():
                timer.cancel()
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for task in rest:
                task.cancel()
            if rest:
                await asyncio.wait(rest, timeout=5)

        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self._call(shutdown(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
