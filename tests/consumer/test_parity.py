"""Drop-in parity with kafka-python 3.0's ``KafkaConsumer``.

The API walk reads kafka-python's class with ``inspect``: every public method and
attribute, each parameter's name, kind and default, and every ``DEFAULT_CONFIG`` key and
default must exist on ``EpochConsumer`` unchanged, except the entries of ``DELIBERATE``,
each with its reason, which must be exactly the rows of the migration guide's table of
deliberate differences (so the list cannot grow without the guide saying so). The
compatibility test runs one typical kafka-python program against both consumers on the
same embedded cluster and compares what it observes.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.future import Future as KafkaFuture
from kafka.structs import OffsetAndMetadata, TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.testing import EmbeddedCluster

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "migration-from-kafka-python.md"

#: Documented deliberate differences: ``name`` for a class member, ``config:key`` for a
#: configuration default. Each is a row of the guide's "Deliberate differences" table.
DELIBERATE: dict[str, str] = {
    "DEFAULT_SESSION_TIMEOUT_MS_PRE_KIP_735": (
        "kafka-python lowers session_timeout_ms to 30000 for brokers older than 3.0; "
        "EpochConsumer keeps the configured value (45000 by default) for every broker"
    ),
    "config:client_id": "defaults to 'epochguard' so brokers can tell the clients apart",
    "config:default_offset_commit_callback": (
        "None (no callback) instead of a lambda that does nothing; both accept a callable"
    ),
    "config:selector": "accepted and ignored: EpochConsumer runs its own network selector",
    "config:kafka_client": (
        "accepted and ignored: EpochConsumer drives its own connections (default None)"
    ),
}

#: Dunder methods a kafka-python program relies on (``for``, ``with``).
_PROTOCOL = ("__iter__", "__next__", "__enter__", "__exit__")


def _public_members(cls: type) -> list[str]:
    names = [n for n in dir(cls) if not n.startswith("_")]
    return sorted(names) + [n for n in _PROTOCOL if hasattr(cls, n)]


def _params(func: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


def parity_problems(reference: type, candidate: type, allowed: set[str]) -> list[str]:
    """Every public member of ``reference`` missing on ``candidate`` or spelled differently."""
    problems = []
    for name in _public_members(reference):
        if name in allowed:
            continue
        want = inspect.getattr_static(reference, name)
        if not hasattr(candidate, name):
            problems.append(f"{name}: missing")
            continue
        got = inspect.getattr_static(candidate, name)
        if isinstance(want, property):
            if not isinstance(got, property):
                problems.append(f"{name}: a property in kafka-python, {type(got).__name__} here")
        elif callable(want):
            if not callable(got):
                problems.append(f"{name}: not callable")
            elif type(want) is not type(got):
                problems.append(f"{name}: {type(want).__name__} there, {type(got).__name__} here")
            elif _params(want) != _params(got):
                problems.append(
                    f"{name}: signature {inspect.signature(want)} in kafka-python, "
                    f"{inspect.signature(got)} here"
                )
    return problems


def config_problems(reference: dict[str, Any], candidate: Any, allowed: set[str]) -> list[str]:
    problems = []
    for key, default in reference.items():
        if key not in candidate:
            problems.append(f"config {key}: missing")
        elif f"config:{key}" not in allowed and candidate[key] != default:
            problems.append(f"config {key}: default {default!r} there, {candidate[key]!r} here")
    return problems


def _guide_rows() -> set[str]:
    text = GUIDE.read_text()
    section = text.split("## Deliberate differences", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, re.MULTILINE)}


# ---------------------------------------------------------------------- the API walk


def test_every_public_member_of_kafka_consumer_exists_with_the_same_signature() -> None:
    assert parity_problems(KafkaConsumer, EpochConsumer, set(DELIBERATE)) == []


def test_every_kafka_config_key_exists_with_the_same_default() -> None:
    problems = config_problems(
        KafkaConsumer.DEFAULT_CONFIG, EpochConsumer.DEFAULT_CONFIG, set(DELIBERATE)
    )
    assert problems == []


def test_constructor_takes_topics_and_keywords_like_kafka_python() -> None:
    assert _params(KafkaConsumer.__init__) == _params(EpochConsumer.__init__)


def test_the_walk_catches_a_missing_method_a_renamed_keyword_and_a_changed_default() -> None:
    class Lacking:
        DEFAULT_CONFIG = {"fetch_max_wait_ms": 100}

        def commit(self, offsets: Any = None) -> None: ...

        def poll(self, timeout: int = 0, max_records: Any = None, update_offsets: bool = True):  # type: ignore[no-untyped-def]
            ...

        def seek(self, partition: Any, offset: Any = 0) -> None: ...

    problems = parity_problems(KafkaConsumer, Lacking, set())
    assert "highwater: missing" in problems
    assert any(p.startswith("commit: signature") for p in problems)
    assert any(p.startswith("poll: signature") for p in problems)
    assert any(p.startswith("seek: signature") for p in problems)
    cfg = config_problems(KafkaConsumer.DEFAULT_CONFIG, Lacking.DEFAULT_CONFIG, set())
    assert "config fetch_max_wait_ms: default 500 there, 100 here" in cfg
    assert "config group_id: missing" in cfg


def test_deliberate_differences_are_exactly_the_guide_table() -> None:
    assert _guide_rows() == set(DELIBERATE)


def test_every_deliberate_difference_is_still_a_difference() -> None:
    # A stale entry would hide a future regression on that name.
    for name in DELIBERATE:
        if name.startswith("config:"):
            key = name.removeprefix("config:")
            assert EpochConsumer.DEFAULT_CONFIG[key] != KafkaConsumer.DEFAULT_CONFIG[key], name
        else:
            assert not hasattr(EpochConsumer, name) or _params(
                getattr(EpochConsumer, name)
            ) != _params(getattr(KafkaConsumer, name)), name


# ---------------------------------------------------------------------- one program, two clients

TOPIC = "compat"
N = 10  # records per partition


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.events.append(("revoked", frozenset(revoked)))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.events.append(("assigned", frozenset(assigned)))


def _drain(consumer: Any, n: int, seconds: float = 15.0) -> list[tuple[int, int, bytes, int]]:
    got: list[tuple[int, int, bytes, int]] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=100).values():
            got += [(r.partition, r.offset, r.value, r.leader_epoch) for r in recs]
    return sorted(got)


def typical_program(cls: Any, bootstrap: str, group: str) -> dict[str, Any]:
    """What a kafka-python application does with its consumer; returns what it saw."""
    seen: dict[str, Any] = {}
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    consumer = cls(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=1000,
        fetch_max_wait_ms=100,
        request_timeout_ms=5000,
    )
    try:
        seen["config has every kafka key"] = set(KafkaConsumer.DEFAULT_CONFIG) <= set(
            consumer.config
        )
        seen["poll with nothing assigned"] = consumer.poll(timeout_ms=50)
        seen["partitions_for_topic"] = consumer.partitions_for_topic(TOPIC)
        seen["partitions_for_topic missing"] = consumer.partitions_for_topic("no-such-topic")
        seen["topics has it"] = TOPIC in consumer.topics()
        seen["subscription"] = consumer.subscription()
        consumer.assign([tp0, tp1])
        seen["assignment"] = consumer.assignment()
        seen["highwater before a fetch"] = consumer.highwater(tp0)
        seen["first pass"] = _drain(consumer, 2 * N)
        seen["highwater"] = consumer.highwater(tp0)
        seen["position"] = consumer.position(tp0)
        seen["committed before"] = consumer.committed(tp0)
        consumer.commit()
        committed = consumer.committed(tp0)
        seen["committed"] = (committed, type(committed))
        seen["committed == position"] = committed == consumer.position(tp0)
        end = consumer.end_offsets([tp0, tp1])
        seen["end_offsets"] = end
        seen["lag"] = end[tp0] - committed
        seen["beginning_offsets"] = consumer.beginning_offsets([tp0, tp1])
        seen["offsets_for_times"] = consumer.offsets_for_times({tp0: 0, tp1: 10**13})
        consumer.commit({tp0: OffsetAndMetadata(4, "app-state", -1)}, timeout_ms=5000)
        seen["committed metadata"] = consumer.committed(tp0, metadata=True)
        calls: list[Any] = []
        future = consumer.commit_async(
            callback=lambda offsets, response: calls.append((offsets, response))
        )
        seen["commit_async future"] = type(future)
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            consumer.poll(timeout_ms=50)
        seen["commit_async callback"] = calls
        seen["commit_async outcome"] = (future.is_done, future.succeeded(), future.value)
        consumer.seek(tp0, 3)
        seen["iterate after seek"] = [(r.partition, r.offset) for r in consumer]
        seen["iterate again, nothing new"] = [r.offset for r in consumer]
        consumer.pause(tp0)
        seen["paused"] = consumer.paused()
        consumer.seek_to_beginning(tp0)
        seen["poll while paused"] = consumer.poll(timeout_ms=300)
        consumer.resume(tp0)
        seen["paused after resume"] = consumer.paused()
        seen["after resume"] = _drain(consumer, N)
        consumer.seek_to_end()
        seen["positions at end"] = (consumer.position(tp0), consumer.position(tp1))
        # Leaving the iterator in the middle of a batch: what was not handed out is
        # neither committed nor skipped.
        consumer.seek_to_beginning()
        taken = []
        for record in consumer:
            taken.append((record.partition, record.offset))
            if len(taken) == 3:
                break
        seen["break: position"] = {
            p: consumer.position(TopicPartition(TOPIC, p)) for p in (0, 1)
        } == {p: max([o + 1 for q, o in taken if q == p], default=0) for p in (0, 1)}
        consumer.commit()
        committed_after_break = {p: consumer.committed(TopicPartition(TOPIC, p)) for p in (0, 1)}
        rest = [(p, o) for p, o, _v, _e in _drain(consumer, 2 * N - 3)]
        seen["break: nothing skipped or repeated"] = sorted(taken + rest) == [
            (p, i) for p in (0, 1) for i in range(N)
        ]
        seen["break: committed what was handed out"] = committed_after_break == {
            p: max([o + 1 for q, o in taken if q == p], default=0) for p in (0, 1)
        }
        # Pausing a partition while iterating: no more of its records until resume().
        consumer.seek_to_beginning()
        got: list[tuple[int, int]] = []
        for record in consumer:  # ends consumer_timeout_ms after the last record
            got.append((record.partition, record.offset))
            if len(got) == 1:
                paused = TopicPartition(TOPIC, record.partition)
                consumer.pause(paused)
        seen["pause while iterating: paused partition"] = [
            o for p, o in got if p == paused.partition
        ]
        seen["pause while iterating: other partition"] = sorted(
            o for p, o in got if p != paused.partition
        )
        consumer.resume(paused)
        seen["pause while iterating: after resume"] = [
            (p == paused.partition, o) for p, o, _v, _e in _drain(consumer, N - 1)
        ]
        try:
            consumer.seek(TopicPartition(TOPIC, 7), 1)
        except ValueError:
            seen["seek unassigned"] = "ValueError"
        seen["metrics shape"] = all(
            isinstance(group_, str) and isinstance(values, dict)
            for group_, values in (consumer.metrics() or {}).items()
        )
        consumer.commit({tp0: OffsetAndMetadata(4, "", -1), tp1: OffsetAndMetadata(8, "", -1)})
        consumer.unsubscribe()
        seen["assignment after unsubscribe"] = consumer.assignment()
        seen["group_metadata"] = consumer.group_metadata()[1:4]  # group ids differ

        # Group management: the listener sees the assignment; unsubscribe() does not call
        # on_partitions_revoked, close() does (kafka-python 3.0 behaviour).
        listener = _Listener()
        consumer.subscribe([TOPIC], listener=listener)
        seen["subscribed"] = consumer.subscription()
        # A subscribing program looks the topic up before it polls. This also keeps the run
        # to one join: kafka-python's group leader keeps the topic metadata it has seen
        # since subscribe() as the snapshot its assignment was made with, and rejoins when
        # a later metadata answer differs from it. On a loaded machine the join can finish
        # before the first metadata answer since subscribe(); the leader then assigns
        # against an empty snapshot, and that answer makes it revoke and rejoin.
        seen["topics after subscribe"] = TOPIC in consumer.topics()
        # A group join: over 30 s for kafka-python on a loaded machine.
        seen["group pass"] = _drain(consumer, 8, seconds=60)
        seen["listener after join"] = list(listener.events)
        consumer.unsubscribe()
        seen["listener after unsubscribe"] = list(listener.events)
        consumer.subscribe([TOPIC], listener=listener)
        seen["topics after subscribing again"] = TOPIC in consumer.topics()
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
        listener.events.clear()
    finally:
        consumer.close()
    seen["listener on close"] = list(listener.events)

    # No group_id: subscribing assigns every partition of the topic, no commits.
    plain = cls(
        TOPIC,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        request_timeout_ms=5000,
    )
    try:
        seen["no group: records"] = _drain(plain, 2 * N)
        seen["no group: assignment"] = plain.assignment()
        seen["no group: subscription"] = plain.subscription()
        try:
            plain.commit()
        except Exception as exc:
            seen["no group: commit"] = type(exc).__name__
    finally:
        plain.close()
    return seen


@pytest.mark.timeout(180)
def test_a_kafka_python_program_sees_the_same_with_either_consumer() -> None:
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic(TOPIC, partitions=2)
        for p in (0, 1):
            cluster.append(TOPIC, p, [b"%d-%d" % (p, i) for i in range(N)], timestamp_ms=1000)
        kafka = typical_program(KafkaConsumer, cluster.bootstrap_servers, "compat-kafka")
        epoch = typical_program(EpochConsumer, cluster.bootstrap_servers, "compat-epoch")
    # Not vacuous: the program saw what it should.
    tp0, tp1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    assert kafka["first pass"] == sorted(
        (p, i, b"%d-%d" % (p, i), 0) for p in (0, 1) for i in range(N)
    )
    assert kafka["committed"] == (N, int) and kafka["lag"] == 0
    assert kafka["committed metadata"] == OffsetAndMetadata(4, "app-state", -1)
    assert kafka["commit_async future"] is KafkaFuture
    assert kafka["commit_async callback"] == [
        ({tp0: OffsetAndMetadata(N, "", 0), tp1: OffsetAndMetadata(N, "", 0)}, None)
    ]
    assert kafka["iterate after seek"] == [(0, i) for i in range(3, N)]
    assert len(kafka["group pass"]) == 8
    # Eager rebalancing: revoked (nothing yet) before the join, then assigned.
    assert kafka["listener after join"] == [
        ("revoked", frozenset()),
        ("assigned", frozenset({tp0, tp1})),
    ]
    assert kafka["listener after unsubscribe"] == kafka["listener after join"]
    assert kafka["break: nothing skipped or repeated"] is True
    assert kafka["break: committed what was handed out"] is True
    assert kafka["break: position"] is True
    assert kafka["pause while iterating: paused partition"] == [0]
    assert kafka["pause while iterating: other partition"] == list(range(N))
    assert kafka["pause while iterating: after resume"] == [(True, i) for i in range(1, N)]
    assert len(kafka["no group: records"]) == 2 * N
    assert kafka["no group: assignment"] == {tp0, tp1}
    assert kafka["no group: commit"] == "IllegalStateError"
    assert kafka["listener on close"] == [("revoked", frozenset({tp0, tp1}))]
    differences = {
        key: (kafka[key], epoch.get(key, "<missing>"))
        for key in kafka
        if kafka[key] != epoch.get(key, "<missing>")
    }
    assert differences == {}
