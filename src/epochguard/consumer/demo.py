"""``epochguard demo``: an unclean election, seen by EpochConsumer, start to finish.

A three-broker EmbeddedCluster; a topic with two replicas. The consumer reads records
that only the leader has (the follower is down), the leader dies, the follower is elected
uncleanly and accepts new writes at the same offsets. The consumer detects the truncation,
prints the report, and continues from the divergence point. At each step the demo prints
every replica's log (offset runs per leader epoch) and leader-epoch cache, so the divergence
and the old leader's KIP-101 truncation on rejoining are visible.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, TextIO

from kafka.structs import TopicPartition

from epochguard._log import cli_output
from epochguard.consumer.consumer import EpochConsumer
from epochguard.consumer.records import ConsumerRecord
from epochguard.offsets.report import TruncationReport

if TYPE_CHECKING:
    from epochguard.testing import EmbeddedCluster

__all__ = ["run_demo"]


def run_demo(out: TextIO = sys.stdout, fast: bool = False) -> int:
    """Run the walk-through; returns 0 when everything happened as described."""
    kafka_logger = logging.getLogger("kafka")
    saved = kafka_logger.level
    kafka_logger.setLevel(logging.CRITICAL)  # the brokers it stops make kafka-python warn
    # The demo is an application: it shows epochguard's warnings (the truncation) on stderr.
    try:
        with cli_output(sys.stderr, logging.WARNING):
            return _run_demo(out, fast)
    finally:
        kafka_logger.setLevel(saved)


def _run_demo(out: TextIO, fast: bool) -> int:
    from epochguard.testing import EmbeddedCluster

    pause = 0.0 if fast else 0.4

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)
        time.sleep(pause if text else 0)

    def show_replicas(cluster: EmbeddedCluster) -> None:
        for line in _replica_lines(cluster, "orders", 0):
            say(f"     {line}")

    tp = TopicPartition("orders", 0)
    reports: list[TruncationReport] = []
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic("orders", partitions=1, replication_factor=2)
        leader = cluster.leader("orders", 0)
        assert leader is not None
        follower = next(b for b in cluster.replicas("orders", 0) if b != leader)
        say(
            f"1. Topic 'orders': leader broker {leader}, follower broker {follower}, "
            f"leader epoch {cluster.leader_epoch('orders', 0)}."
        )
        cluster.append("orders", 0, [b"order-%d" % i for i in range(10)], batch_size=1)
        with EpochConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            on_truncation="rewind",
            on_truncation_report=reports.append,
            fetch_max_wait_ms=100,
            metadata_max_age_ms=500,
        ) as consumer:
            consumer.assign([tp])
            got = _read(consumer, 10)
            say(
                f"2. Consumed offsets {got[0].offset}..{got[-1].offset} "
                f"(replicated on both brokers)."
            )
            show_replicas(cluster)
            cluster.stop_broker(follower)
            cluster.append("orders", 0, [b"order-%d" % i for i in range(10, 15)], batch_size=1)
            got = _read(consumer, 5)
            say(
                f"3. Follower {follower} is down; the leader alone accepted offsets "
                f"{got[0].offset}..{got[-1].offset}, and the consumer read them: "
                f"position {consumer.position_with_epoch(tp)}."
            )
            show_replicas(cluster)
            consumer.poll(timeout_ms=300)
            cluster.stop_broker(leader)
            cluster.start_broker(follower)
            cluster.elect_leader("orders", 0, follower, unclean=True)
            cluster.append("orders", 0, [b"refund-%d" % i for i in range(8)], batch_size=1)
            say(
                f"4. Leader {leader} died. UNCLEAN election: broker {follower} is leader "
                f"(epoch {cluster.leader_epoch('orders', 0)}) without offsets 10..14, and "
                f"has since written 8 new records at offsets 10..17."
            )
            show_replicas(cluster)
            say(
                "   A consumer that ignores epochs would now read offset 15 onwards and "
                "silently skip refund-0..refund-4."
            )
            cluster.start_broker(leader)
            say(
                f"   Broker {leader} rejoins as a follower: it truncates its log to the "
                f"divergence point (KIP-101) and copies the new leader's records."
            )
            show_replicas(cluster)
            got = _read(consumer, 8)
            if not reports:
                say("!! no truncation was detected")
                return 1
            rep = reports[0]
            say("5. EpochConsumer detected the truncation:")
            say(f"   {rep.describe()}")
            for key, value in rep.to_dict().items():
                say(f"     {key:17} {value}")
            say(
                f"6. Policy 'rewind': consumption continued from the divergence point: "
                f"{', '.join(r.value.decode() for r in got)} "
                f"(offsets {got[0].offset}..{got[-1].offset}, leader epoch "
                f"{got[0].leader_epoch})."
            )
            m = consumer.metrics(raw=True) or {}  # None only with metrics_enabled=False
            say(
                f"   metrics: truncations_detected={m['truncations_detected']} "
                f"records_lost={m['records_lost']} "
                f"offset_for_leader_epoch_requests={m['offset_for_leader_epoch_requests']}"
            )
            ok = rep.lost_count == 5 and [r.offset for r in got] == list(range(10, 18))
            return 0 if ok else 1


def _replica_lines(cluster: EmbeddedCluster, topic: str, partition: int) -> list[str]:
    """One line per replica: its log as offset runs per leader epoch, and its epoch cache."""
    leader = cluster.leader(topic, partition)
    lines = []
    for broker in cluster.replicas(topic, partition):
        if not cluster.is_running(broker):
            lines.append(f"broker {broker} (down)")
            continue
        log = cluster.replica_log(topic, partition, broker)
        runs: list[list[int]] = []  # [first offset, last offset, epoch]
        for base, last, epoch in log.batches:
            if runs and runs[-1][2] == epoch and runs[-1][1] + 1 == base:
                runs[-1][1] = last
            else:
                runs.append([base, last, epoch])
        shown = "  ".join(f"[{a}..{b}]@e{e}" for a, b, e in runs) or "(empty)"
        cache = ", ".join(f"e{e.epoch}@{e.start_offset}" for e in log.epoch_cache)
        role = "leader  " if broker == leader else "follower"
        lines.append(
            f"broker {broker} {role} log {shown:34} LEO {log.log_end_offset:<3} "
            f"epoch cache [{cache}]"
        )
    return lines


def _read(consumer: EpochConsumer, n: int, timeout: float = 15.0) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=100, max_records=n - len(got)).values():
            got += recs
    return got
