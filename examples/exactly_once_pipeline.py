"""Exactly-once consume-transform-produce, with the input log truncated mid-pipeline.

A read_committed ``EpochConsumer`` reads ``orders``; kafka-python's transactional producer
writes one output record per input record to ``orders-out`` and commits the consumer's
position, with its leader epoch, in the same transaction
(``send_offsets_to_transaction``). When ``poll()`` reports a truncation
(``on_truncation="raise"``) the pipeline aborts the open transaction, seeks every
partition back to what the last committed transaction covered (a truncated one no further
than its divergence point) and begins again: the output then holds each record of the
input log exactly once, and the outputs of input records that no longer exist are the
ones the truncation report names.

On the EmbeddedCluster (the default) the script stages an unclean election under the
pipeline and checks that outcome itself (exit code 0). With ``--bootstrap-servers`` it
runs the pipeline on a real cluster, writing to ``<topic>-out``: create that topic first
(unless the brokers auto-create topics), or the producer waits for its metadata until
``max_block_ms`` (60 s) runs out.

    python examples/exactly_once_pipeline.py
    python examples/exactly_once_pipeline.py --bootstrap-servers host:9092 --topic orders
"""

from __future__ import annotations

import sys
import time
from typing import Any

from _common import Staging, cluster_or_none, parser, quiet
from kafka import KafkaProducer
from kafka.structs import OffsetAndMetadata, TopicPartition

from epochguard import EpochConsumer, EpochOffset, LogTruncationError, TruncationReport

#: Records per transaction (a transaction spans polls until it holds this many).
BATCH = 4


def transform(record: Any) -> bytes:
    # The output names its input (offset and value), so the outcome can be checked.
    return b"%d:%s" % (record.offset, record.value.upper())


def commit(consumer: EpochConsumer, producer: KafkaProducer) -> dict[TopicPartition, EpochOffset]:
    """Commit the open transaction with the consumer's positions, epochs included: a
    restarted pipeline validates them before reading on (a truncation since is reported)."""
    positions = {tp: consumer.position_with_epoch(tp) for tp in consumer.assignment()}
    producer.send_offsets_to_transaction(
        {tp: OffsetAndMetadata(p.offset, "", p.wire_epoch) for tp, p in positions.items()},
        consumer.group_metadata(),
    )
    producer.commit_transaction()
    return positions


def caught_up(consumer: EpochConsumer) -> bool:
    for tp in consumer.assignment():
        highwater = consumer.highwater(tp)
        if highwater is None or consumer.position(tp) < highwater:
            return False
    return bool(consumer.assignment())


def run_pipeline(
    bootstrap: str, topic: str, seconds: float, staging: Staging | None
) -> tuple[list[TruncationReport], int]:
    """The pipeline; returns the truncations it handled and how many records were in the
    transactions it aborted."""
    reports: list[TruncationReport] = []
    aborted = 0
    consumer = EpochConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id="orders-pipeline",
        isolation_level="read_committed",
        enable_auto_commit=False,  # offsets go into the transactions instead
        auto_offset_reset="earliest",
        on_truncation="raise",
        fetch_max_wait_ms=100,
        metadata_max_age_ms=1000,
    )
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="orders-pipeline-1")
    producer.init_transactions()
    # Where the last committed transaction left each partition: where to go back to.
    committed: dict[TopicPartition, EpochOffset] = {}
    in_transaction = 0  # records in the open transaction
    seen = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if staging is not None and staging.advance(seen) and caught_up(consumer):
                break  # the staging script ran and every input record was read
            try:
                batch = consumer.poll(timeout_ms=100, max_records=BATCH)
            except LogTruncationError as err:
                reports += err.truncations.values()
                if in_transaction:
                    producer.abort_transaction()  # its outputs are never read_committed
                    aborted += in_transaction
                    in_transaction = 0
                for tp in consumer.assignment():
                    target = committed.get(tp)
                    report = err.truncations.get(tp)
                    divergence = None if report is None else report.divergence
                    if divergence is not None and (
                        target is None or target.offset > divergence.offset
                    ):
                        target = divergence
                    if target is not None:
                        consumer.seek(tp, target)  # validated again before fetching
                    else:
                        consumer.seek_to_beginning(tp)
                continue
            if not batch:
                continue
            if in_transaction == 0:
                producer.begin_transaction()
            for records in batch.values():
                for r in records:
                    producer.send(f"{topic}-out", transform(r), partition=r.partition)
                    in_transaction += 1
                    seen += 1
            if in_transaction >= BATCH:
                committed.update(commit(consumer, producer))
                in_transaction = 0
        if in_transaction:
            commit(consumer, producer)
    finally:
        producer.close()
        consumer.close(autocommit=False)
    return reports, aborted


def read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes, int]]:
    """Every committed record of ``topic`` partition 0: (offset, value, leader epoch)."""
    tp = TopicPartition(topic, 0)
    with EpochConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    ) as c:
        c.assign([tp])
        end = c.end_offsets([tp])[tp]
        out: list[tuple[int, bytes, int]] = []
        deadline = time.monotonic() + 10
        while c.position(tp) < end and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=100).values():
                out += [(r.offset, r.value, r.leader_epoch) for r in records]
        return out


def check(bootstrap: str, topic: str, reports: list[TruncationReport]) -> list[str]:
    """What is wrong with the outcome (nothing, when exactly-once held)."""
    problems = []
    inputs = read_all(bootstrap, topic)
    by_value = [v for _o, v, _e in read_all(bootstrap, f"{topic}-out")]
    outputs = [int(v.split(b":", 1)[0]) for v in by_value]
    expected = [b"%d:%s" % (o, v.upper()) for o, v, _e in inputs]
    lost = {o for r in reports for o in range(r.lost_from or 0, r.lost_to)}
    if len(by_value) != len(set(by_value)):
        problems.append("an input record was written twice")
    missing = [e for e in expected if e not in by_value]
    if missing:
        problems.append(f"outputs missing for {missing}")
    stray = [
        v for v, o in zip(by_value, outputs, strict=True) if v not in expected and o not in lost
    ]
    if stray:
        problems.append(f"outputs of no input record and no reported loss: {stray}")
    with EpochConsumer(
        bootstrap_servers=bootstrap, group_id="orders-pipeline", enable_auto_commit=False
    ) as c:
        group_offset = c.committed_with_epoch(TopicPartition(topic, 0))
    last_offset, _v, last_epoch = inputs[-1]
    if group_offset != EpochOffset(last_offset + 1, last_epoch):
        problems.append(f"the group's committed position is {group_offset}")
    print(
        f"committed position: {group_offset}, input records: {len(inputs)}, "
        f"outputs: {len(by_value)}, truncations handled: {len(reports)}, "
        f"outputs of lost input records (reported): {len(by_value) - len(expected) + len(missing)}"
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__ or "").parse_args(argv)
    quiet()
    with cluster_or_none(args.bootstrap_servers) as cluster:
        staging = None
        if cluster is not None:
            staging = Staging(cluster, args.topic)
            cluster.create_topic(f"{args.topic}-out", partitions=1, replication_factor=3)
            staging.replicated(10)
        bootstrap = args.bootstrap_servers or cluster.all_bootstrap_servers
        reports, aborted = run_pipeline(bootstrap, args.topic, args.seconds, staging)
        for r in reports:
            print(f"truncation handled: {r.describe()}")
        print(f"records in aborted transactions: {aborted}")
        if staging is None:
            return 0  # a real cluster: nothing was staged, so there is no outcome to check
        problems = check(bootstrap, args.topic, reports)
        if not reports:
            problems.append("the staged truncation was not reported")
        for p in problems:
            print(f"FAILED: {p}")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
