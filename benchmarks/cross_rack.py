"""KIP-392: record bytes a consumer in one rack pulls from brokers in other racks, with and
without ``client_rack``, on the EmbeddedCluster (brokers in racks a, b, c; the rack-aware
replica selector; the broker counts what it serves to consumers).

The consumer sits in rack c. ``PARTITIONS`` partitions with three replicas each, so every
partition has a replica in rack c, and about a third have their leader there. Without
``client_rack`` every byte of the other partitions crosses racks; with it, the leaders name
the rack-c follower and only the first (empty) answers of each partition come from them.
Target: with ``client_rack`` the cross-rack share is ~0 (under 1 %).
"""

from __future__ import annotations

import os
import time
from typing import Any

from kafka.structs import TopicPartition

from epochguard import EpochConsumer
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.state import RACK_AWARE_REPLICA_SELECTOR

PARTITIONS = int(os.environ.get("CROSS_RACK_PARTITIONS", "6"))
RECORDS = int(os.environ.get("CROSS_RACK_RECORDS", "2000"))
VALUE = b"x" * 1000
RACKS = {0: "rack-a", 1: "rack-b", 2: "rack-c"}
HOME = "rack-c"


def _case(client_rack: str) -> dict[str, Any]:
    with EmbeddedCluster(
        brokers=3, first_broker_id=0, racks=RACKS, replica_selector=RACK_AWARE_REPLICA_SELECTOR
    ) as cluster:
        cluster.create_topic("t", partitions=PARTITIONS, replication_factor=3)
        for p in range(PARTITIONS):
            cluster.append("t", p, [VALUE] * RECORDS, batch_size=100)
        started = time.perf_counter()
        with EpochConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            client_rack=client_rack,
            fetch_max_wait_ms=100,
        ) as consumer:
            consumer.assign([TopicPartition("t", p) for p in range(PARTITIONS)])
            got = 0
            while got < PARTITIONS * RECORDS:
                got += sum(len(v) for v in consumer.poll(timeout_ms=200).values())
                if time.perf_counter() - started > 120:
                    raise RuntimeError(f"only {got} records in 120 s")
            elapsed = time.perf_counter() - started
        served = cluster.consumer_fetch_bytes()
        leaders_home = sum(
            1 for p in range(PARTITIONS) if RACKS[cluster.leader("t", p) or 0] == HOME
        )
    total = sum(served.values())
    cross = sum(n for b, n in served.items() if RACKS[b] != HOME)
    return {
        "client_rack": client_rack or None,
        "bytes_total": total,
        "bytes_cross_rack": cross,
        "cross_rack_share": round(cross / total, 4) if total else None,
        "bytes_by_broker_rack": {RACKS[b]: n for b, n in sorted(served.items())},
        "partitions_led_from_home_rack": leaders_home,
        "seconds": round(elapsed, 3),
    }


def run() -> dict[str, Any]:
    load_before = os.getloadavg()
    cases = [_case(""), _case(HOME)]
    return {
        "partitions": PARTITIONS,
        "records_per_partition": RECORDS,
        "value_bytes": len(VALUE),
        "consumer_rack": HOME,
        "cases": cases,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
