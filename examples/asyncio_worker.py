"""An asyncio worker (the shape of a FastAPI background task or a FastStream subscriber)
that consumes a topic with ``AIOEpochConsumer`` and the ``raise`` policy.

On an unclean election the handler is told exactly which orders it processed that no
longer exist (``LogTruncationError``), compensates for them, seeks to the divergence point
and goes on with the new records. A health endpoint would read ``worker.lag``.

    python examples/asyncio_worker.py                       # EmbeddedCluster, staged election
    python examples/asyncio_worker.py --bootstrap-servers host:9092 --topic orders
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from _common import Staging, cluster_or_none, parser, quiet

from epochguard import AIOEpochConsumer, LogTruncationError


class OrderWorker:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOEpochConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id="example-asyncio-worker",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            on_truncation="raise",
            fetch_max_wait_ms=100,
            metadata_max_age_ms=1000,
        )
        self.processed: list[bytes] = []
        self.compensated: list[int] = []

    async def handle(self, record: Any) -> None:
        self.processed.append(record.value)
        print(f"{record.topic}-{record.partition}@{record.offset}: {record.value!r}")

    async def run(self, stop: asyncio.Event) -> None:
        async with self.consumer as consumer:
            while not stop.is_set():
                try:
                    batches = await consumer.getmany(timeout_ms=200)
                except LogTruncationError as exc:
                    for tp, report in exc.truncations.items():
                        # The orders at [lost_from, lost_to) were processed and are gone.
                        self.compensated += list(range(report.lost_from, report.lost_to))
                        print(f"TRUNCATION: {report.describe()}")
                        assert report.divergence is not None
                        consumer.seek(tp, report.divergence)
                    continue
                for records in batches.values():
                    for record in records:
                        await self.handle(record)
                if batches:
                    await consumer.commit()  # with the leader epochs


async def serve(args: Any) -> int:
    with cluster_or_none(args.bootstrap_servers) as cluster:
        staging = Staging(cluster, args.topic) if cluster is not None else None
        bootstrap = args.bootstrap_servers or cluster.bootstrap_servers
        if staging:
            staging.replicated(10)
        worker = OrderWorker(bootstrap, args.topic)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.05)
            if staging and staging.advance(len(worker.processed)):
                break
        stop.set()
        await task
    if staging is not None:
        refunds = [v for v in worker.processed if v.startswith(b"refund-")]
        return 0 if worker.compensated == [10, 11, 12, 13, 14] and len(refunds) == 8 else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    quiet()
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
