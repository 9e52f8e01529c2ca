"""``for record in consumer`` across errors: the README tour's raise-then-seek retry loop,
run as written, over several truncations."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer, LogTruncationError, NoOffsetForPartitionError
from epochguard.consumer.records import ConsumerRecord
from epochguard.offsets.position import EpochOffset
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer

pytestmark = pytest.mark.timeout(120)

README = Path(__file__).resolve().parents[2] / "README.md"
TOPIC = "orders"
TP = TopicPartition(TOPIC, 0)
KEPT, LOST, FRESH, PASSES = 10, 5, 3, 3


def tour_code() -> str:
    section = README.read_text().split("## A short tour", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


class TourDone(Exception):
    """Raised by ``handle`` once every expected record was seen (ends ``while True``)."""


def _wait_replicated(cluster: EmbeddedCluster, broker: int) -> None:
    deadline = time.monotonic() + 10
    want = cluster.log_end_offset(TOPIC, 0)
    while cluster.log_end_offset(TOPIC, 0, broker=broker) != want:
        assert time.monotonic() < deadline, f"broker {broker} did not catch up to {want}"
        time.sleep(0.02)


class _Scenario:
    """Drives one truncation per pass from inside ``handle``: when the application has read
    the records only the leader has, the follower is elected uncleanly."""

    def __init__(self, cluster: EmbeddedCluster) -> None:
        self.cluster = cluster
        cluster.create_topic(TOPIC, replication_factor=2)
        leader = cluster.leader(TOPIC, 0)
        assert leader is not None
        self.leader = leader
        self.follower = next(b for b in cluster.replicas(TOPIC, 0) if b != leader)
        cluster.append(TOPIC, 0, [b"kept-%d" % i for i in range(KEPT)], batch_size=1)
        _wait_replicated(cluster, self.follower)
        self.passes = 0
        self.start = KEPT  # where this pass's lost (and then fresh) records begin
        self.starts: list[int] = []
        self.seen: list[tuple[int, bytes, int]] = []
        self._append_lost()

    def _append_lost(self) -> None:
        self.passes += 1
        self.starts.append(self.start)
        self.cluster.stop_broker(self.follower)
        self.cluster.append(
            TOPIC, 0, [b"lost-%d-%d" % (self.passes, i) for i in range(LOST)], batch_size=1
        )

    def _elect_follower(self) -> None:
        c, old, new = self.cluster, self.leader, self.follower
        c.stop_broker(old)
        c.start_broker(new)
        c.elect_leader(TOPIC, 0, new, unclean=True)
        c.append(TOPIC, 0, [b"fresh-%d-%d" % (self.passes, i) for i in range(FRESH)])
        c.start_broker(old)
        _wait_replicated(c, old)
        self.leader, self.follower = new, old

    def handle(self, record: ConsumerRecord) -> None:
        self.seen.append((record.offset, record.value, record.leader_epoch))
        if record.value == b"lost-%d-%d" % (self.passes, LOST - 1):
            self._elect_follower()
        elif record.value == b"fresh-%d-%d" % (self.passes, FRESH - 1):
            if self.passes == PASSES:
                raise TourDone
            self.start += FRESH
            self._append_lost()

    def expected(self) -> list[tuple[int, bytes]]:
        want = [(i, b"kept-%d" % i) for i in range(KEPT)]
        for k, start in enumerate(self.starts, 1):
            want += [(start + i, b"lost-%d-%d" % (k, i)) for i in range(LOST)]
            want += [(start + i, b"fresh-%d-%d" % (k, i)) for i in range(FRESH)]
        return want


def test_readme_tour_raise_then_seek_in_a_retry_loop_reads_the_right_records_each_pass(
    cluster: EmbeddedCluster,
) -> None:
    scenario = _Scenario(cluster)
    printed: list[str] = []
    loops: list[int] = []  # len(seen) when each ``for`` loop started
    consumers: list[EpochConsumer] = []

    class TourConsumer(EpochConsumer):
        def __iter__(self) -> TourConsumer:
            loops.append(len(scenario.seen))
            return super().__iter__()

    def consumer_factory(**configs: Any) -> EpochConsumer:
        configs.update(
            bootstrap_servers=cluster.bootstrap_servers,
            fetch_max_wait_ms=100,
            metadata_max_age_ms=300,
            retry_backoff_ms=20,
            request_timeout_ms=5000,
            heartbeat_interval_ms=200,
            session_timeout_ms=6000,
        )
        consumer = TourConsumer(**configs)
        consumers.append(consumer)
        return consumer

    namespace: dict[str, Any] = {
        "handle": scenario.handle,
        "print": lambda *args: printed.append(" ".join(map(str, args))),
    }
    code = tour_code().replace(
        "from epochguard import EpochConsumer, LogTruncationError\n",
        "from epochguard import LogTruncationError\n",
    )
    assert "EpochConsumer(" in code and "while True:" in code
    namespace["EpochConsumer"] = consumer_factory
    try:
        with pytest.raises(TourDone):
            exec(compile(code, str(README), "exec"), namespace)
    finally:
        for consumer in consumers:
            consumer.close(autocommit=False)
    assert [(o, v) for o, v, _e in scenario.seen] == scenario.expected()
    # One ``for`` pass per truncation plus the first, none of them empty: a generator that
    # raised is not kept to end the next pass at once.
    assert len(loops) == PASSES + 1
    assert loops == sorted(set(loops))
    assert len(printed) == PASSES
    for line, start in zip(printed, scenario.starts, strict=True):
        assert f"offsets [{start}, {start + LOST})" in line


def test_after_an_error_the_next_for_loop_yields_records(cluster: EmbeddedCluster) -> None:
    """The bare bug: ``for`` ended at once after a LogTruncationError inside the loop."""
    scenario = _Scenario(cluster)
    with make_consumer(cluster, on_truncation="raise", consumer_timeout_ms=5000) as consumer:
        consumer.assign([TP])
        with pytest.raises(LogTruncationError) as info:
            for record in consumer:
                scenario.handle(record)
        assert info.value.truncation_offsets() == {TP: EpochOffset(KEPT, 0)}
        consumer.seek(TP, info.value.truncation_offsets()[TP])
        first = next(iter(consumer))
        assert (first.offset, first.value) == (KEPT, b"fresh-1-0")


def test_a_for_loop_after_an_error_without_a_seek_keeps_the_other_partitions_flowing(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("it", partitions=2, replication_factor=1)
    for p in (0, 1):
        cluster.append("it", p, [b"%d-%d" % (p, i) for i in range(5)])
    tp0, tp1 = TopicPartition("it", 0), TopicPartition("it", 1)
    with make_consumer(cluster, auto_offset_reset="none", consumer_timeout_ms=1000) as consumer:
        consumer.assign([tp0, tp1])
        consumer.seek(tp1, 0)  # tp0 has no position and no reset policy: it stops
        first: list[ConsumerRecord] = []
        with pytest.raises(NoOffsetForPartitionError):
            for record in consumer:
                first.append(record)
        assert first == []  # raised on the first poll, before any record
        # The application logs the error and carries on, leaving tp0 stopped.
        assert [(r.partition, r.offset) for r in consumer] == [(1, i) for i in range(5)]
