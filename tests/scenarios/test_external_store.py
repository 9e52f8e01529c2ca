"""Positions kept in the application's own store, on both clusters: a restart after the topic
was deleted and re-created (offsets and epochs restart at 0) must be reported, not read on
from the stored offset as if the new records followed the old ones."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard import EpochConsumer, EpochOffset, JsonFileOffsetStore
from epochguard.offsets.report import DetectedBy
from epochguard.testing import Cluster, produce, recreate_topic
from epochguard.testing import wait_until as eventually

from .test_unclean_truncation import kind

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _consumer(cluster: Cluster, store: JsonFileOffsetStore, **kw: Any) -> EpochConsumer:
    return EpochConsumer(
        bootstrap_servers=cluster.all_bootstrap_servers,
        offset_store=store,
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        fetch_max_wait_ms=100,
        metadata_max_age_ms=500,
        retry_backoff_ms=50,
        allow_auto_create_topics=False,
        **kw,
    )


def _read(consumer: EpochConsumer, n: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=100).values():
            got += records
    return got


def test_restart_from_a_stored_position_after_the_topic_was_recreated(
    module_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = module_cluster
    topic = f"eg-store-recreate-{os.getpid()}-{kind(cluster)}"
    tp = TopicPartition(topic, 0)
    store = JsonFileOffsetStore(tmp_path / "positions.json")
    cluster.create_topic(topic, replication_factor=2)
    eventually("a leader", lambda: cluster.leader(topic, 0) is not None)
    produce(cluster, topic, [f"old-{i}" for i in range(5)])
    with _consumer(cluster, store) as consumer:
        consumer.assign([tp])
        assert [r.value for r in _read(consumer, 5)] == [b"old-%d" % i for i in range(5)]
    stored = store.load()[tp]
    assert stored == EpochOffset(5, 0) and stored.topic_id is not None

    recreate_topic(cluster, topic, replication_factor=2)
    produce(cluster, topic, [f"new-{i}" for i in range(8)])  # offsets 0..7 again, epoch 0

    with _consumer(cluster, store, on_truncation="rewind") as consumer:
        consumer.assign([tp])
        got = _read(consumer, 8)
        assert [(r.offset, r.value) for r in got] == [(i, b"new-%d" % i) for i in range(8)]
        [report] = consumer.truncation_reports()
        assert report.detected_by is DetectedBy.TOPIC_RECREATED
        assert (report.consumed_to, report.divergence, report.lost_count) == (
            EpochOffset(5, 0),
            EpochOffset(0),
            5,
        )
        new_position = consumer.position_with_epoch(tp)
    assert new_position == EpochOffset(8, 0) and new_position.topic_id != stored.topic_id
    assert store.load()[tp].topic_id == new_position.topic_id
