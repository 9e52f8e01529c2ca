"""The ``raise`` policy with a compensating action.

``poll()`` raises ``LogTruncationError`` naming, per partition, the offsets the application
consumed that no longer exist. Here the compensation is to record those offsets as
"to be re-requested upstream" and then resume from the divergence point; other
partitions keep flowing meanwhile.

    python examples/raise_compensate.py
    python examples/raise_compensate.py --bootstrap-servers host:9092 --topic orders
"""

from __future__ import annotations

import sys
import time

from _common import Staging, cluster_or_none, parser, quiet
from kafka.structs import TopicPartition

from epochguard import EpochConsumer, LogTruncationError


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    quiet()
    compensations: list[tuple[str, int, int, int]] = []
    consumed: list[tuple[int, bytes]] = []
    with cluster_or_none(args.bootstrap_servers) as cluster:
        staging = Staging(cluster, args.topic) if cluster is not None else None
        bootstrap = args.bootstrap_servers or cluster.bootstrap_servers
        if staging:
            staging.replicated(10)
        tp = TopicPartition(args.topic, 0)
        with EpochConsumer(
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            on_truncation="raise",
            fetch_max_wait_ms=100,
            metadata_max_age_ms=1000,
        ) as consumer:
            consumer.assign([tp])
            deadline = time.monotonic() + args.seconds
            stage = 0
            while time.monotonic() < deadline:
                try:
                    batch = consumer.poll(timeout_ms=100)
                except LogTruncationError as err:
                    for part, report in err.truncations.items():
                        # Compensate: these records were processed but no longer exist.
                        compensations.append(
                            (part.topic, part.partition, report.lost_from or 0, report.lost_to)
                        )
                        print(
                            f"compensating: re-request {part.topic}-{part.partition} "
                            f"offsets [{report.lost_from}, {report.lost_to})"
                        )
                        consumed[:] = [
                            (o, v)
                            for o, v in consumed
                            if report.lost_from is None or o < report.lost_from
                        ]
                    for part, divergence in err.truncation_offsets().items():
                        if divergence is not None:
                            consumer.seek(part, divergence)
                        else:
                            consumer.seek_to_beginning(part)
                    continue
                for records in batch.values():
                    consumed += [(r.offset, r.value) for r in records]
                if staging and stage == 0 and len(consumed) == 10:
                    staging.leader_only(10, 5)
                    stage = 1
                elif staging and stage == 1 and len(consumed) == 15:
                    staging.unclean_election(8)
                    stage = 2
                elif staging and compensations and len(consumed) == 18:
                    break
    print(f"final log as processed: {[v.decode() for _, v in consumed]}")
    if staging is not None:
        ok = (
            compensations == [(args.topic, 0, 10, 15)]
            and [o for o, _ in consumed] == list(range(18))
            and consumed[10][1] == b"refund-0"
        )
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
