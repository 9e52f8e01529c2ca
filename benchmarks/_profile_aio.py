"""Profile an asyncio consumer's ``getmany`` loop (not a benchmark module: ``_`` keeps it out
of ``make bench``).

The EmbeddedCluster runs in its own process with the matrix's preload
(``benchmarks.matrix.serve``: the same batches, keys and values); the consumer reads the
topic from offset 0 in this process, with the matrix's program (``getmany(timeout_ms=1000,
max_records=500)``, key and value of every record touched) and its 1 ms ticker beside it.

    python -m benchmarks._profile_aio 1024 100000                 # cProfile, AIOEpochConsumer
    python -m benchmarks._profile_aio 100 500000 1 rate           # rate and loop block only
    python -m benchmarks._profile_aio 1024 100000 1 blocks        # the slowest loop callbacks
    python -m benchmarks._profile_aio 1024 100000 1 rate aiokafka # the same for aiokafka
    python -m benchmarks._profile_aio 1024 100000 8 rate epochguard-asyncio lz4  # compressed

Every mode prints the loop's longest block (``loop_block_ms``, as the matrix measures it),
the same less the full collections of the garbage collector in it (``outside_gc_ms``), and
how many full collections ran and the longest. ``GC_FREEZE=1`` calls ``gc.freeze()`` once
the consumer has started, as a service may do after its start-up.

``YIELD_INTERVAL_MS`` and ``READ_BUDGET_KB`` set ``epochguard.consumer.aio``'s
``YIELD_INTERVAL_S`` and ``READ_BUDGET_BYTES`` for a run of ``epochguard-asyncio``.

``PIN_CPUS=0,1`` pins the consumer to CPU 0 and the broker to CPU 1.

``POLL_RECORDS`` sets ``getmany``'s ``max_records`` (default the matrix's 500).

Every mode also prints, over the timed reads, the process's user and system CPU, minor page
faults and context switches (voluntary/involuntary), and the consumer's Fetch requests and
prefetches (``epochguard-asyncio``).

``MATRIX_BATCH_RECORDS=1`` preloads batches of one record each (a producer that does not
batch) instead of the matrix's 500.

``PROF_SORT`` (default ``tottime``) and ``PROF_LINES`` (30) shape the profile;
``PROF_CALLEES`` (a regular expression) adds what the matching functions called.

``slowest`` profiles every callback the loop runs from the 20th read on (past the
start-up's) and prints the profiles of the four that took the most CPU time
(``PROF_LINES`` lines each, by cumulative time): what a long wait was made of.

``gap`` lists the callbacks the loop ran (wall and CPU time), some of the consumer's calls
in them (indented) and the collections of generations 1 and 2, in time order, during the
ticker's longest wait as ranked by its time outside full collections.

In ``slowest`` and ``gap`` the rate and the loop's longest wait printed at the end include
what the instrumentation costs (a profiler per callback; a record of every callback).

``blocks`` times every callback the event loop runs and prints the slowest, with the CPU
time the thread spent in each (wall time well above it: the process was not running, the
machine is shared). ``stacks`` samples the loop thread's stack every millisecond while the
ticker is late by ``STACKS_LATE_MS`` (default 5) and prints where those samples were, the
innermost ``STACKS_DEPTH`` (default 6) frames of each, and how many fell in a collection
of the garbage collector. The sampling thread needs the GIL, so it samples where the loop
thread lets go of it (system calls, C code that releases it): Python code that holds it
throughout is under-counted; ``blocks`` gives CPU per callback instead.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import resource
import sys
import time
from typing import Any


def _install_handle_profiler(slowest: list[tuple[float, str, Any]], keep: int = 4) -> None:
    """Each callback the loop runs under its own profiler; the ``keep`` slowest (CPU time)
    keep theirs."""
    handle_run = asyncio.events.Handle._run

    def profiled_run(self: Any) -> None:
        prof = cProfile.Profile(time.thread_time)
        c0 = time.thread_time()
        prof.enable()
        try:
            handle_run(self)
        finally:
            prof.disable()
            cpu = time.thread_time() - c0
            if len(slowest) < keep or cpu > slowest[-1][0]:
                slowest.append((cpu, repr(self)[:120], prof))
                slowest.sort(key=lambda entry: entry[0], reverse=True)
                del slowest[keep:]

    asyncio.events.Handle._run = profiled_run  # type: ignore[method-assign]


class _Timeline:
    """Every callback the loop runs and every collection of the garbage collector, with
    their times, and the ticker's ticks: :meth:`report` prints what ran during the ticker's
    longest wait, :meth:`report_slowest` the slowest callbacks. :meth:`close` takes its
    wrappers off again."""

    def __init__(self) -> None:
        import gc

        self.handles: list[tuple[float, float, float, str]] = []
        self.collections: list[tuple[float, float, int]] = []
        self.ticks: list[float] = []
        self._gc_started = 0.0
        # (owner, name, what was there) of every wrapper put in, to take them off again.
        self._wrapped: list[tuple[Any, str, Any]] = []
        handle_run = asyncio.events.Handle._run
        handles = self.handles

        def timed_run(handle: Any) -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                handle_run(handle)
            finally:
                handles.append(
                    (t0, time.perf_counter(), time.thread_time() - c0, repr(handle)[:100])
                )

        self._wrapped.append((asyncio.events.Handle, "_run", handle_run))
        asyncio.events.Handle._run = timed_run  # type: ignore[assignment, method-assign]
        gc.callbacks.append(self._gc)

    def time_calls(self, owner: type, name: str) -> None:
        """Put each call of the plain method ``owner.name`` on the timeline too."""
        import functools
        import inspect

        inner = inspect.getattr_static(owner, name)
        if not inspect.isfunction(inner):
            raise TypeError(f"{owner.__name__}.{name} is not a plain method")
        handles = self.handles
        label = f"  {owner.__name__}.{name}"

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                handles.append((t0, time.perf_counter(), time.thread_time() - c0, label))

        self._wrapped.append((owner, name, inner))
        setattr(owner, name, timed)

    def close(self) -> None:
        import gc

        for owner, name, original in reversed(self._wrapped):
            setattr(owner, name, original)
        self._wrapped.clear()
        gc.callbacks.remove(self._gc)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.collections.append((self._gc_started, time.perf_counter(), info["generation"]))

    def tick(self, now: float) -> None:
        self.ticks.append(now)

    def report(self) -> None:
        import itertools

        if len(self.ticks) < 2:
            print("  gap: fewer than two ticks, no wait to show")
            return
        full = [(t0, t1) for t0, t1, generation in self.collections if generation == 2]

        def outside_full(a: float, b: float) -> float:
            return b - a - sum(min(b, t1) - max(a, t0) for t0, t1 in full if t1 > a and t0 < b)

        # The longest wait less the full collections in it (what the consumer can change);
        # the ticker's own millisecond of sleep taken off, as LoopTicker does.
        _, start, end = max((outside_full(a, b), a, b) for a, b in itertools.pairwise(self.ticks))
        print(
            f"  longest wait: {(outside_full(start, end) - 0.001) * 1000:.2f} ms outside full "
            f"collections ({(end - start - 0.001) * 1000:.2f} ms with them); what ran in it:"
        )
        lines = [
            (t0, f"{(t1 - t0) * 1000:6.2f} ms (cpu {cpu * 1000:5.2f})  {what}")
            for t0, t1, cpu, what in self.handles
            if t1 > start and t0 < end
        ]
        lines += [
            (t0, f"{(t1 - t0) * 1000:6.2f} ms  gc generation {generation}")
            for t0, t1, generation in self.collections
            if generation >= 1 and t1 > start and t0 < end
        ]
        for t0, text in sorted(lines):
            print(f"    +{(t0 - start) * 1000:6.2f} ms  {text}")

    def report_slowest(self, keep: int = 8) -> None:
        """Each generation's collections and the longest, and the ``keep`` slowest
        callbacks (wall time, with the CPU time the thread spent in each)."""
        by_generation: dict[int, list[float]] = {}
        for t0, t1, generation in self.collections:
            by_generation.setdefault(generation, []).append(t1 - t0)
        for generation, took in sorted(by_generation.items()):
            print(
                f"  gc generation {generation}: {len(took)} collections, "
                f"longest {max(took) * 1000:.2f} ms"
            )
        for t0, t1, cpu, what in sorted(self.handles, key=lambda h: h[0] - h[1])[:keep]:
            print(f"  {(t1 - t0) * 1000:7.2f} ms  cpu {cpu * 1000:6.2f} ms  {what}")


class _LateStacks:
    """A thread that samples the loop thread's stack while the ticker is late."""

    def __init__(self, late_s: float, depth: int) -> None:
        import collections
        import threading

        self.late_s, self.depth = late_s, depth
        self.ticked = time.perf_counter()
        self.in_gc = False
        self.samples: collections.Counter[tuple[str, ...]] = collections.Counter()
        self.gc_samples = 0
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        import gc

        gc.callbacks.append(self._gc)
        self._thread.start()

    def _gc(self, phase: str, _info: dict[str, int]) -> None:
        self.in_gc = phase == "start"

    def tick(self, now: float) -> None:
        """The ticker ran at ``now`` (``LoopTicker.on_tick``)."""
        self.ticked = now

    def _run(self) -> None:
        import traceback

        while not self._stop.wait(0.001):
            if time.perf_counter() - self.ticked < self.late_s:
                continue
            if self.in_gc:
                self.gc_samples += 1
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            stack = traceback.extract_stack(frame)[-self.depth :]
            self.samples[
                tuple(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in stack)
            ] += 1

    def report(self) -> None:
        self._stop.set()
        self._thread.join()
        total = sum(self.samples.values()) + self.gc_samples
        print(f"  late samples: {total}, in a gc collection: {self.gc_samples}")
        for stack, count in self.samples.most_common(12):
            print(f"  {count:5d}  " + " <- ".join(reversed(stack)))


def main(size: int, total: int, parts: int, mode: str, client: str, codec: str = "none") -> None:
    import logging

    logging.disable(logging.CRITICAL)
    from benchmarks import matrix
    from benchmarks._common import LoopTicker, aiokafka_consumer

    unit = parts * matrix.batch_records(size)
    total = max(unit, total - total % unit)
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=matrix.serve, args=(size, parts, codec, total, child)
    )
    proc.start()
    if os.environ.get("PIN_CPUS"):
        # The consumer on the first CPU named, the broker on the second: fewer migrations
        # and less of each in the other's caches, for comparing two builds.
        ours, broker = (int(c) for c in os.environ["PIN_CPUS"].split(","))
        os.sched_setaffinity(0, {ours})
        os.sched_setaffinity(proc.pid, {broker})
    bootstrap = parent.recv()
    profiled: list[tuple[float, str, Any]] = []
    # From the consumer's start on for blocks (as the slowest callbacks may be there); from
    # the ticker's first tick for gap (below).
    blocks = _Timeline() if mode == "blocks" else None

    async def run() -> tuple[float, float, LoopTicker, int]:
        if client == "epochguard-asyncio":
            from epochguard.consumer import aio

            if os.environ.get("YIELD_INTERVAL_MS"):
                aio.YIELD_INTERVAL_S = float(os.environ["YIELD_INTERVAL_MS"]) / 1000
            if os.environ.get("LONG_STEP_MS"):
                aio.LONG_STEP_S = float(os.environ["LONG_STEP_MS"]) / 1000
            if os.environ.get("READ_BUDGET_KB"):
                aio.READ_BUDGET_BYTES = int(os.environ["READ_BUDGET_KB"]) * 1024
        cls = None
        if client == "epochguard-asyncio":
            from epochguard import AIOEpochConsumer

            cls = AIOEpochConsumer
        c = await aiokafka_consumer(bootstrap, matrix.TOPIC, parts, cls)
        if os.environ.get("GC_FREEZE"):
            import gc

            # What a service does to keep its start-up objects (modules, classes) out of
            # every full collection: those then walk only what came later.
            gc.freeze()
        ticks = LoopTicker()

        late = (
            _LateStacks(
                float(os.environ.get("STACKS_LATE_MS", "5")) / 1000,
                int(os.environ.get("STACKS_DEPTH", "6")),
            )
            if mode == "stacks"
            else None
        )

        if late is not None:
            ticks.on_tick = late.tick
        timeline = _Timeline() if mode == "gap" else None
        if timeline is not None:
            ticks.on_tick = timeline.tick
            from epochguard.consumer import aio, fetcher
            from epochguard.consumer import client as eg_client

            for owner, name in (
                (eg_client._LargeReadTransport, "_recv_frames"),
                (aio._LoopIO, "flush"),
                (aio._LoopIO, "_serve"),
                (fetcher.Fetcher, "process_completions"),
                (fetcher.Fetcher, "fetched_records"),
                (fetcher.Fetcher, "send_requests"),
                (fetcher.Fetcher, "_decode_from"),
                (fetcher.Fetcher, "_on_fetch"),
                (fetcher.Fetcher, "_on_prefetch"),
                (fetcher.Fetcher, "_on_metadata"),
                (fetcher.Fetcher, "_on_validation"),
                (fetcher.Fetcher, "_on_list_offsets"),
                (fetcher.Fetcher, "_send_fetch"),
                (fetcher.Fetcher, "_apply_answers"),
            ):
                timeline.time_calls(owner, name)
        ticks.start()
        # CPU time, not wall time: on a shared machine the process is often not running.
        prof = cProfile.Profile(time.thread_time) if mode == "prof" else None
        n = touched = 0
        started, cpu0 = time.perf_counter(), time.process_time()
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        if prof is not None:
            prof.enable()
        reads = 0
        poll_records = int(os.environ.get("POLL_RECORDS", matrix.POLL_RECORDS))
        # What the slowest mode's profiler wraps, put back once the reads are done.
        handle_run = asyncio.events.Handle._run
        while n < total:
            reads += 1
            if mode == "slowest" and reads == 20:
                # Past the start-up's reads (metadata, the first answers).
                _install_handle_profiler(profiled)
            batch = await c.getmany(timeout_ms=1000, max_records=poll_records)
            for recs in batch.values():
                n += len(recs)
                for r in recs:
                    touched += len(r.key) + len(r.value)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"user_s={usage1.ru_utime - usage0.ru_utime:.3f} "
            f"sys_s={usage1.ru_stime - usage0.ru_stime:.3f} "
            f"minor_faults={usage1.ru_minflt - usage0.ru_minflt} "
            f"ctx_switches={usage1.ru_nvcsw - usage0.ru_nvcsw}/"
            f"{usage1.ru_nivcsw - usage0.ru_nivcsw}"
        )
        if mode == "slowest":
            asyncio.events.Handle._run = handle_run  # type: ignore[method-assign]
        if prof is not None:
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(
                os.environ.get("PROF_SORT", "tottime")
            ).print_stats(int(os.environ.get("PROF_LINES", "30")))
            if os.environ.get("PROF_CALLEES"):
                callers = pstats.Stats(prof, stream=out).sort_stats("cumtime")
                callers.print_callees(os.environ["PROF_CALLEES"])
            print(out.getvalue())
        ticks.stop()
        fetcher = getattr(getattr(c, "_engine", None), "fetcher", None)
        if fetcher is not None:
            m = fetcher.metrics
            print(
                f"fetch_requests={m.fetch_requests} prefetches_used={m.prefetches_used} "
                f"prefetches_discarded={m.prefetches_discarded} bytes_fetched={m.bytes_fetched}"
            )
        if late is not None:
            late.report()
        if timeline is not None:
            timeline.report()
            timeline.close()
        await c.stop()
        return elapsed, cpu, ticks, n

    elapsed, cpu, ticks, n = asyncio.run(run())
    parent.send("done")
    proc.join(30)
    print(
        f"client={client} size={size} partitions={parts} codec={codec} records={n} "
        f"rec/s={n / elapsed:,.0f} cpu_s={cpu:.2f} loop_block_ms={ticks.worst_s * 1000:.2f} "
        f"outside_gc_ms={ticks.worst_outside_gc_s * 1000:.2f} "
        f"full_gcs={ticks.full_collections} longest_full_gc_ms={ticks.longest_full_s * 1000:.2f} "
        f"load={os.getloadavg()[0]:.2f} mode={mode}"
    )
    if blocks is not None:
        blocks.report_slowest()
        blocks.close()
    for cpu, what, prof in profiled:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumtime").print_stats(
            int(os.environ.get("PROF_LINES", "30"))
        )
        print(f"=== cpu {cpu * 1000:.2f} ms  {what}")
        print(out.getvalue())


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        int(args[0]),
        int(args[1]),
        int(args[2]) if len(args) > 2 else 1,
        args[3] if len(args) > 3 else "prof",
        args[4] if len(args) > 4 else "epochguard-asyncio",
        args[5] if len(args) > 5 else "none",
    )
