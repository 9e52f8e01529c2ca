"""The consumer benchmark matrix: EpochConsumer, AIOEpochConsumer, kafka-python, aiokafka,
confluent-kafka and its asyncio AIOConsumer side by side over value sizes, partition counts
and compression codecs.

Method (also written into the JSON as ``method`` and ``settings``):

* The EmbeddedCluster (one broker) runs in its own process; each case's topic is
  preloaded there before any client starts (batches of up to 500 records and 512 KiB of
  values, 8-byte keys, values
  of text-like bytes that compress about 3x, so codecs do real work).
* Each client run is a fresh process that reads the whole topic from offset 0 with CRC
  checks on and touches every record's key and value (``len`` of both, summed and checked
  against the expected total, so no client can skip records). Timed from the first poll
  (after the client is built and assigned its partitions) to the last record, so the
  first answer, which may hold a large part of a small topic, counts; that span includes
  connecting and the offset lookup (tens of ms). CPU seconds are the client process's
  (all threads) over the same span.
* Clients are interleaved within a case (one run side by side per round),
  ``MATRIX_REPEAT`` rounds (default 3); the best rate and the median CPU are kept, since
  single runs on a shared machine move by tens of percent (each round's rate and CPU are
  in the row too, ``<client>_rounds`` and ``<client>_cpu_rounds``). Ratios are given of
  the best rounds (``<a>_vs_<b>``) and of the median rounds (``<a>_vs_<b>_median``).
* The asyncio clients (``epochguard-asyncio``, ``aiokafka``, ``confluent-asyncio``) run the
  same loop as coroutines with a 1 ms ticker task beside them; ``<client>_loop_block_ms``
  is the longest the event loop went without running the ticker (median over rounds):
  how long the consumer kept the loop from the application's other tasks.
  ``<client>_loop_block_outside_gc_ms`` is the same less the full collections of the
  garbage collector that ran meanwhile (``<client>_gc_full_collections`` of them): a full
  collection walks the whole process (about 30 ms for a consumer program's 55,000 objects
  here) and comes when enough objects outlived younger collections, whichever code made
  them.
* ``embedded-alone`` is what the cluster serves with no record decoding: Fetch requests one
  at a time (as the consumers send them), answers only walked batch by batch to count
  records. A client near that rate is limited by the cluster, not by itself.
* The load average is recorded before and after each case: the machine is shared.

Cases: values of 100 B, 1 KB and 10 KB over 1, 8, 100 and 1,000 partitions, uncompressed;
each value size over 1 partition with gzip, snappy, lz4 and zstd batches; 1 KB over 8
partitions with lz4 and zstd. ``MATRIX_SCALE`` scales the
record counts; ``MATRIX_CASES`` (e.g. ``100x1,1024x8,1024x1:lz4``) picks cases. A run of
picked cases replaces those rows of the existing ``benchmarks/results/matrix.json`` and keeps
the others (a partial run); every row says when it was measured (``measured_at``) and at
what ``scale`` and ``repeat``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    LoopTicker,
    aiokafka_consumer,
    atimed_loop,
    confluent_consumer,
    confluent_step,
    kafka_python_api_consumer,
    produce,
    run_json_client,
    timed_loop,
    touching_step,
)
from benchmarks.lean_fetch import stop_broker

SCALE = float(os.environ.get("MATRIX_SCALE", "1.0"))
REPEAT = int(os.environ.get("MATRIX_REPEAT", "3"))
BATCH = 500
#: Batches hold up to BATCH records and at most this many value bytes (10 KB values: 51).
BATCH_BYTES = 512 * 1024
KEY_BYTES = 8
POLL_RECORDS = 500
TOPIC = "matrix"
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
#: Records per case by value size: about 100-300 MB of values per case at scale 1.
RECORDS = {100: 1_000_000, 1024: 200_000, 10240: 30_000}
CLIENTS = [
    "epochguard",
    "epochguard-asyncio",
    "kafka-python",
    "aiokafka",
    "confluent-kafka",
    "confluent-asyncio",
    "embedded-alone",
]
SETTINGS: dict[str, dict[str, Any]] = {
    "epochguard": {
        "check_crcs": True,
        "max_poll_records": POLL_RECORDS,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "other": "defaults (fetch_max_bytes 50 MiB, max_partition_fetch_bytes 1 MiB)",
    },
    "kafka-python": {
        "check_crcs": True,
        "max_poll_records": POLL_RECORDS,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "other": "defaults",
    },
    "epochguard-asyncio": {
        "check_crcs": True,
        "getmany max_records": POLL_RECORDS,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "other": "defaults (the same program as aiokafka's, class swapped)",
    },
    "confluent-asyncio": {
        "check.crcs": True,
        "consume num_messages": POLL_RECORDS,
        "other": "confluent_kafka.aio.AIOConsumer, defaults (its thread pool)",
    },
    "aiokafka": {
        "check_crcs": True,
        "getmany max_records": POLL_RECORDS,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "other": "defaults",
    },
    "confluent-kafka": {
        "check.crcs": True,
        "consume num_messages": POLL_RECORDS,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "other": "defaults (librdkafka's queued.min.messages 100k, fetch.max.bytes 50 MiB)",
    },
    "embedded-alone": {
        "what": "Fetch v13 one request at a time, max_partition_fetch_bytes 1 MiB, "
        "fetch_max_bytes 50 MiB, batches walked by header only (no CRC, no records)",
    },
}


def full_matrix() -> list[tuple[int, int, str]]:
    cases = [(size, parts, "none") for size in (100, 1024, 10240) for parts in (1, 8, 100)]
    cases += [(size, 1000, "none") for size in (100, 1024, 10240)]
    codecs = ("gzip", "snappy", "lz4", "zstd")
    cases += [(size, 1, codec) for size in (100, 1024, 10240) for codec in codecs]
    cases += [(1024, 8, codec) for codec in ("lz4", "zstd")]
    return cases


def all_cases() -> list[tuple[int, int, str]]:
    cases = full_matrix()
    wanted = os.environ.get("MATRIX_CASES")
    return parse_cases(wanted) if wanted else cases


def parse_cases(specs: str) -> list[tuple[int, int, str]]:
    """``"100x1,1024x8,1024x1:lz4"`` as (value bytes, partitions, codec) cases."""
    out = []
    for spec in specs.split(","):
        shape, _, codec = spec.strip().partition(":")
        size, _, parts = shape.partition("x")
        out.append((int(size), int(parts), codec or "none"))
    return out


def batch_records(size: int) -> int:
    """Records per batch: ``MATRIX_BATCH_RECORDS`` when set (``1``: a producer that does not
    batch), else as many as ``BATCH`` and ``BATCH_BYTES`` allow."""
    chosen = os.environ.get("MATRIX_BATCH_RECORDS")
    if chosen:
        return max(1, int(chosen))
    return max(1, min(BATCH, BATCH_BYTES // size))


def _values(size: int, rng: random.Random) -> list[bytes]:
    words = [
        bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randrange(3, 9))) for _ in range(200)
    ]
    out = []
    for _ in range(batch_records(size)):
        text = b" ".join(rng.choices(words, k=size // 4 + 1))
        out.append(text[:size].ljust(size, b"."))
    return out


def build_batch(size: int, codec: str, seed: int = 0) -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    rng = random.Random(seed)
    builder = MemoryRecordsBuilder(
        magic=2, compression_type=CODECS[codec], batch_size=(size + 64) * BATCH * 2
    )
    for i, value in enumerate(_values(size, rng)):
        builder.append(timestamp=1_700_000_000_000 + i, key=b"key-%04d" % i, value=value)
    builder.close()
    return bytes(builder.buffer())


def serve(size: int, parts: int, codec: str, total: int, conn: Any) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from epochguard.testing import EmbeddedCluster

    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic(TOPIC, partitions=parts, replication_factor=1)
        batch = build_batch(size, codec)
        produce(
            cluster, TOPIC, total, partitions=parts, batch=batch, batch_records=batch_records(size)
        )
        conn.send(cluster.bootstrap_servers)
        conn.recv()


# --------------------------------------------------------------------------- clients


def _epochguard_driver(io_thread: bool | None = None) -> Any:
    """EpochConsumer at its defaults, or with kafka-python's IO thread or without it
    (``poll()`` serving the connections itself) whatever the default:
    ``benchmarks/io_thread.py`` compares them."""
    chosen = {} if io_thread is None else {"io_thread": io_thread}

    def make(bootstrap: str, parts: int) -> Any:
        from epochguard.consumer import EpochConsumer

        c = kafka_python_api_consumer(
            EpochConsumer, bootstrap, TOPIC, parts, max_poll_records=POLL_RECORDS, **chosen
        )
        return touching_step(c), c.close

    return make


def _kafka_python(bootstrap: str, parts: int) -> Any:
    from kafka import KafkaConsumer

    c = kafka_python_api_consumer(
        KafkaConsumer, bootstrap, TOPIC, parts, max_poll_records=POLL_RECORDS
    )
    return touching_step(c), c.close


def _confluent(bootstrap: str, parts: int) -> Any:
    c = confluent_consumer(bootstrap, TOPIC, parts, **{"group.id": "matrix", "check.crcs": True})
    return confluent_step(c, POLL_RECORDS, touch=True), c.close


def _run_asyncio(client: str, bootstrap: str, parts: int, total: int) -> dict[str, Any]:
    import asyncio

    async def main() -> dict[str, Any]:
        if client == "confluent-asyncio":
            c, step, close = await _confluent_asyncio(bootstrap, parts)
        else:
            cls = None
            if client == "epochguard-asyncio":
                from epochguard import AIOEpochConsumer

                cls = AIOEpochConsumer
            c = await aiokafka_consumer(bootstrap, TOPIC, parts, cls)

            async def step() -> tuple[int, int]:
                n = touched = 0
                batch = await c.getmany(timeout_ms=1000, max_records=POLL_RECORDS)
                for recs in batch.values():
                    n += len(recs)
                    for r in recs:
                        touched += len(r.key) + len(r.value)
                return n, touched

            close = c.stop
        ticker = LoopTicker()
        ticker.start()
        try:
            out = await atimed_loop(step, total)
        finally:
            ticker.stop()
            await close()
        out.update(ticker.results())
        return out

    return asyncio.run(main())


async def _confluent_asyncio(bootstrap: str, parts: int) -> Any:
    from confluent_kafka import TopicPartition
    from confluent_kafka.aio import AIOConsumer

    c = AIOConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "matrix",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "check.crcs": True,
            "log_level": 0,
        }
    )
    await c.assign([TopicPartition(TOPIC, p, 0) for p in range(parts)])

    async def step() -> tuple[int, int]:
        touched = 0
        msgs = await c.consume(num_messages=POLL_RECORDS, timeout=1.0)
        for m in msgs:
            if m.error():
                raise RuntimeError(str(m.error()))
            touched += len(m.key()) + len(m.value())
        return len(msgs), touched

    return c, step, c.close


def _embedded_alone(bootstrap: str, parts: int) -> Any:
    """Fetch answers walked by batch header only: what the cluster serves to a client
    that does no decoding work."""
    from kafka.structs import TopicPartition

    from epochguard.consumer import wire
    from epochguard.consumer.client import BrokerClient

    client = BrokerClient(
        {"bootstrap_servers": bootstrap, "receive_message_max_bytes": 100_000_000}
    )
    client.bootstrap(30_000)
    meta = wire.read_metadata(client.request(None, wire.metadata_request([TOPIC], False), 30))
    [topic] = meta.topics
    leaders = {p.tp.partition: p.leader_id for p in topic.partitions}
    node = next(iter(set(leaders.values())))
    offsets = dict.fromkeys(range(parts), 0)
    params = wire.FetchParams(500, 1, 50 * 1024 * 1024, 1024 * 1024, False)
    head = struct.Struct(">qi").unpack_from

    class Entry:
        def __init__(self, p: int) -> None:
            self.tp = TopicPartition(TOPIC, p)
            self.offset = offsets[p]
            self.current_leader_epoch = None
            self.last_fetched_epoch = None
            self.topic_id = topic.topic_id

    def step() -> tuple[int, int]:
        request, names = wire.fetch_request([Entry(p) for p in range(parts)], params)
        answer = wire.read_fetch(client.request(node, request, 30), names)
        n = 0
        for fp in answer.partitions:
            data = fp.records
            pos = 0
            while data is not None and pos + 61 <= len(data):
                base, length = head(data, pos)
                if pos + 12 + length > len(data):
                    break
                count = struct.unpack_from(">i", data, pos + 57)[0]
                last_delta = struct.unpack_from(">i", data, pos + 23)[0]
                if base >= offsets[fp.tp.partition]:
                    n += count
                offsets[fp.tp.partition] = base + last_delta + 1
                pos += 12 + length
        return n, 0  # no records decoded: nothing touched

    return step, lambda: client.close()


FACTORIES = {
    "epochguard": _epochguard_driver(),
    "epochguard-io-thread": _epochguard_driver(True),
    "epochguard-inline": _epochguard_driver(False),
    "kafka-python": _kafka_python,
    "confluent-kafka": _confluent,
    "embedded-alone": _embedded_alone,
}


def client_main(client: str, bootstrap: str, parts: int, total: int) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    if client in ("aiokafka", "epochguard-asyncio", "confluent-asyncio"):
        out = _run_asyncio(client, bootstrap, parts, total)
    else:
        step, close = FACTORIES[client](bootstrap, parts)
        try:
            out = timed_loop(step, total)
        finally:
            close()
    print(json.dumps(out))


# --------------------------------------------------------------------------- harness


def _run_client(client: str, bootstrap: str, parts: int, total: int) -> dict[str, Any]:
    return run_json_client(
        "benchmarks.matrix", ["--client", client, bootstrap, str(parts), str(total)], 900
    )


def run_case(size: int, parts: int, codec: str, clients: list[str] | None = None) -> dict[str, Any]:
    import multiprocessing as mp

    total = int(RECORDS[size] * SCALE)
    unit = parts * batch_records(size)
    total = max(unit, total - total % unit)
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=serve, args=(size, parts, codec, total, child))
    proc.start()
    row: dict[str, Any] = {
        "value_bytes": size,
        "key_bytes": KEY_BYTES,
        "partitions": parts,
        "compression": codec,
        "records": total,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scale": SCALE,
        "repeat": REPEAT,
    }
    try:
        if not parent.poll(600):
            raise RuntimeError("the broker process did not come up")
        runs = run_rounds(clients or CLIENTS, parent.recv(), size, parts, total, row)
    finally:
        stop_broker(proc, parent)
    summarise(row, runs, total)
    print(json.dumps(row), flush=True)
    return row


RESULT = Path(__file__).resolve().parent / "results" / "matrix.json"


def _key(row: dict[str, Any]) -> tuple[int, int, str]:
    return (row["value_bytes"], row["partitions"], row["compression"])


def merge(rows: list[dict[str, Any]], previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``rows`` in place of the same cases of ``previous`` (a matrix.json record), the
    others kept and stamped with the run they come from; in the order of the full matrix,
    then any other cases."""
    if not previous:
        return rows
    old = previous["result"]
    kept = {}
    for r in old["cases"]:
        r = dict(r)
        r.setdefault("measured_at", previous.get("started_at"))
        r.setdefault("scale", old.get("scale"))
        r.setdefault("repeat", old.get("repeat"))
        kept[_key(r)] = r
    kept.update((_key(r), r) for r in rows)
    order = {case: i for i, case in enumerate(full_matrix())}
    return sorted(kept.values(), key=lambda r: order.get(_key(r), len(order)))


def run_rounds(
    clients: list[str], bootstrap: str, size: int, parts: int, total: int, row: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """``REPEAT`` rounds of every client, interleaved; a client that fails (or touches the
    wrong number of bytes) is left out of the later rounds, its error kept in ``row``."""
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    row["load_avg_1m_before"] = round(os.getloadavg()[0], 2)
    expected = total * (size + KEY_BYTES)
    for _ in range(REPEAT):
        for client in clients:
            if f"{client}_error" in row:
                continue
            try:
                out = _run_client(client, bootstrap, parts, total)
                if client != "embedded-alone" and out["bytes_touched"] != expected:
                    raise RuntimeError(f"touched {out['bytes_touched']} bytes, expected {expected}")
                runs[client].append(out)
            except Exception as exc:
                row[f"{client}_error"] = repr(exc)[-400:]
    row["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return runs


def summarise(row: dict[str, Any], runs: dict[str, list[dict[str, Any]]], total: int) -> None:
    """Each client's best rate, median CPU per million records and every round, and the
    ratios of EpochConsumer to the others, into ``row``."""
    for client, outs in runs.items():
        if not outs:
            row[client] = None
            continue
        row[client] = round(total / min(o["elapsed_s"] for o in outs))
        row[f"{client}_cpu_s_per_million"] = round(
            statistics.median(o["cpu_s"] for o in outs) * 1e6 / total, 3
        )
        # Every round, so the spread (the machine is shared) can be read off the JSON.
        row[f"{client}_rounds"] = [round(total / o["elapsed_s"]) for o in outs]
        row[f"{client}_cpu_rounds"] = [round(o["cpu_s"] * 1e6 / total, 3) for o in outs]
        for key in ("loop_block_ms", "loop_block_outside_gc_ms", "gc_full_collections"):
            values = [o[key] for o in outs if key in o]
            if values:
                row[f"{client}_{key}"] = statistics.median(values)
    for ours, others in (
        ("epochguard", [c for c in runs if c != "epochguard"]),
        ("epochguard-asyncio", ["aiokafka", "confluent-asyncio", "confluent-kafka"]),
    ):
        for other in others:
            if row.get(ours) and row.get(other):
                row[f"{ours}_vs_{other}"] = round(row[ours] / row[other], 2)
                # Of the median rounds too: a best round can be a lucky one.
                mine, theirs = row[f"{ours}_rounds"], row[f"{other}_rounds"]
                row[f"{ours}_vs_{other}_median"] = round(
                    statistics.median(mine) / statistics.median(theirs), 2
                )


def run() -> dict[str, Any]:
    rows = [run_case(*case) for case in all_cases()]
    if os.environ.get("MATRIX_CASES") and RESULT.exists():
        rows = merge(rows, json.loads(RESULT.read_text()))
    result = {
        "method": __doc__,
        "settings": SETTINGS,
        "repeat": REPEAT,
        "scale": SCALE,
        "cases": rows,
    }
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        print(json.dumps(run(), indent=2))
