"""The unclean-election truncation scenario, written once against the ``Cluster`` protocol.

It runs on real Apache Kafka 4.x (the reference) and on the EmbeddedCluster, records what the
partition leader answers on the wire at each step, and asserts both clusters give the answers
real Kafka gave (``kafka_answers``, measured on Kafka 4.3.1). The reference clients' behaviour
is recorded to ``build/scenarios/``; franz-go's is asserted (ErrDataLoss, then the new
leader's records), the others' is not judged.

Steps (RF=2 on brokers A and B, broker C never stopped, min.insync.replicas=1, acks=1):
a0..a4 replicated -> stop B -> d0..d2 on A alone (offsets 5..7, committed: ISR is [A]) ->
clients read 0..7 -> stop A -> start B -> unclean election of B -> b0, b1 (offsets 5, 6) ->
clients poll -> start A: A truncates to 5 and copies b0, b1. Variants refill B past the
clients' position 8 (b0..b4) and let the clients poll idle at the log end before the election.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TypeVar

import pytest

from epochguard.testing import ApacheKafkaCluster, Cluster, produce, wait_until
from epochguard.testing.apache_kafka.jars import missing_tools, real_kafka_required
from epochguard.testing.apache_kafka.pytest_support import require_real_kafka

from .clients import (
    ConfluentClient,
    FranzGoClient,
    JavaClient,
    KafkaPythonClient,
    ReferenceClient,
    franzgo_seen,
    read_all,
)
from .observe import Observer

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "build" / "scenarios"
T = TypeVar("T")

E0, LEADERLESS, UNCLEAN = 0, 1, 2


def kafka_answers(refill: int) -> dict[str, Any]:
    """What Kafka 4.3.1 answered when B got ``refill`` new records after its election."""
    leo = 5 + refill
    new = [[5 + i, UNCLEAN, f"b{i}"] for i in range(refill)]
    return {
        "isr_after_follower_stop": "[A]",
        "leo_before_election": {"A": 8, "B": 5},
        "high_watermark_before_election": 8,
        "leaderless_epoch": LEADERLESS,
        "leader_after_b_restart": None,
        "after_unclean_election": {"leader": "B", "epoch": UNCLEAN, "isr": "[B]"},
        "leo_after_new_writes": {"A": 8, "B": leo},
        "offset_for_leader_epoch": {
            # requested epoch -> (error, epoch, end offset) from the new leader
            str(E0): ["NoError", E0, 5],
            str(LEADERLESS): ["NoError", E0, 5],
            str(UNCLEAN): ["NoError", UNCLEAN, leo],
            "7": ["NoError", -1, -1],
        },
        "offset_for_leader_epoch_fenced": "FencedLeaderEpochError",
        "offset_for_leader_epoch_unknown": "UnknownLeaderEpochError",
        "list_offsets": {"latest": ["NoError", leo, UNCLEAN], "earliest": ["NoError", 0, E0]},
        "fetch": {
            # The consumer's position (8, epoch 0) with LastFetchedEpoch: the broker compares.
            "offset 8, last fetched epoch 0": {
                "error": "NoError",
                "diverging_epoch": [E0, 5],
                "records": [],
            },
            # Without it, offset 8 is either out of range or, once B's log is refilled past
            # 8, simply the next records: nothing on the wire says they are not the old ones.
            "offset 8, no last fetched epoch": {
                "error": "NoError" if leo > 8 else "OffsetOutOfRangeError",
                "diverging_epoch": None,
                "records": [r for r in new if r[0] >= 8],
            },
            "offset 5, last fetched epoch 0": {
                "error": "NoError",
                "diverging_epoch": None,
                "records": new,
            },
            "offset 5, current leader epoch 0": {
                "error": "FencedLeaderEpochError",
                "diverging_epoch": None,
                "records": [],
            },
            "offset 5, current leader epoch 3": {
                "error": "UnknownLeaderEpochError",
                "diverging_epoch": None,
                "records": [],
            },
        },
        "after_old_leader_returns": {"isr": "[A, B]", "leo": {"A": leo, "B": leo}},
        "final_log": [[i, E0, f"a{i}"] for i in range(5)] + new,
    }


#: Shared with the other scenario modules (they import these names from here).
eventually = wait_until


def is_raft(cluster: Cluster) -> bool:
    """Whether the cluster follows Raft-term epoch rules (``EmbeddedCluster(epochs="raft")``)."""
    return getattr(cluster, "epochs", "kafka") == "raft"


def kind(cluster: Cluster) -> str:
    if isinstance(cluster, ApacheKafkaCluster):
        return "apache"
    return "embedded-raft" if is_raft(cluster) else "embedded"


def start_clients(
    cluster: Cluster, topic: str, franzgo_probe: Path | None = None
) -> list[ReferenceClient]:
    bootstrap = cluster.all_bootstrap_servers
    clients: list[ReferenceClient] = [
        KafkaPythonClient(bootstrap, topic),
        ConfluentClient(bootstrap, topic),
    ]
    jars = cluster.jars if isinstance(cluster, ApacheKafkaCluster) else None
    if jars is None and (real_kafka_required() or not missing_tools()):
        # Without Java the embedded run goes on with the Python clients only.
        jars = require_real_kafka()
    if jars is not None:
        log_dir = RESULTS / f"java-{kind(cluster)}"
        clients.append(JavaClient(bootstrap, topic, jars, log_dir))
    if franzgo_probe is not None:
        clients.append(
            FranzGoClient(franzgo_probe, bootstrap, topic, RESULTS / f"franzgo-{kind(cluster)}")
        )
    return clients


VARIANTS = {
    # name: (records B gets after its election, clients poll idle before the election)
    "refill-below-position": (2, False),
    "refill-past-position": (5, False),
    "caught-up-clients-refill-past-position": (5, True),
}


@pytest.mark.real_kafka  # on both clusters: the Java consumer is a reference client
@pytest.mark.go  # and so is franz-go
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_unclean_election_answers_match_kafka(
    cluster: Cluster, variant: str, franzgo_probe: Path | None
) -> None:
    refill, idle_poll = VARIANTS[variant]
    topic = f"scenario-{os.getpid()}-{kind(cluster)}-{variant}"
    leo = 5 + refill
    obs = Observer(cluster)
    seen: dict[str, Any] = {}
    clients_seen: dict[str, dict[str, Any]] = {}

    cluster.create_topic(topic, replication_factor=2, config={"min.insync.replicas": "1"})
    a = eventually("a leader", lambda: cluster.leader(topic, 0))
    (b,) = [r for r in cluster.replicas(topic, 0) if r != a]
    names = {a: "A", b: "B"}

    def named(brokers: list[int]) -> str:
        return "[" + ", ".join(sorted(names.get(x, str(x)) for x in brokers)) + "]"

    produce(cluster, topic, [f"a{i}" for i in range(5)])
    eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == 5)
    eventually("ISR [A, B]", lambda: named(cluster.isr(topic, 0)) == "[A, B]")

    cluster.stop_broker(b)
    seen["isr_after_follower_stop"] = eventually(
        "ISR [A]", lambda: (i := named(cluster.isr(topic, 0))) == "[A]" and i
    )
    produce(cluster, topic, ["d0", "d1", "d2"])
    seen["leo_before_election"] = {
        "A": cluster.log_end_offset(topic, 0, a),
        "B": cluster.log_end_offset(topic, 0, b),
    }
    seen["high_watermark_before_election"] = obs.list_offsets(topic, 0, -1)[1]

    clients = start_clients(cluster, topic, franzgo_probe)
    try:
        for name, events in read_all(clients, 8, 20).items():
            clients_seen[name] = {"before": events}
        if idle_poll:
            # Caught up: empty fetches at the end of the log before anything goes wrong.
            for name, events in read_all(clients, 1, 1.5).items():
                clients_seen[name]["idle"] = events

        cluster.stop_broker(a)
        eventually("no leader", lambda: cluster.leader(topic, 0) is None)
        seen["leaderless_epoch"] = cluster.leader_epoch(topic, 0)
        cluster.start_broker(b)
        time.sleep(1.5)  # the controller's unclean-election interval: nothing should happen
        seen["leader_after_b_restart"] = cluster.leader(topic, 0)
        cluster.elect_leader(topic, 0, b, unclean=True)
        eventually("metadata shows B", lambda: obs.leader_and_epoch(topic, 0)[1] == UNCLEAN)
        seen["after_unclean_election"] = {
            "leader": names[eventually("leader", lambda: cluster.leader(topic, 0))],
            "epoch": cluster.leader_epoch(topic, 0),
            "isr": named(cluster.isr(topic, 0)),
        }
        produce(cluster, topic, [f"b{i}" for i in range(refill)])
        seen["leo_after_new_writes"] = {
            "A": cluster.log_end_offset(topic, 0, a),
            "B": cluster.log_end_offset(topic, 0, b),
        }
        seen["offset_for_leader_epoch"] = {
            str(e): list(obs.offset_for_leader_epoch(topic, 0, e))
            for e in (E0, LEADERLESS, UNCLEAN, 7)
        }
        seen["offset_for_leader_epoch_fenced"] = obs.offset_for_leader_epoch(topic, 0, E0, 0)[0]
        seen["offset_for_leader_epoch_unknown"] = obs.offset_for_leader_epoch(topic, 0, E0, 3)[0]
        seen["list_offsets"] = {
            "latest": list(obs.list_offsets(topic, 0, -1)),
            "earliest": list(obs.list_offsets(topic, 0, -2)),
        }
        fetches = {
            "offset 8, last fetched epoch 0": obs.fetch(topic, 0, 8, UNCLEAN, E0),
            "offset 8, no last fetched epoch": obs.fetch(topic, 0, 8, UNCLEAN),
            "offset 5, last fetched epoch 0": obs.fetch(topic, 0, 5, UNCLEAN, E0),
            "offset 5, current leader epoch 0": obs.fetch(topic, 0, 5, 0),
            "offset 5, current leader epoch 3": obs.fetch(topic, 0, 5, 3),
        }
        seen["fetch"] = {
            k: {
                "error": f.error,
                "diverging_epoch": list(f.diverging_epoch) if f.diverging_epoch else None,
                "records": [list(r) for r in f.records],
            }
            for k, f in fetches.items()
        }
        for name, events in read_all(clients, refill, 6).items():
            clients_seen[name]["after"] = events
    finally:
        for client in clients:
            client.close()

    cluster.start_broker(a)
    eventually("ISR [A, B]", lambda: named(cluster.isr(topic, 0)) == "[A, B]")
    eventually("A truncated and refilled", lambda: cluster.log_end_offset(topic, 0, a) == leo)
    seen["after_old_leader_returns"] = {
        "isr": named(cluster.isr(topic, 0)),
        "leo": {"A": cluster.log_end_offset(topic, 0, a), "B": cluster.log_end_offset(topic, 0, b)},
    }
    seen["final_log"] = [list(r) for r in obs.fetch(topic, 0, 0, UNCLEAN).records]
    seen["epoch_caches"] = {
        "A": cluster.epoch_cache(topic, 0, a),
        "B": cluster.epoch_cache(topic, 0, b),
    }

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{variant}-{kind(cluster)}.json"
    out.write_text(json.dumps({"answers": seen, "clients": clients_seen}, indent=1) + "\n")

    assert seen["epoch_caches"] == {"A": [(E0, 0), (UNCLEAN, 5)], "B": [(E0, 0), (UNCLEAN, 5)]}
    del seen["epoch_caches"]
    expected = kafka_answers(refill)
    mismatches = {k: (seen.get(k), v) for k, v in expected.items() if seen.get(k) != v}
    assert not mismatches, f"answers differ from Kafka 4.3.1 (got, kafka): {mismatches}"
    for name, run in clients_seen.items():
        before = [e for e in run["before"] if e["event"] == "record"]
        assert [e["offset"] for e in before] == list(range(8)), (name, run["before"])
    if "franz-go" in clients_seen:
        # franz-go finds the divergence (DivergingEpoch / OffsetForLeaderEpoch), hands the
        # application ErrDataLoss (consumed to 8 @ 0, reset to 5 @ 0) and goes on from 5: it
        # reads the new leader's records.
        assert franzgo_seen(clients_seen["franz-go"]["after"]) == {
            "data_loss": [[8, E0, 5, E0]],
            "fetch_errors": [],
            "records": [[5 + i, UNCLEAN, f"b{i}"] for i in range(refill)],
        }, clients_seen["franz-go"]


def test_kafka_python_keeps_its_position_epoch_while_idle(cluster: Cluster) -> None:
    """Why the caught-up variant differs between the clusters for kafka-python.

    kafka-python 3.0.12 sets its position's epoch to -1 when it processes a fetch response
    that carries the partition without records. Real Kafka keeps a KIP-227 fetch session and
    leaves unchanged partitions out of incremental responses, so an idle consumer never
    processes such a response and keeps epoch 0; a broker without fetch sessions sends the
    empty partition every time and the epoch is lost (the EmbeddedCluster did, until it
    implemented KIP-227 sessions).
    """
    topic = f"idle-{os.getpid()}-{kind(cluster)}"
    cluster.create_topic(topic, replication_factor=2)
    eventually("a leader", lambda: cluster.leader(topic, 0) is not None)
    produce(cluster, topic, ["x0", "x1", "x2"])
    client = KafkaPythonClient(cluster.bootstrap_servers, topic)
    try:
        read = client.read(3, 20)
        assert [e["offset"] for e in read if e["event"] == "record"] == [0, 1, 2]
        client.read(1, 2.0)  # idle at the log end: only empty fetches
        position = client.consumer._subscription.assignment[client.tp].position
    finally:
        client.close()
    assert (position.offset, position.leader_epoch) == (3, 0)


def test_last_isr_member_returns_as_a_clean_leader(cluster: Cluster) -> None:
    """No unclean election: the last ISR member (ELR in Kafka 4.x) leads again, nothing lost."""
    topic = f"elr-{os.getpid()}-{kind(cluster)}"
    cluster.create_topic(topic, replication_factor=2, config={"min.insync.replicas": "1"})
    a = eventually("a leader", lambda: cluster.leader(topic, 0))
    (b,) = [r for r in cluster.replicas(topic, 0) if r != a]
    obs = Observer(cluster)
    produce(cluster, topic, ["a0", "a1"])
    eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == 2)
    cluster.stop_broker(b)
    eventually("ISR [A]", lambda: cluster.isr(topic, 0) == [a])
    produce(cluster, topic, ["d0"])
    cluster.stop_broker(a)
    eventually("no leader", lambda: cluster.leader(topic, 0) is None)
    leaderless_epoch = cluster.leader_epoch(topic, 0)
    cluster.start_broker(a)
    eventually("A leads again", lambda: cluster.leader(topic, 0) == a)
    eventually("metadata epoch", lambda: obs.metadata_epoch(topic, 0) == LEADERLESS + 1)
    answers = {
        "leaderless_epoch": leaderless_epoch,
        "epoch": cluster.leader_epoch(topic, 0),
        "isr": cluster.isr(topic, 0) == [a],
        "leo_a": cluster.log_end_offset(topic, 0, a),
        "offset_for_leader_epoch_0": list(obs.offset_for_leader_epoch(topic, 0, E0)),
        "latest": list(obs.list_offsets(topic, 0, -1)),
    }
    assert answers == {
        "leaderless_epoch": LEADERLESS,
        "epoch": LEADERLESS + 1,
        "isr": True,
        "leo_a": 3,
        "offset_for_leader_epoch_0": ["NoError", E0, 3],
        "latest": ["NoError", 3, LEADERLESS + 1],
    }
    cluster.start_broker(b)
    eventually("B back in the ISR", lambda: sorted(cluster.isr(topic, 0)) == sorted([a, b]))
    assert eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == 3)


def test_a_leaderless_partition_reports_an_empty_isr(cluster: Cluster) -> None:
    """KIP-966 on by default in Kafka 4.x: the last ISR member moves to the ELR, the ISR empties.

    Clients see it in Metadata v12 ``isr_nodes``; the member is still electable (previous test).
    """
    topic = f"leaderless-{os.getpid()}-{kind(cluster)}"
    cluster.create_topic(topic, replication_factor=2, config={"min.insync.replicas": "1"})
    a = eventually("a leader", lambda: cluster.leader(topic, 0))
    (b,) = [r for r in cluster.replicas(topic, 0) if r != a]
    cluster.stop_broker(b)
    eventually("ISR [A]", lambda: cluster.isr(topic, 0) == [a])
    cluster.stop_broker(a)
    eventually("no leader", lambda: cluster.leader(topic, 0) is None)
    assert cluster.isr(topic, 0) == []
