"""Consumer throughput (records/s) and the cost of noticing a leader change.

Throughput: one EmbeddedCluster (in this process) holds a preloaded topic; each client
(EpochConsumer, kafka-python's KafkaConsumer, aiokafka, confluent-kafka) reads all of it
from offset 0 in its own subprocess (so the Python clients do not share a GIL with the
cluster), with CRC checks on and 500 records per poll. Timed from the first record to the
last; clients interleaved, best of ``CONSUMER_BENCH_REPEAT`` (3) runs each, since the
machine may be shared. Cases: 100 B and 1 KB values, 1 and 8 partitions.

Detection: RF=2, offsets 0..9 replicated, the follower stops, the leader alone appends
10..14 which the client reads, then an unclean election makes the follower leader and it
appends 8 new records at 10..17. Reported per client: milliseconds from the election to
the client's first reaction (a truncation report/error, or the first record of the new
leader), the requests it sent in that window (counted by the cluster), and whether the
loss was detected.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from benchmarks._common import (
    aiokafka_consumer,
    confluent_consumer,
    confluent_step,
    kafka_python_api_consumer,
    produce,
    run_json_client,
)
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.records import build_batch

SCALE = float(os.environ.get("CONSUMER_BENCH_SCALE", "1.0"))
CASES = [
    # (value size, partitions, records)
    (100, 1, int(300_000 * SCALE)),
    (100, 8, int(300_000 * SCALE)),
    (1024, 1, int(100_000 * SCALE)),
    (1024, 8, int(100_000 * SCALE)),
]
CLIENTS = ["epochguard", "epochguard-pure-python", "kafka-python", "aiokafka", "confluent-kafka"]
BATCH = 500
REPEAT = int(os.environ.get("CONSUMER_BENCH_REPEAT", "3"))
POLL_RECORDS = 500
API_NAMES = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    18: "ApiVersions",
    23: "OffsetForLeaderEpoch",
}


# ---------------------------------------------------------------------- client side


def _consume_epochguard(bootstrap: str, topic: str, parts: int, total: int) -> float:
    from epochguard.consumer import EpochConsumer

    c = kafka_python_api_consumer(
        EpochConsumer, bootstrap, topic, parts, max_poll_records=POLL_RECORDS
    )
    return _loop(lambda: sum(len(v) for v in c.poll(timeout_ms=1000).values()), total, c.close)


def _consume_kafka_python(bootstrap: str, topic: str, parts: int, total: int) -> float:
    from kafka import KafkaConsumer

    c = kafka_python_api_consumer(
        KafkaConsumer, bootstrap, topic, parts, max_poll_records=POLL_RECORDS
    )
    return _loop(lambda: sum(len(v) for v in c.poll(timeout_ms=1000).values()), total, c.close)


def _consume_confluent(bootstrap: str, topic: str, parts: int, total: int) -> float:
    c = confluent_consumer(bootstrap, topic, parts, **{"group.id": "bench", "check.crcs": True})
    step = confluent_step(c, POLL_RECORDS, touch=False)
    return _loop(lambda: step()[0], total, c.close)


def _consume_aiokafka(bootstrap: str, topic: str, parts: int, total: int) -> float:
    import asyncio

    async def main() -> float:
        c = await aiokafka_consumer(bootstrap, topic, parts)
        try:
            count = 0
            started = 0.0
            deadline = time.monotonic() + 300
            while count < total and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=1000, max_records=POLL_RECORDS)
                n = sum(len(v) for v in batch.values())
                if n and not started:
                    started = time.perf_counter()
                count += n
            if count < total:
                raise RuntimeError(f"aiokafka read {count} of {total}")
            return time.perf_counter() - started
        finally:
            await c.stop()

    return asyncio.run(main())


def _loop(step: Any, total: int, close: Any) -> float:
    count = 0
    started = 0.0
    deadline = time.monotonic() + 300
    try:
        while count < total and time.monotonic() < deadline:
            n = step()
            if n and not started:
                started = time.perf_counter()
            count += n
        if count < total:
            raise RuntimeError(f"read {count} of {total}")
        return time.perf_counter() - started
    finally:
        close()


CONSUMERS = {
    "epochguard": _consume_epochguard,
    # Same consumer, EPOCHGUARD_PURE_PYTHON=1 in its environment (see _run_client).
    "epochguard-pure-python": _consume_epochguard,
    "kafka-python": _consume_kafka_python,
    "aiokafka": _consume_aiokafka,
    "confluent-kafka": _consume_confluent,
}


def client_main(argv: list[str]) -> None:
    client, bootstrap, topic, parts, total = argv
    import logging

    # The benchmark's own output is its JSON line: no library or client logs at all.
    logging.disable(logging.CRITICAL)
    elapsed = CONSUMERS[client](bootstrap, topic, int(parts), int(total))
    from epochguard.consumer.records import DECODER

    print(json.dumps({"elapsed_s": elapsed, "decoder": DECODER}))


# ---------------------------------------------------------------------- harness


def _run_client(
    client: str, bootstrap: str, topic: str, parts: int, total: int
) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k != "EPOCHGUARD_PURE_PYTHON"}
    if client == "epochguard-pure-python":
        env["EPOCHGUARD_PURE_PYTHON"] = "1"
    try:
        out = run_json_client(
            "benchmarks.consumer_throughput",
            ["--client", client, bootstrap, topic, str(parts), str(total)],
            400,
            env=env,
            tail=2000,
        )
    except RuntimeError as exc:
        raise RuntimeError(f"{client} failed: {exc}") from None
    return float(out["elapsed_s"]), str(out["decoder"])


def _ratio(row: dict[str, Any], a: str, b: str) -> float | None:
    return round(row[a] / row[b], 2) if row.get(a) and row.get(b) else None


def throughput() -> list[dict[str, Any]]:
    rows = []
    with EmbeddedCluster(brokers=1) as cluster:
        for size, parts, total in CASES:
            total -= total % (parts * BATCH)
            topic = f"bench-{size}-{parts}"
            cluster.create_topic(topic, partitions=parts, replication_factor=1)
            batch = build_batch([b"x" * size] * BATCH)
            produce(cluster, topic, total, partitions=parts, batch=batch, batch_records=BATCH)
            row: dict[str, Any] = {
                "value_bytes": size,
                "partitions": parts,
                "records": total,
                "load_avg_1m_before": round(os.getloadavg()[0], 2),
            }
            best: dict[str, float] = {}
            # Clients interleaved, best of REPEAT: the machine is shared, and a load spike
            # should not decide the comparison.
            for _ in range(REPEAT):
                for client in CLIENTS:
                    if f"{client}_error" in row:
                        continue
                    try:
                        elapsed, decoder = _run_client(
                            client, cluster.bootstrap_servers, topic, parts, total
                        )
                        best[client] = min(best.get(client, elapsed), elapsed)
                        if client.startswith("epochguard"):
                            row[f"{client}_decoder"] = decoder
                    except Exception as exc:
                        row[f"{client}_error"] = repr(exc)[:300]
            row["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
            for client in CLIENTS:
                row[client] = round(total / best[client]) if client in best else None
            for name in ("epochguard", "epochguard-pure-python"):
                row[f"{name}_vs_kafka_python"] = _ratio(row, name, "kafka-python")
                row[f"{name}_vs_aiokafka"] = _ratio(row, name, "aiokafka")
            rows.append(row)
            print(json.dumps(row), flush=True)
            cluster.delete_topic(topic)
    return rows


# ---------------------------------------------------------------------- detection cost


def _stage(cluster: EmbeddedCluster, topic: str) -> tuple[int, int]:
    cluster.create_topic(topic, replication_factor=2)
    old = cluster.leader(topic, 0)
    assert old is not None
    new = next(b for b in cluster.replicas(topic, 0) if b != old)
    cluster.append(topic, 0, [b"kept-%d" % i for i in range(10)], batch_size=1)
    cluster.stop_broker(new)
    cluster.append(topic, 0, [b"maybe-lost-%d" % i for i in range(5)], batch_size=1)
    return old, new


def _elect(cluster: EmbeddedCluster, topic: str, old: int, new: int) -> None:
    cluster.stop_broker(old)
    cluster.start_broker(new)
    cluster.elect_leader(topic, 0, new, unclean=True)
    cluster.append(topic, 0, [b"new-%d" % i for i in range(8)], batch_size=1)
    cluster.start_broker(old)


def _idle(poll: Any, seconds: float = 0.6) -> None:
    """Caught up and idle for a while (empty fetches) before the election."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        poll()


def _counts(cluster: EmbeddedCluster) -> dict[int, int]:
    def snap() -> dict[int, int]:
        out: dict[int, int] = {}
        for (key, _v), n in cluster.state.request_counts.items():
            out[key] = out.get(key, 0) + n
        return out

    return cluster.call(snap)


def _diff(before: dict[int, int], after: dict[int, int]) -> dict[str, int]:
    out = {}
    for key, n in after.items():
        d = n - before.get(key, 0)
        if d:
            out[API_NAMES.get(key, str(key))] = d
    return out


def _detect_epochguard(cluster: EmbeddedCluster) -> dict[str, Any]:
    from kafka.structs import TopicPartition

    from epochguard.consumer import EpochConsumer

    topic = "det-eg"
    old, new = _stage(cluster, topic)
    tp = TopicPartition(topic, 0)
    reports: list[Any] = []
    c = EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        metadata_max_age_ms=300000,
        on_truncation_report=reports.append,
    )
    c.assign([tp])
    n = 0
    while n < 15:
        n += sum(len(v) for v in c.poll(timeout_ms=100).values())
    _idle(lambda: c.poll(timeout_ms=100))
    before = _counts(cluster)
    t0 = time.perf_counter()
    _elect(cluster, topic, old, new)
    first_new = None
    deadline = time.monotonic() + 30
    while first_new is None and not reports and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=20).values():
            first_new = first_new or recs[0]
    ms = (time.perf_counter() - t0) * 1000
    after = _counts(cluster)
    c.close()
    return {
        "ms": round(ms, 1),
        "requests": _diff(before, after),
        "detected": bool(reports),
        "lost_count": reports[0].lost_count if reports else None,
        "first_record_after": None if first_new is None else first_new.offset,
    }


def _detect_kafka_python(cluster: EmbeddedCluster) -> dict[str, Any]:
    from kafka import KafkaConsumer, TopicPartition

    topic = "det-kp"
    old, new = _stage(cluster, topic)
    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="none",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    c.assign([tp])
    c.seek(tp, 0)
    n = 0
    while n < 15:
        n += sum(len(v) for v in c.poll(timeout_ms=100).values())
    _idle(lambda: c.poll(timeout_ms=100))
    before = _counts(cluster)
    t0 = time.perf_counter()
    _elect(cluster, topic, old, new)
    detected = False
    got = None
    deadline = time.monotonic() + 30
    while got is None and not detected and time.monotonic() < deadline:
        try:
            for recs in c.poll(timeout_ms=20).values():
                got = got or recs[0]
        except Exception:
            detected = True
    ms = (time.perf_counter() - t0) * 1000
    after = _counts(cluster)
    c.close()
    return {
        "ms": round(ms, 1),
        "requests": _diff(before, after),
        "detected": detected,
        "first_record_after": None if got is None else got.offset,
    }


def _detect_confluent(cluster: EmbeddedCluster) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    topic = "det-ck"
    old, new = _stage(cluster, topic)
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "det",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "log_level": 0,
            "fetch.wait.max.ms": 100,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    n = 0
    while n < 15:
        m = c.poll(0.1)
        if m is not None and not m.error():
            n += 1
    _idle(lambda: c.poll(0.1))
    before = _counts(cluster)
    t0 = time.perf_counter()
    _elect(cluster, topic, old, new)
    detected = False
    got = None
    deadline = time.monotonic() + 30
    while got is None and not detected and time.monotonic() < deadline:
        m = c.poll(0.02)
        if m is None:
            continue
        if m.error():
            detected = True
        else:
            got = m.offset()
    ms = (time.perf_counter() - t0) * 1000
    after = _counts(cluster)
    c.close()
    return {
        "ms": round(ms, 1),
        "requests": _diff(before, after),
        "detected": detected,
        "first_record_after": got,
    }


def detection() -> dict[str, Any]:
    out = {}
    for name, fn in (
        ("epochguard", _detect_epochguard),
        ("kafka-python", _detect_kafka_python),
        ("confluent-kafka", _detect_confluent),
    ):
        with EmbeddedCluster(brokers=3) as cluster:
            try:
                out[name] = fn(cluster)
            except Exception as exc:
                out[name] = {"error": repr(exc)[:300]}
        print(name, json.dumps(out[name]), flush=True)
    return out


def decoder_only() -> list[dict[str, Any]]:
    """``decode_records`` alone on a 1 MB-ish fetch (the default partition fetch size),
    C against pure Python in this process; best of 5 over 100k records."""
    from epochguard.consumer import records

    rows = []
    saved = records._native
    try:
        for size in (100, 1024):
            batch = build_batch([b"x" * size] * BATCH)
            per_fetch = max(1, (1 << 20) // len(batch))
            data = batch * per_fetch
            row: dict[str, Any] = {"value_bytes": size}
            for name, native in (("c", saved), ("python", None)):
                if name == "c" and native is None:
                    continue
                records._native = native
                n = 0
                best = float("inf")
                for _ in range(5):
                    t0 = time.perf_counter()
                    count = 0
                    while count < 100_000:
                        count += len(records.decode_records(data, "t", 0, 0).records)
                    best = min(best, time.perf_counter() - t0)
                    n = count
                row[name] = round(n / best)
            row["c_vs_python"] = round(row["c"] / row["python"], 2) if "c" in row else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        records._native = saved
    return rows


def run() -> dict[str, Any]:
    from epochguard.consumer.records import DECODER

    return {
        "decoder": DECODER,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "repeat": REPEAT,
        "decoder_only_records_per_s": decoder_only(),
        "throughput_records_per_s": throughput(),
        "detection_after_unclean_election": detection(),
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
    else:
        print(json.dumps(run(), indent=2))
