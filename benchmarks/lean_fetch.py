"""EpochConsumer before/after the lean Fetch response path, interleaved in one run.

"after": the default (``client._LeanParser``: ``recv_into`` frame buffers, Fetch frames
parsed by ``wire.read_fetch``, records decoded in place). "before": the same consumer with
``EPOCHGUARD_KAFKA_PYTHON_IO=1`` (kafka-python's parser and ``FetchResponse`` decoding,
256 KiB reads), which is what the consumer did before.

Method: the EmbeddedCluster runs in its own process with one partition preloaded (batches
of 500 records, values of ``size`` bytes, no keys); each run is a fresh client process
reading every record from offset 0 and touching each key and value (as an application
would), CRC checks on, 500 records per poll. Timed from the first record to the last;
CPU seconds are the client process's (all threads) over the same span. Modes alternate,
``LEAN_FETCH_REPEAT`` (3) rounds; the best time and the median CPU per mode are kept, and
the load average is recorded, since the machine is shared.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from benchmarks._common import produce, run_json_client

SCALE = float(os.environ.get("LEAN_FETCH_SCALE", "1.0"))
REPEAT = int(os.environ.get("LEAN_FETCH_REPEAT", "3"))
CASES = [(100, int(1_000_000 * SCALE)), (1024, int(300_000 * SCALE))]
MODES = {"after": {}, "before": {"EPOCHGUARD_KAFKA_PYTHON_IO": "1"}}
BATCH = 500


def serve(size: int, total: int, conn: Any, topic: str = "bench", partitions: int = 1) -> None:
    """The broker process: preload, send the bootstrap string, serve until told to stop."""
    import logging

    logging.disable(logging.CRITICAL)
    from epochguard.testing import EmbeddedCluster
    from epochguard.testing.embedded.records import build_batch

    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic(topic, partitions=partitions, replication_factor=1)
        batch = build_batch([b"x" * size] * BATCH)
        produce(cluster, topic, total, partitions=partitions, batch=batch, batch_records=BATCH)
        conn.send(cluster.bootstrap_servers)
        conn.recv()


def start_broker(size: int, total: int, **kw: Any) -> tuple[Any, Any]:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=serve, args=(size, total, child), kwargs=kw)
    proc.start()
    parent.poll(300)
    return proc, parent


def stop_broker(proc: Any, conn: Any) -> None:
    conn.send("stop")
    proc.join(60)


def client_main(bootstrap: str, total: int) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from kafka.structs import TopicPartition

    from epochguard.consumer import EpochConsumer

    c = EpochConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        check_crcs=True,
        max_poll_records=BATCH,
    )
    c.assign([TopicPartition("bench", 0)])
    n = 0
    touched = 0
    started = cpu0 = 0.0
    deadline = time.monotonic() + 300
    while n < total and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=1000).values():
            if not started:
                started, cpu0 = time.perf_counter(), time.process_time()
            for r in recs:
                touched += len(r.value) + (0 if r.key is None else len(r.key))
            n += len(recs)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    c.close()
    if n < total:
        raise SystemExit(f"read {n} of {total}")
    print(json.dumps({"elapsed_s": elapsed, "cpu_s": cpu, "bytes_touched": touched}))


def _client(bootstrap: str, total: int, env_extra: dict[str, str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "EPOCHGUARD_KAFKA_PYTHON_IO"}
    env.update(env_extra)
    return run_json_client(
        "benchmarks.lean_fetch", ["--client", bootstrap, str(total)], 400, env=env, tail=2000
    )


def run() -> dict[str, Any]:
    rows = []
    for size, total in CASES:
        proc, conn = start_broker(size, total)
        try:
            bootstrap = conn.recv()
            load_before = round(os.getloadavg()[0], 2)
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
            for _ in range(REPEAT):
                for mode, env in MODES.items():
                    out = _client(bootstrap, total, env)
                    if out["bytes_touched"] != total * size:
                        raise RuntimeError(f"{mode}: touched {out['bytes_touched']} bytes")
                    runs[mode].append(out)
        finally:
            stop_broker(proc, conn)
        row: dict[str, Any] = {
            "value_bytes": size,
            "partitions": 1,
            "records": total,
            "load_avg_1m_before": load_before,
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
        }
        for mode, outs in runs.items():
            row[f"{mode}_records_per_s"] = round(total / min(o["elapsed_s"] for o in outs))
            row[f"{mode}_cpu_s_per_million"] = round(
                statistics.median(o["cpu_s"] for o in outs) * 1e6 / total, 3
            )
            row[f"{mode}_runs_records_per_s"] = [round(total / o["elapsed_s"]) for o in outs]
        row["records_per_s_after_vs_before"] = round(
            row["after_records_per_s"] / row["before_records_per_s"], 2
        )
        row["cpu_per_record_after_vs_before"] = round(
            row["after_cpu_s_per_million"] / row["before_cpu_s_per_million"], 2
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {
        "method": __doc__,
        "repeat": REPEAT,
        "cases": rows,
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], int(sys.argv[3]))
    else:
        print(json.dumps(run(), indent=2))
