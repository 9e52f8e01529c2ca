"""The other scenarios of the suite, with the reference clients and the wire answers.

Each scenario is staged once per cluster: the partition leader's answers (Metadata topic
ids, OffsetForLeaderEpoch, ListOffsets, Fetch errors and DivergingEpoch, OffsetFetch
committed epochs) are recorded and the embedded cluster must give what real Kafka 4.3.1
gave; kafka-python, confluent-kafka, the Java consumer (``auto.offset.reset`` none /
error) and franz-go (``kgo.NoResetOffset``) go through the same steps and what they do is
recorded in ``build/scenarios/<scenario>-<cluster>.json``; franz-go's is asserted, as it
behaved on both clusters, the others' is not judged (EpochConsumer's side of the same
scenarios is asserted in test_epoch_consumer.py).

* clean-leader-change: x0..x4 replicated on A and B, clients read them, B is elected
  cleanly, y0..y4 follow.
* unclean-while-stopped-restart-from-committed: a0..a4 replicated, B stopped, d0..d2 on A
  alone (5..7); clients read 0..7, commit (offset 8, epoch 0) and close; A stops, B is
  elected uncleanly and gets b0..b4 (5..9, past the committed offset); new clients of the
  same groups restart from the commit.
* retention-past-position: r0..r9, clients read 0..2, DeleteRecords moves the log start to
  6, r10 follows.
* topic-recreate: t0..t4, clients read them, the topic is deleted and re-created, z0..z7
  are written (offsets 0..7 again, epoch 0 again).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from epochguard.testing import ApacheKafkaCluster, Cluster, produce, recreate_topic
from epochguard.testing import wait_until as eventually
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
from .test_unclean_truncation import RESULTS, kind

# real_kafka and go on both clusters: the Java consumer and franz-go are reference clients.
pytestmark = [pytest.mark.real_kafka, pytest.mark.go, pytest.mark.slow, pytest.mark.timeout(300)]

E0 = 0


def _java_jars(cluster: Cluster) -> Any:
    jars = cluster.jars if isinstance(cluster, ApacheKafkaCluster) else None
    if jars is None and (real_kafka_required() or not missing_tools()):
        jars = require_real_kafka()
    return jars


def replicated_on_two(cluster: Cluster, topic: str, values: list[str]) -> tuple[int, int]:
    """A topic on leader A and follower B (min.insync.replicas=1) holding ``values``, with
    both in the ISR; returns (A, B)."""
    cluster.create_topic(topic, replication_factor=2, config={"min.insync.replicas": "1"})
    a = eventually("a leader", lambda: cluster.leader(topic, 0))
    (b,) = [r for r in cluster.replicas(topic, 0) if r != a]
    produce(cluster, topic, values)
    eventually("B caught up", lambda: cluster.log_end_offset(topic, 0, b) == len(values))
    eventually("ISR [A, B]", lambda: sorted(cluster.isr(topic, 0)) == sorted([a, b]))
    return a, b


def clients_for(
    cluster: Cluster,
    topic: str,
    franzgo_probe: Path | None,
    group: str | None = None,
    from_committed: bool = False,
) -> list[ReferenceClient]:
    """The reference clients, reading from 0, or restarting from ``group``'s commit."""
    bootstrap = cluster.all_bootstrap_servers
    clients: list[ReferenceClient] = [
        KafkaPythonClient(bootstrap, topic, f"{group}-kp" if group else None, from_committed),
        ConfluentClient(bootstrap, topic, f"{group}-ck" if group else None, from_committed),
    ]
    jars = _java_jars(cluster)
    if jars is not None:
        clients.append(
            JavaClient(
                bootstrap,
                topic,
                jars,
                RESULTS / f"java-{kind(cluster)}",
                None if from_committed else (0, None),
                f"{group}-java" if group else None,
            )
        )
    if franzgo_probe is not None:
        clients.append(
            FranzGoClient(
                franzgo_probe,
                bootstrap,
                topic,
                RESULTS / f"franzgo-{kind(cluster)}",
                f"{group}-franzgo" if group else None,
                from_committed,
            )
        )
    return clients


#: The group of each reference client in the restart scenario: ``<group>-<suffix>``.
GROUP_SUFFIXES = {
    "kp": "kafka-python",
    "ck": "confluent-kafka",
    "java": "java",
    "franzgo": "franz-go",
}


def offsets_read(events: list[dict[str, Any]]) -> list[int]:
    return [e["offset"] for e in events if e["event"] == "record"]


def record(
    scenario: str, cluster: Cluster, seen: dict[str, Any], clients_seen: dict[str, dict[str, Any]]
) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{scenario}-{kind(cluster)}.json"
    out.write_text(
        json.dumps({"answers": seen, "clients": clients_seen}, indent=1, default=str) + "\n"
    )


def close_all(clients: list[ReferenceClient]) -> None:
    for c in clients:
        c.close()


def fetch_summary(
    obs: Observer, topic: str, offset: int, current: int = -1, last_fetched: int = -1
) -> dict[str, Any]:
    f = obs.fetch(topic, 0, offset, current, last_fetched)
    return {
        "error": f.error,
        "diverging_epoch": list(f.diverging_epoch) if f.diverging_epoch else None,
        "records": [[o, v] for o, _e, v in f.records],
    }


# ------------------------------------------------------------------------- clean change


def test_clean_leader_change(cluster: Cluster, franzgo_probe: Path | None) -> None:
    topic = f"ref-clean-{os.getpid()}-{kind(cluster)}"
    obs = Observer(cluster)
    _a, b = replicated_on_two(cluster, topic, [f"x{i}" for i in range(5)])
    clients = clients_for(cluster, topic, franzgo_probe)
    clients_seen: dict[str, dict[str, Any]] = {}
    try:
        for name, events in read_all(clients, 5, 20).items():
            clients_seen[name] = {"before": events}
        cluster.elect_leader(topic, 0, b)
        new_epoch = eventually(
            "B leads", lambda: cluster.leader(topic, 0) == b and cluster.leader_epoch(topic, 0)
        )
        eventually("metadata", lambda: obs.leader_and_epoch(topic, 0)[1] == new_epoch)
        produce(cluster, topic, [f"y{i}" for i in range(5)])
        for name, events in read_all(clients, 5, 15).items():
            clients_seen[name]["after"] = events
    finally:
        close_all(clients)
    seen = {
        "epoch_step": new_epoch - E0,
        "offset_for_leader_epoch_0": list(obs.offset_for_leader_epoch(topic, 0, E0)),
        "list_offsets_latest": list(obs.list_offsets(topic, 0, -1)),
        "fetch": {
            "offset 5, current leader epoch 0": fetch_summary(obs, topic, 5, E0),
            "offset 5, last fetched epoch 0": fetch_summary(obs, topic, 5, new_epoch, E0),
        },
    }
    record("clean-leader-change", cluster, seen, clients_seen)
    y = [[5 + i, f"y{i}"] for i in range(5)]
    assert seen == {
        "epoch_step": 1,
        "offset_for_leader_epoch_0": ["NoError", E0, 5],
        "list_offsets_latest": ["NoError", 10, new_epoch],
        "fetch": {
            "offset 5, current leader epoch 0": {
                "error": "FencedLeaderEpochError",
                "diverging_epoch": None,
                "records": [],
            },
            "offset 5, last fetched epoch 0": {
                "error": "NoError",
                "diverging_epoch": None,
                "records": y,
            },
        },
    }
    for name, run in clients_seen.items():
        assert offsets_read(run["before"]) == list(range(5)), (name, run)
    if "franz-go" in clients_seen:
        assert franzgo_seen(clients_seen["franz-go"]["after"]) == {
            "data_loss": [],
            "fetch_errors": [],
            "records": [[5 + i, new_epoch, f"y{i}"] for i in range(5)],
        }, clients_seen["franz-go"]


# ------------------------------------------------------------- restart from committed


def test_unclean_election_while_stopped_then_restart_from_committed(
    cluster: Cluster, franzgo_probe: Path | None
) -> None:
    topic = f"ref-restart-{os.getpid()}-{kind(cluster)}"
    group = f"g-{topic}"
    obs = Observer(cluster)
    a, b = replicated_on_two(cluster, topic, [f"a{i}" for i in range(5)])
    cluster.stop_broker(b)
    eventually("ISR [A]", lambda: cluster.isr(topic, 0) == [a])
    produce(cluster, topic, ["d0", "d1", "d2"])

    seen: dict[str, Any] = {}
    clients_seen: dict[str, dict[str, Any]] = {}
    first = clients_for(cluster, topic, franzgo_probe, group)
    try:
        for name, events in read_all(first, 8, 20).items():
            clients_seen[name] = {"before": events}
        committed = {}
        for c in first:
            committed[c.name] = c.commit()  # type: ignore[attr-defined]
        seen["committed_before"] = committed
    finally:
        close_all(first)

    cluster.stop_broker(a)
    if cluster.running_broker_ids:
        eventually("no leader", lambda: cluster.leader(topic, 0) is None)
    cluster.start_broker(b)
    cluster.elect_leader(topic, 0, b, unclean=True)
    epoch = eventually(
        "B leads", lambda: cluster.leader(topic, 0) == b and cluster.leader_epoch(topic, 0)
    )
    eventually("metadata", lambda: obs.leader_and_epoch(topic, 0)[1] == epoch)
    produce(cluster, topic, [f"b{i}" for i in range(5)])

    restarted = clients_for(cluster, topic, franzgo_probe, group, from_committed=True)
    try:
        for name, events in read_all(restarted, 5, 5).items():
            clients_seen[name]["after_restart"] = events
    finally:
        close_all(restarted)
    seen["epoch_after"] = epoch
    # What a restarting client is told on the wire, whatever each library makes of it.
    suffixes = [s for s, name in GROUP_SUFFIXES.items() if name in clients_seen]
    seen["offset_fetch"] = {
        f"{group}-{suffix}": list(obs.offset_fetch(f"{group}-{suffix}", topic, 0))
        for suffix in suffixes
    }
    seen["offset_for_leader_epoch_0"] = list(obs.offset_for_leader_epoch(topic, 0, E0))
    seen["fetch at the committed position"] = fetch_summary(obs, topic, 8, epoch, E0)
    record("unclean-while-stopped-restart-from-committed", cluster, seen, clients_seen)
    cluster.start_broker(a)
    eventually("A truncated and refilled", lambda: cluster.log_end_offset(topic, 0, a) == 10)

    expected_committed = {"kafka-python": [8, E0], "confluent-kafka": [8, E0]}
    if _java_jars(cluster) is not None:
        expected_committed["java"] = [8, E0]
    if franzgo_probe is not None:
        expected_committed["franz-go"] = [8, E0]
    assert seen == {
        "committed_before": expected_committed,
        "epoch_after": 2,
        "offset_fetch": {f"{group}-{s}": ["NoError", 8, E0] for s in suffixes},
        "offset_for_leader_epoch_0": ["NoError", E0, 5],
        "fetch at the committed position": {
            "error": "NoError",
            "diverging_epoch": [E0, 5],
            "records": [],
        },
    }
    if "franz-go" in clients_seen:
        # Restored with the committed epoch, validated before fetching: ErrDataLoss, then the
        # new leader's records from the divergence on.
        assert franzgo_seen(clients_seen["franz-go"]["after_restart"]) == {
            "data_loss": [[8, E0, 5, E0]],
            "fetch_errors": [],
            "records": [[5 + i, epoch, f"b{i}"] for i in range(5)],
        }, clients_seen["franz-go"]


# ---------------------------------------------------------------------------- retention


def test_retention_moves_log_start_past_the_position(
    cluster: Cluster, franzgo_probe: Path | None
) -> None:
    topic = f"ref-retention-{os.getpid()}-{kind(cluster)}"
    obs = Observer(cluster)
    cluster.create_topic(topic, replication_factor=2)
    eventually("a leader", lambda: cluster.leader(topic, 0) is not None)
    produce(cluster, topic, [f"r{i}" for i in range(3)])
    clients = clients_for(cluster, topic, franzgo_probe)
    clients_seen: dict[str, dict[str, Any]] = {}
    try:
        for name, events in read_all(clients, 3, 20).items():
            clients_seen[name] = {"before": events}
        time.sleep(0.5)  # their next fetches come back empty before more records arrive
        produce(cluster, topic, [f"r{i}" for i in range(3, 10)])
        cluster.delete_records(topic, 0, 6)
        produce(cluster, topic, ["r10"])
        for name, events in read_all(clients, 5, 5).items():
            clients_seen[name]["after"] = events
    finally:
        close_all(clients)
    seen = {
        "list_offsets_earliest": list(obs.list_offsets(topic, 0, -2)),
        "list_offsets_latest": list(obs.list_offsets(topic, 0, -1)),
        "fetch at 3": fetch_summary(obs, topic, 3, E0, E0),
        "fetch at 6": fetch_summary(obs, topic, 6, E0, E0),
    }
    record("retention-past-position", cluster, seen, clients_seen)
    assert seen == {
        "list_offsets_earliest": ["NoError", 6, E0],
        "list_offsets_latest": ["NoError", 11, E0],
        "fetch at 3": {"error": "OffsetOutOfRangeError", "diverging_epoch": None, "records": []},
        "fetch at 6": {
            "error": "NoError",
            "diverging_epoch": None,
            "records": [[6 + i, f"r{6 + i}"] for i in range(5)],
        },
    }
    if "franz-go" in clients_seen:
        # kgo.NoResetOffset: OFFSET_OUT_OF_RANGE on every poll and nothing at the new log
        # start; only what a fetch got before the deletion (r3 in every run so far) is read.
        franzgo = franzgo_seen(clients_seen["franz-go"]["after"])
        prefetched = franzgo.pop("records")
        assert franzgo == {"data_loss": [], "fetch_errors": ["OFFSET_OUT_OF_RANGE"]}, franzgo
        assert prefetched == [[3 + i, E0, f"r{3 + i}"] for i in range(len(prefetched))]
        assert len(prefetched) <= 3, prefetched


# ------------------------------------------------------------------------ topic recreate


def test_topic_deleted_and_recreated(cluster: Cluster, franzgo_probe: Path | None) -> None:
    topic = f"ref-recreate-{os.getpid()}-{kind(cluster)}"
    obs = Observer(cluster)
    cluster.create_topic(topic, replication_factor=2)
    eventually("a leader", lambda: cluster.leader(topic, 0) is not None)
    old_id = eventually("topic id", lambda: obs._metadata(topic).topics[0].topic_id)
    produce(cluster, topic, [f"t{i}" for i in range(5)])
    clients = clients_for(cluster, topic, franzgo_probe)
    clients_seen: dict[str, dict[str, Any]] = {}
    try:
        for name, events in read_all(clients, 5, 20).items():
            clients_seen[name] = {"before": events}
        recreate_topic(cluster, topic, replication_factor=2)
        produce(cluster, topic, [f"z{i}" for i in range(8)])
        for name, events in read_all(clients, 8, 6).items():
            clients_seen[name]["after"] = events
    finally:
        close_all(clients)
    new_id = eventually("new topic id", lambda: obs._metadata(topic).topics[0].topic_id)
    seen = {
        "topic_id_changed": new_id != old_id,
        "leader_epoch": obs.leader_and_epoch(topic, 0)[1],
        "offset_for_leader_epoch_0": list(obs.offset_for_leader_epoch(topic, 0, E0)),
        "fetch by name at 5, last fetched epoch 0": fetch_summary(obs, topic, 5, E0, E0),
    }
    record("topic-recreate", cluster, seen, clients_seen)
    assert seen == {
        "topic_id_changed": True,
        "leader_epoch": E0,
        "offset_for_leader_epoch_0": ["NoError", E0, 8],
        "fetch by name at 5, last fetched epoch 0": {
            "error": "NoError",
            "diverging_epoch": None,
            "records": [[5 + i, f"z{5 + i}"] for i in range(3)],
        },
    }
    if "franz-go" in clients_seen:
        # franz-go fetches by topic id: the old id is UNKNOWN_TOPIC_ID on every poll, and it
        # never reads the new topic's records as the old one's.
        assert franzgo_seen(clients_seen["franz-go"]["after"]) == {
            "data_loss": [],
            "fetch_errors": ["UNKNOWN_TOPIC_ID"],
            "records": [],
        }, clients_seen["franz-go"]
