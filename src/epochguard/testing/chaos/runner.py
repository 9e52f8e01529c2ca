"""One runner applies a :class:`~epochguard.testing.chaos.schedule.Schedule` to an
EmbeddedCluster while client adapters consume, and hands the :class:`History` to the oracle.

Each consumer (group member) polls in its own thread, as applications do (a group join
blocks until every member joins); the runner thread applies one step, snapshots every
partition leader's log, and waits ``step_gap`` seconds before the next. After the last step
it heals the cluster (faults cleared, brokers started, replication resumed), writes one end
marker per partition and waits until every application has received every marker.

A schedule with transactional producers (``Schedule.transactions``) writes through a
:class:`~epochguard.testing.chaos.transactions.TxnDriver`, its consumers read committed
records only, the cluster aborts transactions left open within the run
(``transaction.max.timeout.ms`` :data:`~.transactions.TXN_TIMEOUT_MS`), and before the end
markers the runner waits until the coordinator holds no transaction open: one still open in
a log after that is hanging, and only a report and an abort let the consumers reach the end.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import attrs
from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.testing.chaos.oracle import (
    Committing,
    Decided,
    Delivered,
    Event,
    History,
    LogSnapshot,
    Recreated,
    Stalled,
    Started,
    Verdict,
    judge,
)
from epochguard.testing.chaos.schedule import (
    DeleteRecords,
    Elect,
    FetchFault,
    Idle,
    Join,
    Leave,
    MetadataDelay,
    NetFault,
    PauseReplication,
    Produce,
    RecreateTopic,
    RestartConsumer,
    ResumeReplication,
    Schedule,
    StartBroker,
    Step,
    StopBroker,
    TxnEnd,
    TxnProduce,
)
from epochguard.testing.chaos.transactions import (
    CONSUMER_TXN_MAX_TIMEOUT_MS,
    TXN_TIMEOUT_MS,
    EmbeddedTransactions,
    TxnDriver,
    coordinator_open,
    read_batches,
    settle_markers,
)
from epochguard.testing.embedded.cluster import EmbeddedCluster
from epochguard.testing.embedded.state import DEFAULT_ISR_JOIN_DELAY_S, EmbeddedClusterError
from epochguard.testing.embedded.transactions import MAX_TRANSACTION_TIMEOUT_MS
from epochguard.testing.netfault import FaultProxy

__all__ = [
    "ChaosClient",
    "ChaosClientError",
    "ClientFactory",
    "MemberContext",
    "RunResult",
    "run_many",
    "run_schedule",
]

log = get_logger(__name__)

#: Trail entries shown per tracker in a stall's report (with ``--trail``).
TRAIL_SHOWN = 60

TOPIC = "chaos"

#: What a client may take to give up a connection that never answers (kafka-python and so
#: EpochConsumer: 10 s for the set-up's ApiVersions, whatever ``request_timeout_ms`` says).
CONNECTION_SETUP_TIMEOUT_S = 10.0


@attrs.frozen
class MemberContext:
    """What a client adapter needs to start one consumer of a run."""

    bootstrap: str
    topic: str
    partitions: int
    policy: str
    member: int
    group_id: str  # commits go to this group, unless the client keeps them in store_path
    store_path: str | None  # a SqliteOffsetStore file (single consumer, offsets="store"):
    # EpochConsumer's offset_store; clients without one commit to the group instead
    subscribe: bool  # a consumer group (subscribe) rather than assign()
    emit: Callable[[Any], None]  # takes an event with step=-1; the runner stamps it
    app: str = "app"
    isolation_level: str = "read_uncommitted"  # read_committed with transactional producers
    #: the brokers' transaction.max.timeout.ms as the consumer should believe it
    transaction_max_timeout_ms: int = 900_000

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


class ChaosClient(Protocol):
    """One consumer under chaos. Every method runs on the member's own thread."""

    def poll_once(self) -> None:
        """Poll once (briefly), emit what it delivered or reported, handle errors as the
        policy says (seek after a report under ``raise``), commit what it delivered."""

    def close(self) -> None: ...


ClientFactory = Callable[[MemberContext], ChaosClient]


@attrs.frozen
class RunResult:
    schedule: Schedule
    client: str
    history: History
    verdict: Verdict
    seconds: float
    step_log: tuple[str, ...]
    #: the cluster or the runner raised (a traceback): the run was not judged, and its
    #: empty verdict says nothing of the client
    harness_error: str | None = None

    @property
    def ok(self) -> bool:
        """The run was judged and the client kept every promise."""
        return self.harness_error is None and self.verdict.ok

    def describe(self) -> str:
        steps = "\n".join(f"    {i}: {s}" for i, s in enumerate(self.step_log))
        outcome = (
            self.verdict.describe()
            if self.harness_error is None
            else f"not judged, the harness failed:\n{self.harness_error}"
        )
        return (
            f"schedule seed {self.schedule.seed} with {self.client}: "
            f"{outcome}\n  steps as applied:\n{steps}\n"
            f"  replay:\n{self.schedule.to_code()}"
        )


class _Member(threading.Thread):
    def __init__(self, run: _Run, member: int, app: str, factory: ClientFactory) -> None:
        super().__init__(daemon=True, name=f"chaos-member-{app}-{member}")
        self.run_ = run
        self.member = member
        self.app = app
        self.factory = factory
        self.stop_flag = threading.Event()
        self.started_ok = threading.Event()
        self.error: BaseException | None = None
        self.trace = ""
        self.client: ChaosClient | None = None

    def run(self) -> None:
        r = self.run_
        ctx = MemberContext(
            bootstrap=r.bootstrap,
            topic=r.topic,
            partitions=r.schedule.partitions,
            policy=r.schedule.policy,
            member=self.member,
            group_id=f"chaos-{self.app}",
            store_path=(
                os.path.join(r.tmpdir, f"{self.app}.sqlite")
                if r.schedule.offsets == "store"
                else None
            ),
            subscribe=r.schedule.members > 1,
            emit=lambda ev: r.emit(ev, self.app, self.member),
            app=self.app,
            isolation_level="read_committed" if r.schedule.read_committed else "read_uncommitted",
            transaction_max_timeout_ms=r.consumer_txn_max_timeout_ms,
        )
        client: ChaosClient | None = None
        try:
            client = self.client = self.factory(ctx)
            self.started_ok.set()
            while not self.stop_flag.is_set():
                client.poll_once()
        except BaseException as exc:  # reported by the runner as the run's failure
            self.error = exc
            self.trace = traceback.format_exc()
            log.warning("chaos_member_failed", member=self.member, error=repr(exc))
        finally:
            self.started_ok.set()
            if client is not None:
                try:
                    client.close()
                except Exception as exc:  # a close that fails is not the oracle's business
                    log.info("chaos_member_close_failed", error=repr(exc))

    def halt(self, timeout: float = 15.0) -> None:
        self.stop_flag.set()
        self.join(timeout)


class _Run:
    #: The topic every member consumes (the real-Kafka runner names one per schedule).
    topic = TOPIC
    #: What consumers of a transactional run take the brokers' transaction.max.timeout.ms
    #: for, and how long the end waits for the coordinator to close what is left open.
    consumer_txn_max_timeout_ms = CONSUMER_TXN_MAX_TIMEOUT_MS
    txn_settle_s = 10.0

    def __init__(
        self,
        schedule: Schedule,
        cluster: Any,  # EmbeddedCluster here, ApacheKafkaCluster in chaos/apache.py
        clients: Mapping[str, ClientFactory],
        tmpdir: str,
        step_gap: float,
        proxy: FaultProxy | None = None,
    ) -> None:
        self.schedule = schedule
        self.cluster = cluster
        self.proxy = proxy
        self.clients = clients
        self.tmpdir = tmpdir
        self.step_gap = step_gap
        self.lock = threading.Lock()
        self.events: list[Event] = []
        self.snapshots: list[dict[int, LogSnapshot | None]] = []
        self.values: dict[str, set[bytes]] = {app: set() for app in clients}
        self.members: dict[str, list[_Member]] = {app: [] for app in clients}
        self.next_member = 0
        self.seq = 0
        self.step_log: list[str] = []
        self.txn: TxnDriver | None = None
        #: apps whose member raised, with the error, when the run goes on without them
        #: (the real-Kafka runner's rule): the end does not wait for them
        self.crashed: dict[str, str] = {}
        #: set when the members are closed at the end: their events are no longer judged
        self.closing = False

    @property
    def bootstrap(self) -> str:
        """Where consumers bootstrap: through the fault proxy when the run has one."""
        if self.proxy is not None:
            return self.proxy.bootstrap_servers
        bootstrap: str = self.cluster.all_bootstrap_servers
        return bootstrap

    def result(self, final: dict[int, LogSnapshot | None], started: float) -> RunResult:
        """The run as the oracle's History, judged for the first client."""
        history = History(
            tuple(self.events),
            tuple(self.snapshots),
            {p: s for p, s in final.items() if s is not None},
            self.schedule.policy,
            read_committed=self.schedule.read_committed,
            committed_values=frozenset(self.txn.committed_values if self.txn else ()),
        )
        first = next(iter(self.clients))
        return RunResult(
            self.schedule,
            first,
            history,
            judge(history, first),
            time.monotonic() - started,
            tuple(self.step_log),
        )

    # -- events ------------------------------------------------------------------------------

    def emit(self, ev: Any, app: str, member: int) -> None:
        with self.lock:
            if self.closing:
                # The run ended at the close (see close_members): what members do while
                # they leave one by one is not judged.
                return
            ev = attrs.evolve(ev, step=max(0, len(self.snapshots) - 1), app=app, member=member)
            self.events.append(ev)
            if isinstance(ev, Delivered):
                self.values[app].add(ev.value)

    # -- members -----------------------------------------------------------------------------

    def start_member(self, app: str, member: int | None = None) -> None:
        if member is None:
            member = self.next_member
            self.next_member += 1
        self.emit(Started(member, 0), app, member)
        m = _Member(self, member, app, self.clients[app])
        self.members[app].append(m)
        m.start()
        m.started_ok.wait(30)

    def stop_member(self, app: str, m: _Member) -> None:
        m.halt()
        self.members[app].remove(m)

    def alive(self, app: str) -> list[_Member]:
        return [m for m in self.members[app] if m.is_alive()]

    # -- the cluster -------------------------------------------------------------------------

    def snapshot(self) -> dict[int, LogSnapshot | None]:
        from kafka.record.default_records import DefaultRecordBatch

        read_committed = self.schedule.read_committed

        def snap() -> dict[int, LogSnapshot | None]:
            out: dict[int, LogSnapshot | None] = {}
            state = self.cluster.state
            held_open: dict[int, frozenset[int]] = {}
            if read_committed:
                # Markers the coordinator can write now are written first (its timer would,
                # within 0.1 s): a marker written between two snapshots and lost to the
                # next step's unclean election would leave no trace of a commit that a
                # consumer may have read.
                settle_markers(state)
                held_open = coordinator_open(state, TOPIC)
            for p in range(self.schedule.partitions):
                try:
                    part = state.partition(TOPIC, p)
                except EmbeddedClusterError:
                    out[p] = None
                    continue
                if part.leader is None:
                    out[p] = None
                    continue
                log_ = part.logs[part.leader]
                if read_committed:
                    contents = read_batches(DefaultRecordBatch(raw) for raw in log_.batches_from(0))
                    out[p] = LogSnapshot(
                        log_.log_start_offset,
                        contents.records,
                        contents.transactional,
                        contents.markers,
                        held_open.get(p, frozenset()),
                    )
                    continue
                records: dict[int, tuple[int, bytes | None]] = {}
                for raw in log_.batches_from(0):
                    batch = DefaultRecordBatch(raw)
                    for rec in batch:
                        records[rec.offset] = (batch.leader_epoch, rec.value)
                out[p] = LogSnapshot(log_.log_start_offset, records)
            return out

        snapshots: dict[int, LogSnapshot | None] = self.cluster.call(snap)
        return snapshots

    def apply(self, step: Step) -> str:
        c = self.cluster
        brokers = c.broker_ids
        if isinstance(step, Produce):
            if c.leader(TOPIC, step.partition) is None:
                return f"{step!r}: no leader"
            values = self.new_values(step.count)
            c.append(TOPIC, step.partition, values, batch_size=step.batch)
            return f"{step!r}: {values[0]!r}..{values[-1]!r}"
        if isinstance(step, TxnProduce | TxnEnd):
            return self.apply_txn(step)
        if isinstance(step, Elect):
            leader = c.leader(TOPIC, step.partition)
            isr = sorted(c.isr(TOPIC, step.partition))  # by id: picks independent of ISR order
            if step.unclean:
                cands = [
                    b for b in c.replicas(TOPIC, step.partition) if b not in isr and c.is_running(b)
                ]
            else:
                cands = [b for b in isr if b != leader and c.is_running(b)]
            if not cands:
                return f"{step!r}: no candidate"
            b = cands[step.pick % len(cands)]
            if step.unclean and getattr(c, "epochs", "kafka") == "raft":
                return f"{step!r}: {self.power_cycle_all_but(step.partition, b)}"
            c.elect_leader(TOPIC, step.partition, b, unclean=step.unclean)
            return f"{step!r}: broker {b}, epoch {c.leader_epoch(TOPIC, step.partition)}"
        if isinstance(step, StopBroker):
            running = c.running_broker_ids
            if len(running) <= 1:
                return f"{step!r}: last broker"
            b = running[step.pick % len(running)]
            c.stop_broker(b)
            return f"{step!r}: broker {b}"
        if isinstance(step, StartBroker):
            stopped = [b for b in brokers if not c.is_running(b)]
            if not stopped:
                return f"{step!r}: none stopped"
            b = stopped[step.pick % len(stopped)]
            c.start_broker(b)
            return f"{step!r}: broker {b}"
        if isinstance(step, PauseReplication):
            leader = c.leader(TOPIC, step.partition)
            followers = [b for b in c.replicas(TOPIC, step.partition) if b != leader]
            b = followers[step.pick % len(followers)]
            c.pause_replication(b)
            return f"{step!r}: broker {b}"
        if isinstance(step, ResumeReplication):
            b = brokers[step.pick % len(brokers)]
            c.resume_replication(b)
            return f"{step!r}: broker {b}"
        if isinstance(step, MetadataDelay):
            b = brokers[step.pick % len(brokers)]
            c.set_metadata_delay(b, step.seconds)
            return f"{step!r}: broker {b}"
        if isinstance(step, FetchFault):
            if step.kind == "delay":
                c.faults.delay_responses(step.seconds, api_key=step.api, count=1)
            elif step.kind == "drop":
                c.faults.drop_responses(api_key=step.api, count=1)
            else:
                c.faults.disconnect_on(api_key=step.api, count=1)
            return repr(step)
        if isinstance(step, NetFault):
            return self.apply_net_fault(step)
        if isinstance(step, DeleteRecords):
            leader = c.leader(TOPIC, step.partition)
            if leader is None:
                return f"{step!r}: no leader"
            start = c.log_start_offset(TOPIC, step.partition, leader)
            hw = c.high_watermark(TOPIC, step.partition, leader)
            if hw <= start:
                return f"{step!r}: nothing to delete"
            before = start + max(1, round((hw - start) * step.fraction))
            c.delete_records(TOPIC, step.partition, before)
            return f"{step!r}: below {before}"
        if isinstance(step, RecreateTopic):
            if getattr(c, "epochs", "kafka") == "raft":
                # Raft-term brokers serve Fetch v11, which names topics: a re-created topic
                # is then read as the old one until metadata shows its new id (the consumer
                # guide's known limits), a matter of Fetch versions, not of terms.
                return f"{step!r}: not staged on Raft-term brokers (Fetch by name)"
            with self.lock:
                self.events.append(Recreated(max(0, len(self.snapshots) - 1)))
            c.delete_topic(TOPIC)
            c.create_topic(TOPIC, partitions=self.schedule.partitions, replication_factor=3)
            return f"{step!r}: topic id {c.topic_id(TOPIC)}"
        if isinstance(step, RestartConsumer):
            out = []
            for app in self.clients:
                alive = self.alive(app)
                if not alive:
                    continue
                m = alive[step.member % len(alive)]
                self.stop_member(app, m)
                self.start_member(app, m.member)
                out.append(f"{app} member {m.member}")
            return f"{step!r}: {', '.join(out)}"
        if isinstance(step, Join):
            for app in self.clients:
                self.start_member(app)
            return repr(step)
        if isinstance(step, Leave):
            out = []
            for app in self.clients:
                alive = self.alive(app)
                if len(alive) <= 1:
                    continue
                m = alive[step.member % len(alive)]
                self.stop_member(app, m)
                out.append(f"{app} member {m.member}")
            return f"{step!r}: {', '.join(out) or 'the last member stays'}"
        if isinstance(step, Idle):
            time.sleep(step.seconds)
            return repr(step)
        raise TypeError(f"not a chaos step: {step!r}")

    def power_cycle_all_but(self, partition: int, survivor: int) -> str:
        """Raft-term brokers have no unclean election; their way to lose records: every
        running replica but ``survivor`` loses power (the leader last, so that no new
        term's flush saves its unflushed records) and starts again."""
        c = self.cluster
        leader = c.leader(TOPIC, partition)
        others = [b for b in c.replicas(TOPIC, partition) if b != survivor and c.is_running(b)]
        others.sort(key=lambda b: b == leader)
        for b in others:
            c.stop_broker(b)
        for b in others:
            c.start_broker(b)
        return (
            f"brokers {others} lost power, broker {survivor} kept it: leader "
            f"{c.leader(TOPIC, partition)}, epoch {c.leader_epoch(TOPIC, partition)}"
        )

    def new_values(self, count: int) -> list[bytes]:
        """``count`` values never written before in this run."""
        values = []
        for _ in range(count):
            values.append(b"%d:%d" % (self.schedule.seed, self.seq))
            self.seq += 1
        return values

    def apply_txn(self, step: TxnProduce | TxnEnd) -> str:
        if self.txn is None:
            raise ValueError(f"{step!r} needs a schedule with transactions")
        if isinstance(step, TxnEnd):
            return f"{step!r}: {self.txn.end(step.producer, step.commit)}"
        values = self.new_values(step.count)
        return f"{step!r}: {self.txn.produce(step.producer, step.partition, values)}"

    def make_transactions(self) -> TxnDriver:
        """The run's transactional producers."""
        return EmbeddedTransactions(
            self.cluster, TOPIC, self.schedule.transactions, on_decided=self.decided
        )

    def committing(self, partition: int, values: frozenset[bytes]) -> None:
        """A commit of ``values`` is under way (a real broker's marker may be read before
        the commit call returns): an event among the consumers'."""
        with self.lock:
            self.events.append(Committing(partition, values, max(0, len(self.snapshots) - 1)))

    def decided(self, partition: int, commit: bool, values: frozenset[bytes]) -> None:
        """A marker was written (on the cluster's loop): an event among the consumers'."""
        with self.lock:
            self.events.append(Decided(partition, commit, values, max(0, len(self.snapshots) - 1)))

    def apply_net_fault(self, step: NetFault) -> str:
        if self.proxy is None:
            raise ValueError(f"{step!r} needs a run with a fault proxy")
        p = self.proxy
        brokers = p.broker_ids
        b = brokers[step.pick % len(brokers)]
        seconds = step.seconds
        if step.kind == "latency":
            p.set_latency(b, step.latency_s, jitter_s=step.latency_s / 2, seconds=seconds)
        elif step.kind == "bandwidth":
            p.set_bandwidth(b, step.bytes_per_s, seconds=seconds)
        elif step.kind == "cut":
            p.cut_answer(b, step.at_byte, api_key=step.api)
        elif step.kind == "blackhole":
            p.blackhole(b, seconds=seconds)
            p.reset(b)
        elif step.kind == "reset":
            p.reset(b)
        else:
            p.partition(b, seconds=seconds)
        return f"{step!r}: broker {b}"

    def create_topic(self) -> None:
        self.cluster.create_topic(TOPIC, partitions=self.schedule.partitions, replication_factor=3)

    def append(self, partition: int, values: list[bytes]) -> None:
        self.cluster.append(TOPIC, partition, values)

    def heal(self) -> None:
        c = self.cluster
        c.faults.clear()
        if self.proxy is not None:
            self.proxy.heal()
        for b in c.broker_ids:
            c.start_broker(b)
            c.resume_replication(b)
        c.settle()
        deadline = time.monotonic() + 10
        for p in range(self.schedule.partitions):
            while c.leader(TOPIC, p) is None:
                if time.monotonic() > deadline:
                    raise EmbeddedClusterError(f"p{p} has no leader after healing")
                time.sleep(0.02)

    def execute(self, end_timeout: float) -> None:
        s = self.schedule
        self.create_topic()
        if s.transactions:
            self.txn = self.make_transactions()
        # Taken outside the lock: a snapshot writes pending markers, whose events take it.
        first = self.snapshot()
        with self.lock:
            self.snapshots.append(first)
        for app in self.clients:
            for _ in range(s.members):
                self.start_member(app)
        for step in s.steps:
            try:
                self.step_log.append(self.apply(step))
            except EmbeddedClusterError as exc:  # e.g. electing a broker that just stopped
                self.step_log.append(f"{step!r}: refused ({exc})")
            snap = self.snapshot()
            with self.lock:
                self.snapshots.append(snap)
            self.check_members()
            time.sleep(self.step_gap)
        self.heal()
        if self.txn is not None:
            self.step_log.append(f"transactions: {self.txn.settle(self.txn_settle_s)}")
        markers = {}
        for p in range(s.partitions):
            markers[p] = b"end:%d:%d" % (s.seed, p)
            self.append(p, [markers[p]])
        snap = self.snapshot()
        with self.lock:
            self.snapshots.append(snap)
        self.step_log.append("heal, end markers")
        # The stall deadline counts what the network faults held back (their durations,
        # and a connection set-up timeout for each blackhole: kafka-python-based clients
        # give up a connection that never answers its ApiVersions after 10 s), and what a
        # hanging transaction takes to be reported.
        end_timeout += s.injected_delay_s + CONNECTION_SETUP_TIMEOUT_S * sum(
            1 for step in s.steps if isinstance(step, NetFault) and step.kind == "blackhole"
        )
        if s.read_committed:
            end_timeout += self.consumer_txn_max_timeout_ms / 1000
        deadline = time.monotonic() + end_timeout
        while time.monotonic() < deadline:
            self.check_members()
            with self.lock:
                waited = [v for app, v in self.values.items() if app not in self.crashed]
                if all(set(markers.values()) <= v for v in waited):
                    break
            time.sleep(0.02)
        # A client that is done must stay done: re-deliveries after the end still count.
        time.sleep(min(0.3, 10 * self.step_gap))
        with self.lock:
            for app, got in self.values.items():
                for p, marker in markers.items():
                    if marker not in got:
                        detail = f"end marker not received in {end_timeout} s"
                        self.events.append(Stalled(p, detail + self.inner_state(app, p), app))

    def inner_state(self, app: str, partition: int | None = None) -> str:
        """What the app's EpochConsumer members hold, for a stall's report (a stall that
        does not replay can only be read from this); with trails installed (``--trail``,
        ``trail.py``) also the last entries of ``partition``'s trackers."""
        from epochguard.consumer import EpochConsumer
        from epochguard.testing.chaos import trail
        from epochguard.testing.helpers import describe_consumer

        out = []
        for m in self.members[app]:
            consumer = getattr(m.client, "consumer", None)
            if isinstance(consumer, EpochConsumer):
                try:
                    out.append(f"\n    member {m.member}: {describe_consumer(consumer)}")
                except Exception as exc:  # a closed consumer: say so, do not hide the stall
                    out.append(f"\n    member {m.member}: not described ({exc!r})")
                if trail.installed() and partition is not None:
                    tracker = consumer._engine.fetcher.trackers.get(
                        TopicPartition(self.topic, partition)
                    )
                    if tracker is not None:
                        entries = trail.trail_of(tracker)[-TRAIL_SHOWN:]
                        out.append(
                            f"\n    member {m.member} p{partition} trail (last {len(entries)}):"
                        )
                        out.extend(f"\n      {e}" for e in entries)
        return "".join(out)

    def check_members(self) -> None:
        for app, members in self.members.items():
            for m in members:
                if m.error is not None:
                    raise ChaosClientError(
                        f"{app} member {m.member} failed: {m.error!r}\n{m.trace}", app
                    ) from m.error

    def close_members(self) -> None:
        # Each member that leaves hands its partitions to the others still in the group. A
        # member given back a partition it read before a truncation reports that truncation
        # (again) and its application seeks back, after the end markers, with no time left
        # to read again: the oracle saw records never delivered (chaos seed 867, about one
        # run in fifty under load). So every member stops polling first, and nothing emitted
        # from here on is judged.
        with self.lock:
            self.closing = True
        members = [m for app in self.clients for m in self.members[app]]
        for m in members:
            m.stop_flag.set()
        for m in members:
            m.halt()
        if self.txn is not None:
            self.txn.close()


class ChaosClientError(RuntimeError):
    """A client adapter raised: the client (or its adapter) failed, which counts against
    it as a stall. Anything else a run raises is the harness's (:attr:`RunResult.harness_error`)."""

    def __init__(self, message: str, app: str | None = None) -> None:
        super().__init__(message)
        #: the application whose member raised
        self.app = app


def run_schedule(
    schedule: Schedule,
    clients: Mapping[str, ClientFactory] | ClientFactory | None = None,
    *,
    step_gap: float = 0.03,
    end_timeout: float = 15.0,
    epochs: str = "kafka",
    isr_join_delay_s: float = DEFAULT_ISR_JOIN_DELAY_S,
) -> RunResult:
    """Run ``schedule`` on a fresh 3-broker EmbeddedCluster.

    ``clients``: one factory (default: EpochConsumer) or several by application name; every
    application consumes the same run, and the verdict judges the first one (see
    :func:`judge` with ``app=`` for the others). ``epochs="raft"``: the brokers follow
    Raft-term rules (``EmbeddedCluster(epochs=...)``): ``StopBroker`` is a power cut that
    loses unflushed records, and unclean elections are refused. ``isr_join_delay_s``:
    the cluster's (``EmbeddedCluster(isr_join_delay_s=...)``); 0 replays schedules shrunk
    when followers joined the ISR the moment they caught up.
    """
    if clients is None:
        from epochguard.testing.chaos.clients import epoch_consumer

        clients = {"epochguard": epoch_consumer}
    elif callable(clients):
        clients = {getattr(clients, "client_name", "app"): clients}
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmpdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-"))
        txn_timeout = TXN_TIMEOUT_MS if schedule.transactions else MAX_TRANSACTION_TIMEOUT_MS
        c = stack.enter_context(
            EmbeddedCluster(
                brokers=3,
                epochs=epochs,
                transaction_max_timeout_ms=txn_timeout,
                isr_join_delay_s=isr_join_delay_s,
            )
        )
        proxy = None
        if schedule.network:
            proxy = stack.enter_context(FaultProxy())
            proxy.attach_embedded(c)
        run = _Run(schedule, c, clients, tmpdir, step_gap, proxy)
        try:
            run.execute(end_timeout)
        except ChaosClientError:
            raise
        except Exception:
            run.check_members()  # a member that raised meanwhile is the client's failure
            raise
        finally:
            run.close_members()
        final = run.snapshot()
    return run.result(final, started)


def run_many(
    schedules: Iterable[Schedule],
    clients: Mapping[str, ClientFactory] | ClientFactory | None = None,
    *,
    workers: int = 4,
    step_gap: float = 0.03,
    end_timeout: float = 15.0,
    epochs: str = "kafka",
) -> Iterator[RunResult]:
    """Run schedules ``workers`` at a time, each on its own cluster (threads: a run mostly
    waits on sockets and on the step gap). Results come in completion order. A run whose
    client raised (:class:`ChaosClientError`) yields a result with a stall naming the
    error, counted against the client; a run the cluster or the runner broke (an
    ``OSError`` restarting a broker, a cluster that cannot heal) yields a result with
    ``harness_error`` set and nothing judged."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    todo = iter(schedules)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chaos-run") as pool:
        running: dict[Future[RunResult], Schedule] = {}

        def submit() -> bool:
            s = next(todo, None)
            if s is None:
                return False
            running[
                pool.submit(
                    run_schedule,
                    s,
                    clients,
                    step_gap=step_gap,
                    end_timeout=end_timeout,
                    epochs=epochs,
                )
            ] = s
            return True

        for _ in range(workers):
            if not submit():
                break
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                s = running.pop(f)
                try:
                    result = f.result()
                except ChaosClientError as exc:
                    result = _crashed(s, clients, exc)
                except Exception as exc:
                    result = _harness_failed(s, clients, exc)
                yield result
                submit()


def _first_client(clients: Mapping[str, ClientFactory] | ClientFactory | None) -> str:
    if clients is None:
        return "epochguard"
    if isinstance(clients, Mapping):
        return next(iter(clients))
    return str(getattr(clients, "client_name", "app"))


def _crashed(
    schedule: Schedule,
    clients: Mapping[str, ClientFactory] | ClientFactory | None,
    exc: ChaosClientError,
) -> RunResult:
    """A run its client broke: a stall, against the client."""
    name = _first_client(clients)
    history = History((Stalled(-1, f"the run raised {exc!r}", name),), (), {}, schedule.policy)
    return RunResult(schedule, name, history, judge(history), 0.0, (f"raised {exc!r}",))


def _harness_failed(
    schedule: Schedule,
    clients: Mapping[str, ClientFactory] | ClientFactory | None,
    exc: Exception,
) -> RunResult:
    """A run the cluster or the runner broke: not judged, nothing counted against the client."""
    trace = "".join(traceback.format_exception(exc))
    log.warning("chaos_harness_failed", seed=schedule.seed, error=repr(exc))
    history = History((), (), {}, schedule.policy)
    return RunResult(
        schedule,
        _first_client(clients),
        history,
        Verdict(),
        0.0,
        (f"the harness raised {exc!r}",),
        harness_error=trace,
    )
