"""What benchmarks/load.py and benchmarks/_soak.py share: consumers in their own processes
feeding a ``Ledger`` (``epochguard.testing.load``), driven by this process, which holds the
EmbeddedCluster and stages the unclean elections.

Each consumer process polls in a loop and keeps its ledger; it publishes its partitions'
positions in shared memory (so the driver can wait for "the doomed records were read"
without a round trip) and answers ``status`` / ``finish`` messages on a pipe: record counts,
first/last record times, truncation reports with their times (``time.monotonic()``, one
clock for every process on Linux), its resident memory, and at the end its violations and
the partitions where what it holds differs from the final log.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks._common import status_kib

_CTX = mp.get_context("spawn")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def process_resources(pid: int) -> dict[str, int]:
    """Another process's resident memory (KiB), open file descriptors and threads, read
    from ``/proc`` (so sampling costs the process nothing)."""
    out = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name == "VmRSS":
                out["rss_kib"] = int(value.split()[0])
            elif name == "Threads":
                out["threads"] = int(value)
    return out


def _worker(
    config: dict[str, Any],
    topic: str,
    assign: list[int] | None,
    window: int | None,
    positions: Any,
    conn: Any,
) -> None:
    import logging

    log_dir = os.environ.get("LOAD_WORKER_LOG_DIR")
    if log_dir:
        # For diagnosis: each consumer process logs to its own file.
        logging.basicConfig(
            filename=os.path.join(log_dir, f"consumer-{os.getpid()}.log"), level=logging.INFO
        )
    else:
        logging.disable(logging.CRITICAL)
    from kafka.structs import TopicPartition

    from epochguard.consumer import EpochConsumer
    from epochguard.testing.load import Ledger

    ledger = Ledger(window=window)
    consumer = EpochConsumer(on_truncation_report=ledger.on_report, **config)
    if assign is None:
        consumer.subscribe([topic])
    else:
        consumer.assign([TopicPartition(topic, p) for p in assign])
    first_at: float | None = None
    last_at: float | None = None
    seen_reports = 0
    try:
        while True:
            batch = consumer.poll(timeout_ms=50, max_records=10000)
            if batch:
                now = time.monotonic()
                if first_at is None:
                    first_at = now
                last_at = now
                ledger.add(batch)
                for tp in batch:
                    positions[tp.partition] = ledger.position(tp)
            if len(ledger.reports) != seen_reports:
                for tp, _div, _lost, _at in ledger.reports[seen_reports:]:
                    positions[tp.partition] = ledger.position(tp)
                seen_reports = len(ledger.reports)
            if not conn.poll():
                continue
            msg = conn.recv()
            if msg[0] == "status":
                m = consumer.metrics(raw=True) or {}
                conn.send(
                    {
                        "records": ledger.records,
                        "reports": len(ledger.reports),
                        "first_at": first_at,
                        "last_at": last_at,
                        "rss_kib": status_kib("VmRSS"),
                        "hwm_kib": status_kib("VmHWM"),
                        "assigned": sorted(tp.partition for tp in consumer.assignment()),
                        "metrics": m,
                    }
                )
            elif msg[0] == "finish":
                final: Mapping[Any, Sequence[bytes | None]] = msg[1]
                mine = {tp: v for tp, v in final.items() if tp in consumer.assignment()}
                conn.send(
                    {
                        "violations": ledger.violations[:20],
                        "violation_count": len(ledger.violations),
                        "mismatches": ledger.mismatches(mine)[:20],
                        "reports": [(tp.partition, d, n, at) for tp, d, n, at in ledger.reports],
                        "records": ledger.records,
                    }
                )
                # Stop polling but stay in the group until every member has answered: a
                # member leaving first would hand its partitions to the others, who would
                # read them again from the start (nothing is committed).
                conn.recv()
                return
    finally:
        consumer.close()


class ConsumerProcess:
    """One consumer in its own process (see the module docstring)."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        positions: Any,
        assign: list[int] | None = None,
        window: int | None = None,
    ) -> None:
        self._conn, child = _CTX.Pipe()
        self.proc = _CTX.Process(
            target=_worker, args=(config, topic, assign, window, positions, child), daemon=True
        )
        self.proc.start()

    def status(self) -> dict[str, Any]:
        self._conn.send(("status",))
        if not self._conn.poll(60):
            raise RuntimeError("consumer process did not answer a status request")
        answer: dict[str, Any] = self._conn.recv()
        return answer

    def finish(self, final: Mapping[Any, Sequence[bytes | None]]) -> dict[str, Any]:
        """Stop polling and report; the consumer stays open until :meth:`close`."""
        self._conn.send(("finish", dict(final)))
        if not self._conn.poll(120):
            raise RuntimeError("consumer process did not finish")
        answer: dict[str, Any] = self._conn.recv()
        return answer

    def close(self) -> None:
        self._conn.send(("close",))
        self.proc.join(timeout=30)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)


def shared_positions(partitions: int) -> Any:
    return _CTX.Array("q", partitions, lock=False)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 300.0) -> float:
    """Wait (polling) until ``cond()``; returns the seconds it took."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not reached in {timeout:.0f} s")
        time.sleep(0.01)
    return time.monotonic() - start
