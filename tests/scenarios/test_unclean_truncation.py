"""The unclean-election truncation scenario, written once against the ``Cluster`` protocol.

It runs on real Apache Kafka 4.x (the reference) and on the EmbeddedCluster, records what the
partition leader answers on the wire at each step, and asserts both clusters give the answers
real Kafka gave (``KAFKA_ANSWERS``, measured on Kafka 4.3.1). The reference clients' behaviour
is recorded to ``build/scenarios/`` and not judged.

Steps (RF=2 on brokers A and B, broker C never stopped, min.insync.replicas=1, acks=1):
a0..a4 replicated -> stop B -> d0..d2 on A alone (offsets 5..7, committed: ISR is [A]) ->
clients read 0..7 -> stop A -> start B -> unclean election of B -> b0, b1 (offsets 5, 6) ->
clients poll -> start A: A truncates to 5 and copies b0, b1.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kafka import KafkaProducer

from epochguard.testing import ApacheKafkaCluster, Cluster, EmbeddedCluster
from epochguard.testing.apache_kafka.pytest_support import require_real_kafka

from .clients import ConfluentClient, JavaClient, KafkaPythonClient, ReferenceClient
from .observe import Observer

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "build" / "scenarios"
T = TypeVar("T")

E0, LEADERLESS, UNCLEAN = 0, 1, 2
KAFKA_ANSWERS: dict[str, Any] = {
    "isr_after_follower_stop": "[A]",
    "leo_before_election": {"A": 8, "B": 5},
    "high_watermark_before_election": 8,
    "leaderless_epoch": LEADERLESS,
    "leader_after_b_restart": None,
    "after_unclean_election": {"leader": "B", "epoch": UNCLEAN, "isr": "[B]"},
    "leo_after_new_writes": {"A": 8, "B": 7},
    "offset_for_leader_epoch": {
        # requested epoch -> (error, epoch, end offset) from the new leader
        str(E0): ["NoError", E0, 5],
        str(LEADERLESS): ["NoError", E0, 5],
        str(UNCLEAN): ["NoError", UNCLEAN, 7],
        "7": ["NoError", -1, -1],
    },
    "offset_for_leader_epoch_fenced": "FencedLeaderEpochError",
    "offset_for_leader_epoch_unknown": "UnknownLeaderEpochError",
    "list_offsets": {"latest": ["NoError", 7, UNCLEAN], "earliest": ["NoError", 0, E0]},
    "fetch": {
        # the consumer's position (8, epoch 0) with LastFetchedEpoch: the broker does the check
        "offset 8, last fetched epoch 0": {
            "error": "NoError",
            "diverging_epoch": [E0, 5],
            "records": [],
        },
        "offset 8, no last fetched epoch": {
            "error": "OffsetOutOfRangeError",
            "diverging_epoch": None,
            "records": [],
        },
        "offset 5, last fetched epoch 0": {
            "error": "NoError",
            "diverging_epoch": None,
            "records": [[5, UNCLEAN, "b0"], [6, UNCLEAN, "b1"]],
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
    "after_old_leader_returns": {"isr": "[A, B]", "leo": {"A": 7, "B": 7}},
    "final_log": [[i, E0, f"a{i}"] for i in range(5)] + [[5, UNCLEAN, "b0"], [6, UNCLEAN, "b1"]],
}


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except Exception as exc:  # both clusters raise their own errors while catching up
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def produce(cluster: Cluster, topic: str, values: list[str]) -> None:
    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap_servers,
        acks=1,
        enable_idempotence=False,
        linger_ms=0,
        retries=5,
    )
    try:
        for value in values:
            producer.send(topic, value.encode(), partition=0).get(timeout=15)
    finally:
        producer.close(timeout=5)


def every_broker(cluster: Cluster) -> str:
    if isinstance(cluster, ApacheKafkaCluster):
        return cluster.all_bootstrap_servers
    assert isinstance(cluster, EmbeddedCluster)
    return ",".join(cluster.broker_address(b) for b in cluster.broker_ids)


def epoch_cache(cluster: Cluster, topic: str, broker: int) -> list[tuple[int, int]]:
    if isinstance(cluster, ApacheKafkaCluster):
        return cluster.replica_epoch_cache(topic, 0, broker)
    assert isinstance(cluster, EmbeddedCluster)
    return cluster.epoch_cache(topic, 0, broker)


def kind(cluster: Cluster) -> str:
    return "apache" if isinstance(cluster, ApacheKafkaCluster) else "embedded"


def start_clients(cluster: Cluster, topic: str) -> list[ReferenceClient]:
    bootstrap = every_broker(cluster)
    clients: list[ReferenceClient] = [
        KafkaPythonClient(bootstrap, topic),
        ConfluentClient(bootstrap, topic),
    ]
    jars = cluster.jars if isinstance(cluster, ApacheKafkaCluster) else None
    if jars is None and os.environ.get("EPOCHGUARD_SCENARIO_JAVA", "1") == "1":
        jars = require_real_kafka()
    if jars is not None:
        log_dir = RESULTS / f"java-{kind(cluster)}"
        clients.append(JavaClient(bootstrap, topic, jars, log_dir))
    return clients


def test_unclean_election_answers_match_kafka(cluster: Cluster, request: Any) -> None:
    topic = f"scenario-{os.getpid()}-{kind(cluster)}"
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

    clients = start_clients(cluster, topic)
    try:
        for client in clients:
            clients_seen[client.name] = {"before": client.read(8, 20)}

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
        produce(cluster, topic, ["b0", "b1"])
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
        for client in clients:
            clients_seen[client.name]["after"] = client.read(2, 12)
    finally:
        for client in clients:
            client.close()

    cluster.start_broker(a)
    eventually("ISR [A, B]", lambda: named(cluster.isr(topic, 0)) == "[A, B]")
    eventually("A truncated and refilled", lambda: cluster.log_end_offset(topic, 0, a) == 7)
    seen["after_old_leader_returns"] = {
        "isr": named(cluster.isr(topic, 0)),
        "leo": {"A": cluster.log_end_offset(topic, 0, a), "B": cluster.log_end_offset(topic, 0, b)},
    }
    seen["final_log"] = [list(r) for r in obs.fetch(topic, 0, 0, UNCLEAN).records]
    seen["epoch_caches"] = {
        "A": epoch_cache(cluster, topic, a),
        "B": epoch_cache(cluster, topic, b),
    }

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"unclean-truncation-{kind(cluster)}.json"
    out.write_text(json.dumps({"answers": seen, "clients": clients_seen}, indent=1) + "\n")

    assert seen["epoch_caches"] == {"A": [(E0, 0), (UNCLEAN, 5)], "B": [(E0, 0), (UNCLEAN, 5)]}
    del seen["epoch_caches"]
    mismatches = {k: (seen.get(k), v) for k, v in KAFKA_ANSWERS.items() if seen.get(k) != v}
    assert not mismatches, f"answers differ from Kafka 4.3.1 (got, kafka): {mismatches}"
    for name, run in clients_seen.items():
        before = [e for e in run["before"] if e["event"] == "record"]
        assert [e["offset"] for e in before] == list(range(8)), (name, run["before"])
