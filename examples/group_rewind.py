"""A group consumer with the ``rewind`` policy.

On an unclean election it rewinds to the divergence point, logs ``truncation_detected``
and keeps going; the callback counts what was lost so it can be alerted on.

    python examples/group_rewind.py                       # EmbeddedCluster, staged election
    python examples/group_rewind.py --bootstrap-servers host:9092 --topic orders
"""

from __future__ import annotations

import sys
import time

from _common import Staging, cluster_or_none, parser, quiet

from epochguard import EpochConsumer, TruncationReport


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    quiet()
    lost: list[TruncationReport] = []
    with cluster_or_none(args.bootstrap_servers) as cluster:
        staging = Staging(cluster, args.topic) if cluster is not None else None
        bootstrap = args.bootstrap_servers or cluster.bootstrap_servers
        if staging:
            staging.replicated(10)
        consumer = EpochConsumer(
            bootstrap_servers=bootstrap,
            group_id="example-rewind",
            auto_offset_reset="earliest",
            on_truncation="rewind",
            on_truncation_report=lost.append,
            session_timeout_ms=10000,
            heartbeat_interval_ms=500,
            fetch_max_wait_ms=100,
            metadata_max_age_ms=1000,
        )
        consumer.subscribe([args.topic])
        seen = 0
        deadline = time.monotonic() + args.seconds
        with consumer:
            while time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=100).items():
                    for r in records:
                        seen += 1
                        print(
                            f"{tp.topic}-{tp.partition}@{r.offset} (epoch {r.leader_epoch}):"
                            f" {r.value!r}"
                        )
                if staging and staging.advance(seen):
                    break
            consumer.commit()
    for rep in lost:
        print(f"TRUNCATION: {rep.describe()}")
    if staging is not None:
        return 0 if len(lost) == 1 and lost[0].lost_count == 5 and seen == 23 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
