"""Profile EpochConsumer's poll loop (not a benchmark module: ``_`` keeps it out of ``make
bench``).

The EmbeddedCluster runs in its own process (so the profile holds only the consumer); the
consumer reads ``records`` values of ``size`` bytes from ``partitions`` partitions (default
1) in this process with every thread profiled by cProfile (with ``io_thread``, kafka-python's
IO thread shares the GIL with ``poll``, so its cost is part of the consumer's; times of calls
that wait are wall-clock). ``io_thread`` (the argument) runs the consumer with
``io_thread=True``; by default it serves its connections from ``poll()``. ``codec`` (none,
gzip, snappy, lz4, zstd) compresses the batches; the values are then the matrix's text-like
ones (``benchmarks.matrix.build_batch``), which compress about 3x.

    python -m benchmarks._profile_poll 100 1000000
    python -m benchmarks._profile_poll 1024 300000
    python -m benchmarks._profile_poll 100 1000000 1000          # 1,000 partitions
    python -m benchmarks._profile_poll 1024 200000 1 snappy
    python -m benchmarks._profile_poll 100 1000000 100 none noprof   # rate only
    python -m benchmarks._profile_poll 1024 300000 1 none io_thread  # io_thread=True
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import sys
import threading
import time
from typing import Any


def _per_batch(size: int, codec: str) -> int:
    if codec == "none":
        return 500
    from benchmarks.matrix import batch_records

    return batch_records(size)


def _per_partition(size: int, total: int, parts: int, codec: str) -> int:
    """Records per partition: whole batches, at least one."""
    per_batch = _per_batch(size, codec)
    return max(per_batch, total // parts // per_batch * per_batch)


def _serve(size: int, total: int, parts: int, codec: str, conn: Any) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from benchmarks._common import produce
    from epochguard.testing import EmbeddedCluster
    from epochguard.testing.embedded.records import build_batch

    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("prof", partitions=parts, replication_factor=1)
        per_batch = _per_batch(size, codec)
        if codec == "none":
            batch = build_batch([b"x" * size] * per_batch)
        else:
            from benchmarks.matrix import build_batch as matrix_batch

            batch = matrix_batch(size, codec)
        per_partition = _per_partition(size, total, parts, codec)
        produce(
            cluster,
            "prof",
            per_partition * parts,
            partitions=parts,
            batch=batch,
            batch_records=per_batch,
        )
        conn.send(cluster.bootstrap_servers)
        conn.recv()  # until the consumer is done


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of another process so far; NaN where /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(
    size: int,
    total: int,
    parts: int = 1,
    codec: str = "none",
    profile: bool = True,
    io_thread: bool = False,
) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from kafka.structs import TopicPartition

    from epochguard.consumer import EpochConsumer

    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_serve, args=(size, total, parts, codec, child))
    proc.start()
    bootstrap = parent.recv()
    profiles: list[cProfile.Profile] = []

    def _thread_profile(*_a: Any) -> None:
        p = cProfile.Profile()
        profiles.append(p)
        p.enable()

    if profile:
        threading.setprofile(_thread_profile)  # type: ignore[arg-type]
    c = EpochConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        check_crcs=True,
        max_poll_records=500,
        io_thread=io_thread,
    )
    c.assign([TopicPartition("prof", p) for p in range(parts)])
    main_prof = cProfile.Profile()
    if profile:
        main_prof.enable()
    n = 0
    started = 0.0
    cpu0 = time.process_time()
    cluster_cpu0 = _process_cpu_s(proc.pid)
    checksum = 0
    total = _per_partition(size, total, parts, codec) * parts
    while n < total:
        for recs in c.poll(timeout_ms=1000).values():
            if not started:
                started = time.perf_counter()
            for r in recs:  # as an application would: touch key and value
                checksum += len(r.value) + (0 if r.key is None else len(r.key))
            n += len(recs)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    cluster_cpu = _process_cpu_s(proc.pid) - cluster_cpu0
    main_prof.disable()
    threading.setprofile(None)  # type: ignore[arg-type]
    for p in profiles:
        p.disable()
    c.close()
    parent.send("done")
    proc.join(30)
    print(
        f"size={size} partitions={parts} codec={codec} records={n} "
        f"rec/s={n / elapsed:,.0f} cpu_s={cpu:.2f} cluster_cpu_s={cluster_cpu:.2f} "
        f"load={os.getloadavg()[0]:.2f} profiled={profile} io_thread={io_thread}"
    )
    if profile:
        out = io.StringIO()
        stats = pstats.Stats(main_prof, stream=out)
        for p in profiles:
            with contextlib.suppress(TypeError):  # a thread that never ran under it
                stats.add(p)
        stats.sort_stats("tottime").print_stats(25)
        print(out.getvalue())


if __name__ == "__main__":
    args = sys.argv[1:]
    noprof = "noprof" in args
    io_thread = "io_thread" in args
    args = [a for a in args if a not in ("noprof", "io_thread")]
    main(
        int(args[0]),
        int(args[1]),
        int(args[2]) if len(args) > 2 else 1,
        args[3] if len(args) > 3 else "none",
        profile=not noprof,
        io_thread=io_thread,
    )
