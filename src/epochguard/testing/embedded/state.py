"""Cluster state: topics, partitions, replica logs, the controller and per-broker views.

Everything here is mutated only on the server's event-loop thread. The controller's truth
(leader, epoch, replicas, ISR) lives in :class:`PartitionState`; each broker serves from its
own :class:`MetadataImage`, which it learns after ``faults.metadata_delay(broker)`` seconds, so a
broker can be staged as a stale leader.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from epochguard._errors import ErrorCode
from epochguard._log import get_logger
from epochguard.testing.embedded.fetch_sessions import FetchSessionCache
from epochguard.testing.embedded.partition_log import UNDEFINED_EPOCH_OFFSET, PartitionLog
from epochguard.testing.embedded.security import SecuritySettings

if TYPE_CHECKING:
    from epochguard.testing.embedded.faults import Faults
    from epochguard.testing.embedded.raft import RaftElections

log = get_logger("epochguard.testing.embedded")

CLUSTER_ID = "epochguard-embedded"

DEFAULT_TOPIC_CONFIG: dict[str, str] = {
    "min.insync.replicas": "1",
    "unclean.leader.election.enable": "false",
    "cleanup.policy": "delete",
    "retention.ms": "604800000",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
}


#: How long after catching up a follower joins the ISR, by default (Kafka's rules): the
#: follower's next fetch, then the leader's AlterPartition through the controller.
DEFAULT_ISR_JOIN_DELAY_S = 0.2

#: Kafka's ``replica.selector.class`` for rack-aware follower fetching (KIP-392); both test
#: clusters accept it.
RACK_AWARE_REPLICA_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


class EmbeddedClusterError(Exception):
    """A control-API call cannot be carried out (unknown topic, broker, bad election...)."""


class ControllerUnavailableError(EmbeddedClusterError):
    """No controller can act now (Raft terms: no majority of the brokers runs)."""


@attrs.frozen
class PartitionView:
    """What one broker believes about a partition."""

    leader: int  # -1 when leaderless
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...]
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@attrs.frozen
class TopicView:
    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionView]


@attrs.frozen
class MetadataImage:
    """An immutable snapshot of the controller's metadata; ``version`` increases."""

    version: int
    topics: Mapping[str, TopicView]

    def partition(self, topic: str, partition: int) -> PartitionView | None:
        t = self.topics.get(topic)
        return None if t is None else t.partitions.get(partition)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicView | None:
        for t in self.topics.values():
            if t.topic_id == topic_id:
                return t
        return None


EMPTY_IMAGE = MetadataImage(0, {})


@attrs.define(eq=False)
class BrokerState:
    node_id: int
    host: str = "127.0.0.1"
    port: int = 0
    alive: bool = True
    rack: str | None = None
    view: MetadataImage = EMPTY_IMAGE
    # Replication to this broker is paused (a lagging follower): it drops out of ISRs.
    replication_paused: bool = False
    fetch_sessions: FetchSessionCache = attrs.field(factory=FetchSessionCache)
    # Listener name -> port, for listeners other than PLAINTEXT (``port``).
    listener_ports: dict[str, int] = attrs.field(factory=dict)
    # Listener name -> the port Metadata names instead of the bound one (a proxy in front).
    advertised_ports: dict[str, int] = attrs.field(factory=dict)
    # How many times it started again: metadata on its way to an earlier run is dropped.
    restarts: int = 0


@attrs.define(eq=False)
class PartitionState:
    topic: str
    index: int
    replicas: list[int]
    isr: list[int]
    leader: int | None
    leader_epoch: int
    logs: dict[int, PartitionLog]
    # KIP-966 eligible leader replicas: ISR members that left while the ISR was below
    # min.insync.replicas; they still have every committed record.
    elr: list[int] = attrs.field(factory=list)
    last_known_elr: list[int] = attrs.field(factory=list)
    # Followers whose fetcher gave up on this partition (Kafka's markPartitionFailed) until
    # they learn a new leader or epoch, or restart.
    failed_followers: set[int] = attrs.field(factory=set)
    # Followers that checked their log against the current leader epoch (truncating where it
    # diverges): only their log end offsets count for the high watermark, and only they
    # catch up by appending (Kafka's leader counts a follower's position from its fetches,
    # and a diverging one truncates before it fetches on).
    synced_followers: set[int] = attrs.field(factory=set)

    @property
    def leader_log(self) -> PartitionLog | None:
        return None if self.leader is None else self.logs[self.leader]


@attrs.define(eq=False)
class TopicState:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState]
    config: dict[str, str]

    @property
    def min_insync_replicas(self) -> int:
        return int(self.config.get("min.insync.replicas", "1"))

    @property
    def unclean_election(self) -> bool:
        return self.config.get("unclean.leader.election.enable", "false").lower() == "true"


class ClusterState:
    """The whole cluster. Handlers reach it as ``ctx.cluster``.

    ``groups`` is the hook for the group coordinator (``testing/embedded/groups.py``): None
    until that module installs its coordinator object there.
    """

    def __init__(self, broker_ids: list[int], faults: Faults | None = None) -> None:
        from epochguard.testing.embedded.faults import Faults
        from epochguard.testing.embedded.telemetry import ClientMetrics

        self.cluster_id = CLUSTER_ID
        self.brokers: dict[int, BrokerState] = {b: BrokerState(b) for b in broker_ids}
        self.topics: dict[str, TopicState] = {}
        #: every topic id this cluster created, in creation order: a broker whose view lags
        #: knows an older incarnation of a name than the controller
        self.topic_id_order: dict[uuid.UUID, int] = {}
        self.faults: Faults = faults if faults is not None else Faults()
        self.security = SecuritySettings()
        self.groups: Any = None
        # The transaction coordinator (``transactions.py``), installed on first use by
        # ``handlers/_txn_common.py``.
        self.transactions: Any = None
        # KIP-714 client-metrics subscriptions and the pushes received (``telemetry.py``).
        self.telemetry = ClientMetrics()
        # Kafka's ``transaction.max.timeout.ms``.
        self.transaction_max_timeout_ms = 900_000
        self.loop: asyncio.AbstractEventLoop | None = None
        self._image_version = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._next_producer_id = 1000
        self.auto_create_topics = False
        # KIP-227 incremental fetch sessions, on as in Kafka.
        self.fetch_sessions_enabled = True
        # KIP-966 eligible leader replicas, on by default in Kafka 4.x clusters.
        self.elr_enabled = True
        # (api_key, version) -> number of requests decoded, for tests to assert on.
        self.request_counts: collections.Counter[tuple[int, int]] = collections.Counter()
        # (client_id, api_key) -> number of requests decoded: what each client asked for.
        self.request_counts_by_client: collections.Counter[tuple[str | None, int]] = (
            collections.Counter()
        )
        #: When set (a list), every decoded request is appended to it as a dict: ``at``
        #: (wall clock), ``client``, ``api``, ``broker``, Fetch's ``max_wait_ms``, and once
        #: answered ``answered`` (wall clock) and a Fetch answer's ``errors``.
        self.request_trace: list[dict[str, Any]] | None = None
        #: bytes of requests received per API key (framing included)
        self.request_bytes: collections.Counter[int] = collections.Counter()
        self.default_partitions = 1
        # Called with (topic, partition, broker, new log end offset) after a replica truncated.
        self.on_truncate: list[Callable[[str, int, int, int], None]] = []
        # KIP-392 ``replica.selector.class``: None (Kafka's LeaderSelector: consumers read from
        # leaders) or RACK_AWARE_REPLICA_SELECTOR.
        self.replica_selector: str | None = None
        # Record bytes each broker served to consumers' Fetch requests (cross-rack traffic).
        self.consumer_fetch_bytes: collections.Counter[int] = collections.Counter()
        # Raft-term leader epochs (``raft.py``): None keeps Kafka's rules.
        self.raft: RaftElections | None = None
        # API key -> the highest version these brokers serve, below what the handler can.
        self.max_versions: dict[int, int] = {}
        # How long after a follower has caught up its leader adds it to the ISR (Kafka's
        # rules; 0: at once): the follower's next fetch shows the leader it holds the whole
        # log, and the ISR change goes through the controller (AlterPartition).
        self.isr_join_delay_s = DEFAULT_ISR_JOIN_DELAY_S
        # ISR joins due: (topic id, partition, follower, leader epoch, follower's restarts).
        self._isr_joins_due: set[tuple[uuid.UUID, int, int, int, int]] = set()

    # -- helpers ---------------------------------------------------------------------------

    @property
    def active_controller(self) -> int:
        """The lowest live broker id acts as controller (-1 when none is running)."""
        alive = sorted(b.node_id for b in self.brokers.values() if b.alive)
        return alive[0] if alive else -1

    @property
    def controller_available(self) -> bool:
        """Whether topics can be created or deleted now. Raft terms: the controller is a
        Raft group of every broker too (Redpanda's), so a majority of them must run."""
        alive = len(self.alive_brokers())
        if self.raft is not None:
            return alive >= len(self.brokers) // 2 + 1
        return alive > 0

    def _require_controller(self) -> None:
        if not self.controller_available:
            raise ControllerUnavailableError(
                f"no controller: {len(self.alive_brokers())} of {len(self.brokers)} brokers "
                "running, and a Raft-term cluster's controller needs a majority"
            )

    def alive_brokers(self) -> list[BrokerState]:
        return [b for b in self.brokers.values() if b.alive]

    def partition(self, topic: str, partition: int) -> PartitionState:
        t = self.topics.get(topic)
        if t is None:
            raise EmbeddedClusterError(f"unknown topic {topic!r}")
        p = t.partitions.get(partition)
        if p is None:
            raise EmbeddedClusterError(f"topic {topic!r} has no partition {partition}")
        return p

    def broker(self, broker_id: int) -> BrokerState:
        b = self.brokers.get(broker_id)
        if b is None:
            raise EmbeddedClusterError(f"unknown broker {broker_id}")
        return b

    def next_producer_id(self) -> int:
        self._next_producer_id += 1
        return self._next_producer_id

    def api_versions(self, api_key: int, min_version: int, max_version: int) -> tuple[int, int]:
        """The versions of ``api_key`` these brokers serve (what ApiVersions advertises)."""
        return min_version, min(max_version, self.max_versions.get(api_key, max_version))

    def _new_partition(self, name: str, index: int, replicas: list[int]) -> PartitionState:
        """A new partition and its first leader (Kafka: the first running replica, epoch 0;
        Raft: the first election, term 1)."""
        alive = [r for r in replicas if self.brokers[r].alive]
        raft = self.raft is not None
        logs = {r: PartitionLog(raft=raft) for r in replicas}
        if self.raft is not None:
            p = PartitionState(name, index, list(replicas), [replicas[0]], None, 0, logs)
            if self.raft.campaign(p, failed_attempts=0):
                assert p.leader is not None
                p.isr[:] = [p.leader, *(r for r in alive if r != p.leader)]
            return p
        leader = alive[0] if alive else None
        p = PartitionState(
            name, index, list(replicas), list(alive) or [replicas[0]], leader, 0, logs
        )
        if leader is not None:
            logs[leader].assign_epoch(0)
        return p

    # -- data-change notification for long-polling fetches ---------------------------------

    def notify_data(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_for_data(self, timeout: float) -> None:
        """Return when any log changes or after ``timeout`` seconds."""
        if timeout <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fut, timeout)

    # -- topics ----------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
        assignments: Mapping[int, list[int]] | None = None,
    ) -> TopicState:
        if name in self.topics:
            raise EmbeddedClusterError(f"topic {name!r} already exists")
        self._require_controller()
        ids = sorted(self.brokers)
        if assignments is None:
            if not 1 <= replication_factor <= len(ids):
                raise EmbeddedClusterError(
                    f"replication factor {replication_factor} with {len(ids)} brokers"
                )
            if partitions < 1:
                raise EmbeddedClusterError(f"{partitions} partitions")
            start = len(self.topics)
            assignments = {
                p: [ids[(start + p + r) % len(ids)] for r in range(replication_factor)]
                for p in range(partitions)
            }
        parts = {p: self._new_partition(name, p, replicas) for p, replicas in assignments.items()}
        topic = TopicState(name, uuid.uuid4(), parts, {**DEFAULT_TOPIC_CONFIG, **(config or {})})
        self.topics[name] = topic
        self.topic_id_order[topic.topic_id] = len(self.topic_id_order)
        log.info("topic_created", topic=name, partitions=len(parts), topic_id=str(topic.topic_id))
        self.publish()
        return topic

    def set_topic_config(self, name: str, changes: Mapping[str, str | None]) -> None:
        """Set (or, with None, reset to default) topic configs.

        Enabling ``unclean.leader.election.enable`` makes the controller elect a leader for
        every leaderless partition of the topic from its live replicas, as Kafka does.
        """
        t = self.topics.get(name)
        if t is None:
            raise EmbeddedClusterError(f"unknown topic {name!r}")
        for key, value in changes.items():
            if value is None:
                if key in DEFAULT_TOPIC_CONFIG:
                    t.config[key] = DEFAULT_TOPIC_CONFIG[key]
                else:
                    t.config.pop(key, None)
            else:
                t.config[key] = value
        log.info("topic_config_changed", topic=name, changes=dict(changes))
        if t.unclean_election and self.raft is None:
            changed = False
            for p in t.partitions.values():
                changed = self.elect_any_leader(p) or changed
            if changed:
                self.publish()

    def create_partitions(
        self, name: str, count: int, assignments: list[list[int]] | None = None
    ) -> None:
        """Grow ``name`` to ``count`` partitions (new ones start at epoch 0)."""
        t = self.topics.get(name)
        if t is None:
            raise EmbeddedClusterError(f"unknown topic {name!r}")
        current = len(t.partitions)
        if count <= current:
            raise EmbeddedClusterError(f"topic {name!r} already has {current} partitions")
        self._require_controller()
        ids = sorted(self.brokers)
        rf = len(t.partitions[0].replicas)
        for i, idx in enumerate(range(current, count)):
            replicas = (
                assignments[i] if assignments else [ids[(idx + r) % len(ids)] for r in range(rf)]
            )
            if any(r not in self.brokers for r in replicas):
                raise EmbeddedClusterError(f"unknown broker in {replicas}")
            t.partitions[idx] = self._new_partition(name, idx, replicas)
        self.publish()

    def delete_topic(self, name: str) -> None:
        if name not in self.topics:
            raise EmbeddedClusterError(f"unknown topic {name!r}")
        self._require_controller()
        del self.topics[name]
        if self.groups is not None:
            self.groups.topic_deleted(name)
        from epochguard.testing.embedded.consumer_groups import consumer_coordinator

        modern = consumer_coordinator(self)
        if modern is not None:
            modern.topic_deleted(name)
        log.info("topic_deleted", topic=name)
        self.publish()
        self.notify_data()

    # -- metadata propagation --------------------------------------------------------------

    @property
    def metadata_version(self) -> int:
        """Version of the controller's latest published metadata."""
        return self._image_version

    def image(self) -> MetadataImage:
        topics: dict[str, TopicView] = {}
        for t in self.topics.values():
            parts = {
                p.index: PartitionView(
                    -1 if p.leader is None else p.leader,
                    p.leader_epoch,
                    tuple(p.replicas),
                    tuple(p.isr),
                    tuple(r for r in p.replicas if not self.brokers[r].alive),
                    tuple(p.elr),
                    tuple(p.last_known_elr),
                )
                for p in t.partitions.values()
            }
            topics[t.name] = TopicView(t.name, t.topic_id, parts)
        return MetadataImage(self._image_version, topics)

    def older_incarnation(self, topic_id: uuid.UUID, than: uuid.UUID) -> bool:
        """Whether the topic ``topic_id`` was created before ``than`` (ids this cluster did
        not create count as older)."""
        order = self.topic_id_order
        return order.get(topic_id, -1) < order.get(than, -1)

    def publish(self) -> None:
        """Send the controller's new metadata to every live broker (after its delay)."""
        self._image_version += 1
        image = self.image()
        for b in self.brokers.values():
            if not b.alive:
                continue
            delay = self.faults.metadata_delay(b.node_id)
            if delay <= 0 or self.loop is None:
                self.apply_image(b.node_id, image)
            else:
                self.loop.call_later(delay, self._deliver_image, b.node_id, b.restarts, image)

    def _deliver_image(self, broker_id: int, restarts: int, image: MetadataImage) -> None:
        """A delayed image arrives. A broker that stopped and started since it was sent
        never sees it: it learns the controller's metadata of its new run (a restarted
        broker must not take an image where it led before its stop as its own view)."""
        if self.brokers[broker_id].restarts == restarts:
            self.apply_image(broker_id, image)

    def apply_image(self, broker_id: int, image: MetadataImage) -> None:
        """A broker learns ``image``: leaders stamp their epoch, followers re-sync."""
        b = self.brokers[broker_id]
        if not b.alive or image.version <= b.view.version:
            return
        old = b.view
        b.view = image
        for t in image.topics.values():
            state = self.topics.get(t.name)
            if state is None or state.topic_id != t.topic_id:
                continue
            for idx, pv in t.partitions.items():
                if broker_id not in pv.replicas:
                    continue
                p = state.partitions[idx]
                before = old.partition(t.name, idx)
                changed = (
                    before is None
                    or before.leader_epoch != pv.leader_epoch
                    or before.leader != pv.leader
                )
                if changed:
                    p.failed_followers.discard(broker_id)  # a new fetcher state
                if pv.leader == broker_id:
                    p.logs[broker_id].assign_epoch(pv.leader_epoch)
                    if changed:
                        # A new leader: followers that already know it check for divergence
                        # (none has yet: a follower checks once the leader has taken over).
                        self.replicate(p)
                elif changed and pv.leader >= 0:
                    self.sync_follower(p, broker_id)
        self.notify_data()

    # -- replication -----------------------------------------------------------------------

    def _follower_ready(self, p: PartitionState, follower: int) -> bool:
        b = self.brokers[follower]
        if not b.alive or b.replication_paused or follower in p.failed_followers:
            return False
        pv = b.view.partition(p.topic, p.index)
        return pv is not None and pv.leader == p.leader and pv.leader_epoch == p.leader_epoch

    def sync_follower(self, p: PartitionState, follower: int) -> None:
        """KIP-101/KIP-279 truncation of ``follower`` against the leader, then catch-up."""
        if p.leader is None or p.leader == follower or not self._follower_ready(p, follower):
            return
        leader_log = p.logs[p.leader]
        flog = p.logs[follower]
        leader_view = self.brokers[p.leader].view.partition(p.topic, p.index)
        if leader_view is None or leader_view.leader_epoch != p.leader_epoch:
            return  # the leader has not taken over yet; it re-syncs followers when it does
        f_epoch = flog.latest_epoch
        l_epoch, l_end = leader_log.end_offset_for_epoch(f_epoch)
        if l_end == UNDEFINED_EPOCH_OFFSET:
            target = min(flog.high_watermark, leader_log.log_end_offset)
        elif l_epoch == f_epoch:
            target = min(l_end, flog.log_end_offset)
        else:
            _, f_end = flog.end_offset_for_epoch(l_epoch)
            target = min(l_end, flog.log_end_offset if f_end < 0 else f_end)
        old_leo = flog.log_end_offset
        flog.truncate_to(target)
        self.replica_shortened(p, follower, old_leo, "replica_truncated")
        p.synced_followers.add(follower)
        self._catch_up(p, follower)

    def _catch_up(self, p: PartitionState, follower: int) -> None:
        assert p.leader is not None
        leader_log = p.logs[p.leader]
        flog = p.logs[follower]
        # Raft: the last term it held before this fetch (the new ones' entries come with it).
        term = flog.latest_epoch
        if flog.log_end_offset < leader_log.log_start_offset:
            flog.reset(leader_log.log_start_offset)
        batches = leader_log.batches_from(flog.log_end_offset)
        if batches and flog.log_end_offset == flog.log_start_offset:
            # An empty log starting inside the leader's first batch (a log start moved by
            # DeleteRecords is not a batch boundary): batches are atomic, so start the log
            # at the batch, as Kafka's fetcher does on UnexpectedAppendOffsetException.
            base = int.from_bytes(batches[0][0:8], "big", signed=True)
            if base < flog.log_end_offset:
                flog.reset(base)
        if batches and int.from_bytes(batches[0][0:8], "big", signed=True) < flog.log_end_offset:
            # The follower truncated to a log start the leader's DeleteRecords left inside a
            # batch, with records of its own below it: Kafka's appendAsFollower throws
            # UnexpectedAppendOffsetException, which Partition only recovers from on an empty
            # log, and the fetcher marks the partition failed. It stays out of sync.
            self._fail_follower(p, follower, batches[0], flog.log_end_offset)
            return
        for batch in batches:
            flog.append_replicated(batch)
        if flog.log_start_offset < leader_log.log_start_offset:
            flog.delete_before(leader_log.log_start_offset)
        if self.raft is not None:
            flog.adopt_epochs(leader_log)
            if flog.latest_epoch > term:
                # It appended a new term's configuration batch, written with a flush (with
                # the new term's records or without).
                flog.flush()
        if follower not in p.isr and flog.log_end_offset == leader_log.log_end_offset:
            if self.raft is None and self.isr_join_delay_s > 0 and self.loop is not None:
                self._isr_join_later(p, follower)
                self._update_hw(p)
            else:
                self._expand_isr(p, follower)
        else:
            self._update_hw(p)

    def _isr_join_later(self, p: PartitionState, follower: int) -> None:
        """The caught-up ``follower`` joins the ISR after ``isr_join_delay_s`` if it is
        still caught up with the same leader epoch, in the same run (Kafka's
        Partition.maybeExpandIsr: the leader adds a follower whose fetch reached its high
        watermark and the start of its epoch, through the controller)."""
        assert self.loop is not None
        t = self.topics.get(p.topic)
        if t is None:
            return
        due = (t.topic_id, p.index, follower, p.leader_epoch, self.brokers[follower].restarts)
        if due in self._isr_joins_due:
            return
        self._isr_joins_due.add(due)
        self.loop.call_later(self.isr_join_delay_s, self._isr_join_due, p, due)

    def _isr_join_due(self, p: PartitionState, due: tuple[uuid.UUID, int, int, int, int]) -> None:
        self._isr_joins_due.discard(due)
        topic_id, index, follower, leader_epoch, restarts = due
        t = self.topics.get(p.topic)
        if t is None or t.topic_id != topic_id or t.partitions.get(index) is not p:
            return  # deleted (or re-created) meanwhile
        if (
            follower in p.isr
            or p.leader is None
            or p.leader_epoch != leader_epoch
            or self.brokers[follower].restarts != restarts
            or not self._follower_ready(p, follower)
            or p.logs[follower].log_end_offset != p.logs[p.leader].log_end_offset
        ):
            return  # a newer epoch or run catches up on its own and joins after it
        self._expand_isr(p, follower)

    def _expand_isr(self, p: PartitionState, follower: int) -> None:
        # Appended: Kafka's leader sends the ISR it has plus the follower, and the controller
        # keeps the order it is given.
        p.isr.append(follower)
        if follower in p.elr:
            p.elr.remove(follower)
        if len(p.isr) >= self._min_isr(p):
            p.elr.clear()
            p.last_known_elr.clear()
        log.info("isr_expanded", topic=p.topic, partition=p.index, broker=follower, isr=list(p.isr))
        self._update_hw(p)
        self.publish()

    def _fail_follower(
        self, p: PartitionState, follower: int, batch: bytes, log_end_offset: int
    ) -> None:
        p.failed_followers.add(follower)
        log.warning(
            "replica_fetch_failed",
            topic=p.topic,
            partition=p.index,
            broker=follower,
            reason="unexpected_append_offset",
            batch_base_offset=int.from_bytes(batch[0:8], "big", signed=True),
            log_end_offset=log_end_offset,
        )
        if follower in p.isr and len(p.isr) > 1:
            p.isr.remove(follower)
            self.publish()

    def replicate(self, p: PartitionState) -> None:
        """Copy the leader's new batches to every follower that follows it now; one that has
        not checked its log against this leader (``synced_followers``) checks for divergence
        by epoch first, as every follower of a new leader does in Kafka."""
        if p.leader is None:
            return
        for r in p.replicas:
            if r != p.leader and self._follower_ready(p, r):
                if r in p.isr and r in p.synced_followers:
                    self._catch_up(p, r)
                else:
                    self.sync_follower(p, r)
        self._update_hw(p)

    def _update_hw(self, p: PartitionState) -> None:
        """HW = min LEO over the ISR, counting only followers that follow this leader now.

        An ISR member that has not learnt about the current epoch yet (metadata delay), or
        has not checked its log against it yet (the new leader had not taken over when it
        learnt), has not fetched from this leader, so the high watermark waits for it, as in
        Kafka: a log end offset of records another leader wrote must not count.
        """
        if p.leader is None:
            return
        llog = p.logs[p.leader]
        if self.raft is not None:
            # Raft: what a majority of the replicas following this leader hold.
            following = [r for r in p.replicas if r != p.leader and self._follower_ready(p, r)]
            majority = self.raft.majority_end(p, following)
            hw = llog.high_watermark if majority is None else majority
        else:
            hw = llog.log_end_offset
            for r in p.isr:
                if r == p.leader:
                    continue
                if self._follower_ready(p, r) and r in p.synced_followers:
                    hw = min(hw, p.logs[r].log_end_offset)
                else:
                    hw = min(hw, llog.high_watermark)
        if self.raft is None and self.elr_enabled and len(p.isr) < self._min_isr(p):
            # KIP-966: nothing is committed while the ISR is below min.insync.replicas.
            hw = llog.high_watermark
        if hw > llog.high_watermark:
            llog.high_watermark = hw
        for r in p.replicas:
            if r != p.leader and r in p.isr and self._follower_ready(p, r):
                flog = p.logs[r]
                flog.high_watermark = min(llog.high_watermark, flog.log_end_offset)
        self.notify_data()

    # -- controller: brokers and elections -------------------------------------------------

    def _min_isr(self, p: PartitionState) -> int:
        t = self.topics.get(p.topic)
        return t.min_insync_replicas if t is not None else 1

    def _shrink_isr(self, p: PartitionState, broker_id: int) -> None:
        """A broker shut down: it leaves the ISR (into the ELR below min ISR, KIP-966)."""
        if broker_id not in p.isr:
            return
        if not self.elr_enabled:
            # Without ELR, KRaft keeps the last member in the ISR.
            if len(p.isr) > 1:
                p.isr.remove(broker_id)
            return
        p.isr.remove(broker_id)
        if len(p.isr) < self._min_isr(p) and broker_id not in p.elr:
            p.elr.append(broker_id)

    def preferred_read_replica(
        self, p: PartitionState, client_rack: str, fetch_offset: int
    ) -> int | None:
        """KIP-392, as Kafka's ReplicaManager with RackAwareReplicaSelector: among the leader
        and the in-sync followers that hold ``fetch_offset``, one in the client's rack, the
        leader if it is there, else the most caught-up. ``None``: the leader serves it."""
        if self.replica_selector != RACK_AWARE_REPLICA_SELECTOR or not client_rack:
            return None
        leader = p.leader
        if leader is None:
            return None
        candidates = []
        for r in p.isr:
            log = p.logs.get(r)
            b = self.brokers.get(r)
            if r == leader or log is None or b is None or not b.alive:
                continue
            if log.log_start_offset <= fetch_offset <= log.log_end_offset:
                candidates.append((r, b.rack, log.log_end_offset))
        if self.brokers[leader].rack == client_rack:
            return None
        same_rack = [c for c in candidates if c[1] == client_rack]
        if not same_rack:
            return None
        return max(same_rack, key=lambda c: (c[2], -c[0]))[0]

    def eligible_leaders(self, p: PartitionState) -> list[int]:
        """Clean-election candidates: live ISR members, else live ELR members, in the
        order of the replica assignment, as Kafka's controller tries them
        (PartitionChangeBuilder.electAnyLeader)."""
        in_sync = [r for r in p.replicas if r in p.isr and self.brokers[r].alive]
        if in_sync or not self.elr_enabled:
            return in_sync
        return [r for r in p.replicas if r in p.elr and self.brokers[r].alive]

    def _make_leader(self, p: PartitionState, leader: int, unclean: bool) -> None:
        if unclean:
            # The new leader's log is the truth; everyone else must re-sync.
            p.isr[:] = [leader]
            p.elr.clear()
        elif leader not in p.isr:
            p.isr[:] = [leader]  # from the ELR, which only stands in for an empty ISR
            if leader in p.elr:
                p.elr.remove(leader)
        p.last_known_elr.clear()
        self._set_leader(p, leader)

    def elect_any_leader(self, p: PartitionState) -> bool:
        """The controller's unclean path for a leaderless partition: ISR/ELR, else any.
        Raft has none: a leaderless partition lacks a majority, which no order changes."""
        if p.leader is not None or self.raft is not None:
            return False
        eligible = self.eligible_leaders(p)
        if eligible:
            self._make_leader(p, eligible[0], unclean=False)
            return True
        alive = [r for r in p.replicas if self.brokers[r].alive]
        if not alive:
            return False
        self._make_leader(p, alive[0], unclean=True)
        return True

    def replica_shortened(
        self, p: PartitionState, broker: int, before: int, event: str, level: int = logging.INFO
    ) -> None:
        """Log ``event`` and tell the truncation listeners when ``broker``'s replica of ``p``
        now ends below ``before``."""
        end = p.logs[broker].log_end_offset
        if end >= before:
            return
        log.log(
            level,
            event,
            topic=p.topic,
            partition=p.index,
            broker=broker,
            from_offset=before,
            to_offset=end,
        )
        for cb in self.on_truncate:
            cb(p.topic, p.index, broker, end)

    def stop_broker(self, broker_id: int) -> None:
        b = self.broker(broker_id)
        if not b.alive:
            return
        b.alive = False
        b.fetch_sessions.clear()
        for t in self.topics.values():
            for p in t.partitions.values():
                if broker_id not in p.replicas:
                    continue
                if self.raft is not None:
                    self.raft.broker_stopped(p, broker_id)
                    self._update_hw(p)
                    continue
                self._shrink_isr(p, broker_id)
                if p.leader == broker_id:
                    candidates = self.eligible_leaders(p)
                    if candidates:
                        self._make_leader(p, candidates[0], unclean=False)
                    else:
                        self._set_leader(p, None)
                        p.last_known_elr[:] = p.elr
                self._update_hw(p)
        log.info("broker_stopped", broker=broker_id)
        self.publish()

    def start_broker(self, broker_id: int) -> None:
        b = self.broker(broker_id)
        if b.alive:
            return
        b.alive = True
        b.view = EMPTY_IMAGE
        b.restarts += 1
        for t in self.topics.values():
            for p in t.partitions.values():
                if broker_id not in p.replicas or p.leader is not None:
                    continue
                if self.raft is not None:
                    self.raft.broker_started(p)
                elif broker_id in self.eligible_leaders(p):
                    self._make_leader(p, broker_id, unclean=False)
                elif t.unclean_election:
                    self._make_leader(p, broker_id, unclean=True)
        log.info("broker_started", broker=broker_id)
        self.publish()

    def pause_replication(self, broker_id: int) -> None:
        b = self.broker(broker_id)
        if b.replication_paused:
            return
        b.replication_paused = True
        changed = False
        for t in self.topics.values():
            for p in t.partitions.values():
                if p.leader != broker_id and broker_id in p.isr and len(p.isr) > 1:
                    p.isr.remove(broker_id)
                    changed = True
        if changed:
            self.publish()

    def resume_replication(self, broker_id: int) -> None:
        b = self.broker(broker_id)
        if not b.replication_paused:
            return
        b.replication_paused = False
        for t in self.topics.values():
            for p in t.partitions.values():
                if broker_id in p.replicas:
                    self.sync_follower(p, broker_id)

    def _set_leader(self, p: PartitionState, leader: int | None) -> None:
        p.leader = leader
        p.leader_epoch += 1
        p.synced_followers.clear()
        log.info(
            "leader_elected",
            topic=p.topic,
            partition=p.index,
            leader=leader,
            leader_epoch=p.leader_epoch,
            isr=list(p.isr),
        )

    def elect_leader(
        self,
        topic: str,
        partition: int,
        broker_id: int,
        unclean: bool,
        failed_attempts: int = 0,
    ) -> None:
        p = self.partition(topic, partition)
        b = self.broker(broker_id)
        if broker_id not in p.replicas:
            raise EmbeddedClusterError(
                f"broker {broker_id} is not a replica of {topic}-{partition}"
            )
        if not b.alive:
            raise EmbeddedClusterError(f"broker {broker_id} is not running")
        if self.raft is not None:
            self.raft.elect(p, broker_id, unclean, failed_attempts)
            self._update_hw(p)
            self.publish()
            return
        if failed_attempts:
            raise EmbeddedClusterError(
                "failed election attempts take terms of their own in a Raft-term cluster "
                "only (EmbeddedCluster(epochs='raft')); Kafka's controller makes none"
            )
        clean = broker_id in p.isr or (not p.isr and broker_id in p.elr)
        if not unclean and not clean:
            raise EmbeddedClusterError(
                f"broker {broker_id} is not in the ISR {p.isr} (or ELR {p.elr}) of "
                f"{topic}-{partition}; pass unclean=True"
            )
        self._make_leader(p, broker_id, unclean=not clean)
        self.publish()

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        p = self.partition(topic, partition)
        if p.leader is None:
            raise EmbeddedClusterError(f"{topic}-{partition} has no leader")
        llog = p.logs[p.leader]
        if before_offset == -1:
            before_offset = llog.high_watermark
        if before_offset > llog.high_watermark:
            raise EmbeddedClusterError(
                f"offset {before_offset} is above the high watermark {llog.high_watermark}"
            )
        # A follower learns the new log start from its next fetch response (Kafka's
        # ReplicaFetcherThread.processPartitionData), so one that is not fetching from this
        # leader (stopped, paused, on another epoch) keeps its old log start and epoch cache
        # until it catches up: if elected uncleanly first, it still serves those records.
        llog.delete_before(before_offset)
        for r in p.replicas:
            if r != p.leader and self._follower_ready(p, r):
                p.logs[r].delete_before(before_offset)
        return llog.log_start_offset

    # -- producing -------------------------------------------------------------------------

    def write_txn_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> bool:
        """Append a COMMIT / ABORT marker on the partition's leader, then replicate it (the
        coordinator's WriteTxnMarkers). False when it cannot be written now: no leader, a
        leader that has not taken over yet, or an ISR below min.insync.replicas (the
        coordinator retries). A deleted partition needs no marker."""
        t = self.topics.get(topic)
        p = t.partitions.get(partition) if t is not None else None
        if t is None or p is None:
            return True
        if p.leader is None:
            return False
        view = self.brokers[p.leader].view.partition(topic, partition)
        if view is None or view.leader_epoch != p.leader_epoch:
            return False
        error = self.append_txn_marker(
            p, p.leader, view.leader_epoch, producer_id, producer_epoch, commit, coordinator_epoch
        )
        # A fenced marker is given up, as Kafka's coordinator does; a short ISR is retried.
        return error != ErrorCode.NOT_ENOUGH_REPLICAS

    def append_txn_marker(
        self,
        p: PartitionState,
        broker_id: int,
        leader_epoch: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> int:
        """Append a marker on ``broker_id``'s replica as leader, with Kafka's checks (an
        epoch older than the producer's, a coordinator epoch older than the last marker's,
        an ISR below min.insync.replicas: markers are written with acks=all)."""
        from epochguard.testing.embedded.records import build_control_batch

        entry = p.logs[broker_id].producer(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if entry is not None and coordinator_epoch < entry.coordinator_epoch:
            return ErrorCode.TRANSACTION_COORDINATOR_FENCED
        if len(p.isr) < self._min_isr(p):
            return ErrorCode.NOT_ENOUGH_REPLICAS
        batch = build_control_batch(
            producer_id, producer_epoch, commit=commit, coordinator_epoch=coordinator_epoch
        )
        self.append(p, broker_id, batch, leader_epoch)
        self.flush_acknowledged(p)
        return ErrorCode.NONE

    def flush_acknowledged(self, p: PartitionState) -> None:
        """Raft: an acks=all write is on disk on the leader and on every follower that has
        it now (followers replicating from the leader)."""
        if self.raft is None or p.leader is None:
            return
        for r in p.replicas:
            if r == p.leader or self._follower_ready(p, r):
                p.logs[r].flush()

    def flush(self, p: PartitionState) -> None:
        """Every running replica writes what it holds to disk (a broker's periodic flush)."""
        for r in p.replicas:
            if self.brokers[r].alive:
                p.logs[r].flush()

    def append(
        self, p: PartitionState, broker_id: int, records: bytes | memoryview, leader_epoch: int
    ) -> tuple[int, int]:
        """Append on ``broker_id``'s replica as leader at ``leader_epoch``, then replicate."""
        base, last = p.logs[broker_id].append_as_leader(records, leader_epoch)
        if broker_id == p.leader and leader_epoch == p.leader_epoch:
            self.replicate(p)
        else:
            self.notify_data()
        return base, last
