"""Exactly-once style processing: output rows and the position (offset, leader epoch) are
written in ONE SQLite transaction, and a restart seeks with the stored epoch.

If the log was truncated while the application was down, the restored position fails
validation and the ``on_truncation`` callback removes the output of the lost records
(same database) before consumption resumes at the divergence point.

    python examples/exactly_once_sqlite.py --db /tmp/out.db
    python examples/exactly_once_sqlite.py --bootstrap-servers host:9092 --topic orders
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from _common import Staging, cluster_or_none, parser, quiet
from kafka.structs import TopicPartition

from epochguard import EpochConsumer, EpochOffset, SqliteOffsetStore, TruncationReport
from epochguard.offsets import TruncationDecision


def process(
    store: SqliteOffsetStore, tp: TopicPartition, records: list[object], position: EpochOffset
) -> None:
    """Output and position commit or roll back together. ``position`` (the consumer's,
    after these records) carries the leader epoch and the topic id."""
    with store.transaction() as conn:
        for r in records:
            conn.execute(
                "INSERT INTO output(topic, partition, offset, value) VALUES (?,?,?,?)",
                (r.topic, r.partition, r.offset, r.value),
            )  # type: ignore[attr-defined]
        store.save({tp: position}, connection=conn)


def run_once(bootstrap: str, topic: str, db: Path, seconds: float, until: int) -> list[str]:
    store = SqliteOffsetStore(db)
    conn: sqlite3.Connection = store.connection
    conn.execute(
        "CREATE TABLE IF NOT EXISTS output(topic TEXT, partition INT, offset INT, "
        "value BLOB, PRIMARY KEY(topic, partition, offset))"
    )
    tp = TopicPartition(topic, 0)

    def undo_lost_output(report: TruncationReport) -> TruncationDecision:
        with store.transaction() as c:
            c.execute(
                "DELETE FROM output WHERE topic=? AND partition=? AND offset>=?",
                (report.topic, report.partition, report.lost_from or 0),
            )
        print(f"truncation: removed output of offsets [{report.lost_from}, {report.lost_to})")
        return TruncationDecision.REWIND

    with EpochConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        offset_store=store,
        on_truncation=undo_lost_output,
        fetch_max_wait_ms=100,
    ) as consumer:
        consumer.assign([tp])  # the stored (offset, epoch) is validated before fetching
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for part, records in consumer.poll(timeout_ms=100).items():
                process(store, part, records, consumer.position_with_epoch(part))
            (count,) = conn.execute("SELECT count(*) FROM output").fetchone()
            if count >= until:
                break
    rows = [v.decode() for (v,) in conn.execute("SELECT value FROM output ORDER BY offset")]
    print(f"output: {rows}; position stored: {store.load().get(tp)}")
    store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__ or "")
    p.add_argument("--db", type=Path, default=None)
    args = p.parse_args(argv)
    quiet()
    db = args.db or Path(tempfile.mkdtemp()) / "exactly_once.db"
    with cluster_or_none(args.bootstrap_servers) as cluster:
        if cluster is None:
            run_once(args.bootstrap_servers, args.topic, db, args.seconds, until=10**9)
            return 0
        staging = Staging(cluster, args.topic)
        staging.replicated(10)
        staging.leader_only(10, 5)
        first = run_once(cluster.bootstrap_servers, args.topic, db, args.seconds, until=15)
        # The application is down while the partition is truncated and refilled.
        staging.unclean_election(8)
        second = run_once(cluster.bootstrap_servers, args.topic, db, args.seconds, until=18)
        expected = [f"order-{i}" for i in range(10)] + [f"refund-{i}" for i in range(8)]
        return 0 if len(first) == 15 and second == expected else 1


if __name__ == "__main__":
    sys.exit(main())
