"""Chaos schedules on real Apache Kafka: EpochConsumer and the Java reference consumer side by
side through the same :func:`~epochguard.testing.chaos.schedule.generate_apache` schedule,
judged by the same oracle as the EmbeddedCluster runs (docs/reliability.md, "Real Apache
Kafka").

Topology: one 3-broker :class:`ApacheKafkaCluster` serves a whole series of schedules (its
start-up is the expensive part), each schedule on a topic of its own with one partition on
brokers 0 and 1 (``min.insync.replicas=1``, so ``acks=1`` writes that only the leader got
are lost by an unclean election). Broker 2 holds no replica and is never stopped: metadata,
the group coordinator (``__consumer_offsets`` has a replica on every broker) and the runner's
control calls always have a broker to go to.

One partition, because the faults real Kafka allows are per broker and one partition on two
replicas already sees every kind; and because the Java probe (``TruncationProbe.java``)
drives exactly one partition with the stock ``KafkaConsumer`` and its own
``LogTruncationException``, which is what the scoreboard compares.

What the oracle needs is read from the brokers, never assumed: after every step the runner
reads the current leader's log with a plain Fetch (replica id -1, the consumer's view, up to
the high watermark, after giving the high watermark up to 3 s to reach the leader's log end)
straight from the leader, epochs included; the final log is read the same way after healing
(every broker started, both replicas in sync) and the end marker.

With transactions (``generate_apache(seed, transactions=True)``, ``--transactions``) the
cluster runs with ``transaction.max.timeout.ms`` :data:`TXN_TIMEOUT_MS` (and its coordinator
looks for timed-out transactions every second), a kafka-python transactional producer
writes, both consumers read committed records only, and the snapshots also keep which
records are transactional and where the markers are. The unclean-election recipe then
usually loses a marker (see :meth:`_ApacheRun._lose_marker`); EpochConsumer's application
aborts the hanging transaction it reports, as the transactions guide says, which frees the
Java consumer too. The coordinator's state is not read: no report is judged spurious here.

With network faults (``generate_apache(seed, network=True)``, ``--network``) a
:class:`~epochguard.testing.netfault.FaultProxy` stands in front of every broker
(``ApacheKafkaCluster(fault_proxy=...)``): Metadata answers name the proxy's addresses, every
consumer (the Java probe too) bootstraps from it and reaches each broker through it, while
replication, the runner's writes, log reads and control calls stay on the brokers' own
listener. :class:`~epochguard.testing.chaos.schedule.NetFault` steps set the proxy's faults,
and the end-marker deadline counts their durations (``_Run.execute``). ``apps`` adds the
scoreboard's other clients (kafka-python, confluent-kafka, aiokafka) on the same schedules.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kafka.errors import KafkaError
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record.memory_records import MemoryRecords

from epochguard._log import get_logger
from epochguard.testing.apache_kafka.cluster import (
    EARLIEST,
    ApacheKafkaCluster,
    ClusterError,
)
from epochguard.testing.apache_kafka.jars import KafkaJars
from epochguard.testing.apache_kafka.probe import Event as ProbeEvent
from epochguard.testing.apache_kafka.probe import JavaTruncationProbe, ProbeError
from epochguard.testing.apache_kafka.wire import WireError, call, error_name
from epochguard.testing.chaos.oracle import (
    Assigned,
    Committed,
    Delivered,
    History,
    LogSnapshot,
    Reported,
    Seeked,
    Stalled,
    Verdict,
    judge,
)
from epochguard.testing.chaos.runner import (
    ChaosClientError,
    ClientFactory,
    MemberContext,
    RunResult,
    _Run,
)
from epochguard.testing.chaos.schedule import (
    DeleteRecords,
    Elect,
    Idle,
    NetFault,
    Produce,
    RestartConsumer,
    Schedule,
    StartBroker,
    Step,
    StopBroker,
    TxnEnd,
    TxnProduce,
    generate_apache,
)
from epochguard.testing.chaos.transactions import (
    KafkaPythonTransactions,
    TxnDriver,
    iter_open,
    read_batches,
)
from epochguard.testing.helpers import produce
from epochguard.testing.netfault import FaultProxy

__all__ = [
    "ALL_APPS",
    "REPLICAS",
    "JavaChaosClient",
    "java_consumer",
    "read_log",
    "replay_code",
    "run_apache_many",
    "run_apache_schedule",
    "verdicts",
]

log = get_logger("epochguard.testing.chaos.apache")  # also when run as __main__

#: The brokers holding the partition (leader first at creation); broker 2 holds none.
REPLICAS = (0, 1)
#: Every client a real-Kafka run can put on a schedule: EpochConsumer, the Java consumer and
#: the EmbeddedCluster scoreboard's reference clients.
ALL_APPS = ("epochguard", "java", "kafka-python", "confluent-kafka", "aiokafka")
_topics = itertools.count()

#: With transactions: the brokers' ``transaction.max.timeout.ms`` and the producer's
#: transaction timeout (long enough for a transaction to stay open while a broker stops),
#: how often the coordinator aborts timed-out transactions, and what the consumers are told
#: the maximum is (above the two together, so that a transaction that is only long is never
#: reported as hanging).
TXN_TIMEOUT_MS = 10_000
TXN_CLEANUP_INTERVAL_MS = 1000
CONSUMER_TXN_MAX_TIMEOUT_MS = 15_000
TXN_BROKER_CONFIG = {
    "transaction.max.timeout.ms": str(TXN_TIMEOUT_MS),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": str(TXN_CLEANUP_INTERVAL_MS),
}


def read_log(
    cluster: ApacheKafkaCluster, topic: str, partition: int, broker: int, leader_epoch: int
) -> LogSnapshot:
    """``broker``'s log of the partition as a plain consumer fetching from it reads it (log
    start to high watermark), with each record's batch epoch, which records are
    transactional and where the markers are. Raises :class:`ClusterError` if ``broker`` is
    not the leader at ``leader_epoch`` any more."""
    start = cluster.list_offsets(topic, partition, EARLIEST, broker=broker).offset
    host, port = cluster.broker_address(broker).rsplit(":", 1)
    records: dict[int, tuple[int, bytes | None]] = {}
    transactional: dict[int, int] = {}
    markers: dict[int, tuple[int, bool]] = {}
    offset = start
    while True:
        FP = FetchRequest.FetchTopic.FetchPartition
        req = FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=8 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[
                FetchRequest.FetchTopic(
                    topic=topic,
                    topic_id=uuid.UUID(int=0),
                    partitions=[
                        FP(
                            partition=partition,
                            current_leader_epoch=leader_epoch,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=4 << 20,
                        )
                    ],
                )
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        resp = call((host, int(port)), req, FetchResponse, 12)
        part = resp.responses[0].partitions[0]
        if part.error_code != 0:
            raise ClusterError(
                f"fetch {topic}-{partition} at {offset} from broker {broker}: "
                f"{error_name(part.error_code)}"
            )
        hw = int(part.high_watermark)
        before = offset
        if part.records:
            batches = MemoryRecords(bytes(part.records))
            read = []
            while (batch := batches.next_batch()) is not None:
                read.append(batch)
            contents = read_batches(read, below=hw)
            seen = [*contents.records, *contents.markers]
            records.update((o, r) for o, r in contents.records.items() if o >= offset)
            transactional.update(contents.transactional)
            markers.update(contents.markers)
            offset = max([offset, *(o + 1 for o in seen)])
        if offset >= hw or offset == before:
            return LogSnapshot(int(part.log_start_offset), records, transactional, markers, None)


class _ApacheRun(_Run):
    def __init__(
        self,
        schedule: Schedule,
        cluster: ApacheKafkaCluster,
        clients: Mapping[str, ClientFactory],
        tmpdir: str,
        step_gap: float,
        topic: str,
        proxy: FaultProxy | None = None,
    ) -> None:
        super().__init__(schedule, cluster, clients, tmpdir, step_gap, proxy)
        self.topic = topic
        self.kafka = cluster
        self.consumer_txn_max_timeout_ms = CONSUMER_TXN_MAX_TIMEOUT_MS
        self.txn_settle_s = (TXN_TIMEOUT_MS + 3 * TXN_CLEANUP_INTERVAL_MS) / 1000 + 10

    def check_members(self) -> None:
        """A member that raised fails its own client (a stall: its end marker is never
        received, and the stall names the error); the other clients of the schedule are
        still judged. A real-Kafka run costs tens of seconds and puts up to five clients on
        it: one client's crash must not take the others' verdicts with it."""
        for app, members in self.members.items():
            for m in [m for m in members if m.error is not None]:
                log.warning("chaos_apache_member_failed", app=app, error=repr(m.error))
                self.crashed.setdefault(app, f"{m.error!r}")
                members.remove(m)

    def inner_state(self, app: str, partition: int | None = None) -> str:
        crashed = self.crashed.get(app)
        prefix = f"; the client raised {crashed}" if crashed else ""
        return prefix + super().inner_state(app, partition)

    def make_transactions(self) -> TxnDriver:
        ids = [
            self._coordinated_by_spare(f"chaos-tx-{self.topic}-{i}")
            for i in range(self.schedule.transactions)
        ]
        return KafkaPythonTransactions(
            self.kafka.all_bootstrap_servers,
            self.topic,
            ids,
            TXN_TIMEOUT_MS,
            list_open=self._open_transactions,
            on_decided=self.decided,
            on_committing=self.committing,
        )

    def _coordinated_by_spare(self, base: str) -> str:
        """A transactional id starting with ``base`` whose transaction coordinator is the
        broker that never stops (it holds no replica of the partition): kafka-python's
        producer did not always find a new coordinator within a step when a replica's
        broker that coordinated it stopped in the marker recipe (the commit went unanswered
        for 20 s and the coordinator rolled the transaction back). Producers fail over
        coordinators in other tests; here the steps are about the partition's replicas."""
        spare = next(b for b in self.kafka.broker_ids if b not in REPLICAS)
        return self.kafka.transactional_id_coordinated_by(spare, base)

    def _open_transactions(self, ids: list[str]) -> list[str]:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.kafka.all_bootstrap_servers)
        try:
            listed = admin.list_transactions()
        finally:
            admin.close()
        found = listed.values() if isinstance(listed, dict) else [listed]
        return sorted(set(iter_open((t for ts in found for t in ts), ids)))

    def create_topic(self) -> None:
        c = self.kafka
        c.create_topic(
            self.topic, assignments={0: list(REPLICAS)}, config={"min.insync.replicas": "1"}
        )
        c.wait_for_isr(self.topic, 0, list(REPLICAS))

    def append(self, partition: int, values: list[bytes]) -> None:
        produce(self.kafka, self.topic, values, partition=partition)

    def snapshot(self) -> dict[int, LogSnapshot | None]:
        c = self.kafka
        for _ in range(10):
            try:
                state = c.partition_state(self.topic, 0)
                if state.leader < 0 or not c.is_running(state.leader):
                    return {0: None}
                # acks=1: the high watermark trails the leader's log end until the follower
                # fetches; the leader does hold those records, so give it a moment.
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline and c.high_watermark(
                    self.topic, 0
                ) < c.log_end_offset(self.topic, 0, state.leader):
                    time.sleep(0.05)
                return {0: read_log(c, self.topic, 0, state.leader, state.leader_epoch)}
            except (ClusterError, WireError) as exc:  # a leader that just moved: read again
                log.info("chaos_apache_snapshot_retry", error=repr(exc))
                time.sleep(0.2)
        return {0: None}

    def _values(self, count: int) -> list[bytes]:
        values = []
        for _ in range(count):
            values.append(b"%d:%d" % (self.schedule.seed, self.seq))
            self.seq += 1
        return values

    def _other(self, broker: int) -> int:
        return next(b for b in REPLICAS if b != broker)

    def apply(self, step: Step) -> str:
        try:
            return self._apply(step)
        except (ClusterError, WireError, KafkaError) as exc:
            # A broker that would not stop in time, an election the controller refused, a
            # write that timed out: the step did what it did, the run goes on (the snapshot
            # after it shows the leader's log as it is) and heal() starts what is stopped.
            log.info("chaos_apache_step_refused", step=repr(step), error=repr(exc))
            return f"{step!r}: refused ({exc!r})"

    def _apply(self, step: Step) -> str:
        c = self.kafka
        t = self.topic
        if isinstance(step, Produce):
            if c.leader(t, 0) is None:
                return f"{step!r}: no leader"
            values = self._values(step.count)
            produce(c, t, values)
            return f"{step!r}: {values[0]!r}..{values[-1]!r}"
        if isinstance(step, Elect) and not step.unclean:
            state = c.partition_state(t, 0)
            cands = [b for b in state.isr if b != state.leader and c.is_running(b)]
            if not cands:
                return f"{step!r}: no candidate"
            b = cands[step.pick % len(cands)]
            c.elect_leader(t, 0, b)
            return f"{step!r}: broker {b}, epoch {c.leader_epoch(t, 0)}"
        if isinstance(step, Elect):
            return self._unclean(step)
        if isinstance(step, StopBroker):
            running = [b for b in REPLICAS if c.is_running(b)]
            if not running:
                return f"{step!r}: none running"
            b = running[step.pick % len(running)]
            c.stop_broker(b)
            return f"{step!r}: broker {b}"
        if isinstance(step, StartBroker):
            stopped = [b for b in REPLICAS if not c.is_running(b)]
            if not stopped:
                return f"{step!r}: none stopped"
            b = stopped[step.pick % len(stopped)]
            c.start_broker(b)
            return f"{step!r}: broker {b}"
        if isinstance(step, DeleteRecords):
            leader = c.leader(t, 0)
            if leader is None:
                return f"{step!r}: no leader"
            start = c.list_offsets(t, 0, EARLIEST).offset
            hw = c.high_watermark(t, 0)
            if hw <= start:
                return f"{step!r}: nothing to delete"
            before = start + max(1, round((hw - start) * step.fraction))
            c.delete_records(t, 0, before)
            return f"{step!r}: below {before}"
        if isinstance(step, Idle | RestartConsumer):
            return super().apply(step)
        if isinstance(step, NetFault):
            return self.apply_net_fault(step)
        if isinstance(step, TxnProduce | TxnEnd):
            return self.apply_txn(step)
        raise TypeError(f"not a real-Kafka chaos step: {step!r}")

    def _unclean(self, step: Elect) -> str:
        """The cluster's recipe (tests/apache_kafka/test_apache_unclean.py): the follower
        stops, the leader takes ``acks=1`` records alone, the leader stops, and the follower
        (neither in the ISR nor in the ELR) is elected with ElectLeaders(UNCLEAN)."""
        c = self.kafka
        t = self.topic
        state = c.partition_state(t, 0)
        doomed: list[bytes] = []
        if (
            self.txn is not None
            and step.pick % 3 != 2
            and state.leader >= 0
            and c.is_running(state.leader)
        ):
            return self._lose_marker(step, state.leader)
        if state.leader >= 0 and c.is_running(state.leader):
            leader = state.leader
            follower = self._other(leader)
            if c.is_running(follower):
                c.stop_broker(follower)
                c.wait_for_isr(t, 0, [leader])
            doomed = self._values(1 + step.pick % 3)
            produce(c, t, doomed)
            c.stop_broker(leader)
            c.wait_for_partition(t, 0, lambda s: s.leader < 0, "no leader")
            target = follower
        else:
            # No live leader already: elect a replica the controller would not pick itself.
            cands = [b for b in REPLICAS if b not in state.isr and b not in state.elr]
            if not cands:
                return f"{step!r}: no replica outside the ISR and ELR"
            target = cands[step.pick % len(cands)]
        if not c.is_running(target):
            c.start_broker(target)
        c.elect_leader(t, 0, target, unclean=True)
        lost = f", {doomed[0]!r}..{doomed[-1]!r} written to the old leader only" if doomed else ""
        return f"{step!r}: broker {target}, epoch {c.leader_epoch(t, 0)}{lost}"

    def _lose_marker(self, step: Elect, leader: int) -> str:
        """The unclean recipe with a transaction marker among what is lost: the producer's
        open transaction (a new one of ``1 + pick % 3`` records if none is open) reaches
        both replicas, the follower stops, the transaction ends (commit when ``pick`` is
        even) with its marker on the leader alone, the leader stops and the follower is
        elected uncleanly: on the new leader the transaction is open for good."""
        c = self.kafka
        t = self.topic
        txn = self.txn
        assert txn is not None
        follower = self._other(leader)
        if not c.is_running(follower):
            c.start_broker(follower)
            c.wait_for_isr(t, 0, list(REPLICAS))
        notes = [txn.produce(0, 0, self._values(1 + step.pick % 3))]
        deadline = time.monotonic() + 10
        while c.high_watermark(t, 0) < c.log_end_offset(t, 0, leader):
            if time.monotonic() > deadline:
                raise ClusterError(f"{t}-0: the follower did not catch up in 10 s")
            time.sleep(0.05)
        c.stop_broker(follower)
        c.wait_for_isr(t, 0, [leader])
        notes.append(txn.end(0, step.pick % 2 == 0))
        c.stop_broker(leader)
        c.wait_for_partition(t, 0, lambda s: s.leader < 0, "no leader")
        c.start_broker(follower)
        c.elect_leader(t, 0, follower, unclean=True)
        return (
            f"{step!r}: broker {follower}, epoch {c.leader_epoch(t, 0)}, a marker on the old "
            f"leader only ({'; '.join(notes)})"
        )

    def heal(self) -> None:
        c = self.kafka
        if self.proxy is not None:
            self.proxy.heal()
        for b in c.broker_ids:
            if not c.is_running(b):
                c.start_broker(b)
        c.wait_for_partition(
            self.topic,
            0,
            lambda s: s.leader >= 0 and sorted(s.isr) == sorted(REPLICAS),
            "a leader and both replicas in sync",
            timeout=60,
        )


class JavaChaosClient:
    """The stock Java ``KafkaConsumer`` (``TruncationProbe.java``) as a chaos client.

    ``auto.offset.reset=none``: Java then throws ``LogTruncationException`` with the
    divergence instead of rewinding silently (with a reset policy it seeks to the divergence
    and says so only in its log). The application does what Java's documentation says:
    seek to the divergent offset with its epoch (to the beginning when the leader could not
    say), commit (``commitSync``: the position with the last record's epoch) after each
    poll that delivered, and start a partition without a commit at the beginning.
    """

    def __init__(self, ctx: MemberContext, cluster: ApacheKafkaCluster) -> None:
        self.ctx = ctx
        self.key = f"{ctx.topic}-0"
        self.seen = False
        self.uncommitted = False
        props = {"group.id": ctx.group_id}
        if ctx.read_committed:
            props["isolation.level"] = "read_committed"
        # ctx.bootstrap: through the fault proxy when the run has one, as every client.
        self.probe: JavaTruncationProbe = cluster.java_probe(
            ctx.topic, 0, "none", props=props, bootstrap_servers=ctx.bootstrap
        )
        ctx.emit(Assigned(-1, 0, -1))

    def _seek(self, divergence: Mapping[str, Any] | None) -> None:
        if divergence is None:
            self.probe.seek_to_beginning()
            self.ctx.emit(Seeked(-1, 0, None, -1))
        else:
            self.probe.seek(int(divergence["offset"]), divergence.get("leader_epoch"))
            self.ctx.emit(Seeked(-1, 0, int(divergence["offset"]), -1))

    def _on(self, e: ProbeEvent) -> None:
        kind = e["event"]
        if kind == "record":
            value = e["value"]
            self.ctx.emit(
                Delivered(
                    -1,
                    0,
                    int(e["offset"]),
                    e.get("leader_epoch"),
                    b"" if value is None else str(value).encode(),
                    -1,
                )
            )
            self.seen = True
            self.uncommitted = True
        elif kind == "truncation":
            div = e["divergent_offsets"].get(self.key)
            fetch = e["fetch_offsets"].get(self.key)
            self.ctx.emit(
                Reported(
                    -1,
                    0,
                    None if div is None else int(div["offset"]),
                    None if fetch is None else int(fetch),
                    -1,
                    text=str(e.get("message", "")),
                )
            )
            self._seek(div)
        elif kind == "out_of_range":
            # As for the other reference clients: a signal on a partition it delivered from
            # counts as a report with no divergence; the application starts over.
            if self.seen:
                self.ctx.emit(Reported(-1, 0, None, None, -1, text=str(e.get("message", ""))))
            self._seek(None)
        elif kind == "error" and e.get("type") == "NoOffsetForPartitionException":
            self.probe.seek_to_beginning()  # no commit yet: the first position
        elif kind == "error":
            log.info("chaos_java_error", error=e)

    def poll_once(self) -> None:
        for e in self.probe.poll(500, 200):
            self._on(e)
        if self.uncommitted:
            try:
                offset, _epoch = self.probe.commit()
            except ProbeError as exc:  # the coordinator moved: again after the next poll
                log.info("chaos_commit_failed", error=repr(exc))
                return
            self.uncommitted = False
            self.ctx.emit(Committed(-1, 0, offset, -1))

    def close(self) -> None:
        self.probe.close()


def java_consumer(cluster: ApacheKafkaCluster) -> ClientFactory:
    """A factory of :class:`JavaChaosClient` on ``cluster``."""

    def factory(ctx: MemberContext) -> JavaChaosClient:
        return JavaChaosClient(ctx, cluster)

    factory.client_name = "java"  # type: ignore[attr-defined]
    return factory


def default_clients(cluster: ApacheKafkaCluster) -> dict[str, ClientFactory]:
    """Every client of :data:`ALL_APPS` by application name."""
    from epochguard.testing.chaos.clients import CLIENTS

    return {
        "epochguard": CLIENTS["epochguard"],
        "java": java_consumer(cluster),
        **{app: CLIENTS[app] for app in ALL_APPS if app not in ("epochguard", "java")},
    }


def run_apache_schedule(
    schedule: Schedule,
    cluster: ApacheKafkaCluster,
    clients: Mapping[str, ClientFactory] | None = None,
    *,
    step_gap: float = 0.3,
    end_timeout: float = 60.0,
    proxy: FaultProxy | None = None,
) -> RunResult:
    """Run a one-partition ``schedule`` on ``cluster`` (a topic of its own), EpochConsumer
    and the Java consumer side by side by default; :func:`verdicts` judges each. A schedule
    with network faults needs ``proxy``, the fault proxy ``cluster`` was started with
    (``ApacheKafkaCluster(fault_proxy=proxy)``): the consumers then connect through it."""
    if schedule.partitions != 1 or schedule.members != 1 or schedule.offsets != "group":
        raise ValueError(
            "a real-Kafka schedule has one partition and one consumer committing to its "
            f"group (generate_apache), got {schedule!r}"
        )
    if schedule.network and proxy is None:
        raise ValueError(
            "a schedule with network faults needs proxy=, the FaultProxy the cluster was "
            "started with (ApacheKafkaCluster(fault_proxy=proxy))"
        )
    if clients is None:
        clients = {a: c for a, c in default_clients(cluster).items() if a in ("epochguard", "java")}
    topic = f"chaos-{schedule.seed}-{os.getpid()}-{next(_topics)}"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chaos-apache-") as tmpdir:
        run = _ApacheRun(schedule, cluster, clients, tmpdir, step_gap, topic, proxy)
        try:
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
        finally:
            try:
                # Partitions left behind would make every later broker stop slower
                # (controlled shutdown moves each one's leadership), a failed run's too: a
                # series of schedules stays flat.
                cluster.delete_topic(topic)
            except (ClusterError, WireError) as exc:
                log.info("chaos_apache_delete_failed", topic=topic, error=repr(exc))
    return run.result(final, started)


def replay_code(schedule: Schedule) -> str:
    """Python that replays ``schedule`` on a fresh cluster (paste it into a test or a shell);
    behind a fault proxy when it has network faults."""
    if not schedule.network:
        return (
            "from epochguard.testing.apache_kafka import ApacheKafkaCluster\n"
            "from epochguard.testing.chaos.apache import run_apache_schedule, verdicts\n"
            "from epochguard.testing.chaos.schedule import *\n\n"
            "with ApacheKafkaCluster(brokers=3) as cluster:\n"
            f"    result = run_apache_schedule({schedule!r}, cluster)\n"
            "for app, verdict in verdicts(result, ('epochguard', 'java')).items():\n"
            "    print(app, verdict.describe())\n"
        )
    return (
        "from epochguard.testing.apache_kafka import ApacheKafkaCluster\n"
        "from epochguard.testing.chaos.apache import run_apache_schedule, verdicts\n"
        "from epochguard.testing.chaos.schedule import *\n"
        "from epochguard.testing.netfault import FaultProxy\n\n"
        "with FaultProxy() as proxy, ApacheKafkaCluster(brokers=3, fault_proxy=proxy) as cluster:\n"
        f"    result = run_apache_schedule({schedule!r}, cluster, proxy=proxy)\n"
        "for app, verdict in verdicts(result, ('epochguard', 'java')).items():\n"
        "    print(app, verdict.describe())\n"
    )


def verdicts(result: RunResult, apps: Iterable[str]) -> dict[str, Verdict]:
    """The oracle's verdict for each application of one run."""
    return {app: judge(result.history, app) for app in apps}


def _recover(cluster: ApacheKafkaCluster, proxy: FaultProxy | None) -> None:
    if proxy is not None:
        proxy.heal()
    for b in cluster.broker_ids:
        if not cluster.is_running(b):
            cluster.start_broker(b)


def run_apache_many(
    schedules: Iterable[Schedule],
    *,
    jars: KafkaJars | None = None,
    apps: tuple[str, ...] = ("epochguard", "java"),
    step_gap: float = 0.3,
    end_timeout: float = 60.0,
    transactions: bool = False,
    network: bool = False,
) -> Iterator[tuple[RunResult, dict[str, Verdict]]]:
    """Run ``schedules`` one after another on one fresh ApacheKafkaCluster (with
    ``transactions``: configured for transactional schedules, :data:`TXN_BROKER_CONFIG`;
    with ``network``: behind a fault proxy, for schedules with network faults).
    ``apps``: which of :data:`ALL_APPS` consume each schedule.
    A run a client raised in (:class:`ChaosClientError`) comes with that client's verdict
    only, a stall; a run the cluster or the runner broke comes with no verdicts, its error
    as the step log and its traceback as ``harness_error``. Either way the cluster's
    brokers are started again."""
    config = TXN_BROKER_CONFIG if transactions else None
    unknown = [a for a in apps if a not in ALL_APPS]
    if unknown or not apps:
        raise ValueError(f"apps must name some of {ALL_APPS}, got {apps!r}")
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy()) if network else None
        cluster = stack.enter_context(
            ApacheKafkaCluster(brokers=3, jars=jars, broker_config=config, fault_proxy=proxy)
        )
        yield from _run_on(cluster, proxy, schedules, apps, step_gap, end_timeout)


def _run_on(
    cluster: ApacheKafkaCluster,
    proxy: FaultProxy | None,
    schedules: Iterable[Schedule],
    apps: tuple[str, ...],
    step_gap: float,
    end_timeout: float,
) -> Iterator[tuple[RunResult, dict[str, Verdict]]]:
    everyone = default_clients(cluster)
    clients = {a: everyone[a] for a in apps}
    for s in schedules:
        try:
            r = run_apache_schedule(
                s, cluster, clients, step_gap=step_gap, end_timeout=end_timeout, proxy=proxy
            )
        except Exception as exc:
            log.warning("chaos_apache_run_failed", seed=s.seed, error=repr(exc))
            _recover(cluster, proxy)
            failed_app = exc.app if isinstance(exc, ChaosClientError) else None
            if failed_app in apps:
                # The client raised: a stall of its own; the others were not judged.
                stall = Stalled(-1, f"the run raised {exc!r}", failed_app)
                history = History((stall,), (), {}, s.policy)
                r = RunResult(s, failed_app, history, judge(history), 0.0, (f"raised {exc!r}",))
                yield r, {failed_app: r.verdict}
                continue
            trace = "".join(traceback.format_exception(exc))
            r = RunResult(
                s,
                apps[0],
                History((), (), {}, s.policy),
                Verdict(),
                0.0,
                (f"the harness raised {exc!r}",),
                harness_error=trace,
            )
            yield r, {}
            continue
        yield r, verdicts(r, apps)


_COUNTS = (
    "silent_losses",
    "silent_rereads",
    "spurious_reports",
    "stalls",
    "raise_breaches",
    "delivered",
    "reports",
)
_TXN_COUNTS = (
    "aborted_deliveries",
    "committed_losses",
    "unreported_hanging",
    "spurious_hanging",
    "hanging_reports",
    "hanging_transactions",
    "committed_lost_by_cluster",
    "decided_again",
    "reopened_reports",
    "decided_again_reported",
)


def score(
    seeds: Iterable[int],
    *,
    steps: int = 8,
    jars: KafkaJars | None = None,
    echo: bool = False,
    transactions: bool = False,
    network: bool = False,
    apps: tuple[str, ...] = ("epochguard", "java"),
) -> dict[str, Any]:
    """Run the real-Kafka schedules of ``seeds`` and sum each client's verdicts (the
    ``apache_kafka`` section of benchmarks/results/chaos_scoreboard.json; with
    ``network``, its ``apache_kafka_network`` section; with ``transactions``,
    benchmarks/results/chaos_transactions_apache.json). ``apps``: the clients put on
    every schedule (:data:`ALL_APPS`)."""
    seeds = list(seeds)
    started = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    totals: dict[str, Counter[str]] = {}
    failed: dict[str, list[int]] = {}
    decided_again: dict[str, list[int]] = {}
    examples: dict[str, list[str]] = {}
    seconds: list[float] = []
    not_run: list[str] = []
    net_faults: Counter[str] = Counter()
    injected_delay_s = 0.0
    schedules = (
        generate_apache(s, steps=steps, transactions=transactions, network=network) for s in seeds
    )
    counts = _COUNTS + (_TXN_COUNTS if transactions else ())
    for r, vs in run_apache_many(
        schedules, jars=jars, apps=apps, transactions=transactions, network=network
    ):
        if not vs:  # the harness failed: no client is to blame, none is counted
            not_run.append(f"seed {r.schedule.seed}: {r.step_log[0]}")
            if echo:
                print(f"seed {r.schedule.seed} did not run: {r.step_log[0]}", flush=True)
            continue
        seconds.append(round(r.seconds, 1))
        net_faults.update(s.kind for s in r.schedule.steps if isinstance(s, NetFault))
        injected_delay_s += r.schedule.injected_delay_s
        for app, v in vs.items():
            totals.setdefault(app, Counter()).update(
                {k: getattr(v, k) for k in counts} | {"schedules": 1}
            )
            if v.only_decided_again:
                decided_again.setdefault(app, []).append(r.schedule.seed)
            if not v.ok:
                failed.setdefault(app, []).append(r.schedule.seed)
                if len(examples.setdefault(app, [])) < 3 and v.problems:
                    examples[app].append(f"seed {r.schedule.seed}: {v.problems[0]}")
        if echo:
            line = ", ".join(f"{a}: {v.describe().splitlines()[0]}" for a, v in vs.items())
            print(f"seed {r.schedule.seed} ({r.seconds:.0f} s) {line}", flush=True)
            if not all(v.ok for v in vs.values()):
                applied = "\n".join(f"    {i}: {s}" for i, s in enumerate(r.step_log))
                problems = "\n".join(f"{a}: {v.describe()}" for a, v in vs.items() if not v.ok)
                replay = replay_code(r.schedule)
                print(f"{problems}\n  steps as applied:\n{applied}\n  replay:\n{replay}")
    clients = {}
    for app, t in totals.items():
        clients[app] = {
            "schedules": t["schedules"],
            "schedules_failed": len(failed.get(app, [])),
            "silent_losses": t["silent_losses"],
            "silent_rereads": t["silent_rereads"],
            "spurious_reports": t["spurious_reports"],
            "stalls": t["stalls"],
            "raise_breaches": t["raise_breaches"],
            "records_delivered": t["delivered"],
            "reports": t["reports"],
            **{k: t[k] for k in (_TXN_COUNTS if transactions else ())},
            "failed_seeds": sorted(failed.get(app, [])),
            **(
                {"failed_only_decided_again": sorted(decided_again.get(app, []))}
                if transactions
                else {}
            ),
            "examples": examples.get(app, []),
        }
    flavour = ", transactions=True" if transactions else ", network=True" if network else ""
    cluster = "ApacheKafkaCluster (3 KRaft brokers, one partition on brokers 0 and 1)"
    extra: dict[str, Any] = {}
    if network:
        cluster = cluster[:-1] + "; every client through the fault proxy)"
        extra = {
            "network_faults": dict(sorted(net_faults.items())),
            "injected_delay_s": round(injected_delay_s, 1),
        }
    return {
        "cluster": cluster,
        "generator": f"generate_apache(seed, steps={steps}{flavour})",
        "seeds": f"{seeds[0]}..{seeds[-1]}" if seeds else "",
        "seconds": round(time.monotonic() - started, 1),
        "seconds_per_schedule": seconds,
        "runs_that_raised": not_run,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        **extra,
        "clients": clients,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m epochguard.testing.chaos.apache")
    ap.add_argument("--seeds", type=int, default=30, help="how many schedules (default 30)")
    ap.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--steps", type=int, default=8, help="steps per schedule (default 8)")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument(
        "--transactions",
        action="store_true",
        help="transactional schedules: a transactional producer, read_committed consumers,"
        " unclean elections that lose transaction markers",
    )
    ap.add_argument(
        "--network",
        action="store_true",
        help="network faults too: every client reaches the brokers through the fault proxy",
    )
    ap.add_argument(
        "--clients",
        default="epochguard,java",
        help=f"comma-separated, of {','.join(ALL_APPS)} (default epochguard,java)",
    )
    args = ap.parse_args(argv)
    apps = tuple(a for a in args.clients.split(",") if a)
    if not apps or any(a not in ALL_APPS for a in apps):
        ap.error(f"--clients must name some of {','.join(ALL_APPS)}, got {args.clients!r}")
    if args.network and args.transactions:
        ap.error("--network and --transactions are not drawn together")
    if args.seeds < 1 or args.first < 0 or args.steps < 1:
        ap.error("--seeds and --steps must be >= 1, --first >= 0")
    result = score(
        range(args.first, args.first + args.seeds),
        steps=args.steps,
        echo=True,
        transactions=args.transactions,
        network=args.network,
        apps=apps,
    )
    print(json.dumps(result, indent=2), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if result["clients"].get("epochguard", {}).get("schedules_failed") else 0


if __name__ == "__main__":
    sys.exit(main())
