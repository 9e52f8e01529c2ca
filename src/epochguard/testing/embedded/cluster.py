"""``EmbeddedCluster``: the control API, called from the test thread."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import attrs

from epochguard.testing.embedded.faults import Faults
from epochguard.testing.embedded.partition_log import EpochEntry, PartitionLog, batch_epoch
from epochguard.testing.embedded.raft import EPOCH_RULES, KAFKA, RAFT_MAX_VERSIONS, RaftElections
from epochguard.testing.embedded.records import Record, build_batch
from epochguard.testing.embedded.security import (
    PLAINTEXT,
    SASL_PLAINTEXT,
    SSL,
    SecuritySettings,
)
from epochguard.testing.embedded.server import EmbeddedServer
from epochguard.testing.embedded.state import (
    DEFAULT_ISR_JOIN_DELAY_S,
    RACK_AWARE_REPLICA_SELECTOR,
    ClusterState,
    EmbeddedClusterError,
    PartitionView,
    TopicState,
)
from epochguard.testing.embedded.transactions import MAX_TRANSACTION_TIMEOUT_MS
from epochguard.testing.telemetry import TelemetryPush
from epochguard.testing.tls import TlsMaterial

__all__ = ["RACK_AWARE_REPLICA_SELECTOR", "EmbeddedCluster", "EmbeddedClusterError", "ReplicaLog"]

T = TypeVar("T")


@attrs.frozen
class ReplicaLog:
    """A snapshot of one replica's log, for assertions."""

    broker: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    epoch_cache: tuple[EpochEntry, ...]
    batches: tuple[tuple[int, int, int], ...]  # (base offset, last offset, leader epoch)


class EmbeddedCluster:
    """A pure-Python multi-broker Kafka-protocol cluster with per-replica logs.

    Brokers listen on 127.0.0.1 (free ports); all state lives on one event loop in a
    background thread and every method here marshals onto it. Implements
    :class:`epochguard.testing.cluster.Cluster`.
    """

    def __init__(
        self,
        brokers: int = 3,
        *,
        first_broker_id: int = 1,
        auto_create_topics: bool = False,
        fetch_sessions: bool = True,
        eligible_leader_replicas: bool = True,
        port: int | None = None,
        sasl_users: Mapping[str, str] | None = None,
        tls: TlsMaterial | None = None,
        racks: Mapping[int, str] | None = None,
        replica_selector: str | None = None,
        transaction_max_timeout_ms: int = MAX_TRANSACTION_TIMEOUT_MS,
        epochs: str = KAFKA,
        isr_join_delay_s: float = DEFAULT_ISR_JOIN_DELAY_S,
    ) -> None:
        """``port``: the first broker listens there and broker ``i`` (ids start at 1) on
        ``port + i - 1`` (default: free ports chosen by the OS). A restarted broker keeps its port.

        ``sasl_users`` (name -> password): brokers also listen with SASL_PLAINTEXT, offering
        PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512. ``tls`` (see
        :func:`epochguard.testing.tls.make_tls_material`): brokers also listen with SSL, and
        with SASL_SSL when there are users too. ``bootstrap_servers`` stays PLAINTEXT; the
        others are :meth:`listener_bootstrap_servers`.

        ``racks`` (broker id -> ``broker.rack``) and ``replica_selector``
        (``replica.selector.class``; only :data:`RACK_AWARE_REPLICA_SELECTOR` is implemented)
        turn on KIP-392 follower fetching: leaders name a replica in the consumer's rack as
        ``preferred_read_replica`` and followers serve Fetch v11+ up to their high
        watermark.

        ``transaction_max_timeout_ms`` is the brokers' ``transaction.max.timeout.ms``: the
        largest transaction timeout a producer may ask for (docs/guides/testing.md,
        "Transactions").

        ``epochs``: whose leader-epoch rules the brokers follow. ``"kafka"`` (the default):
        Apache Kafka's controller, ISR and unclean elections. ``"raft"``: the Raft term is
        the leader epoch, as on Redpanda (:mod:`epochguard.testing.embedded.raft`): every
        election attempt takes a term, a majority elects and makes records visible,
        ``stop_broker`` is a power cut that loses unflushed acks=1 writes, and there are no
        unclean elections (docs/concepts.md, "Raft-term brokers").

        ``isr_join_delay_s``: a follower that has caught up with its leader (a restarted
        broker, a follower resuming replication, one that truncated after an election)
        joins the ISR that long afterwards, as in Kafka, where the leader adds it once a
        fetch shows it holds the whole log and the controller accepts the change
        (AlterPartition); until then it is not electable cleanly and the ISR leaves it out.
        0: at once, the moment it catches up (before ``start_broker`` returns). Raft-term
        clusters keep their own rule (a caught-up follower is in sync at once)."""
        if brokers < 1:
            raise ValueError("an EmbeddedCluster needs at least one broker")
        if epochs not in EPOCH_RULES:
            raise ValueError(f"epochs must be one of {', '.join(EPOCH_RULES)}, got {epochs!r}")
        if port is not None and not 1 <= port <= 65535 - (brokers - 1):
            raise ValueError(
                f"port must leave room for {brokers} consecutive ports in 1..65535, got {port}"
            )
        if (
            isinstance(isr_join_delay_s, bool)
            or not isinstance(isr_join_delay_s, int | float)
            or not 0 <= isr_join_delay_s < float("inf")
        ):
            raise ValueError(
                "isr_join_delay_s must be a finite number of seconds >= 0, "
                f"got {isr_join_delay_s!r}"
            )
        if tls is not None and not isinstance(tls, TlsMaterial):
            raise TypeError(f"tls must be a TlsMaterial, got {type(tls).__name__}")
        self._state = ClusterState(list(range(first_broker_id, first_broker_id + brokers)))
        for broker_id, rack in (racks or {}).items():
            if broker_id not in self._state.brokers:
                raise ValueError(
                    f"racks names broker {broker_id}; the brokers are {sorted(self._state.brokers)}"
                )
            if not isinstance(rack, str) or not rack:
                raise ValueError(f"broker {broker_id}: a rack is a non-empty string, got {rack!r}")
            self._state.brokers[broker_id].rack = rack
        if replica_selector not in (None, RACK_AWARE_REPLICA_SELECTOR):
            raise ValueError(
                f"replica_selector {replica_selector!r}: only None (leaders serve consumers) "
                f"and {RACK_AWARE_REPLICA_SELECTOR!r} are implemented"
            )
        self._state.replica_selector = replica_selector
        self._state.security = SecuritySettings.create(
            sasl_users, tls.server_context() if tls is not None else None
        )
        self._tls = tls
        if port is not None:
            for i, broker_id in enumerate(sorted(self._state.brokers)):
                self._state.brokers[broker_id].port = port + i
        self._state.auto_create_topics = auto_create_topics
        # Off: every Fetch is answered in full (session id 0), as a broker without KIP-227.
        self._state.fetch_sessions_enabled = fetch_sessions
        # Off: the pre-KIP-966 rules (the last ISR member stays in the ISR; the high watermark
        # advances below min.insync.replicas).
        self._state.elr_enabled = eligible_leader_replicas
        if transaction_max_timeout_ms < 1:
            raise ValueError(
                f"transaction_max_timeout_ms must be positive, got {transaction_max_timeout_ms}"
            )
        self._state.transaction_max_timeout_ms = transaction_max_timeout_ms
        self._state.isr_join_delay_s = float(isr_join_delay_s)
        self._epochs = epochs
        if epochs != KAFKA:
            self._state.raft = RaftElections(self._state)
            self._state.elr_enabled = False
            self._state.max_versions.update(RAFT_MAX_VERSIONS)
        self._server = EmbeddedServer(self._state)
        self._started = False
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        if self._closed:
            raise EmbeddedClusterError("the cluster was closed")
        if not self._started:
            try:
                self._server.start()
            except BaseException:
                # A taken port: stop the loop thread instead of leaving it behind.
                self._server.close()
                raise
            self._started = True
        return self

    def close(self) -> None:
        if self._started and not self._closed:
            self._server.close()
        self._closed = True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, fn: Callable[[], T]) -> T:
        if not self._started or self._closed:
            raise EmbeddedClusterError("the cluster is not running (call start())")
        return self._server.call(fn)

    # -- addresses -------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{b.host}:{b.port}" for b in self._call(self._state.alive_brokers))

    def listener_bootstrap_servers(self, listener: str) -> str:
        """The running brokers' addresses on ``listener`` (PLAINTEXT, SASL_PLAINTEXT, SSL or
        SASL_SSL)."""
        if listener == PLAINTEXT:
            return self.bootstrap_servers
        if listener not in self._state.security.listeners:
            offered = ", ".join((PLAINTEXT, *self._state.security.listeners))
            raise EmbeddedClusterError(
                f"this cluster has no {listener} listener (it has {offered}; "
                "pass sasl_users= and/or tls=)"
            )
        return ",".join(
            f"{b.host}:{b.listener_ports[listener]}" for b in self._call(self._state.alive_brokers)
        )

    @property
    def sasl_bootstrap_servers(self) -> str:
        """The SASL_PLAINTEXT listeners (PLAIN and SCRAM); needs ``sasl_users``."""
        return self.listener_bootstrap_servers(SASL_PLAINTEXT)

    @property
    def ssl_bootstrap_servers(self) -> str:
        """The SSL listeners; needs ``tls``."""
        return self.listener_bootstrap_servers(SSL)

    @property
    def tls(self) -> TlsMaterial | None:
        return self._tls

    @property
    def all_bootstrap_servers(self) -> str:
        """Every broker, running or not: for clients that must outlive the brokers now up."""
        return ",".join(self.broker_address(b) for b in self.broker_ids)

    @property
    def running_broker_ids(self) -> list[int]:
        return [b for b in self.broker_ids if self.is_running(b)]

    def broker_address(self, broker_id: int) -> str:
        b = self._state.broker(broker_id)
        return f"{b.host}:{b.port}"

    @property
    def broker_ids(self) -> list[int]:
        return sorted(self._state.brokers)

    @property
    def controller_available(self) -> bool:
        """Whether topics can be created or deleted now (Raft terms: a majority of the
        brokers runs; Kafka's rules: any broker)."""
        return self._call(lambda: self._state.controller_available)

    @property
    def epochs(self) -> str:
        """The leader-epoch rules the brokers follow: ``"kafka"`` or ``"raft"``."""
        return self._epochs

    @property
    def faults(self) -> Faults:
        """Fault injection rules (see :mod:`epochguard.testing.embedded.faults`)."""
        return self._state.faults

    @property
    def state(self) -> ClusterState:
        """The live state; read it only through :meth:`call` (it belongs to the loop)."""
        return self._state

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the cluster's loop thread and return its result."""
        return self._call(fn)

    def requests_seen(self) -> dict[tuple[int, int], int]:
        """How many requests of each (api_key, version) the brokers decoded."""
        return self._call(lambda: dict(self._state.request_counts))

    def requests_by_client(self) -> dict[tuple[str | None, int], int]:
        """How many requests of each API key each client (by its client id) sent."""
        return self._call(lambda: dict(self._state.request_counts_by_client))

    def trace_requests(self) -> None:
        """Record every request from now on, timestamped (see :meth:`request_trace`)."""

        def start() -> None:
            self._state.request_trace = []

        self._call(start)

    def request_trace(self) -> list[dict[str, Any]]:
        """The requests recorded since :meth:`trace_requests`, in arrival order: each a dict
        with ``at`` (``time.time()`` when decoded), ``client`` (client id), ``api`` (key),
        ``broker``, for Fetch ``max_wait_ms``, and once answered ``answered`` (when) and, for
        Fetch, ``errors`` (the answer's error code, then each partition's; -1: a diverging
        epoch)."""
        return self._call(lambda: [dict(e) for e in self._state.request_trace or []])

    def request_bytes(self) -> dict[int, int]:
        """Bytes of the requests the brokers decoded, per API key (size prefix included)."""
        return self._call(lambda: dict(self._state.request_bytes))

    # -- topics ----------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
    ) -> None:
        rf = (
            min(3, len(self._state.brokers)) if replication_factor is None else (replication_factor)
        )
        self._call(lambda: self._state.create_topic(name, partitions, rf, config))

    def delete_topic(self, name: str) -> None:
        self._call(lambda: self._state.delete_topic(name))

    def set_topic_config(self, name: str, changes: Mapping[str, str | None]) -> None:
        """Change topic configs (None resets one); enabling unclean election elects."""
        self._call(lambda: self._state.set_topic_config(name, changes))

    def set_client_metrics(
        self, name: str, metrics: list[str], interval_ms: int, match: list[str] | None = None
    ) -> None:
        """Create or replace the KIP-714 client-metrics subscription ``name``: clients whose
        id matches ``match`` (``["client_id=<regex>"]``; every client when empty) push the
        metrics whose names start with one of ``metrics`` every ``interval_ms``."""
        self._call(lambda: self._state.telemetry.set(name, metrics, interval_ms, match))

    def delete_client_metrics(self, name: str) -> None:
        self._call(lambda: self._state.telemetry.delete(name))

    def telemetry_pushes(self) -> list[TelemetryPush]:
        """Every client metrics push the brokers accepted, oldest first, decompressed."""
        return self._call(lambda: list(self._state.telemetry.pushes))

    def create_partitions(self, name: str, count: int) -> None:
        self._call(lambda: self._state.create_partitions(name, count))

    def topic_id(self, name: str) -> str:
        return str(self._call(lambda: self._topic(name).topic_id))

    def _topic(self, name: str) -> TopicState:
        t = self._state.topics.get(name)
        if t is None:
            raise EmbeddedClusterError(f"unknown topic {name!r}")
        return t

    # -- partition state -------------------------------------------------------------------

    def leader(self, topic: str, partition: int) -> int | None:
        return self._call(lambda: self._state.partition(topic, partition).leader)

    def leader_epoch(self, topic: str, partition: int) -> int:
        return self._call(lambda: self._state.partition(topic, partition).leader_epoch)

    def replicas(self, topic: str, partition: int) -> list[int]:
        return self._call(lambda: list(self._state.partition(topic, partition).replicas))

    def isr(self, topic: str, partition: int) -> list[int]:
        """The in-sync replicas in Kafka's order: as the partition was created, a follower
        that joins after the others."""
        return self._call(lambda: list(self._state.partition(topic, partition).isr))

    def elr(self, topic: str, partition: int) -> list[int]:
        """Eligible leader replicas (KIP-966): ISR members kept electable below min ISR."""
        return self._call(lambda: list(self._state.partition(topic, partition).elr))

    def log_end_offset(self, topic: str, partition: int, broker: int | None = None) -> int:
        return self._call(lambda: self._log(topic, partition, broker).log_end_offset)

    def log_start_offset(self, topic: str, partition: int, broker: int | None = None) -> int:
        return self._call(lambda: self._log(topic, partition, broker).log_start_offset)

    def high_watermark(self, topic: str, partition: int, broker: int | None = None) -> int:
        return self._call(lambda: self._log(topic, partition, broker).high_watermark)

    def last_stable_offset(self, topic: str, partition: int, broker: int | None = None) -> int:
        """The replica's last stable offset: what read_committed consumers may read up to."""
        return self._call(lambda: self._log(topic, partition, broker).last_stable_offset)

    def aborted_transactions(
        self, topic: str, partition: int, broker: int | None = None
    ) -> list[tuple[int, int, int]]:
        """The replica's aborted-transaction index: ``[(producer id, first offset, offset of
        the ABORT marker), ...]``."""
        return self._call(
            lambda: [
                (a.producer_id, a.first_offset, a.last_offset)
                for a in self._log(topic, partition, broker).aborted_transactions(0, 2**63 - 1)
            ]
        )

    def _log(self, topic: str, partition: int, broker: int | None) -> PartitionLog:
        p = self._state.partition(topic, partition)
        b = p.leader if broker is None else broker
        if b is None:
            raise EmbeddedClusterError(f"{topic}-{partition} has no leader; name a broker")
        if b not in p.logs:
            raise EmbeddedClusterError(f"broker {b} has no replica of {topic}-{partition}")
        return p.logs[b]

    def replica_log(self, topic: str, partition: int, broker: int) -> ReplicaLog:
        def snap() -> ReplicaLog:
            log = self._log(topic, partition, broker)
            batches = []
            for raw in log.batches_from(log.log_start_offset):
                base = int.from_bytes(raw[0:8], "big", signed=True)
                delta = int.from_bytes(raw[23:27], "big", signed=True)
                batches.append((base, base + delta, batch_epoch(raw)))
            return ReplicaLog(
                broker,
                log.log_start_offset,
                log.log_end_offset,
                log.high_watermark,
                tuple(log.epoch_cache),
                tuple(batches),
            )

        return self._call(snap)

    def epoch_cache(self, topic: str, partition: int, broker: int) -> list[tuple[int, int]]:
        """``[(epoch, start_offset), ...]`` of ``broker``'s replica."""
        return self._call(
            lambda: [
                (e.epoch, e.start_offset) for e in self._log(topic, partition, broker).epoch_cache
            ]
        )

    def read_records(
        self,
        topic: str,
        partition: int,
        broker: int | None = None,
    ) -> list[tuple[int, bytes | None, bytes | None]]:
        """``(offset, key, value)`` of every record in a replica (decoded in the test)."""
        from kafka.record.default_records import DefaultRecordBatch

        raw = self._call(lambda: list(self._log(topic, partition, broker).batches_from(0)))
        out: list[tuple[int, bytes | None, bytes | None]] = []
        for b in raw:
            for r in DefaultRecordBatch(b):
                out.append((r.offset, r.key, r.value))
        return out

    # -- brokers and elections -------------------------------------------------------------

    def stop_broker(
        self, broker_id: int, *, controlled: bool = False, grace_s: float = 0.2
    ) -> None:
        """Stop ``broker_id``: a kill by default (the controller elects new leaders from the
        ISR at once; connections to the broker are cut; its ports stay bound, not
        listening, so connecting is refused and a restart finds them free), or
        ``controlled``, as Kafka's controlled shutdown: every partition it leads first moves
        to another running ISR replica by a clean election, and the broker keeps serving for
        ``grace_s``, answering NOT_LEADER_OR_FOLLOWER (with the new leader) to what is still
        sent to it, before it stops. Raft terms: a kill is a power cut (unflushed records
        are lost); a controlled stop transfers leadership where a replica can win the vote
        and writes every replica of the broker to disk before it stops."""
        self._state.broker(broker_id)
        if controlled:
            self._call(lambda: self._move_leadership_off(broker_id))
            time.sleep(grace_s)
            if self._state.raft is not None:
                self._call(lambda: self._flush_broker(broker_id))

        def stop() -> None:
            self._state.stop_broker(broker_id)

        self._server.call(self._server.stop_listener(broker_id))
        self._call(stop)

    def _move_leadership_off(self, broker_id: int) -> None:
        state = self._state
        for topic in list(state.topics.values()):
            for index, p in sorted(topic.partitions.items()):
                if p.leader != broker_id:
                    continue
                # Kafka's controller: the first replica in assignment order that may lead.
                successor = next(
                    (
                        b
                        for b in p.replicas
                        if b != broker_id and b in p.isr and state.broker(b).alive
                    ),
                    None,
                )
                if successor is not None:
                    try:
                        state.elect_leader(topic.name, index, successor, False)
                    except EmbeddedClusterError:
                        continue  # Raft: it would lose the vote; leadership goes at the stop

    def _flush_broker(self, broker_id: int) -> None:
        for topic in self._state.topics.values():
            for p in topic.partitions.values():
                if broker_id in p.logs:
                    p.logs[broker_id].flush()

    def start_broker(self, broker_id: int, port: int | None = None) -> None:
        """Start a stopped broker (a running one is left as it is). It listens on the port
        it kept bound while stopped. ``port``: it listens there from now on (0: a free
        port) instead, as a broker restarted on a new address; its old port is let go."""
        b = self._state.broker(broker_id)
        if self._call(lambda: b.alive):
            return
        if port is not None:
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise ValueError(f"port must be 0 (a free port) or 1..65535, got {port!r}")
            self._call(lambda: setattr(b, "port", port))
        self._server.call(self._server.start_listener(broker_id))
        self._call(lambda: self._state.start_broker(broker_id))

    def is_running(self, broker_id: int) -> bool:
        return self._call(lambda: self._state.broker(broker_id).alive)

    def elect_leader(
        self,
        topic: str,
        partition: int,
        broker_id: int,
        unclean: bool = False,
        *,
        failed_attempts: int = 0,
    ) -> None:
        """Make ``broker_id`` the leader under a new epoch. Raft-term clusters: it must win a
        majority's votes (the current leader too: re-elected under a new term), and
        ``failed_attempts`` rounds fail first, each taking a term; ``unclean`` is refused."""
        self._call(
            lambda: self._state.elect_leader(topic, partition, broker_id, unclean, failed_attempts)
        )

    def flush(self, topic: str, partition: int | None = None) -> None:
        """Every running replica of the partition (``None``: of the topic) writes what it
        holds to disk, as brokers do periodically: in a Raft-term cluster those records
        then survive ``stop_broker``."""

        def do() -> None:
            t = self._topic(topic)
            parts = (
                t.partitions.values()
                if partition is None
                else [self._state.partition(topic, partition)]
            )
            for p in parts:
                self._state.flush(p)

        self._call(do)

    def flushed_offset(self, topic: str, partition: int, broker: int) -> int:
        """Records of ``broker``'s replica below this offset are on disk."""
        return self._call(lambda: self._log(topic, partition, broker).flushed_offset)

    def fetch_sessions(self, broker_id: int) -> dict[int, dict[tuple[str, int], tuple[int, int]]]:
        """The KIP-227 fetch sessions ``broker_id`` holds: ``{session id: {(topic, partition):
        (fetch offset, current leader epoch)}}``, topics by name also in sessions that
        address them by id."""

        def read() -> dict[int, dict[tuple[str, int], tuple[int, int]]]:
            b = self._state.broker(broker_id)
            out: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
            for sid, session in b.fetch_sessions.sessions().items():
                parts: dict[tuple[str, int], tuple[int, int]] = {}
                for (key, partition), t in session.partitions.items():
                    if isinstance(key, str):
                        name = key
                    else:
                        tv = b.view.topic_by_id(key)
                        name = tv.name if tv is not None else str(key)
                    parts[(name, partition)] = (t.fetch_offset, t.current_leader_epoch)
                out[sid] = parts
            return out

        self._state.broker(broker_id)
        return self._call(read)

    def drop_fetch_sessions(self, broker_id: int) -> None:
        """``broker_id`` forgets its fetch sessions, as a cache eviction does: the next
        incremental fetch of each is answered FETCH_SESSION_ID_NOT_FOUND."""
        self._state.broker(broker_id)
        self._call(lambda: self._state.broker(broker_id).fetch_sessions.clear())

    def set_metadata_delay(self, broker_id: int, seconds: float) -> None:
        """``broker_id`` learns controller changes ``seconds`` late (stale leader staging).

        Same as ``faults.set_metadata_delay``; checks that the broker exists.
        """
        self._state.broker(broker_id)
        self._state.faults.set_metadata_delay(broker_id, seconds)

    def broker_view(self, topic: str, partition: int, broker: int) -> PartitionView | None:
        """What ``broker`` currently believes about the partition (may lag the controller)."""
        return self._call(lambda: self._state.broker(broker).view.partition(topic, partition))

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every running broker has learnt the controller's latest metadata."""
        deadline = time.monotonic() + timeout

        def settled() -> bool:
            latest = self._state.metadata_version
            return all(b.view.version >= latest for b in self._state.alive_brokers())

        while not self._call(settled):
            if time.monotonic() > deadline:
                raise EmbeddedClusterError(f"brokers did not settle within {timeout} s")
            time.sleep(0.01)

    def consumer_fetch_bytes(self) -> dict[int, int]:
        """Record bytes each broker has served to consumers' Fetch requests so far (KIP-392:
        what a consumer in a rack pulled across racks)."""
        return self._call(lambda: dict(self._state.consumer_fetch_bytes))

    def pause_replication(self, broker_id: int) -> None:
        """``broker_id`` stops fetching as a follower: it falls out of every ISR."""
        self._call(lambda: self._state.pause_replication(broker_id))

    def resume_replication(self, broker_id: int) -> None:
        """The follower fetches again: truncates if needed, catches up, rejoins ISRs."""
        self._call(lambda: self._state.resume_replication(broker_id))

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        self._call(lambda: self._state.delete_records(topic, partition, before_offset))

    # -- producing directly ----------------------------------------------------------------

    def append(
        self,
        topic: str,
        partition: int,
        records: Iterable[Record],
        *,
        timestamp_ms: int | None = None,
        batch_size: int | None = None,
    ) -> int:
        """Append records on the current leader as a producer with acks=1 would.

        Returns the offset of the first record. ``batch_size`` splits into batches of that
        many records (default: one batch).
        """
        recs = list(records)
        size = batch_size or max(1, len(recs))
        batches = b"".join(
            build_batch(recs[i : i + size], timestamp_ms=timestamp_ms)
            for i in range(0, len(recs), size)
        )
        return self.append_raw(topic, partition, batches)

    def append_raw(self, topic: str, partition: int, batches: bytes) -> int:
        """Append already-encoded v2 batches on the leader; returns the first offset."""

        def do() -> int:
            p = self._state.partition(topic, partition)
            if p.leader is None:
                raise EmbeddedClusterError(f"{topic}-{partition} has no leader")
            base, _ = self._state.append(p, p.leader, batches, p.leader_epoch)
            return base

        return self._call(do)
