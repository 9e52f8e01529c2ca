"""The cooperative-sticky assignment (KIP-429) as a pure function, and its wire form."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from kafka.structs import TopicPartition

from epochguard.consumer import ConsumerConfigError, CooperativeStickyAssignor, EpochConsumer
from epochguard.consumer.assignors import cooperative_assignment

T = "t"


def tps(*ps: int, topic: str = T) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in ps]


def test_first_assignment_is_balanced() -> None:
    got = cooperative_assignment({"a": [T], "b": [T], "c": [T]}, {}, {T: range(8)})
    sizes = sorted(len(v) for v in got.values())
    assert sizes == [2, 3, 3]
    assert sorted(tp for v in got.values() for tp in v) == tps(*range(8))


def test_owned_partitions_stay_and_a_moving_one_is_withheld_for_a_round() -> None:
    owned = {"a": tps(0, 1, 2, 3), "b": tps(4, 5, 6, 7)}
    subs = {"a": [T], "b": [T], "c": [T]}
    first = cooperative_assignment(subs, owned, {T: range(8)})
    # Nobody gets a partition another member still owns; c gets nothing yet.
    assert first["c"] == []
    assert set(first["a"]) <= set(owned["a"]) and set(first["b"]) <= set(owned["b"])
    given_up = (set(owned["a"]) - set(first["a"])) | (set(owned["b"]) - set(first["b"]))
    assert len(given_up) == 2  # one each, for c
    # Round two: a and b report what they kept; c gets exactly what they gave up.
    second = cooperative_assignment(subs, {"a": first["a"], "b": first["b"]}, {T: range(8)})
    assert set(second["c"]) == given_up
    assert second["a"] == first["a"] and second["b"] == first["b"]


def test_a_departed_members_partitions_go_out_at_once() -> None:
    owned = {"a": tps(0, 1, 2), "b": tps(3, 4, 5)}  # c left; it owned 6, 7
    got = cooperative_assignment({"a": [T], "b": [T]}, owned, {T: range(8)})
    assert sorted(got["a"] + got["b"]) == tps(*range(8))
    assert set(owned["a"]) <= set(got["a"]) and set(owned["b"]) <= set(got["b"])


def test_a_double_claim_goes_to_the_newer_generation() -> None:
    owned = {"a": tps(0, 1), "b": tps(1, 2)}
    got = cooperative_assignment(
        {"a": [T], "b": [T]}, owned, {T: range(4)}, generations={"a": 4, "b": 5}
    )
    assert TopicPartition(T, 1) in got["b"] and TopicPartition(T, 1) not in got["a"]


def test_partitions_of_unsubscribed_or_vanished_topics_are_dropped() -> None:
    owned = {"a": tps(0, topic="gone") + tps(0), "b": tps(1)}
    got = cooperative_assignment({"a": [T], "b": [T, "u"]}, owned, {T: range(2), "u": range(2)})
    assert got["a"] == tps(0)
    # Balanced, b keeps the topic only it reads; t-1 moves to a, so this round nobody has it.
    assert got["b"] == tps(0, 1, topic="u")
    again = cooperative_assignment({"a": [T], "b": [T, "u"]}, got, {T: range(2), "u": range(2)})
    assert again["a"] == tps(0, 1) and again["b"] == got["b"]


def test_wire_round_trip_reports_owned_partitions() -> None:
    leader = CooperativeStickyAssignor()
    member = CooperativeStickyAssignor()
    member.set_owned(tps(2, 0))
    sub = ConsumerProtocolSubscription.decode(member.metadata({T}).encode())
    assert sub.version >= 1
    cluster = SimpleNamespace(partitions_for_topic=lambda t: {0, 1, 2, 3})
    members = [
        SimpleNamespace(member_id="m1", metadata=sub),
        SimpleNamespace(
            member_id="m2",
            metadata=ConsumerProtocolSubscription.decode(leader.metadata({T}).encode()),
        ),
    ]
    out = leader.assign(cluster, members)
    a1 = ConsumerProtocolAssignment.decode(out["m1"].encode())
    assert sorted(a1.partitions()) == tps(0, 2)
    member.on_assignment(a1, 3)
    assert member.owned == tps(0, 2)


def test_config_refuses_mixing_eager_and_cooperative_assignors() -> None:
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    with pytest.raises(ConsumerConfigError, match="eager-only and cooperative-only"):
        EpochConsumer(
            partition_assignment_strategy=[CooperativeStickyAssignor, RangePartitionAssignor]
        )
