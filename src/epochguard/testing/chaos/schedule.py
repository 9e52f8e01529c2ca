"""Chaos schedules as data: small frozen steps, a frozen :class:`Schedule`, a seeded generator.

A schedule says *what* happens, never *how a cluster answered*: steps that need a broker name
an index (``pick``) that the runner resolves against the live cluster (``candidates[pick %
len(candidates)]``), so a schedule with steps removed still replays (shrinking) and the same
schedule drives any client. ``repr(schedule)`` is code: with ``from
epochguard.testing.chaos.schedule import *`` it evaluates back to an equal schedule.
"""

from __future__ import annotations

import random
from typing import Literal

import attrs

__all__ = [
    "DeleteRecords",
    "Elect",
    "FetchFault",
    "Idle",
    "Join",
    "Leave",
    "MetadataDelay",
    "NetFault",
    "PauseReplication",
    "Produce",
    "RecreateTopic",
    "RestartConsumer",
    "ResumeReplication",
    "Schedule",
    "ScheduleError",
    "StartBroker",
    "Step",
    "StopBroker",
    "TxnEnd",
    "TxnProduce",
    "generate",
    "generate_apache",
]

Policy = Literal["rewind", "raise"]
OffsetSource = Literal["group", "store"]

#: request kinds a response fault may hit (Kafka API keys: Fetch, ListOffsets, Metadata,
#: OffsetForLeaderEpoch)
FAULT_APIS = (1, 2, 3, 23)


class ScheduleError(ValueError):
    """A schedule or step that cannot describe a run (names the field and the value)."""


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScheduleError(f"{attribute.name} must be an int >= 0, got {value!r}")


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScheduleError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _seconds(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 30:
        raise ScheduleError(f"{attribute.name} must be seconds in [0, 30], got {value!r}")


@attrs.frozen
class Produce:
    """``count`` new records on the partition's leader, ``batch`` records per batch (acks=1)."""

    partition: int = attrs.field(validator=_non_negative)
    count: int = attrs.field(validator=_positive)
    batch: int = attrs.field(default=1, validator=_positive)


@attrs.frozen
class TxnProduce:
    """``count`` records, in one batch, in the open transaction of transactional producer
    ``producer`` on the partition's leader; the producer begins a transaction first when it
    has none open (and initialises again when the coordinator fenced it: a transaction it
    left open longer than its timeout was aborted)."""

    partition: int = attrs.field(validator=_non_negative)
    count: int = attrs.field(validator=_positive)
    producer: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class TxnEnd:
    """Transactional producer ``producer`` commits (or aborts) its open transaction; nothing
    happens when it has none open."""

    producer: int = attrs.field(default=0, validator=_non_negative)
    commit: bool = True


@attrs.frozen
class Elect:
    """Elect another replica: a clean election picks among running ISR members, an unclean
    one among running replicas outside the ISR (the one that loses records)."""

    partition: int = attrs.field(validator=_non_negative)
    unclean: bool = False
    pick: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class StopBroker:
    pick: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class StartBroker:
    pick: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class PauseReplication:
    """A follower of the partition stops fetching (falls out of the ISR: a lagging replica)."""

    partition: int = attrs.field(validator=_non_negative)
    pick: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class ResumeReplication:
    pick: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class MetadataDelay:
    """A broker learns controller changes ``seconds`` late (a stale leader keeps serving)."""

    pick: int = attrs.field(validator=_non_negative)
    seconds: float = attrs.field(validator=_seconds)


@attrs.frozen
class FetchFault:
    """Misbehaving responses to ``api`` (a Kafka API key): ``delay`` holds the next one for
    ``seconds``, ``drop`` never sends it (the client times out), ``disconnect`` closes the
    connection instead of answering."""

    api: int
    kind: Literal["delay", "drop", "disconnect"]
    seconds: float = attrs.field(default=0.0, validator=_seconds)

    def __attrs_post_init__(self) -> None:
        if self.api not in FAULT_APIS:
            raise ScheduleError(f"api must be one of {FAULT_APIS}, got {self.api!r}")
        if self.kind not in ("delay", "drop", "disconnect"):
            raise ScheduleError(f"kind must be delay, drop or disconnect, got {self.kind!r}")


#: What a :class:`NetFault` does to the network between the consumers and one broker.
NET_FAULT_KINDS = ("latency", "bandwidth", "cut", "blackhole", "reset", "partition")


@attrs.frozen
class NetFault:
    """A fault on the network between the consumers and a broker (``pick``), applied by the
    loopback fault proxy (:mod:`epochguard.testing.netfault`) that every consumer of the
    run connects through. ``latency`` delays every byte by ``latency_s`` plus up to half as
    much jitter, and ``bandwidth`` caps each connection at ``bytes_per_s``, both for
    ``seconds``; ``cut`` ends the next answer (to ``api``, a Kafka API key, or to any
    request when None) after ``at_byte`` bytes and resets that connection; ``blackhole``
    answers no new connection for ``seconds`` and resets the open ones (so clients
    reconnect into it); ``reset`` resets every open connection; ``partition`` passes
    nothing either way for ``seconds``."""

    kind: str
    pick: int = attrs.field(default=0, validator=_non_negative)
    seconds: float = attrs.field(default=0.0, validator=_seconds)
    latency_s: float = attrs.field(default=0.0, validator=_seconds)
    bytes_per_s: int = attrs.field(default=0, validator=_non_negative)
    at_byte: int = attrs.field(default=0, validator=_non_negative)
    api: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in NET_FAULT_KINDS:
            raise ScheduleError(f"kind must be one of {NET_FAULT_KINDS}, got {self.kind!r}")
        if self.kind == "bandwidth" and self.bytes_per_s < 1:
            raise ScheduleError(f"a bandwidth cap needs bytes_per_s >= 1, got {self.bytes_per_s}")
        if self.api is not None and self.api not in FAULT_APIS:
            raise ScheduleError(f"api must be None or one of {FAULT_APIS}, got {self.api!r}")

    @property
    def delay_s(self) -> float:
        """How long this fault may hold a consumer back: the time it lasts."""
        return (
            self.seconds if self.kind in ("latency", "bandwidth", "blackhole", "partition") else 0.0
        )


@attrs.frozen
class DeleteRecords:
    """Retention: move the log start to ``fraction`` of the way to the high watermark."""

    partition: int = attrs.field(validator=_non_negative)
    fraction: float = attrs.field(default=0.5)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ScheduleError(f"fraction must be in (0, 1], got {self.fraction!r}")


@attrs.frozen
class RecreateTopic:
    """Delete the topic and create it again (same name and partitions, a new topic id)."""


@attrs.frozen
class RestartConsumer:
    """Close a consumer after committing (group or offset store) and start a new one that
    restores its positions from there."""

    member: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class Join:
    """A new group member joins (a rebalance)."""


@attrs.frozen
class Leave:
    """A group member leaves after committing (a rebalance); the last one never leaves."""

    member: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen
class Idle:
    """Nothing happens for ``seconds``: the consumers catch up."""

    seconds: float = attrs.field(default=0.1, validator=_seconds)


Step = (
    Produce
    | Elect
    | StopBroker
    | StartBroker
    | PauseReplication
    | ResumeReplication
    | MetadataDelay
    | FetchFault
    | NetFault
    | DeleteRecords
    | RecreateTopic
    | RestartConsumer
    | Join
    | Leave
    | Idle
    | TxnProduce
    | TxnEnd
)

_STEP_TYPES = Step.__args__


def _steps(value: object) -> tuple[Step, ...]:
    if not isinstance(value, tuple | list):
        raise ScheduleError(f"steps must be a tuple of steps, got {type(value).__name__}")
    for s in value:
        if not isinstance(s, _STEP_TYPES):
            raise ScheduleError(f"not a chaos step: {s!r}")
    return tuple(value)


@attrs.frozen
class Schedule:
    """One reproducible run: the consumers' set-up and the steps applied between polls.

    ``members`` 1 is a single consumer on ``assign()`` that commits with its ``group`` or to a
    ``SqliteOffsetStore`` (``offsets``); 2 or more is a consumer group on ``subscribe()``
    (group commits), with :class:`Join`/:class:`Leave` rebalancing it.

    ``transactions`` is the number of transactional producers (:class:`TxnProduce`,
    :class:`TxnEnd`); with one or more the consumers read with
    ``isolation_level="read_committed"`` and the oracle also judges transactions.
    """

    seed: int
    steps: tuple[Step, ...] = attrs.field(converter=_steps)
    partitions: int = attrs.field(default=2, validator=_positive)
    policy: Policy = "rewind"
    members: int = attrs.field(default=1, validator=_positive)
    offsets: OffsetSource = "group"
    transactions: int = attrs.field(default=0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        if self.policy not in ("rewind", "raise"):
            raise ScheduleError(f"policy must be rewind or raise, got {self.policy!r}")
        if self.offsets not in ("group", "store"):
            raise ScheduleError(f"offsets must be group or store, got {self.offsets!r}")
        if self.members > 1 and self.offsets != "group":
            raise ScheduleError("a consumer group (members > 1) commits to its group")
        for s in self.steps:
            p = getattr(s, "partition", None)
            if p is not None and p >= self.partitions:
                raise ScheduleError(f"{s!r} names partition {p} of {self.partitions}")
            if isinstance(s, TxnProduce | TxnEnd) and s.producer >= self.transactions:
                raise ScheduleError(
                    f"{s!r} names transactional producer {s.producer} of {self.transactions}"
                )

    @property
    def unclean(self) -> bool:
        return any(isinstance(s, Elect) and s.unclean for s in self.steps)

    @property
    def read_committed(self) -> bool:
        """Whether the run has transactional producers (and read_committed consumers)."""
        return self.transactions > 0

    @property
    def network(self) -> bool:
        """Whether the run needs the fault proxy between consumers and brokers."""
        return any(isinstance(s, NetFault) for s in self.steps)

    @property
    def injected_delay_s(self) -> float:
        """The summed durations of the network faults that hold consumers back."""
        return sum(s.delay_s for s in self.steps if isinstance(s, NetFault))

    def replace(self, **changes: object) -> Schedule:
        return attrs.evolve(self, **changes)  # type: ignore[arg-type]

    def to_code(self) -> str:
        """Python that replays this schedule (paste it into a test or a shell)."""
        steps = "".join(f"\n        {s!r}," for s in self.steps)
        txn = f"        transactions={self.transactions},\n" if self.transactions else ""
        return (
            "from epochguard.testing.chaos import run_schedule\n"
            "from epochguard.testing.chaos.schedule import *\n\n"
            "verdict = run_schedule(\n"
            "    Schedule(\n"
            f"        seed={self.seed}, partitions={self.partitions}, policy={self.policy!r},\n"
            f"        members={self.members}, offsets={self.offsets!r},\n"
            f"{txn}"
            f"        steps=({steps}\n        ),\n"
            "    )\n"
            ").verdict\n"
            "assert verdict.ok, verdict.describe()\n"
        )


#: With ``generate(transactions=True)``: how often transactional writes and transaction ends
#: are drawn (plain writes drop to :data:`TXN_PLAIN_PRODUCE_WEIGHT`), and the share of ends
#: that commit.
TXN_STEP_WEIGHTS = (("txn_produce", 8), ("txn_end", 4))
TXN_FAULT_WEIGHTS = (("pause", 2), ("unclean", 2))
TXN_PLAIN_PRODUCE_WEIGHT = 3
TXN_COMMIT_SHARE = 0.65


# What real Apache Kafka lets a test do to its brokers (ApacheKafkaCluster).
REAL_KAFKA_STEPS = (Produce, StopBroker, StartBroker, Elect, Idle, RestartConsumer)


def generate(
    seed: int,
    *,
    steps: int = 24,
    unclean: bool = True,
    policy: Policy | None = None,
    partitions: int | None = None,
    members: int | None = None,
    offsets: OffsetSource | None = None,
    real_kafka: bool = False,
    group_recreate: bool = False,
    network: bool = False,
    transactions: bool = False,
) -> Schedule:
    """The schedule of ``seed``: everything not given is drawn from ``seed`` too.

    ``unclean=False`` leaves out what loses records (unclean elections, topic re-creation):
    a run that must see no report at all;
    ``real_kafka`` keeps to the faults real brokers allow (stop/start, elections);
    ``group_recreate`` lets consumer groups see topic re-creation too (off by default so that
    every seed keeps the schedule it always had: the CI set and the seeds kept as regressions
    name schedules by seed); ``network`` mixes :class:`NetFault` steps in (the same seed
    draws another schedule with it); ``transactions`` makes most writes transactional (one
    or two transactional producers committing, aborting or leaving open what they write,
    :data:`TXN_STEP_WEIGHTS`, more lagging followers and unclean elections) under
    read_committed consumers, without topic re-creation
    (the same seed draws another schedule with it too).
    """
    rng = random.Random(seed)
    n_parts = partitions if partitions is not None else rng.choice([1, 2, 2, 3, 4])
    n_members = members if members is not None else rng.choice([1, 1, 1, 2, 3])
    if real_kafka:  # the Java reference consumer reads one partition, alone
        n_parts = partitions if partitions is not None else 1
        n_members = 1
    pol: Policy = policy if policy is not None else rng.choice(["rewind", "raise"])
    src: OffsetSource = (
        offsets
        if offsets is not None
        else ("group" if n_members > 1 or real_kafka else rng.choice(["group", "store"]))
    )
    n_txn = rng.choice([1, 2, 2]) if transactions else 0
    weights: list[tuple[str, int]] = [
        ("produce", TXN_PLAIN_PRODUCE_WEIGHT if transactions else 10),
        ("stop", 1),
        ("start", 2),
        ("clean", 2),
        ("idle", 1),
        ("restart", 1),
    ]
    if unclean:
        # On real Kafka a replica leaves the ISR only by stopping: elect more often.
        weights.append(("unclean", 5 if real_kafka else 3))
    if not real_kafka:
        weights += [
            ("pause", 3),
            ("resume", 2),
            ("metadata", 1),
            ("fault", 2),
            ("retention", 1),
            # Groups only with ``group_recreate``: drawn the same way, so that the seeds of
            # single consumers keep their schedules either way.
            (
                "recreate",
                0
                if rng.random() < 0.7
                or not unclean
                or (n_members > 1 and not group_recreate)
                or transactions
                else 1,
            ),
        ]
    if n_members > 1:
        weights += [("join", 1), ("leave", 1)]
    if network:
        weights.append(("net", 4))
    if transactions:
        weights += list(TXN_STEP_WEIGHTS)
        # Lagging followers elected uncleanly lose markers: more of both.
        weights += [(k, w) for k, w in TXN_FAULT_WEIGHTS if unclean or k != "unclean"]
    kinds, ws = zip(*weights, strict=True)
    out: list[Step] = []
    for _ in range(steps):
        kind = rng.choices(kinds, ws)[0]
        p = rng.randrange(n_parts)
        pick = rng.randrange(6)
        step: Step
        if kind == "produce":
            n = rng.randint(1, 6)
            step = Produce(p, n, rng.choice([1, 2, n]))
        elif kind == "pause":
            step = PauseReplication(p, pick)
        elif kind == "resume":
            step = ResumeReplication(pick)
        elif kind == "stop":
            step = StopBroker(pick)
        elif kind == "start":
            step = StartBroker(pick)
        elif kind == "clean":
            step = Elect(p, False, pick)
        elif kind == "unclean":
            step = Elect(p, True, pick)
        elif kind == "idle":
            step = Idle(rng.choice([0.05, 0.2]))
        elif kind == "restart":
            step = RestartConsumer(rng.randrange(n_members))
        elif kind == "metadata":
            step = MetadataDelay(pick, rng.choice([0.0, 0.2, 0.5]))
        elif kind == "fault":
            fk: Literal["delay", "drop", "disconnect"] = rng.choice(["delay", "drop", "disconnect"])
            step = FetchFault(
                rng.choice(FAULT_APIS), fk, rng.choice([0.1, 0.3]) if fk == "delay" else 0.0
            )
        elif kind == "retention":
            step = DeleteRecords(p, rng.choice([0.25, 0.5, 1.0]))
        elif kind == "recreate":
            step = RecreateTopic()
        elif kind == "join":
            step = Join()
        elif kind == "net":
            step = _net_fault(rng, pick)
        elif kind == "txn_produce":
            step = TxnProduce(p, rng.randint(1, 4), rng.randrange(n_txn))
        elif kind == "txn_end":
            step = TxnEnd(rng.randrange(n_txn), rng.random() < TXN_COMMIT_SHARE)
        else:
            step = Leave(rng.randrange(n_members))
        out.append(step)
    return Schedule(seed, tuple(out), n_parts, pol, n_members, src, n_txn)


def _net_fault(rng: random.Random, pick: int) -> NetFault:
    kind = rng.choice(NET_FAULT_KINDS)
    seconds = rng.choice([0.3, 1.0, 2.0])
    if kind == "latency":
        return NetFault(kind, pick, seconds, latency_s=rng.choice([0.02, 0.1, 0.3]))
    if kind == "bandwidth":
        return NetFault(kind, pick, seconds, bytes_per_s=rng.choice([20_000, 100_000]))
    if kind == "cut":
        return NetFault(
            kind, pick, at_byte=rng.choice([0, 3, 8, 30, 100]), api=rng.choice((None, *FAULT_APIS))
        )
    if kind == "reset":
        return NetFault(kind, pick)
    return NetFault(kind, pick, seconds)


#: The steps of :func:`generate_apache`: what an ApacheKafkaCluster run applies.
APACHE_STEPS = (Produce, Elect, StopBroker, StartBroker, DeleteRecords, Idle, RestartConsumer)
#: With ``generate_apache(transactions=True)``, also these.
APACHE_TXN_STEPS = (*APACHE_STEPS, TxnProduce, TxnEnd)
#: With ``generate_apache(network=True)``, also this (applied by the fault proxy in front of
#: every broker).
APACHE_NET_STEPS = (*APACHE_STEPS, NetFault)

#: Steps that stop or start a broker JVM (seconds each on real Kafka): at most this many a
#: schedule, so 30 schedules take minutes, not an hour.
APACHE_HEAVY_MAX = 3


def _heavy(step: Step) -> bool:
    return isinstance(step, StopBroker | StartBroker) or (isinstance(step, Elect) and step.unclean)


def generate_apache(
    seed: int,
    *,
    steps: int = 8,
    unclean: bool = True,
    policy: Policy | None = None,
    transactions: bool = False,
    network: bool = False,
) -> Schedule:
    """The real-Kafka schedule of ``seed`` (``epochguard.testing.chaos.apache``): one
    partition, one consumer per client on ``assign()`` committing to its group, and only the
    faults real brokers allow through ApacheKafkaCluster's helpers.

    What the steps mean there: :class:`Produce` writes with ``acks=1``, one record per
    request (``batch`` is not used); a clean :class:`Elect` moves leadership to the other
    in-sync replica; :class:`StopBroker`/:class:`StartBroker` stop (controlled shutdown) and
    start a replica's broker; an unclean :class:`Elect` is the cluster's recipe (stop the
    follower, write ``1 + pick % 3`` records that only the leader gets, stop the leader,
    elect the follower with ElectLeaders(UNCLEAN)); :class:`DeleteRecords` moves the log
    start. With ``unclean`` (the default) every schedule has at least one unclean election:
    a real-Kafka run costs tens of seconds and should exercise a truncation; at most
    :data:`APACHE_HEAVY_MAX` steps stop or start brokers.

    ``transactions`` (another schedule for the same seed): one transactional producer
    writes most records (:class:`TxnProduce`, :class:`TxnEnd`) and the consumers read
    committed records only. An unclean :class:`Elect` whose ``pick % 3`` is not 2 then
    loses a transaction marker instead of plain records (the recipe of
    ``epochguard.testing.chaos.apache``: the producer's open transaction, or a new one, is
    on both replicas when the follower stops; the leader alone gets its COMMIT, or its ABORT
    when ``pick`` is odd): the new leader has the transaction open with nobody to end it, a
    hanging transaction. Every such schedule has at least one of those.

    ``network`` (another schedule for the same seed): :class:`NetFault` steps are drawn too,
    the same kinds and durations as :func:`generate`'s, applied between the consumers and
    one of the three brokers (``pick % 3``: a replica's or the spare's, which coordinates
    the groups); every such schedule has at least one. Not together with ``transactions``.
    """
    if network and transactions:
        raise ScheduleError("generate_apache: network and transactions are not drawn together")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ScheduleError(f"steps must be an int >= 1, got {steps!r}")
    rng = random.Random(seed)
    pol: Policy = policy if policy is not None else rng.choice(["rewind", "raise"])
    weights: list[tuple[str, int]] = [
        ("produce", 3 if transactions else 8),
        ("clean", 2),
        ("stop", 1),
        ("start", 1),
        ("retention", 1),
        ("idle", 1),
        ("restart", 1),
    ]
    if unclean:
        weights.append(("unclean", 2))
    if transactions:
        weights += [("txn_produce", 5), ("txn_end", 3)]
    if network:
        weights.append(("net", 5))
    kinds, ws = zip(*weights, strict=True)
    out: list[Step] = []
    heavy = 0
    for _ in range(steps):
        kind = rng.choices(kinds, ws)[0]
        pick = rng.randrange(6)
        step: Step
        if kind == "net":
            step = _net_fault(rng, pick)
        elif kind == "clean":
            step = Elect(0, False, pick)
        elif kind == "unclean":
            step = Elect(0, True, pick)
        elif kind == "stop":
            step = StopBroker(pick)
        elif kind == "start":
            step = StartBroker(pick)
        elif kind == "retention":
            step = DeleteRecords(0, rng.choice([0.25, 0.5, 1.0]))
        elif kind == "idle":
            step = Idle(rng.choice([0.2, 1.0]))
        elif kind == "restart":
            step = RestartConsumer(0)
        elif kind == "txn_produce":
            step = TxnProduce(0, rng.randint(1, 4))
        elif kind == "txn_end":
            step = TxnEnd(0, rng.random() < TXN_COMMIT_SHARE)
        else:
            n = rng.randint(1, 6)
            step = Produce(0, n)
        if _heavy(step):
            if heavy >= APACHE_HEAVY_MAX:
                step = Produce(0, rng.randint(1, 6))
            else:
                heavy += 1
        out.append(step)
    if unclean and not any(isinstance(s, Elect) and s.unclean for s in out):
        # Replace a light step (not the first when there is a choice: consumers should have
        # read something), or a stop/start when the heavy budget is spent.
        light = [i for i in range(len(out)) if not _heavy(out[i])]
        if heavy >= APACHE_HEAVY_MAX or not light:
            at = rng.choice([i for i in range(len(out)) if _heavy(out[i])])
        else:
            at = rng.choice([i for i in light if i > 0] or light)
        out[at] = Elect(0, True, rng.randrange(6))
    if network and not any(isinstance(s, NetFault) for s in out):
        # Inserted (after the first step: consumers should have read something), so that
        # the schedule keeps its unclean election.
        fault = _net_fault(rng, rng.randrange(6))
        out.insert(rng.randint(1, len(out)), fault)
    if transactions and not any(
        isinstance(s, Elect) and s.unclean and s.pick % 3 != 2 for s in out
    ):
        # The schedule's first unclean election loses a marker.
        at = next(i for i, s in enumerate(out) if isinstance(s, Elect) and s.unclean)
        pick = out[at].pick  # type: ignore[union-attr]
        out[at] = Elect(0, True, pick - 1 if pick % 3 == 2 else pick)
    return Schedule(seed, tuple(out), 1, pol, 1, "group", 1 if transactions else 0)
