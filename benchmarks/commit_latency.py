"""How long a synchronous commit takes from a consumer that has caught up: EpochConsumer,
AIOEpochConsumer, kafka-python, aiokafka and confluent-kafka, each with its default
``fetch_max_wait_ms`` (500 ms for all five).

Method (also written into the JSON as ``method``):

* One broker in its own process: the EmbeddedCluster (``python -m epochguard cluster``) and
  real Apache Kafka (``ApacheKafkaCluster``, KRaft, from the Maven Central jars). With one
  broker the group's coordinator also leads the partition read, so a client that sent its
  coordinator requests on the connection that fetches would have them answered after the
  long-poll Fetch in flight there.
* Each run has a fresh one-partition topic holding ``COMMIT_RECORDS`` records (default 10)
  and a fresh group. The consumer is a fresh process: assigned the partition (no group
  membership, so no rebalance is timed), it reads every record, then
  ``COMMIT_COUNT`` times (default 50) polls once with a 50 ms timeout (nothing arrives:
  a Fetch is left waiting at the broker) and commits the next offset synchronously
  (``commit(offsets)``; confluent-kafka ``commit(offsets=..., asynchronous=False)``),
  timing the commit call alone.
* p50, p99 and the maximum of those commits, and the consumer process's CPU seconds over
  the commits. Clients are interleaved, ``COMMIT_REPEAT`` rounds (default 2); the round
  with the lowest p99 is kept. The load average is recorded: the machine is shared.

``python -m benchmarks commit_latency``; ``COMMIT_CLUSTERS=embedded`` skips real Kafka.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import create_topic, on_one_broker, percentile, produce

RECORDS = int(os.environ.get("COMMIT_RECORDS", "10"))
COUNT = int(os.environ.get("COMMIT_COUNT", "50"))
REPEAT = int(os.environ.get("COMMIT_REPEAT", "2"))
CLUSTERS = os.environ.get("COMMIT_CLUSTERS", "embedded,apache").split(",")
CLIENTS = ["epochguard", "epochguard-asyncio", "kafka-python", "aiokafka", "confluent-kafka"]
POLL_MS = 50


# ---------------------------------------------------------------- consumer process


def _consumer(
    client: str, bootstrap: str, topic: str, group: str
) -> tuple[Callable[[], int], Callable[[int], None], Callable[[], None]]:
    """``(poll, commit, close)`` for ``client``: ``poll()`` returns how many records it was
    handed, ``commit(offset)`` commits partition 0 at ``offset`` and returns when answered."""
    if client in ("epochguard", "kafka-python"):
        from kafka.structs import OffsetAndMetadata, TopicPartition

        if client == "epochguard":
            from epochguard.consumer import EpochConsumer as Consumer
        else:
            from kafka import KafkaConsumer as Consumer
        tp = TopicPartition(topic, 0)
        c = Consumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        c.assign([tp])

        def poll() -> int:
            return sum(len(v) for v in c.poll(timeout_ms=POLL_MS).values())

        def commit(offset: int) -> None:
            c.commit({tp: OffsetAndMetadata(offset, "", -1)})

        return poll, commit, c.close
    if client == "confluent-kafka":
        from confluent_kafka import Consumer as CConsumer
        from confluent_kafka import TopicPartition as CTopicPartition

        cc = CConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 0,
            }
        )
        cc.assign([CTopicPartition(topic, 0, 0)])

        def cpoll() -> int:
            got = cc.consume(100, POLL_MS / 1000)
            for m in got:
                if m.error():
                    raise RuntimeError(str(m.error()))
            return len(got)

        def ccommit(offset: int) -> None:
            cc.commit(offsets=[CTopicPartition(topic, 0, offset)], asynchronous=False)

        return cpoll, ccommit, cc.close
    if client in ("aiokafka", "epochguard-asyncio"):
        import asyncio

        if client == "aiokafka":
            from aiokafka import AIOKafkaConsumer as AConsumer
            from aiokafka import TopicPartition as ATopicPartition
        else:
            from kafka.structs import TopicPartition as ATopicPartition

            from epochguard import AIOEpochConsumer as AConsumer

        loop = asyncio.new_event_loop()
        atp = ATopicPartition(topic, 0)

        async def start() -> Any:
            consumer = AConsumer(
                bootstrap_servers=bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
            await consumer.start()
            consumer.assign([atp])
            return consumer

        ac = loop.run_until_complete(start())

        def apoll() -> int:
            got = loop.run_until_complete(ac.getmany(timeout_ms=POLL_MS))
            return sum(len(v) for v in got.values())

        def acommit(offset: int) -> None:
            loop.run_until_complete(ac.commit({atp: offset}))

        def aclose() -> None:
            loop.run_until_complete(ac.stop())
            loop.close()

        return apoll, acommit, aclose
    raise ValueError(f"unknown client {client!r}")


def client_main(client: str, bootstrap: str, topic: str, group: str) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    poll, commit, close = _consumer(client, bootstrap, topic, group)
    seen = 0
    deadline = time.monotonic() + 60
    while seen < RECORDS and time.monotonic() < deadline:
        seen += poll()
    took: list[float] = []
    cpu0 = time.process_time()
    if seen == RECORDS:
        for i in range(COUNT):
            poll()
            started = time.perf_counter()
            commit(1 + i % RECORDS)
            took.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu0
    close()
    print(json.dumps({"seen": seen, "commits": took, "cpu_s": cpu}), flush=True)


# ---------------------------------------------------------------- benchmark process


def _run_one(client: str, bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.commit_latency", client, bootstrap, topic, group],
        stdout=subprocess.PIPE,
        text=True,
        timeout=60 + COUNT * 15,
        check=True,
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    took = got["commits"]
    if got["seen"] != RECORDS or len(took) != COUNT:
        return {"error": f"read {got['seen']} of {RECORDS} records"}
    p50, p99 = percentile(took, 50), percentile(took, 99)
    assert p50 is not None and p99 is not None  # took is not empty
    return {
        "commits": len(took),
        "p50_ms": round(p50 * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
        "max_ms": round(max(took) * 1000, 2),
        "cpu_s": round(got["cpu_s"], 2),
    }


def _cases(kind: str, bootstrap: str) -> list[dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    load_before = os.getloadavg()[0]
    for round_no in range(REPEAT):
        for client in CLIENTS:
            name = f"commit-{client}-{round_no}"
            create_topic(bootstrap, name)
            produce(bootstrap, name, RECORDS)
            try:
                got = _run_one(client, bootstrap, name, name)
            except Exception as exc:
                got = {"error": repr(exc)}
            old = best.get(client)
            if old is None or "error" in old or got.get("p99_ms", 1e9) < old["p99_ms"]:
                best[client] = got
    rows = []
    for client in CLIENTS:
        rows.append(
            {
                "cluster": kind,
                "client": client,
                **best[client],
                "load_before": round(load_before, 2),
                "load_after": round(os.getloadavg()[0], 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run() -> dict[str, Any]:
    rows = on_one_broker(CLUSTERS, _cases)
    return {
        "method": __doc__,
        "settings": {
            "records": RECORDS,
            "commits": COUNT,
            "poll_timeout_ms": POLL_MS,
            "repeat": REPEAT,
            "fetch_max_wait_ms": 500,
        },
        "rows": rows,
    }


if __name__ == "__main__":
    client_main(*sys.argv[1:])
