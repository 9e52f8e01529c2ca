"""Trails (``epochguard.testing.chaos.trail``): what each tracker was told and handed out."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace as NS

import pytest

from epochguard.offsets import EpochOffset, OffsetPolicy, PartitionTracker, TopicPartition
from epochguard.testing.chaos import trail

TP = TopicPartition("t", 0)


@pytest.fixture
def trails() -> Iterator[None]:
    trail.install()
    try:
        yield
    finally:
        trail.uninstall()


def test_a_trail_holds_inputs_outputs_and_events(trails: None) -> None:
    tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
    assert tr.next_action(0.0) is None  # initializing: nothing handed out, nothing recorded
    tr.on_metadata(1, 3, "topic-a")
    tr.seek(EpochOffset(5, 2))
    action = tr.next_action(0.0)
    tr.on_validation(action, 0, 1, 4, 0.0)  # type: ignore[arg-type]
    tr.drain_events()
    entries = trail.trail_of(tr)
    kinds = [e.split(" ", 2)[2].split("(", 1)[0] for e in entries]
    assert kinds == [
        "created for TopicPartition",
        "on_metadata",
        "seek",
        "next_action",
        "on_validation",
        "event ValidationStarted",
        "event TruncationDetected",
    ], entries
    assert "ValidateAction" in entries[3] and "in_flight=True" in entries[3]
    assert entries[-1].endswith("in_flight=False truncated")  # stopped under policy raise


def test_uninstall_puts_the_tracker_class_back() -> None:
    before = {name: getattr(PartitionTracker, name) for name in trail.TRACED_METHODS}
    trail.install()
    try:
        trail.install()  # idempotent: not wrapped twice
        tr = PartitionTracker(TP, OffsetPolicy("earliest", "raise"))
        tr.on_metadata(1, 0, "topic-a")
        assert len(trail.trail_of(tr)) == 2
    finally:
        trail.uninstall()
    assert {name: getattr(PartitionTracker, name) for name in trail.TRACED_METHODS} == before
    assert not trail.installed() and trail.trail_of(tr) == []
    tr.on_metadata(1, 1, "topic-a")
    assert trail.trail_of(tr) == []


def test_a_stall_report_shows_the_partitions_trail(trails: None) -> None:
    from epochguard.consumer import EpochConsumer
    from epochguard.testing.chaos.runner import _Run
    from epochguard.testing.embedded.cluster import EmbeddedCluster

    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("chaos", partitions=1, replication_factor=1)
        cluster.append("chaos", 0, [b"v"])
        consumer = EpochConsumer(
            bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest"
        )
        try:
            consumer.assign([TopicPartition("chaos", 0)])
            got = consumer.poll(timeout_ms=5000)
            assert sum(len(v) for v in got.values()) == 1
            run = NS(topic="chaos", members={"app": [NS(member=0, client=NS(consumer=consumer))]})
            text = _Run.inner_state(run, "app", 0)  # type: ignore[arg-type]
        finally:
            consumer.close()
    assert "member 0 p0 trail" in text
    assert "on_records(" in text and "created for TopicPartition(topic='chaos'" in text
