"""Drop-in parity with aiokafka 0.14's ``AIOKafkaConsumer``.

The API walk reads aiokafka's class with ``inspect``: every public method (and the async
protocol methods) must exist on ``AIOEpochConsumer`` with the same parameters (names, kinds,
defaults) and be a coroutine function exactly where aiokafka's is; every constructor keyword
must be accepted with aiokafka's default. The exceptions are the entries of ``DELIBERATE``,
which must be exactly the rows of the migration guide's table (so the list cannot grow
without the guide saying so) and must each still be a difference. Then one typical aiokafka
program runs unchanged against both consumers on the same embedded cluster, and what it
observes is compared.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiokafka
import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import TopicPartition as AIOTopicPartition

from epochguard import AIOEpochConsumer
from epochguard.consumer.aio import _aiokafka_config
from epochguard.consumer.config import build_config
from epochguard.testing import EmbeddedCluster

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "migration-from-aiokafka.md"

#: ``name`` for a class member, ``config:key`` for a constructor keyword's default.
DELIBERATE: dict[str, str] = {
    "config:client_id": "defaults to 'epochguard' so brokers can tell the clients apart",
    "config:partition_assignment_strategy": (
        "kafka-python's assignor classes (aiokafka's own copies are accepted and mapped by "
        "their protocol name)"
    ),
    "config:consumer_timeout_ms": (
        "accepted and ignored: aiokafka's background fetch wait has no counterpart"
    ),
    "config:rebalance_timeout_ms": (
        "accepted; the join's rebalance timeout is max_poll_interval_ms unless this is given"
    ),
}

_PROTOCOL = ("__aiter__", "__anext__", "__aenter__", "__aexit__")


def _members(cls: type) -> list[str]:
    return sorted(n for n in dir(cls) if not n.startswith("_")) + list(_PROTOCOL)


def _params(func: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


def parity_problems(reference: type, candidate: type, allowed: set[str]) -> list[str]:
    problems = []
    for name in _members(reference):
        if name in allowed:
            continue
        want = getattr(reference, name)
        if not hasattr(candidate, name):
            problems.append(f"{name}: missing")
            continue
        got = getattr(candidate, name)
        if not callable(want):
            continue
        if inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(got):
            problems.append(f"{name}: coroutine in one, plain in the other")
        elif _params(want) != _params(got):
            problems.append(
                f"{name}: signature {inspect.signature(want)} in aiokafka, "
                f"{inspect.signature(got)} here"
            )
    return problems


def _aiokafka_defaults() -> dict[str, Any]:
    params = list(inspect.signature(AIOKafkaConsumer.__init__).parameters.values())
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name != "loop"}


def config_problems(allowed: set[str]) -> list[str]:
    ours = build_config(_aiokafka_config({}))
    problems = []
    for key, default in _aiokafka_defaults().items():
        try:
            build_config(_aiokafka_config({key: default}))
        except Exception as exc:
            problems.append(f"config {key}: refused ({exc})")
            continue
        if f"config:{key}" in allowed:
            continue
        value = ours.get(key, "<absent>")
        if key == "max_poll_records" and default is None:
            value = None if value == 2**31 - 1 else value  # None: no limit, as aiokafka
        if key == "client_rack" and default is None:
            value = None if value == "" else value
        if value != default:
            problems.append(f"config {key}: default {default!r} there, {value!r} here")
    return problems


def _guide_rows() -> set[str]:
    text = GUIDE.read_text()
    section = text.split("## Deliberate differences", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, re.MULTILINE)}


def test_every_public_member_of_aiokafka_consumer_exists_with_the_same_signature() -> None:
    assert aiokafka.__version__.startswith("0.14")
    assert parity_problems(AIOKafkaConsumer, AIOEpochConsumer, set(DELIBERATE)) == []


def test_every_aiokafka_keyword_is_accepted_with_the_same_default() -> None:
    assert config_problems(set(DELIBERATE)) == []


def test_the_walk_catches_a_missing_method_a_sync_coroutine_and_a_changed_default() -> None:
    class Lacking:
        def getone(self, *partitions: Any) -> Any: ...  # not a coroutine

        async def getmany(self, *partitions: Any, timeout_ms: int = 100) -> Any: ...

    problems = parity_problems(AIOKafkaConsumer, Lacking, set())
    assert "highwater: missing" in problems
    assert "getone: coroutine in one, plain in the other" in problems
    assert any(p.startswith("getmany: signature") for p in problems)
    assert any(p.startswith("config client_id") for p in config_problems(set()))


def test_deliberate_differences_are_exactly_the_guide_table() -> None:
    assert _guide_rows() == set(DELIBERATE)


def test_every_deliberate_difference_is_still_a_difference() -> None:
    ours = build_config(_aiokafka_config({}))
    defaults = _aiokafka_defaults()
    for name in DELIBERATE:
        key = name.removeprefix("config:")
        if key in ours:
            assert ours[key] != defaults[key], name
        else:
            assert key == "rebalance_timeout_ms" and key not in ours, name


# ---------------------------------------------------------------------- one program, two clients

TOPIC = "compat"
N = 10


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[tuple[str, int]]]] = []

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.events.append(("revoked", frozenset((tp.topic, tp.partition) for tp in revoked)))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.events.append(("assigned", frozenset((tp.topic, tp.partition) for tp in assigned)))


async def typical_program(cls: Any, bootstrap: str, group: str) -> dict[str, Any]:
    """What an aiokafka application does with its consumer; returns what it saw."""
    seen: dict[str, Any] = {}
    tp0, tp1 = AIOTopicPartition(TOPIC, 0), AIOTopicPartition(TOPIC, 1)
    consumer = cls(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        seen["topics has it"] = TOPIC in await consumer.topics()
        consumer.assign([tp0, tp1])
        seen["assignment"] = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        got = []
        deadline = time.monotonic() + 15
        while len(got) < 2 * N and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for tp, records in batch.items():
                got += [(tp.partition, r.offset, r.value, r.key) for r in records]
        seen["getmany"] = sorted(got)
        seen["partitions_for_topic"] = consumer.partitions_for_topic(TOPIC)
        seen["highwater"] = consumer.highwater(tp0)
        seen["position"] = await consumer.position(tp0)
        seen["committed before"] = await consumer.committed(tp0)
        await consumer.commit()
        seen["committed"] = await consumer.committed(tp0)
        await consumer.commit({tp0: 4})
        seen["committed explicit"] = await consumer.committed(tp0)
        seen["end_offsets"] = {
            (tp.topic, tp.partition): o for tp, o in (await consumer.end_offsets([tp0])).items()
        }
        seen["beginning_offsets"] = list((await consumer.beginning_offsets([tp1])).values())
        times = await consumer.offsets_for_times({tp0: 0, tp1: 10**13})
        seen["offsets_for_times"] = {
            tp.partition: None if v is None else v.offset for tp, v in times.items()
        }
        consumer.seek(tp0, 7)
        one = await consumer.getone(tp0)
        seen["getone after seek"] = (one.partition, one.offset, one.value)
        await consumer.seek_to_committed(tp0)
        seen["position after seek_to_committed"] = await consumer.position(tp0)
        consumer.pause(tp1)
        seen["paused"] = {tp.partition for tp in consumer.paused()}
        await consumer.seek_to_beginning(tp1)
        rest = []
        async for record in consumer:
            rest.append((record.partition, record.offset))
            if len(rest) == N - 4:
                break
        seen["async for while paused"] = rest
        consumer.resume(tp1)
        await consumer.seek_to_end(tp0)
        seen["position at end"] = await consumer.position(tp0)
    finally:
        await consumer.stop()

    # Group management with a rebalance listener, in a consumer of its own.
    listener = _Listener()
    consumer = cls(
        bootstrap_servers=bootstrap,
        group_id=group + "-sub",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        consumer.subscribe([TOPIC], listener=listener)
        seen["subscription"] = consumer.subscription()
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < 2 and time.monotonic() < deadline:
            await consumer.getmany(timeout_ms=100)
        seen["group assignment"] = {tp.partition for tp in consumer.assignment()}
        seen["listener"] = list(listener.events)
        listener.events.clear()
    finally:
        await consumer.stop()
    seen["listener on stop"] = list(listener.events)
    return seen


@pytest.mark.timeout(120)
def test_one_aiokafka_program_observes_the_same_on_both(cluster: EmbeddedCluster) -> None:
    cluster.create_topic(TOPIC, partitions=2, replication_factor=1)
    for p in range(2):
        cluster.append(TOPIC, p, [b"v%d-%d" % (p, i) for i in range(N)])
    reference = asyncio.run(typical_program(AIOKafkaConsumer, cluster.bootstrap_servers, "ga"))
    ours = asyncio.run(typical_program(AIOEpochConsumer, cluster.bootstrap_servers, "ge"))
    assert ours == reference
    assert reference["getmany"] and reference["committed"] == N


@pytest.fixture
def cluster() -> Any:
    with EmbeddedCluster(brokers=1) as c:
        yield c
