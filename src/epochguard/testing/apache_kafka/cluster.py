"""Real Apache Kafka (KRaft) brokers as local ``java`` processes, behind the ``Cluster`` protocol.

Topology: one dedicated controller process (node id 3000, a static single-voter quorum) and
``brokers`` broker-only processes (ids ``0..n-1``). Stopping any broker never touches the
controller quorum, so unclean elections, restarts and fencing all keep working.

Per-replica log end offsets: a running broker answers ``ListOffsets(LATEST)`` sent with the
debugging replica id (-2) from its own local log, leader or follower, and returns its log end
offset rather than the high watermark. A stopped broker is read from disk: the last record
batch of its newest segment file names the last offset.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import attrs
from kafka.protocol.admin import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.consumer import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from epochguard._errors import ErrorCode
from epochguard._log import get_logger
from epochguard.testing import ports
from epochguard.testing.apache_kafka import class_archive, process
from epochguard.testing.apache_kafka.group_member import GroupProtocol, JavaGroupMember
from epochguard.testing.apache_kafka.jars import (
    KafkaJars,
    ensure_kafka_jars,
    ensure_probe_classes,
)
from epochguard.testing.apache_kafka.probe import JavaTruncationProbe
from epochguard.testing.apache_kafka.wire import WireError, call, error_name
from epochguard.testing.netfault import FaultProxy
from epochguard.testing.tls import TlsMaterial

log = get_logger("epochguard.testing.apache_kafka")

T = TypeVar("T")

CONTROLLER_ID = 3000
# Kafka's AclOperation / ResourceType / PatternType / AclPermissionType codes.
_ACL_OPERATIONS = {
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
}
_ACL_OPERATION_ANY = 1
_RESOURCE_TOPIC = 2
_RESOURCE_GROUP = 3
_PATTERN_LITERAL = 3
_PERMISSION_ALLOW = 3
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
DEBUGGING_REPLICA_ID = -2
CONSUMER_REPLICA_ID = -1
LATEST = -1
EARLIEST = -2

# Error codes the control calls treat as "not there yet, poll again".
_RETRIABLE = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_CONTROLLER,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
}

#: The broker-side KIP-714 receiver (TelemetryReceiverPlugin.java), compiled with the probes.
TELEMETRY_RECEIVER = "TelemetryReceiverPlugin"
#: Kafka's ConfigResource.Type.CLIENT_METRICS.
CLIENT_METRICS_RESOURCE = 16

JVM_OPTS = (
    "-Xms64m",
    "-Xmx256m",
    "-Xss512k",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Dlog4j2.shutdownHookEnabled=false",
)

LOG4J2_PROPERTIES = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.network.name = kafka.network.RequestChannel$
logger.network.level = WARN
logger.utils.name = org.apache.kafka.common.utils.AppInfoParser
logger.utils.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


class ClusterError(RuntimeError):
    """A control call failed; the message names the call and the broker's error."""


class ClusterTimeoutError(ClusterError):
    """The cluster did not reach the awaited state in time."""


class ElectionError(ClusterError):
    """The wanted replica cannot be made leader the way that was asked."""


@attrs.frozen
class PartitionState:
    """A partition as one broker's metadata cache sees it."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()


@attrs.frozen
class EpochEndOffset:
    """An OffsetForLeaderEpoch answer, error as the Kafka error name (``"NoError"``...)."""

    error: str
    leader_epoch: int
    end_offset: int


@attrs.frozen
class OffsetAndEpoch:
    """A ListOffsets answer."""

    offset: int
    leader_epoch: int


@attrs.frozen
class _Node:
    node_id: int
    role: class_archive.Role
    port: int
    directory: Path
    #: A second listener, SASL_PLAINTEXT with PLAIN and SCRAM, when the cluster has SASL users.
    sasl_port: int | None = None
    #: An SSL listener, when the cluster has TLS material.
    ssl_port: int | None = None
    #: A PLAINTEXT listener advertised at a fault proxy's address (``fault_proxy=``).
    proxied_port: int | None = None
    proxy_address: tuple[str, int] | None = None

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def config_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


#: The file ``kafka-storage format`` writes into a node's log directory besides
#: ``meta.properties``.
BOOTSTRAP_CHECKPOINT = "bootstrap.checkpoint"

#: The listener a fault proxy forwards to (``ApacheKafkaCluster(fault_proxy=...)``).
FAULT_PROXY_LISTENER = "FAULT_PROXY"


@contextlib.contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Serialise cluster start-ups between the processes of the machine.

    Starting a cluster is CPU-bound (a controller and a JVM per broker warming up at once);
    several at once on a small machine (parallel test workers) each take so long that they
    run into the start-up timeout, while one after the other costs hardly more in total."""
    with open(Path(tempfile.gettempdir()) / "epochguard-kafka-start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _scratch_dir() -> str | None:
    """Where a cluster keeps its data: /dev/shm (memory) where there is one, else the temp dir.

    A broker fsyncs a snapshot file per partition when it stops and loads every log when it
    starts; on a disk shared with other work a broker of 500 small partitions took 20 s to
    stop. The brokers' files behave the same in memory for every test here: a killed JVM
    loses nothing it wrote either way, and no test survives a machine crash."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _list_offsets_request(
    topic: str, partitions: list[int], timestamp: int, replica_id: int
) -> ListOffsetsRequest:
    """ListOffsets v7 for ``partitions`` of ``topic`` at ``timestamp``, as ``replica_id``."""
    return ListOffsetsRequest(
        replica_id=replica_id,
        isolation_level=0,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=topic,
                partitions=[
                    ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=p, current_leader_epoch=-1, timestamp=timestamp
                    )
                    for p in partitions
                ],
            )
        ],
    )


def _wait(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T:
    """Poll ``probe`` until it returns something other than None, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = probe()
            if result is not None:
                return result
        except (WireError, ClusterError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise ClusterTimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def _last_offset_on_disk(partition_dir: Path) -> int:
    """Log end offset of a stopped replica: one past the last batch of its newest segment."""
    segments = sorted(partition_dir.glob("*.log"))
    for segment in reversed(segments):
        base = int(segment.stem)
        data = segment.read_bytes()
        pos, end = 0, base
        # v2 batch: baseOffset int64, batchLength int32, then 9 bytes, lastOffsetDelta at 23.
        while pos + 27 <= len(data):
            base_offset = int.from_bytes(data[pos : pos + 8], "big", signed=True)
            length = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
            if length <= 0 or pos + 12 + length > len(data):
                break
            delta = int.from_bytes(data[pos + 23 : pos + 27], "big", signed=True)
            end = base_offset + delta + 1
            pos += 12 + length
        if end > base or len(segments) == 1:
            return end
    return 0


class ApacheKafkaCluster:
    """A KRaft Apache Kafka cluster of one controller and ``brokers`` brokers on 127.0.0.1.

    >>> with ApacheKafkaCluster(brokers=2) as cluster:
    ...     cluster.create_topic("t", replication_factor=2)
    """

    def __init__(
        self,
        brokers: int | None = None,
        *,
        num_brokers: int | None = None,
        jars: KafkaJars | None = None,
        broker_config: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
        startup_timeout: float = 90.0,
        stop_timeout: float = 30.0,
        sasl_users: Mapping[str, str] | None = None,
        tls: TlsMaterial | None = None,
        authorizer: bool = False,
        racks: Mapping[int, str] | None = None,
        replica_selector: str | None = None,
        fault_proxy: FaultProxy | None = None,
        telemetry_file: Path | None = None,
        class_archive_dump: Mapping[class_archive.Role, Path] | None = None,
    ) -> None:
        """``sasl_users`` (name -> password): brokers also listen with SASL_PLAINTEXT,
        offering PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (``sasl_bootstrap_servers``; the
        SCRAM credentials are written by ``kafka-storage format --add-scram``). ``tls``
        (:func:`epochguard.testing.tls.make_tls_material`): brokers also listen with SSL
        (``ssl_bootstrap_servers``). Brokers talk to each other and to the controller in
        PLAINTEXT. ``authorizer``: KRaft's StandardAuthorizer with no ACLs, so SASL users
        may do nothing until :meth:`grant` allows it; the PLAINTEXT listener's
        principal (``User:ANONYMOUS``, used by every control call here) is a super user.
        ``brokers`` defaults to 3; ``num_brokers`` is its deprecated name (the keyword is
        ``brokers`` as in ``EmbeddedCluster(brokers=...)``). ``racks`` (broker id ->
        ``broker.rack``) and ``replica_selector`` (``replica.selector.class``, e.g.
        :data:`~epochguard.testing.embedded.state.RACK_AWARE_REPLICA_SELECTOR`) set up
        KIP-392 follower fetching. ``fault_proxy``
        (:class:`~epochguard.testing.netfault.FaultProxy`): each broker also listens on a
        ``FAULT_PROXY`` listener advertised at the proxy's port for it, and the proxy
        forwards there; clients that bootstrap from ``fault_proxy.bootstrap_servers`` then
        reach every broker through the proxy, while replication and this class's control
        calls stay on the PLAINTEXT listener. ``telemetry_file``: every broker runs
        ``TelemetryReceiverPlugin`` (a KIP-714 ``ClientTelemetry`` metrics reporter, compiled
        with the Java probes) that appends each client metrics push it accepts to this file
        as a JSON line (see :func:`read_telemetry_pushes`); subscriptions are made with
        :meth:`set_client_metrics`. ``class_archive_dump`` (role -> path) makes the
        controller and the first broker write their class-data-sharing archives there when
        they exit (:mod:`~epochguard.testing.apache_kafka.class_archive` does it); without it
        nodes map the archives already made."""
        if num_brokers is not None:
            if brokers is not None:
                raise TypeError("pass brokers= or its deprecated alias num_brokers=, not both")
            warnings.warn(
                "ApacheKafkaCluster(num_brokers=...) is deprecated; use brokers=...",
                DeprecationWarning,
                stacklevel=2,
            )
            brokers = num_brokers
        if brokers is None:
            brokers = 3
        if brokers < 1:
            raise ValueError(f"an ApacheKafkaCluster needs at least one broker, got {brokers}")
        for user, password in (sasl_users or {}).items():
            # The JAAS line and --add-scram's [name=...,password=...] have no quoting.
            if not user or not user.isidentifier() or not password or set(password) & set('"[],='):
                raise ValueError(
                    f"SASL user {user!r}: names must be identifiers and "
                    'passwords non-empty without any of " [ ] , ='
                )
        if tls is not None and not isinstance(tls, TlsMaterial):
            raise TypeError(f"tls must be a TlsMaterial, got {type(tls).__name__}")
        if authorizer and not sasl_users:
            raise ValueError("authorizer=True needs sasl_users: every other client is a super user")
        for broker_id, rack in (racks or {}).items():
            if not 0 <= broker_id < brokers:
                raise ValueError(
                    f"racks names broker {broker_id}; the brokers are 0..{brokers - 1}"
                )
            if not isinstance(rack, str) or not rack or set(rack) & set("\n\r\\="):
                raise ValueError(
                    f"broker {broker_id}: a rack is a non-empty plain string, got {rack!r}"
                )
        if replica_selector is not None and (
            not replica_selector or set(replica_selector) & set("\n\r\\= ")
        ):
            raise ValueError(
                f"replica_selector must be a Java class name, got {replica_selector!r}"
            )
        self._racks = dict(racks or {})
        self._fault_proxy = fault_proxy
        self._replica_selector = replica_selector
        self._sasl_users = dict(sasl_users or {})
        self._tls = tls
        self._authorizer = authorizer
        self._num_brokers = brokers
        self._jars = jars
        self._extra_config = dict(broker_config or {})
        self._telemetry_file = telemetry_file
        self._class_archive_dump = dict(class_archive_dump or {})
        self._own_work_dir = work_dir is None
        self._work_dir = work_dir
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._cluster_id = ""
        self._nodes: dict[int, _Node] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._ports: list[int] = []  # reserved while the cluster lives (testing.ports)
        self.start_seconds: float | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            raise ClusterError("cluster not started")
        return self._work_dir

    @property
    def jars(self) -> KafkaJars:
        if self._jars is None:
            self._jars = ensure_kafka_jars()
        return self._jars

    @property
    def kafka_version(self) -> str:
        return self.jars.version

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def broker_ids(self) -> list[int]:
        return list(range(self._num_brokers))

    @property
    def running_broker_ids(self) -> list[int]:
        return [b for b in self.broker_ids if self._running(b)]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self._nodes[b].port}" for b in self.running_broker_ids)

    @property
    def all_bootstrap_servers(self) -> str:
        """Every broker, running or not: for clients that must outlive the brokers now up."""
        return ",".join(f"127.0.0.1:{self._nodes[b].port}" for b in self.broker_ids)

    @property
    def sasl_bootstrap_servers(self) -> str:
        """Every broker's SASL_PLAINTEXT (PLAIN, SCRAM) listener; needs ``sasl_users``."""
        if not self._sasl_users:
            raise ClusterError("this cluster has no SASL listener (pass sasl_users=...)")
        return ",".join(f"127.0.0.1:{self._nodes[b].sasl_port}" for b in self.broker_ids)

    @property
    def ssl_bootstrap_servers(self) -> str:
        """Every broker's SSL listener; needs ``tls``."""
        if self._tls is None:
            raise ClusterError("this cluster has no SSL listener (pass tls=...)")
        return ",".join(f"127.0.0.1:{self._nodes[b].ssl_port}" for b in self.broker_ids)

    @property
    def tls(self) -> TlsMaterial | None:
        return self._tls

    def listener_bootstrap_servers(self, listener: str) -> str:
        """Every broker's address on ``listener``: PLAINTEXT, SASL_PLAINTEXT or SSL."""
        by_name = {
            "PLAINTEXT": lambda: self.all_bootstrap_servers,
            "SASL_PLAINTEXT": lambda: self.sasl_bootstrap_servers,
            "SSL": lambda: self.ssl_bootstrap_servers,
        }
        if listener not in by_name:
            raise ClusterError(f"unknown listener {listener!r}; one of {', '.join(by_name)}")
        return by_name[listener]()

    def broker_address(self, broker_id: int) -> str:
        host, port = self._nodes[broker_id].address
        return f"{host}:{port}"

    def is_running(self, broker_id: int) -> bool:
        return self._running(broker_id)

    def _running(self, node_id: int) -> bool:
        proc = self._procs.get(node_id)
        return proc is not None and proc.poll() is None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> Self:
        started = time.monotonic()
        jars = self.jars
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="epochguard-kafka-", dir=_scratch_dir()))
        self._cluster_id = self._random_cluster_id()
        sasl = bool(self._sasl_users)
        n = self._num_brokers
        ports.release(self._ports)
        self._ports = ports.reserve_free(n * 4 + 1)
        free = self._ports
        controller = _Node(CONTROLLER_ID, "controller", free[0], self.work_dir / "controller")
        self._nodes = {CONTROLLER_ID: controller}
        for i, broker_id in enumerate(self.broker_ids):
            directory = self.work_dir / f"broker-{broker_id}"
            sasl_port = free[1 + n + i] if sasl else None
            ssl_port = free[1 + 2 * n + i] if self._tls is not None else None
            proxied_port = proxy_address = None
            if self._fault_proxy is not None:
                proxied_port = free[1 + 3 * n + i]
                self._fault_proxy.route(broker_id, "127.0.0.1", proxied_port)
                proxy_address = self._fault_proxy.address(broker_id)
            self._nodes[broker_id] = _Node(
                broker_id,
                "broker",
                free[1 + i],
                directory,
                sasl_port,
                ssl_port,
                proxied_port,
                proxy_address,
            )
        (self.work_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        for node in self._nodes.values():
            node.directory.mkdir(parents=True, exist_ok=True)
            node.config_path.write_text(self._properties(node))
        try:
            with _one_start_at_a_time():
                started = time.monotonic()
                self._format_storage()
                self._launch(controller)
                for broker_id in self.broker_ids:
                    self._launch(self._nodes[broker_id])
                for broker_id in self.broker_ids:
                    self._await_registered(broker_id)
                # Create __consumer_offsets while every broker is up, so a test that stops a
                # broker before it first uses a group still finds a coordinator.
                self._warm_up_group_coordinator()
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - started
        log.info(
            "kafka_cluster_started",
            version=jars.version,
            brokers=self._num_brokers,
            seconds=round(self.start_seconds, 2),
            work_dir=str(self.work_dir),
        )
        return self

    def close(self) -> None:
        """Stop brokers (in parallel), then the controller; remove the work dir if we made it."""
        running = [b for b in self.broker_ids if self._running(b)]
        for broker_id in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._procs[broker_id].pid, 15)
        for broker_id in running:
            process.stop(self._procs.pop(broker_id), self._stop_timeout)
        if CONTROLLER_ID in self._procs:
            process.stop(self._procs.pop(CONTROLLER_ID), self._stop_timeout)
        self._procs.clear()
        ports.release(self._ports)
        self._ports = []
        if self._own_work_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def copy_logs(self, destination: Path) -> None:
        """Copy every node's config and logs (not its data) to ``destination``."""
        if self._work_dir is None:
            return
        for node in self._nodes.values():
            target = destination / node.directory.name
            target.mkdir(parents=True, exist_ok=True)
            for name in ("server.log", "stdout.log", "server.properties"):
                source = node.directory / name
                if source.exists():
                    shutil.copy2(source, target / name)
        probes = self._work_dir / "probes"
        if probes.is_dir():
            shutil.copytree(probes, destination / "probes", dirs_exist_ok=True)

    @staticmethod
    def _random_cluster_id() -> str:
        # Like Kafka's Uuid.randomUuid: an id starting with "-" would read as an option flag.
        while True:
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            if not cluster_id.startswith("-"):
                return cluster_id

    def _properties(self, node: _Node) -> str:
        voters = f"{CONTROLLER_ID}@127.0.0.1:{self._nodes[CONTROLLER_ID].port}"
        rf = min(3, self._num_brokers)
        common = {
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(node.data_dir),
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
        }
        if node.role == "controller":
            props = {
                **common,
                "process.roles": "controller",
                "listeners": f"CONTROLLER://127.0.0.1:{node.port}",
                # Fence a kill -9'ed broker quickly, and let a stopped broker register again
                # soon: the controller refuses a new registration of the same id
                # (DUPLICATE_BROKER_REGISTRATION) until the old session has expired, even
                # after a controlled shutdown. Brokers heartbeat 6x per session.
                "broker.session.timeout.ms": "1500",
                # Topics with unclean.leader.election.enable=true get their unclean leader
                # within a second of a replica coming back, not after the 5 minute default.
                "unclean.leader.election.interval.ms": "1000",
                # A restarted preferred leader must not take leadership back behind a test's
                # back: every leadership change is explicit.
                "auto.leader.rebalance.enable": "false",
                # The no-op records that keep the metadata log moving while nothing changes
                # (Kafka writes one every 500 ms, and every broker applies it).
                "metadata.max.idle.interval.ms": "5000",
            }
        else:
            props = {
                **common,
                "process.roles": "broker",
                "listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
                "inter.broker.listener.name": "PLAINTEXT",
                "broker.heartbeat.interval.ms": "250",
                "auto.create.topics.enable": "false",
                "auto.leader.rebalance.enable": "false",
                "num.partitions": "1",
                "default.replication.factor": str(rf),
                "min.insync.replicas": "1",
                "offsets.topic.replication.factor": str(rf),
                "offsets.topic.num.partitions": "3",
                "transaction.state.log.replication.factor": str(rf),
                "transaction.state.log.min.isr": "1",
                "transaction.state.log.num.partitions": "3",
                "group.initial.rebalance.delay.ms": "0",
                "share.coordinator.state.topic.replication.factor": str(rf),
                "share.coordinator.state.topic.min.isr": "1",
                # A follower that stops fetching (SIGSTOP, a hung JVM) leaves the ISR in ~2 s;
                # a stopped broker leaves it at once through fencing / controlled shutdown.
                "replica.lag.time.max.ms": "2000",
                # An idle follower's fetch waits up to a second (data ends the wait at once):
                # idle clusters are most of a test run's broker CPU.
                "replica.fetch.wait.max.ms": "1000",
                "replica.fetch.backoff.ms": "100",
                "replica.socket.timeout.ms": "5000",
                "num.replica.fetchers": "1",
                "log.cleaner.enable": "false",
                "log.flush.offset.checkpoint.interval.ms": "1000",
                "group.coordinator.rebalance.protocols": "classic,consumer",
                # KIP-848 groups: Kafka's 5 s heartbeat interval (and its 5 s minimum) would
                # make every hand-over in the tests take seconds; sessions stay >= 6 s.
                "group.consumer.heartbeat.interval.ms": "500",
                "group.consumer.min.heartbeat.interval.ms": "500",
                "group.consumer.session.timeout.ms": "10000",
                "group.consumer.min.session.timeout.ms": "6000",
                "controlled.shutdown.enable": "true",
            }
            props.update(self._listener_properties(node))
        if self._authorizer:
            props.update(
                {
                    "authorizer.class.name": AUTHORIZER,
                    # Brokers and the controller reach each other, and this class's control
                    # calls reach the brokers, over PLAINTEXT as User:ANONYMOUS.
                    "super.users": "User:ANONYMOUS",
                    "allow.everyone.if.no.acl.found": "false",
                }
            )
        if node.role == "broker":
            rack = self._racks.get(node.node_id)
            if rack is not None:
                props["broker.rack"] = rack
            if self._replica_selector is not None:
                props["replica.selector.class"] = self._replica_selector
        if node.role == "broker" and self._telemetry_file is not None:
            props["metric.reporters"] = TELEMETRY_RECEIVER
            props["epochguard.telemetry.file"] = str(self._telemetry_file)
        props.update(self._extra_config if node.role == "broker" else {})
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _listener_properties(self, node: _Node) -> dict[str, str]:
        listeners = {"PLAINTEXT": node.port}
        if node.sasl_port is not None:
            listeners["SASL_PLAINTEXT"] = node.sasl_port
        if node.ssl_port is not None:
            listeners["SSL"] = node.ssl_port
        if node.proxied_port is not None:
            listeners[FAULT_PROXY_LISTENER] = node.proxied_port
        if len(listeners) == 1:
            return {}
        advertised = {name: f"127.0.0.1:{port}" for name, port in listeners.items()}
        if node.proxy_address is not None:
            host, port = node.proxy_address
            advertised[FAULT_PROXY_LISTENER] = f"{host}:{port}"
        protocols = {name: name for name in listeners}
        protocols[FAULT_PROXY_LISTENER] = "PLAINTEXT"
        props = {
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,"
            + ",".join(f"{name}:{protocols[name]}" for name in listeners),
            "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in listeners.items()),
            "advertised.listeners": ",".join(
                f"{name}://{address}" for name, address in advertised.items()
            ),
        }
        if node.sasl_port is not None:
            users = " ".join(f'user_{u}="{pw}"' for u, pw in self._sasl_users.items())
            prefix = "listener.name.sasl_plaintext"
            props["sasl.enabled.mechanisms"] = ",".join(SASL_MECHANISMS)
            props[f"{prefix}.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            )
            for mechanism in SCRAM_MECHANISMS:
                props[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                )
        if node.ssl_port is not None and self._tls is not None:
            prefix = "listener.name.ssl"
            props.update(
                {
                    f"{prefix}.ssl.keystore.type": "PKCS12",
                    f"{prefix}.ssl.keystore.location": str(self._tls.keystore),
                    f"{prefix}.ssl.keystore.password": self._tls.store_password,
                    f"{prefix}.ssl.key.password": self._tls.store_password,
                    f"{prefix}.ssl.client.auth": "none",
                }
            )
        return props

    def _java(self, node: _Node, main_class: str, *args: str, dump: bool = False) -> list[str]:
        return [
            "java",
            *JVM_OPTS,
            *self._class_archive_options(node, dump),
            f"-Dkafka.logs.dir={node.directory}",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            self._classpath(),
            main_class,
            *args,
        ]

    def _class_archive_options(self, node: _Node, dump: bool) -> tuple[str, ...]:
        if not self._class_archive_dump:
            return class_archive.jvm_options(self.jars, node.role)
        first_broker = self.broker_ids[0]
        if dump and node.node_id in (CONTROLLER_ID, first_broker):
            return (f"-XX:ArchiveClassesAtExit={self._class_archive_dump[node.role]}",)
        # Every other JVM of the dumping cluster runs without an archive.
        return ()

    def _classpath(self) -> str:
        if self._telemetry_file is None:
            return self.jars.classpath
        return f"{self.jars.classpath}{os.pathsep}{ensure_probe_classes(self.jars)}"

    def set_client_metrics(
        self, name: str, metrics: list[str], interval_ms: int, match: list[str] | None = None
    ) -> None:
        """Create or replace the KIP-714 client-metrics subscription ``name`` (what
        ``kafka-configs --alter --entity-type client-metrics`` does): clients matching
        ``match`` (``["client_id=..."]``; every client when empty) push the metrics whose
        names start with one of ``metrics`` every ``interval_ms``."""
        R = IncrementalAlterConfigsRequest
        values = {
            "metrics": ",".join(metrics),
            "interval.ms": str(interval_ms),
            "match": ",".join(match or []),
        }
        configs = [
            R.AlterConfigsResource.AlterableConfig(
                name=key, config_operation=0 if value else 1, value=value or None
            )
            for key, value in values.items()
        ]
        req = R(
            resources=[
                R.AlterConfigsResource(
                    resource_type=CLIENT_METRICS_RESOURCE, resource_name=name, configs=configs
                )
            ],
            validate_only=False,
        )
        resp = call(self._any_broker(), req, IncrementalAlterConfigsResponse, 1)
        for r in resp.responses:
            if r.error_code:
                raise ClusterError(
                    f"client-metrics {name}: {error_name(r.error_code)} {r.error_message or ''}"
                )

    def _format_storage(self) -> None:
        """What ``kafka-storage format`` writes for each node: ``meta.properties`` (the
        cluster, node and directory ids) and ``bootstrap.checkpoint`` (the metadata version
        and features, and for the controller the SCRAM credentials). The checkpoint does not
        depend on the cluster, so the tool runs once per role, credentials and Kafka version, and
        later clusters copy its checkpoint and write their own ids: a JVM per node less on
        every start."""
        procs = []
        for node in self._nodes.values():
            if (node.data_dir / "meta.properties").is_file():
                continue  # formatted already (the tool's --ignore-formatted)
            cached = self._formatted_checkpoint(node)
            if cached.is_file():
                node.data_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(cached, node.data_dir / BOOTSTRAP_CHECKPOINT)
                (node.data_dir / "meta.properties").write_text(
                    "version=1\n"
                    f"cluster.id={self._cluster_id}\n"
                    f"node.id={node.node_id}\n"
                    f"directory.id={self._random_cluster_id()}\n"
                )
                continue
            args = self._java(
                node,
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                self._cluster_id,
                "--config",
                str(node.config_path),
                "--ignore-formatted",
                *self._scram_format_args(node),
            )
            procs.append(
                (node, subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            )
        for node, proc in procs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise ClusterError(f"kafka-storage format failed for node {node.node_id}: {out!r}")
            cached = self._formatted_checkpoint(node)
            cached.parent.mkdir(parents=True, exist_ok=True)
            # Another process may be writing the same file: each renames its own copy.
            partial = cached.with_name(f"{cached.name}.{os.getpid()}")
            shutil.copyfile(node.data_dir / BOOTSTRAP_CHECKPOINT, partial)
            os.replace(partial, cached)

    def _formatted_checkpoint(self, node: _Node) -> Path:
        """Where the checkpoint ``kafka-storage format`` writes for ``node`` is kept: in the
        Kafka version's own cache folder, by role and SCRAM credentials."""
        key = hashlib.sha256("\0".join([node.role, *self._scram_format_args(node)]).encode())
        return self.jars.home / "formatted" / f"{node.role}-{key.hexdigest()[:16]}.checkpoint"

    def _scram_format_args(self, node: _Node) -> list[str]:
        # SCRAM credentials live in the metadata log: the controller's bootstrap records.
        if node.role != "controller":
            return []
        args = []
        for mechanism in SCRAM_MECHANISMS:
            for user, password in self._sasl_users.items():
                args += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
        return args

    def _launch(self, node: _Node) -> None:
        args = self._java(node, "kafka.Kafka", str(node.config_path), dump=True)
        self._procs[node.node_id] = process.spawn(
            args, node.directory / "stdout.log", node.directory
        )

    def _await_registered(self, broker_id: int) -> None:
        """Wait until the broker serves metadata that lists itself (registered and unfenced)."""

        def probe() -> bool | None:
            proc = self._procs[broker_id]
            if proc.poll() is not None:
                raise ClusterError(
                    f"broker {broker_id} exited with {proc.returncode}; see "
                    f"{self._nodes[broker_id].directory / 'server.log'}"
                )
            meta = self._metadata_from(broker_id, None)
            return True if any(b.node_id == broker_id for b in meta.brokers) else None

        _wait(f"broker {broker_id} to register", probe, self._startup_timeout, 0.2)

    def _warm_up_group_coordinator(self) -> None:
        def probe() -> bool | None:
            req = FindCoordinatorRequest(key_type=0, coordinator_keys=["epochguard-warm-up"])
            resp = call(self._any_broker(), req, FindCoordinatorResponse, 4)
            return True if all(c.error_code == 0 for c in resp.coordinators) else None

        _wait("the group coordinator", probe, self._startup_timeout, 0.2)

    def transactional_id_coordinated_by(self, broker_id: int, base: str) -> str:
        """A transactional id starting with ``base`` whose transaction coordinator is
        ``broker_id`` (FindCoordinator over ``base-0``, ``base-1``, ...), for a test that stops
        the partition's replicas and must not stop its producer's coordinator with them:
        kafka-python's producer does not always find a new coordinator in time, and its
        ``commit_transaction()`` has no timeout. After 100 ids, the last one is returned
        whoever coordinates it (``__transaction_state`` has 50 partitions)."""
        host, port = self.broker_address(broker_id).rsplit(":", 1)
        for n in range(100):
            tid = f"{base}-{n}"

            def coordinator(tid: str = tid) -> int | None:
                req = FindCoordinatorRequest(key_type=1, coordinator_keys=[tid])
                (c,) = call((host, int(port)), req, FindCoordinatorResponse, 4).coordinators
                # not 0 while __transaction_state is still being created
                return int(c.node_id) if c.error_code == 0 else None

            if _wait(f"a transaction coordinator for {tid}", coordinator, 30, 0.2) == broker_id:
                return tid
        return f"{base}-99"

    # -- broker control ----------------------------------------------------------------------

    def stop_broker(
        self, broker_id: int, kill: bool = False, *, controlled: bool | None = None
    ) -> None:
        """SIGTERM (controlled shutdown) or, with ``kill`` (or ``controlled=False``, the
        EmbeddedCluster's keyword), SIGKILL; wait until it is fenced."""
        if controlled is not None:
            kill = not controlled
        proc = self._procs.get(broker_id)
        if proc is None or proc.poll() is not None:
            raise ClusterError(f"broker {broker_id} is not running")
        started = time.monotonic()
        process.stop(proc, self._stop_timeout, kill=kill)
        del self._procs[broker_id]
        if self.running_broker_ids:

            def fenced() -> bool | None:
                for b in self.running_broker_ids:
                    if any(n.node_id == broker_id for n in self._metadata_from(b, None).brokers):
                        return None
                return True

            _wait(f"broker {broker_id} to be fenced", fenced, self._startup_timeout)
        log.info(
            "kafka_broker_stopped",
            broker=broker_id,
            kill=kill,
            seconds=round(time.monotonic() - started, 2),
        )

    def start_broker(self, broker_id: int) -> None:
        self.start_brokers(broker_id)

    def start_brokers(self, *broker_ids: int) -> None:
        """Start the stopped ``broker_ids`` side by side (their JVMs boot at the same time)
        and wait until every one has registered."""
        for broker_id in broker_ids:
            if broker_id not in self.broker_ids:
                raise ClusterError(f"no broker {broker_id} in this cluster")
            if self._running(broker_id):
                raise ClusterError(f"broker {broker_id} is already running")
        if len(set(broker_ids)) != len(broker_ids):
            raise ClusterError(f"broker ids repeat: {list(broker_ids)}")
        started = time.monotonic()
        for broker_id in broker_ids:
            self._launch(self._nodes[broker_id])
        for broker_id in broker_ids:
            self._await_registered(broker_id)
            log.info(
                "kafka_broker_started",
                broker=broker_id,
                seconds=round(time.monotonic() - started, 2),
            )

    # -- metadata ----------------------------------------------------------------------------

    def _any_broker(self) -> tuple[str, int]:
        running = self.running_broker_ids
        if not running:
            raise ClusterError("no broker is running")
        return self._nodes[running[0]].address

    def _metadata_from(self, broker_id: int, topics: list[str] | None) -> Any:
        req = MetadataRequest(
            topics=None
            if topics is None
            else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=False,
        )
        return call(self._nodes[broker_id].address, req, MetadataResponse, 12)

    def _describe_partitions(
        self, address: tuple[str, int], topic: str, first: int, limit: int
    ) -> tuple[dict[int, PartitionState], int | None]:
        """DescribeTopicPartitions of ``topic`` from partition ``first`` on, at most ``limit``
        of them; returns them and the next partition (None after the last)."""
        req = DescribeTopicPartitionsRequest(
            topics=[DescribeTopicPartitionsRequest.TopicRequest(name=topic)],
            response_partition_limit=limit,
            cursor=DescribeTopicPartitionsRequest.Cursor(topic_name=topic, partition_index=first),
        )
        resp = call(address, req, DescribeTopicPartitionsResponse, 0)
        states: dict[int, PartitionState] = {}
        for t in resp.topics:
            if t.name != topic:
                continue
            if t.error_code != 0:
                raise ClusterError(f"describe {topic}: {error_name(t.error_code)}")
            for p in t.partitions:
                states[p.partition_index] = PartitionState(
                    leader=p.leader_id,
                    leader_epoch=p.leader_epoch,
                    replicas=tuple(p.replica_nodes),
                    isr=tuple(p.isr_nodes),
                    elr=tuple(p.eligible_leader_replicas or ()),
                    last_known_elr=tuple(p.last_known_elr or ()),
                    offline_replicas=tuple(p.offline_replicas),
                )
        cursor = resp.next_cursor
        following = (
            cursor.partition_index if cursor is not None and cursor.topic_name == topic else None
        )
        return states, following

    def partition_states(self, topic: str, broker: int) -> dict[int, PartitionState]:
        """Every partition of ``topic`` as ``broker`` sees it (in pages of 2,000)."""
        states: dict[int, PartitionState] = {}
        following: int | None = 0
        while following is not None:
            page, following = self._describe_partitions(
                self._nodes[broker].address, topic, following, 2000
            )
            states.update(page)
        return states

    def partition_state(
        self, topic: str, partition: int, broker: int | None = None
    ) -> PartitionState:
        """The partition as ``broker`` (default: the first running broker) sees it, with ELR.

        Asks for this one partition only (the request's cursor), so a call costs the same on
        a topic of 1,000 partitions as on one of a single partition."""
        address = self._nodes[broker].address if broker is not None else self._any_broker()
        states, _ = self._describe_partitions(address, topic, partition, 1)
        if partition not in states:
            raise ClusterError(f"no partition {topic}-{partition}")
        return states[partition]

    def leader(self, topic: str, partition: int) -> int | None:
        leader = self.partition_state(topic, partition).leader
        return None if leader < 0 else leader

    def leader_epoch(self, topic: str, partition: int) -> int:
        return self.partition_state(topic, partition).leader_epoch

    def replicas(self, topic: str, partition: int) -> list[int]:
        return list(self.partition_state(topic, partition).replicas)

    def isr(self, topic: str, partition: int) -> list[int]:
        return list(self.partition_state(topic, partition).isr)

    def elr(self, topic: str, partition: int) -> list[int]:
        """Eligible leader replicas (KIP-966): ISR members kept electable below min ISR."""
        return list(self.partition_state(topic, partition).elr)

    def wait_for_partition(
        self,
        topic: str,
        partition: int,
        condition: Callable[[PartitionState], bool],
        what: str,
        timeout: float = 30.0,
    ) -> PartitionState:
        """Poll until every running broker's metadata for the partition satisfies ``condition``."""

        def probe() -> PartitionState | None:
            states = [self.partition_state(topic, partition, b) for b in self.running_broker_ids]
            if states and all(condition(s) for s in states) and len(set(states)) == 1:
                return states[0]
            return None

        return _wait(f"{topic}-{partition}: {what}", probe, timeout)

    def wait_for_isr(
        self, topic: str, partition: int, isr: list[int], timeout: float = 30.0
    ) -> PartitionState:
        want = sorted(isr)
        return self.wait_for_partition(
            topic, partition, lambda s: sorted(s.isr) == want, f"ISR {want}", timeout
        )

    # -- topics ------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
        assignments: Mapping[int, list[int]] | None = None,
    ) -> None:
        """Create a topic and wait until every running broker knows a leader for each partition.

        ``assignments`` (partition -> replica list, preferred leader first) pins replicas.
        """
        topic = CreateTopicsRequest.CreatableTopic(
            name=name,
            num_partitions=-1 if assignments else partitions,
            replication_factor=-1
            if assignments or replication_factor is None
            else replication_factor,
            assignments=[
                CreateTopicsRequest.CreatableTopic.CreatableReplicaAssignment(
                    partition_index=p, broker_ids=list(brokers)
                )
                for p, brokers in sorted((assignments or {}).items())
            ],
            configs=[
                CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(name=k, value=v)
                for k, v in (config or {}).items()
            ],
        )
        req = CreateTopicsRequest(topics=[topic], timeout_ms=30000, validate_only=False)
        resp = call(self._any_broker(), req, CreateTopicsResponse, 7, timeout=40)
        for result in resp.topics:
            if result.error_code != 0:
                raise ClusterError(
                    f"create topic {name}: {error_name(result.error_code)} {result.error_message}"
                )
        count = len(assignments) if assignments else partitions
        # One request per broker and poll for the whole topic, not one per partition: on a
        # topic of 1,000 partitions the per-partition waits took a minute.
        timeout = 30.0 + 0.12 * count

        def led_everywhere() -> dict[int, PartitionState] | None:
            views = [self.partition_states(name, b) for b in self.running_broker_ids]
            if not views or len(views[0]) != count:
                return None
            if any(s.leader < 0 for s in views[0].values()):
                return None
            return views[0] if all(v == views[0] for v in views) else None

        states = _wait(f"{name}: a leader for each of {count} partitions", led_everywhere, timeout)
        # Followers must have created their local replica before per-replica calls hit them.
        hosted: dict[int, list[int]] = {}
        for p, state in sorted(states.items()):
            for replica in state.replicas:
                if self._running(replica):
                    hosted.setdefault(replica, []).append(p)
        for replica, on_it in hosted.items():
            _wait(
                f"replicas of {name} on broker {replica}",
                functools.partial(self._replicas_created, name, on_it, replica),
                timeout,
            )
        log.info("kafka_topic_created", topic=name, partitions=count)

    def grant(
        self,
        user: str,
        operations: tuple[str, ...],
        *,
        topic: str | None = None,
        group: str | None = None,
    ) -> None:
        """Allow SASL ``user`` the ``operations`` (``"READ"``, ``"DESCRIBE"``, ...) on one
        topic or one group (literal names), and wait until every running broker enforces it.
        Needs ``authorizer=True``."""
        if not self._authorizer:
            raise ClusterError("this cluster has no authorizer (pass authorizer=True)")
        if (topic is None) == (group is None):
            raise ValueError("grant() takes exactly one of topic= or group=")
        unknown = [op for op in operations if op not in _ACL_OPERATIONS]
        if not operations or unknown:
            raise ValueError(
                f"operations must be some of {', '.join(_ACL_OPERATIONS)}; got {operations!r}"
            )
        resource_type, name = (
            (_RESOURCE_TOPIC, topic) if topic is not None else (_RESOURCE_GROUP, group)
        )
        assert name is not None
        principal = f"User:{user}"
        creations = [
            CreateAclsRequest.AclCreation(
                resource_type=resource_type,
                resource_name=name,
                resource_pattern_type=_PATTERN_LITERAL,
                principal=principal,
                host="*",
                operation=_ACL_OPERATIONS[op],
                permission_type=_PERMISSION_ALLOW,
            )
            for op in operations
        ]
        resp = call(
            self._any_broker(), CreateAclsRequest(creations=creations), CreateAclsResponse, 3
        )
        for result in resp.results:
            if result.error_code:
                raise ClusterError(
                    f"CreateAcls {principal} {operations} on {name}: "
                    f"{error_name(result.error_code)} {result.error_message or ''}"
                )
        wanted = {_ACL_OPERATIONS[op] for op in operations}

        def enforced_everywhere() -> bool | None:
            for broker_id in self.running_broker_ids:
                req = DescribeAclsRequest(
                    resource_type_filter=resource_type,
                    resource_name_filter=name,
                    pattern_type_filter=_PATTERN_LITERAL,
                    principal_filter=principal,
                    host_filter=None,
                    operation=_ACL_OPERATION_ANY,
                    permission_type=_PERMISSION_ALLOW,
                )
                got = call(self._nodes[broker_id].address, req, DescribeAclsResponse, 3)
                if got.error_code:
                    return None
                seen = {acl.operation for res in got.resources for acl in res.acls}
                if not wanted <= seen:
                    return None
            return True

        _wait(f"ACLs for {principal} on {name}", enforced_everywhere, timeout=30)

    def topic_names(self) -> set[str]:
        """The topics the cluster has, internal ones (``__consumer_offsets`` and the like)
        left out."""
        meta = self._metadata_from(self.running_broker_ids[0], None)
        return {t.name for t in meta.topics if t.error_code == 0 and not t.is_internal}

    def delete_topic(self, name: str) -> None:
        req = DeleteTopicsRequest(
            topics=[DeleteTopicsRequest.DeleteTopicState(name=name)], timeout_ms=30000
        )
        resp = call(self._any_broker(), req, DeleteTopicsResponse, 6, timeout=40)
        for result in resp.responses:
            if result.error_code != 0:
                raise ClusterError(f"delete topic {name}: {error_name(result.error_code)}")

        def gone() -> bool | None:
            for b in self.running_broker_ids:
                meta = self._metadata_from(b, [name])
                if any(t.name == name and t.error_code == 0 for t in meta.topics):
                    return None
            return True

        _wait(f"topic {name} to disappear", gone, 30.0)

    # -- offsets -----------------------------------------------------------------------------

    def list_offsets(
        self,
        topic: str,
        partition: int,
        timestamp: int = LATEST,
        broker: int | None = None,
        replica_id: int = CONSUMER_REPLICA_ID,
    ) -> OffsetAndEpoch:
        """ListOffsets v7 to ``broker`` (default: the leader), as a consumer by default."""
        target = broker if broker is not None else self._require_leader(topic, partition)
        req = _list_offsets_request(topic, [partition], timestamp, replica_id)
        resp = call(self._nodes[target].address, req, ListOffsetsResponse, 7)
        p = resp.topics[0].partitions[0]
        if p.error_code != 0:
            raise ClusterError(
                f"ListOffsets {topic}-{partition} on broker {target}: {error_name(p.error_code)}"
            )
        return OffsetAndEpoch(offset=p.offset, leader_epoch=p.leader_epoch)

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.list_offsets(topic, partition, LATEST).offset

    def _replicas_created(self, topic: str, partitions: list[int], broker: int) -> bool | None:
        """True once ``broker`` answers ListOffsets (debugging replica id) for every one of
        ``partitions`` of ``topic`` from its own log."""
        req = _list_offsets_request(topic, partitions, LATEST, DEBUGGING_REPLICA_ID)
        resp = call(self._nodes[broker].address, req, ListOffsetsResponse, 7)
        answered = {
            p.partition_index for t in resp.topics for p in t.partitions if p.error_code == 0
        }
        return True if answered >= set(partitions) else None

    def log_end_offset(self, topic: str, partition: int, broker: int | None = None) -> int:
        """Log end offset of the leader's replica, or of ``broker``'s replica.

        Running broker: ListOffsets(LATEST) with the debugging replica id, answered from its own
        log whether it leads or follows. Stopped broker: read from its segment files.
        """
        target = broker if broker is not None else self._require_leader(topic, partition)
        if self._running(target):
            return self.list_offsets(
                topic, partition, LATEST, broker=target, replica_id=DEBUGGING_REPLICA_ID
            ).offset
        partition_dir = self._nodes[target].data_dir / f"{topic}-{partition}"
        if not partition_dir.is_dir():
            raise ClusterError(f"broker {target} has no replica of {topic}-{partition}")
        return _last_offset_on_disk(partition_dir)

    def epoch_cache(self, topic: str, partition: int, broker: int) -> list[tuple[int, int]]:
        """``(epoch, start_offset)`` entries of ``broker``'s leader-epoch-checkpoint file."""
        path = self._nodes[broker].data_dir / f"{topic}-{partition}" / "leader-epoch-checkpoint"
        lines = path.read_text().split("\n")
        count = int(lines[1])
        entries = [tuple(int(x) for x in line.split()) for line in lines[2 : 2 + count]]
        return [(e[0], e[1]) for e in entries]

    def offset_for_leader_epoch(
        self,
        topic: str,
        partition: int,
        leader_epoch: int,
        current_leader_epoch: int = -1,
        broker: int | None = None,
    ) -> EpochEndOffset:
        """OffsetForLeaderEpoch v4 as a consumer (replica id -1) to the leader or ``broker``."""
        target = broker if broker is not None else self._require_leader(topic, partition)
        req = OffsetForLeaderEpochRequest(
            replica_id=CONSUMER_REPLICA_ID,
            topics=[
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                    topic=topic,
                    partitions=[
                        OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                            partition=partition,
                            current_leader_epoch=current_leader_epoch,
                            leader_epoch=leader_epoch,
                        )
                    ],
                )
            ],
        )
        resp = call(self._nodes[target].address, req, OffsetForLeaderEpochResponse, 4)
        p = resp.topics[0].partitions[0]
        return EpochEndOffset(
            error=error_name(p.error_code), leader_epoch=p.leader_epoch, end_offset=p.end_offset
        )

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Delete records below ``before_offset`` (-1: the high watermark).

        Kafka refuses an offset above the high watermark (OFFSET_OUT_OF_RANGE), and after an
        acks=1 write the high watermark trails until the followers fetch, so wait for it first.
        """
        if before_offset >= 0:
            _wait(
                f"{topic}-{partition} high watermark >= {before_offset}",
                lambda: True if self.high_watermark(topic, partition) >= before_offset else None,
                30.0,
            )
        leader = self._require_leader(topic, partition)
        req = DeleteRecordsRequest(
            topics=[
                DeleteRecordsRequest.DeleteRecordsTopic(
                    name=topic,
                    partitions=[
                        DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(
                            partition_index=partition, offset=before_offset
                        )
                    ],
                )
            ],
            timeout_ms=30000,
        )
        resp = call(self._nodes[leader].address, req, DeleteRecordsResponse, 2, timeout=40)
        p = resp.topics[0].partitions[0]
        if p.error_code != 0:
            raise ClusterError(f"delete records {topic}-{partition}: {error_name(p.error_code)}")

    # -- elections ---------------------------------------------------------------------------

    def _require_leader(self, topic: str, partition: int) -> int:
        leader = self.leader(topic, partition)
        if leader is None:
            raise ClusterError(f"{topic}-{partition} has no leader")
        return leader

    def _elect(self, topic: str, partition: int, election_type: int) -> int:
        req = ElectLeadersRequest(
            election_type=election_type,
            topic_partitions=[
                ElectLeadersRequest.TopicPartitions(topic=topic, partitions=[partition])
            ],
            timeout_ms=30000,
        )
        resp = call(self._any_broker(), req, ElectLeadersResponse, 2, timeout=40)
        if resp.error_code != 0:
            raise ElectionError(f"ElectLeaders {topic}-{partition}: {error_name(resp.error_code)}")
        result = resp.replica_election_results[0].partition_result[0]
        return int(result.error_code)

    def prefer_replica(self, topic: str, partition: int, broker_id: int) -> None:
        """Reorder the replica list so ``broker_id`` is preferred: same set, no data moves,
        the leader stays (:meth:`elect_leader` does this first; done beforehand, the election
        alone is what clients see next)."""
        state = self.partition_state(topic, partition)
        if state.replicas[0] == broker_id:
            return
        order = [broker_id, *(r for r in state.replicas if r != broker_id)]
        req = AlterPartitionReassignmentsRequest(
            timeout_ms=30000,
            topics=[
                AlterPartitionReassignmentsRequest.ReassignableTopic(
                    name=topic,
                    partitions=[
                        AlterPartitionReassignmentsRequest.ReassignableTopic.ReassignablePartition(
                            partition_index=partition, replicas=order
                        )
                    ],
                )
            ],
        )
        resp = call(self._any_broker(), req, AlterPartitionReassignmentsResponse, 0, timeout=40)
        if resp.error_code != 0:
            raise ElectionError(f"reorder replicas of {topic}-{partition}: {resp.error_message}")
        code = resp.responses[0].partitions[0].error_code
        if code not in (ErrorCode.NONE, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS):
            raise ElectionError(f"reorder replicas of {topic}-{partition}: {error_name(code)}")
        self.wait_for_partition(
            topic, partition, lambda s: s.replicas[:1] == (broker_id,), f"{broker_id} preferred"
        )

    def elect_leader(
        self, topic: str, partition: int, broker_id: int, unclean: bool = False
    ) -> None:
        """Make ``broker_id`` the leader through the ElectLeaders API, then wait to see it.

        Clean: ``broker_id`` must be in the ISR; it is made the preferred replica (replica order
        only) and a PREFERRED election runs. Unclean: only a partition without a live leader
        can be elected uncleanly (Kafka answers ELECTION_NOT_NEEDED otherwise); ``broker_id`` is
        put first in the replica order, because the controller picks the first live replica,
        and an UNCLEAN election runs. It needs no ``unclean.leader.election.enable`` on the
        topic. If the controller already made ``broker_id`` leader, that is success.
        """
        if not self._running(broker_id):
            raise ElectionError(f"broker {broker_id} is not running")
        state = self.partition_state(topic, partition)
        if state.leader == broker_id:
            return
        if broker_id not in state.replicas:
            raise ElectionError(f"broker {broker_id} has no replica of {topic}-{partition}")
        live_leader = state.leader >= 0 and self._running(state.leader)
        in_isr = broker_id in state.isr or (not state.isr and broker_id in state.elr)
        if unclean and live_leader and not in_isr:
            raise ElectionError(
                f"{topic}-{partition} has live leader {state.leader}; Kafka elects uncleanly "
                f"only a partition without a leader (stop broker {state.leader} first)"
            )
        if not unclean and not in_isr:
            raise ElectionError(
                f"broker {broker_id} is not in the ISR {list(state.isr)} of {topic}-{partition}"
            )
        self.prefer_replica(topic, partition, broker_id)
        election_type = 1 if unclean and not live_leader else 0  # 0 PREFERRED, 1 UNCLEAN
        deadline = time.monotonic() + 30.0
        while True:
            code = self._elect(topic, partition, election_type)
            if code in (ErrorCode.NONE, ErrorCode.ELECTION_NOT_NEEDED):
                break
            if code not in _RETRIABLE or time.monotonic() > deadline:
                raise ElectionError(
                    f"{'unclean' if unclean else 'clean'} election of {broker_id} for "
                    f"{topic}-{partition}: {error_name(code)}"
                )
            time.sleep(0.2)
        new = self.wait_for_partition(
            topic, partition, lambda s: s.leader == broker_id, f"leader {broker_id}"
        )
        log.info(
            "kafka_leader_elected",
            topic=topic,
            partition=partition,
            leader=broker_id,
            leader_epoch=new.leader_epoch,
            unclean=unclean,
        )

    # -- convenience -------------------------------------------------------------------------

    def java_probe(
        self,
        topic: str,
        partition: int,
        auto_offset_reset: str,
        props: Mapping[str, str] | None = None,
        *,
        bootstrap_servers: str | None = None,
    ) -> JavaTruncationProbe:
        """Start the reference Java consumer on one partition; it knows every broker's address
        (or bootstraps from ``bootstrap_servers``: a fault proxy's, for example)."""
        return JavaTruncationProbe(
            bootstrap_servers or self.all_bootstrap_servers,
            topic,
            partition,
            auto_offset_reset,
            props=props,
            jars=self.jars,
            log_dir=self.work_dir / "probes",
        )

    def java_member(
        self,
        group_id: str,
        *,
        protocol: GroupProtocol = "consumer",
        assignor: str | None = None,
        instance_id: str | None = None,
        auto_offset_reset: Literal["earliest", "latest", "none"] = "earliest",
        auto_commit: bool = False,
        props: Mapping[str, str] | None = None,
    ) -> JavaGroupMember:
        """Start the reference Java consumer as a member of ``group_id`` (subscribe() next)."""
        return JavaGroupMember(
            self.all_bootstrap_servers,
            group_id,
            protocol=protocol,
            assignor=assignor,
            instance_id=instance_id,
            auto_offset_reset=auto_offset_reset,
            auto_commit=auto_commit,
            props=props,
            jars=self.jars,
            log_dir=self.work_dir / "probes",
        )

    def node_log(self, node_id: int) -> Path:
        return self._nodes[node_id].directory / "server.log"

    def __repr__(self) -> str:
        return (
            f"ApacheKafkaCluster(brokers={self._num_brokers}, running={self.running_broker_ids}, "
            f"work_dir={self._work_dir})"
        )
