"""Leader changes: how long after a clean leader change each consumer delivers the first
record the new leader wrote, and what EpochConsumer asked the brokers for on the way.

Method (also written into the JSON):

* One EmbeddedCluster (three brokers) in this process; a topic of one partition replicated
  on all three. Each client runs in a process of its own, assigned the partition from
  offset 0 with its default settings (fetch waits, metadata age, backoffs), and prints
  when it received each record (wall clock, the same clock this process reads).
* ``CHANGES`` times (default 30): one record is appended, every client has it; the
  leadership moves to the next replica in the ISR (a clean, preferred election), and at
  once a marker record is appended through the new leader. A client's time for that
  change is from the election's return to its receipt of the marker.
* p50, p99 and max per client; EpochConsumer's Metadata, OffsetForLeaderEpoch and Fetch
  requests and the leader hints it used (KIP-951) over the run, per change.
* The clients: EpochConsumer, AIOEpochConsumer, kafka-python, confluent-kafka (librdkafka)
  and aiokafka, side by side in one run; the load average is recorded (the machine may be
  shared).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import percentile

CHANGES = int(os.environ.get("LEADER_CHANGES", "30"))
TOPIC = "leaders"
CLIENTS = ["epochguard", "epochguard-asyncio", "kafka-python", "confluent-kafka", "aiokafka"]


# --------------------------------------------------------------------------- client side


def _emit(value: bytes) -> None:
    print(json.dumps({"value": value.decode(), "at": time.time()}), flush=True)


def _kafka_python_like(cls: Any, bootstrap: str, want: int) -> Any:
    from kafka.structs import TopicPartition

    c = cls(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    c.assign([TopicPartition(TOPIC, 0)])
    seen = 0
    while seen < want:
        for records in c.poll(timeout_ms=100).values():
            for r in records:
                _emit(r.value)
                seen += 1
    return c


def client_main(client: str, bootstrap: str, want: int) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    print(json.dumps({"ready": time.time()}), flush=True)
    if client == "epochguard":
        from epochguard import EpochConsumer

        c = _kafka_python_like(EpochConsumer, bootstrap, want)
        print(json.dumps({"metrics": c.metrics(raw=True)}), flush=True)
        c.close()
    elif client == "kafka-python":
        from kafka import KafkaConsumer

        _kafka_python_like(KafkaConsumer, bootstrap, want).close()
    elif client == "confluent-kafka":
        from confluent_kafka import Consumer, TopicPartition

        cc = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "leader-change",
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )
        cc.assign([TopicPartition(TOPIC, 0, 0)])
        seen = 0
        while seen < want:
            for m in cc.consume(num_messages=100, timeout=0.1):
                if m.error():
                    continue
                _emit(m.value())
                seen += 1
        cc.close()
    else:
        asyncio.run(_asyncio_client(client, bootstrap, want))


async def _asyncio_client(client: str, bootstrap: str, want: int) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    cls: Any = AIOKafkaConsumer
    if client == "epochguard-asyncio":
        from epochguard import AIOEpochConsumer

        cls = AIOEpochConsumer
    c = cls(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    await c.start()
    try:
        c.assign([TopicPartition(TOPIC, 0)])
        seen = 0
        while seen < want:
            for records in (await c.getmany(timeout_ms=100)).values():
                for r in records:
                    _emit(r.value)
                    seen += 1
        if client == "epochguard-asyncio":
            print(json.dumps({"metrics": c.metrics(raw=True)}), flush=True)
    finally:
        await c.stop()


# --------------------------------------------------------------------------- harness


def run() -> dict[str, Any]:
    from epochguard.testing import EmbeddedCluster

    load_before = round(os.getloadavg()[0], 2)
    want = 2 * CHANGES + 1
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        cluster.append(TOPIC, 0, [b"start"])
        procs = {
            name: subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.leader_change",
                    "--client",
                    name,
                    cluster.bootstrap_servers,
                    str(want),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for name in CLIENTS
        }
        for proc in procs.values():
            assert proc.stdout is not None
            proc.stdout.readline()  # ready
        time.sleep(3)  # every client has read "start" and is waiting at the end
        elected_at: dict[str, float] = {}
        for i in range(CHANGES):
            cluster.append(TOPIC, 0, [b"before-%d" % i])
            time.sleep(0.5)
            replicas = cluster.isr(TOPIC, 0)
            leader = cluster.leader(TOPIC, 0)
            target = next(b for b in replicas if b != leader)
            cluster.elect_leader(TOPIC, 0, target)
            elected_at[f"marker-{i}"] = time.time()
            cluster.append(TOPIC, 0, [b"marker-%d" % i])
            time.sleep(1.0)
        outputs = {}
        for name, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            outputs[name] = [json.loads(line) for line in out.splitlines() if line.strip()]
    result: dict[str, Any] = {
        "method": __doc__,
        "changes": CHANGES,
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "clients": {},
    }
    for name, lines in outputs.items():
        received = {d["value"]: d["at"] for d in lines if "value" in d}
        ms = [(received[m] - t) * 1000 for m, t in elected_at.items() if m in received]
        row: dict[str, Any] = {
            "received": len(ms),
            "missed": CHANGES - len(ms),
            "p50_ms": None if not ms else round(percentile(ms, 50) or 0, 1),
            "p99_ms": None if not ms else round(percentile(ms, 99) or 0, 1),
            "max_ms": None if not ms else round(max(ms), 1),
            "each_ms": [round(v, 1) for v in ms],
        }
        metrics = next((d["metrics"] for d in lines if "metrics" in d), None)
        if metrics is not None:
            for key in (
                "metadata_requests",
                "offset_for_leader_epoch_requests",
                "fetch_requests",
                "leader_hints_applied",
            ):
                row[f"{key}_per_change"] = round(metrics[key] / CHANGES, 2)
        result["clients"][name] = row
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        print(json.dumps(run(), indent=2))
