"""KIP-392: record bytes a consumer in one rack pulls from brokers in other racks, with and
without ``client_rack``, on the EmbeddedCluster and on a real Apache Kafka cluster (brokers
in racks a, b, c; Kafka's ``RackAwareReplicaSelector``).

The consumer sits in rack c. ``PARTITIONS`` partitions with three replicas each, so every
partition has a replica in rack c, and about a third have their leader there. Without
``client_rack`` every byte of the other partitions crosses racks; with it, the leaders name
the rack-c follower and only the first (empty) answers of each partition come from them.
Target: with ``client_rack`` the cross-rack share is ~0 (under 1 %).

Bytes are counted on both sides: the EmbeddedCluster counts what each broker served to
consumers (``consumer_fetch_bytes()``); the consumer counts record bytes per broker it
fetched from (its fetcher's ``bytes_by_node``, an internal diagnostic read here), which
is what the real-Kafka case uses.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import AbstractContextManager
from typing import Any

from kafka.structs import TopicPartition

from benchmarks._common import produce
from epochguard import EpochConsumer
from epochguard.testing import Cluster, EmbeddedCluster, wait_until
from epochguard.testing.embedded.records import build_batch
from epochguard.testing.embedded.state import RACK_AWARE_REPLICA_SELECTOR

PARTITIONS = int(os.environ.get("CROSS_RACK_PARTITIONS", "6"))
RECORDS = int(os.environ.get("CROSS_RACK_RECORDS", "2000"))
VALUE = b"x" * 1000
HOME = "rack-c"


def _racks(first: int) -> dict[int, str]:
    return {first: "rack-a", first + 1: "rack-b", first + 2: "rack-c"}


def _fill(cluster: Cluster, topic: str) -> None:
    total = RECORDS * PARTITIONS
    if isinstance(cluster, EmbeddedCluster):
        per_batch = math.gcd(RECORDS, 100)  # batches of (up to) 100 records
        batch = build_batch([VALUE] * per_batch)
        produce(cluster, topic, total, partitions=PARTITIONS, batch=batch, batch_records=per_batch)
    else:
        produce(cluster, topic, total, partitions=PARTITIONS, value=VALUE, acks="all")


def _case(cluster: Cluster, racks: dict[int, str], topic: str, client_rack: str) -> dict[str, Any]:
    started = time.perf_counter()
    before = cluster.consumer_fetch_bytes() if isinstance(cluster, EmbeddedCluster) else {}
    with EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        client_rack=client_rack,
        fetch_max_wait_ms=100,
    ) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        got = 0
        while got < PARTITIONS * RECORDS:
            got += sum(len(v) for v in consumer.poll(timeout_ms=200).values())
            if time.perf_counter() - started > 180:
                raise RuntimeError(f"only {got} records in 180 s")
        elapsed = time.perf_counter() - started
        by_node = dict(consumer._fetcher.bytes_by_node)
    total = sum(by_node.values())
    cross = sum(n for b, n in by_node.items() if racks.get(b) != HOME)
    out: dict[str, Any] = {
        "client_rack": client_rack or None,
        "bytes_total": total,
        "bytes_cross_rack": cross,
        "cross_rack_share": round(cross / total, 4) if total else None,
        "bytes_by_broker_rack": {racks.get(b, str(b)): n for b, n in sorted(by_node.items())},
        "partitions_led_from_home_rack": sum(
            1 for p in range(PARTITIONS) if racks.get(cluster.leader(topic, p) or -1) == HOME
        ),
        "seconds": round(elapsed, 3),
    }
    if isinstance(cluster, EmbeddedCluster):
        after = cluster.consumer_fetch_bytes()
        served = {b: after.get(b, 0) - before.get(b, 0) for b in after}
        out["broker_side_cross_rack"] = sum(n for b, n in served.items() if racks[b] != HOME)
    return out


def _cluster_cases(cluster_cm: AbstractContextManager[Any], first: int) -> list[dict[str, Any]]:
    racks = _racks(first)
    with cluster_cm as cluster:
        cases = []
        for client_rack in ("", HOME):
            topic = f"cross-rack-{client_rack or 'none'}"
            cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
            wait_until(
                "full ISRs",
                lambda topic=topic: all(len(cluster.isr(topic, p)) == 3 for p in range(PARTITIONS)),
                timeout=60,
            )
            _fill(cluster, topic)
            cases.append(_case(cluster, racks, topic, client_rack))
        return cases


def run() -> dict[str, Any]:
    load_before = os.getloadavg()
    result: dict[str, Any] = {
        "partitions": PARTITIONS,
        "records_per_partition": RECORDS,
        "value_bytes": len(VALUE),
        "consumer_rack": HOME,
        "embedded": _cluster_cases(
            EmbeddedCluster(
                brokers=3,
                first_broker_id=0,
                racks=_racks(0),
                replica_selector=RACK_AWARE_REPLICA_SELECTOR,
            ),
            0,
        ),
    }
    if os.environ.get("CROSS_RACK_APACHE", "1") == "1":
        from epochguard.testing.apache_kafka import ApacheKafkaCluster, ensure_kafka_jars

        result["apache_kafka"] = _cluster_cases(
            ApacheKafkaCluster(
                brokers=3,
                jars=ensure_kafka_jars(),
                racks=_racks(0),
                replica_selector=RACK_AWARE_REPLICA_SELECTOR,
            ),
            0,
        )
    result["load_average_before"] = [round(x, 2) for x in load_before]
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result
