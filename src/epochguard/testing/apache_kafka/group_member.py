"""Python driver of ``GroupMemberProbe.java``: the stock Java ``KafkaConsumer`` as one member of
a consumer group, beside EpochConsumer and librdkafka in the mixed-group tests.

The member runs as its own JVM (the kafka-clients jar the brokers use) and answers commands on
stdin with JSON lines. Everything it reports comes back as small typed values: the records it
read with their leader epochs, each rebalance callback (assigned / revoked / lost), its commits
with their epochs, and every exception by its Java class (``LogTruncationException`` with its
divergent offsets). The driver decides nothing; tests compare what Java did with what
EpochConsumer did.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
from kafka.structs import TopicPartition

from epochguard.offsets.position import EpochOffset
from epochguard.testing.apache_kafka.jars import KafkaJars
from epochguard.testing.apache_kafka.probe import DEFAULT_PROPS, JavaProgram, ProbeError

__all__ = [
    "CLASSIC_ASSIGNORS",
    "GroupProtocol",
    "JavaCommit",
    "JavaException",
    "JavaGroupMember",
    "JavaMemberConfigError",
    "JavaPoll",
    "JavaRebalance",
    "JavaRecord",
]

GroupProtocol = Literal["classic", "consumer"]

#: ``partition.assignment.strategy`` for the classic protocol, by the names the other clients
#: use for the same assignors (librdkafka's ``partition.assignment.strategy`` values).
CLASSIC_ASSIGNORS: Mapping[str, str] = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "roundrobin": "org.apache.kafka.clients.consumer.RoundRobinAssignor",
    "sticky": "org.apache.kafka.clients.consumer.StickyAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
}
_TERMINAL = frozenset(
    {"ready", "subscribed", "polled", "committed", "seeked", "unsubscribed", "closed", "error"}
)
#: Settings the driver owns; passing them in ``props`` would contradict the typed arguments.
_OWNED_PROPS = frozenset(
    {
        "group.id",
        "group.protocol",
        "group.remote.assignor",
        "group.instance.id",
        "partition.assignment.strategy",
        "auto.offset.reset",
        "enable.auto.commit",
        "bootstrap.servers",
    }
)


class JavaMemberConfigError(ValueError):
    """The Java group member was asked for a setting combination it cannot take."""


def _tp(pair: list[Any]) -> TopicPartition:
    return TopicPartition(str(pair[0]), int(pair[1]))


def _offsets(entries: list[dict[str, Any]]) -> dict[TopicPartition, EpochOffset | None]:
    return {
        TopicPartition(e["topic"], int(e["partition"])): None
        if e["offset"] is None
        else EpochOffset(int(e["offset"]), e["leader_epoch"])
        for e in entries
    }


@attrs.frozen
class JavaRecord:
    """One record the Java member returned from ``poll()``, with its batch's leader epoch."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int | None
    value: str | None

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@attrs.frozen
class JavaRebalance:
    """One ``ConsumerRebalanceListener`` callback (``lost`` is reported as itself, not as the
    ``revoked`` Java's default ``onPartitionsLost`` would call)."""

    kind: Literal["assigned", "revoked", "lost"]
    partitions: frozenset[TopicPartition]


@attrs.frozen
class JavaException:
    """An exception the Java consumer threw, by class. For ``LogTruncationException``,
    ``divergent_offsets`` is its ``divergentOffsets()`` (``None``: the leader could not say);
    for it and ``OffsetOutOfRangeException``, ``fetch_offsets`` the positions that failed."""

    type: str
    java_class: str | None
    message: str | None
    divergent_offsets: Mapping[TopicPartition, EpochOffset | None] = attrs.field(factory=dict)
    fetch_offsets: Mapping[TopicPartition, int] = attrs.field(factory=dict)


@attrs.frozen
class JavaPoll:
    """What one ``poll`` command did: records, callbacks and at most one exception, in order
    of arrival, and the assignment after it."""

    records: tuple[JavaRecord, ...]
    rebalances: tuple[JavaRebalance, ...]
    exception: JavaException | None
    assignment: frozenset[TopicPartition]


@attrs.frozen
class JavaCommit:
    """``commitSync()`` then ``committed()``: what the coordinator holds per assigned
    partition (offset and leader epoch; ``None``: nothing committed)."""

    offsets: Mapping[TopicPartition, EpochOffset | None]


Event = dict[str, Any]


def _exception(event: Event) -> JavaException:
    divergent = _offsets(event.get("divergent_offsets") or [])
    fetch = {
        tp: o.offset
        for tp, o in _offsets(event.get("fetch_offsets") or []).items()
        if o is not None
    }
    return JavaException(
        type=str(event["type"]),
        java_class=event.get("class"),
        message=event.get("message"),
        divergent_offsets=divergent,
        fetch_offsets=fetch,
    )


def _java_props(
    protocol: GroupProtocol, assignor: str | None, instance_id: str | None
) -> dict[str, str]:
    if protocol not in ("classic", "consumer"):
        raise JavaMemberConfigError(f"protocol must be 'classic' or 'consumer', got {protocol!r}")
    if assignor is not None and (not isinstance(assignor, str) or not assignor):
        raise JavaMemberConfigError(f"assignor must be a non-empty name or None, got {assignor!r}")
    if instance_id is not None and (not isinstance(instance_id, str) or not instance_id):
        raise JavaMemberConfigError(
            f"instance_id must be a non-empty string or None, got {instance_id!r}"
        )
    props: dict[str, str] = {"group.protocol": protocol}
    if protocol == "classic":
        if assignor is not None:
            if assignor not in CLASSIC_ASSIGNORS:
                raise JavaMemberConfigError(
                    f"classic assignor {assignor!r} unknown; one of {sorted(CLASSIC_ASSIGNORS)}"
                )
            props["partition.assignment.strategy"] = CLASSIC_ASSIGNORS[assignor]
    elif assignor is not None:
        # Not checked against a list: brokers can be configured with more assignors, and a
        # refusal (UNSUPPORTED_ASSIGNOR) is the coordinator's answer to observe.
        props["group.remote.assignor"] = assignor
    if instance_id is not None:
        props["group.instance.id"] = instance_id
    return props


class JavaGroupMember(JavaProgram):
    """One Java ``KafkaConsumer`` in group ``group_id``, driven one command at a time.

    ``protocol="classic"`` takes ``assignor`` as a client-side assignor name
    (:data:`CLASSIC_ASSIGNORS`); ``protocol="consumer"`` (KIP-848) as ``group.remote.assignor``,
    the coordinator's assignor (``"uniform"``, ``"range"``). Without ``auto_commit``
    commits happen only when the test calls :meth:`commit`. Not thread-safe
    (nor is the consumer it drives).
    """

    label = "Java member"
    terminal = _TERMINAL

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str,
        *,
        protocol: GroupProtocol = "consumer",
        assignor: str | None = None,
        instance_id: str | None = None,
        auto_offset_reset: Literal["earliest", "latest", "none"] = "earliest",
        auto_commit: bool = False,
        props: Mapping[str, str] | None = None,
        jars: KafkaJars | None = None,
        log_dir: Path,
    ) -> None:
        if not group_id:
            raise JavaMemberConfigError("group_id must be a non-empty string")
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise JavaMemberConfigError(
                f"auto_offset_reset must be earliest, latest or none, got {auto_offset_reset!r}"
            )
        clashes = sorted(_OWNED_PROPS & set(props or {}))
        if clashes:
            raise JavaMemberConfigError(
                f"{', '.join(clashes)} are set through JavaGroupMember's arguments, not props"
            )
        settings = {
            **DEFAULT_PROPS,
            # A classic member learns of a rebalance from its heartbeat: 500 ms (not 3 s) keeps
            # an eager rebalance of a mixed group within a test's budget. KIP-848 members get
            # the interval from the coordinator (and Java refuses the setting there).
            **({"heartbeat.interval.ms": "500"} if protocol == "classic" else {}),
            **_java_props(protocol, assignor, instance_id),
            # Auto commit as the other members of a mixed group do it: every 200 ms, before a
            # revocation and on close(), each with the epoch of the last record returned.
            **(
                {"enable.auto.commit": "true", "auto.commit.interval.ms": "200"}
                if auto_commit
                else {}
            ),
            **(props or {}),
        }
        self.group_id = group_id
        self.protocol: GroupProtocol = protocol
        self._launch(
            "GroupMemberProbe",
            [
                bootstrap_servers,
                group_id,
                auto_offset_reset,
                *(f"{k}={v}" for k, v in settings.items()),
            ],
            jars=jars,
            log_dir=log_dir,
            log_name=f"member-{group_id}-{int(time.time() * 1000)}.log",
        )
        #: Every record it returned, across commands.
        self.records: list[JavaRecord] = []
        #: Every rebalance callback, across commands (including those run by close()).
        self.rebalances: list[JavaRebalance] = []
        self.assignment: frozenset[TopicPartition] = frozenset()
        self._closed = False
        first = self._until_terminal(60.0)[-1]
        if first["event"] == "error":
            self.close()
            raise ProbeError(f"the Java consumer refused its configuration: {first}")

    # ------------------------------------------------------------------ plumbing

    def _on_event(self, event: Event) -> None:
        if event["event"] in ("assigned", "revoked", "lost"):
            parts = frozenset(_tp(p) for p in event["partitions"])
            self.rebalances.append(JavaRebalance(event["event"], parts))

    def _command(self, line: str, timeout: float) -> list[Event]:
        events = self._send(line, timeout)
        last = events[-1]
        if last["event"] == "error":
            raise ProbeError(f"{line!r} failed in Java: {last['type']}: {last.get('message')}")
        return events

    # ------------------------------------------------------------------ commands

    def subscribe(self, topics: Iterable[str]) -> None:
        names = list(topics)
        if not names or any(not t or "," in t or " " in t for t in names):
            raise JavaMemberConfigError(f"topics must be non-empty names, got {names!r}")
        self._command(f"subscribe {','.join(names)}", 30)

    def poll(self, max_records: int = 0, timeout_ms: int = 1000) -> JavaPoll:
        """``poll()`` in a loop until ``max_records`` records (0: until ``timeout_ms``), an
        exception, or ``timeout_ms``."""
        if max_records < 0 or timeout_ms <= 0:
            raise ValueError(
                f"poll needs max_records >= 0 and timeout_ms > 0, got {max_records}, {timeout_ms}"
            )
        events = self._command(f"poll {max_records} {timeout_ms}", timeout_ms / 1000 + 30)
        records = tuple(
            JavaRecord(
                e["topic"], int(e["partition"]), int(e["offset"]), e["leader_epoch"], e["value"]
            )
            for e in events
            if e["event"] == "record"
        )
        self.records += records
        rebalances = tuple(
            JavaRebalance(e["event"], frozenset(_tp(p) for p in e["partitions"]))
            for e in events
            if e["event"] in ("assigned", "revoked", "lost")
        )
        errors = [_exception(e) for e in events if e["event"] == "exception"]
        self.assignment = frozenset(_tp(p) for p in events[-1]["assignment"])
        return JavaPoll(records, rebalances, errors[0] if errors else None, self.assignment)

    def poll_until(
        self, done: Callable[[JavaPoll], bool], what: str, timeout: float = 60.0
    ) -> list[JavaPoll]:
        """Poll in 200 ms rounds until ``done`` holds for a round (or fail naming ``what``);
        every round's result, in order."""
        rounds: list[JavaPoll] = []
        deadline = time.monotonic() + timeout
        while True:
            rounds.append(self.poll(0, 200))
            if done(rounds[-1]):
                return rounds
            if time.monotonic() >= deadline:
                raise ProbeError(
                    f"Java member: timed out waiting for {what}; assignment "
                    f"{sorted(map(str, self.assignment))}, last events {self.history[-10:]}"
                )

    def commit(self) -> JavaCommit:
        """``commitSync()`` of every assigned partition's position (with the epoch of the
        last record read), then ``committed()`` read back from the coordinator."""
        last = self._command("commit", 30)[-1]
        return JavaCommit(_offsets(last["offsets"]))

    def seek(self, tp: TopicPartition, offset: int, leader_epoch: int | None = None) -> None:
        suffix = "" if leader_epoch is None else f" {leader_epoch}"
        self._command(f"seek {tp.topic} {tp.partition} {offset}{suffix}", 30)

    def unsubscribe(self) -> None:
        self._command("unsubscribe", 30)
        self.assignment = frozenset()

    def close(self) -> None:
        """``close()``: the member leaves the group (its revoke callback runs first)."""
        if self._closed:
            return
        self._closed = True
        self._stop(30)
        self.assignment = frozenset()
