"""KIP-429 cooperative-sticky partition assignor for the classic group protocol.

Named ``cooperative-sticky`` like Java's ``CooperativeStickyAssignor`` and librdkafka's
``partition.assignment.strategy=cooperative-sticky``, so EpochConsumers and those clients
form one group. Members report what they own in the ``owned_partitions`` field of their
subscription (ConsumerProtocolSubscription v1+); the leader keeps every member's owned
partitions where it can, balances the rest, and withholds a partition that moves from one
member to another for one round: its owner gives it up first (committing its position, with
the leader epoch) and rejoins, and only the next generation hands it to the new owner. No
partition is ever owned by two members at once, and members keep consuming what they keep.

The assignment itself is a pure function (:func:`cooperative_assignment`), tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kafka.coordinator.assignors.abstract import RebalanceProtocol
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from kafka.structs import TopicPartition

__all__ = ["CooperativeStickyAssignor", "cooperative_assignment"]

#: ConsumerProtocolSubscription v1 added ``owned_partitions`` (KIP-429).
_SUBSCRIPTION_VERSION = 1


def cooperative_assignment(
    subscriptions: Mapping[str, Iterable[str]],
    owned: Mapping[str, Iterable[TopicPartition]],
    partitions: Mapping[str, Iterable[int]],
    generations: Mapping[str, int] | None = None,
) -> dict[str, list[TopicPartition]]:
    """This round's assignment: member id -> partitions.

    ``subscriptions``: each member's topics; ``owned``: what each member says it owns;
    ``partitions``: the partitions of each topic; ``generations``: the generation each
    member's ownership is from (a partition claimed twice goes to the newer claim, as Java
    decides; unknown: -1). A partition whose owner must give it up is in nobody's list.
    """
    gens = generations or {}
    members = sorted(subscriptions)
    subs = {m: set(subscriptions[m]) for m in members}
    universe = {
        TopicPartition(t, p)
        for t in set().union(*subs.values())
        if t in partitions
        for p in partitions[t]
    }
    # Keep what members own and may still have; a double claim goes to the newest generation.
    assignment: dict[str, list[TopicPartition]] = {m: [] for m in members}
    owner: dict[TopicPartition, str] = {}
    for m in sorted(members, key=lambda m: (-gens.get(m, -1), m)):
        for tp in sorted(set(owned.get(m, ()))):
            if tp in universe and tp.topic in subs[m] and tp not in owner:
                owner[tp] = m
                assignment[m].append(tp)
    # Partitions nobody owns: to the least loaded member subscribed to the topic.
    for tp in sorted(universe - owner.keys()):
        candidates = [m for m in members if tp.topic in subs[m]]
        if candidates:
            assignment[min(candidates, key=lambda m: (len(assignment[m]), m))].append(tp)
    # Balance: move a partition from a member with two more than another member that could
    # take it, until no such move is left. Each move lowers the spread, so this ends.
    changed = True
    while changed:
        changed = False
        for hi in sorted(members, key=lambda m: (-len(assignment[m]), m)):
            for tp in sorted(assignment[hi], reverse=True):
                takers = [
                    m
                    for m in members
                    if tp.topic in subs[m] and len(assignment[m]) < len(assignment[hi]) - 1
                ]
                if not takers:
                    continue
                lo = min(takers, key=lambda m: (len(assignment[m]), m))
                assignment[hi].remove(tp)
                assignment[lo].append(tp)
                changed = True
                break
            if changed:
                break
    # KIP-429: a partition leaving its current owner is withheld for one round.
    out: dict[str, list[TopicPartition]] = {}
    for m in members:
        out[m] = sorted(tp for tp in assignment[m] if owner.get(tp, m) == m)
    return out


def _owned_of(subscription: Any) -> list[TopicPartition]:
    return [
        TopicPartition(t.topic, p)
        for t in getattr(subscription, "owned_partitions", None) or ()
        for p in t.partitions
    ]


class CooperativeStickyAssignor:
    """The ``cooperative-sticky`` assignor (KIP-429) for ``partition_assignment_strategy``.

    Use it alone, or only with other cooperative assignors: a group rebalances
    cooperatively only when every assignor a member offers is cooperative."""

    name = "cooperative-sticky"
    version = _SUBSCRIPTION_VERSION

    def __init__(self) -> None:
        self._owned: list[TopicPartition] = []
        self._generation = -1

    def supported_protocols(self) -> list[RebalanceProtocol]:
        return [RebalanceProtocol.COOPERATIVE]

    @property
    def owned(self) -> list[TopicPartition]:
        """What this member reports owning in its next JoinGroup."""
        return list(self._owned)

    def set_owned(self, partitions: Iterable[TopicPartition]) -> None:
        """The consumer's partitions now (after it gave up revoked ones)."""
        self._owned = sorted(set(partitions))

    def metadata(self, topics: Iterable[str]) -> Any:
        by_topic: dict[str, list[int]] = {}
        for tp in self._owned:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return ConsumerProtocolSubscription(
            version=self.version,
            topics=sorted(topics),
            user_data=b"",
            owned_partitions=[
                ConsumerProtocolSubscription.TopicPartition(topic=t, partitions=sorted(ps))
                for t, ps in sorted(by_topic.items())
            ],
        )

    def assign(self, cluster: Any, members: Sequence[Any]) -> dict[str, Any]:
        """``members``: JoinGroup members whose ``metadata`` is a decoded
        ``ConsumerProtocolSubscription`` (v0 members own nothing)."""
        subscriptions: dict[str, list[str]] = {}
        owned: dict[str, list[TopicPartition]] = {}
        generations: dict[str, int] = {}
        topics: set[str] = set()
        for member in members:
            sub = member.metadata
            subscriptions[member.member_id] = list(sub.topics)
            owned[member.member_id] = _owned_of(sub)
            generations[member.member_id] = int(getattr(sub, "generation_id", -1) or -1)
            topics.update(sub.topics)
        partitions = {t: cluster.partitions_for_topic(t) or set() for t in topics}
        result = cooperative_assignment(subscriptions, owned, partitions, generations)
        out: dict[str, Any] = {}
        for member_id, tps in result.items():
            by_topic: dict[str, list[int]] = {}
            for tp in tps:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            out[member_id] = ConsumerProtocolAssignment(self.version, sorted(by_topic.items()), b"")
        return out

    def on_assignment(self, assignment: Any, generation: int) -> None:
        self._owned = sorted(assignment.partitions())
        self._generation = generation

    def on_generation_assignment(self, generation: int) -> None:
        self._generation = generation
