"""offset_store=: positions (with epochs) loaded and saved through an OffsetStore."""

from __future__ import annotations

import pytest

from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.offsets.stores import JsonFileOffsetStore, SqliteOffsetStore

from .conftest import TP0, diverge, make_consumer, read, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)


def test_sqlite_store_round_trip_and_truncation_on_restart(cluster, tmp_path) -> None:
    old, new = setup_topic(cluster)
    store = SqliteOffsetStore(tmp_path / "pos.db")
    with make_consumer(cluster, offset_store=store, enable_auto_commit=True) as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        diverge(cluster, old, new)
        assert len(read(consumer, 5)) == 5
    # close() saved the position through the store, epoch included.
    assert store.load() == {TP0: EpochOffset(15, 0)}
    unclean_elect(cluster, old, new)
    with make_consumer(cluster, offset_store=store, on_truncation="rewind") as consumer:
        consumer.assign([TP0])
        got = read(consumer, 8)
        assert [r.offset for r in got] == list(range(10, 18))
        [rep] = consumer.truncation_reports()
        assert rep.position_source == "offset_store" and rep.lost_count == 5
        consumer.commit()
        assert consumer.committed_with_epoch(TP0) == EpochOffset(18, 2)
    assert store.load() == {TP0: EpochOffset(18, 2)}
    store.close()


def test_json_store_resumes_where_it_stopped(cluster, tmp_path) -> None:
    setup_topic(cluster)
    store = JsonFileOffsetStore(tmp_path / "pos.json")
    store.save({TP0: EpochOffset(4, 0)})
    with make_consumer(cluster, offset_store=store) as consumer:
        consumer.assign([TP0])
        assert [r.offset for r in read(consumer, 6)] == list(range(4, 10))
        consumer.commit()
    assert store.load() == {TP0: EpochOffset(10, 0)}


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_topic_recreated_while_stopped_is_reported_on_restart(cluster, tmp_path, kind) -> None:
    """The stored position carries the topic id, so a topic deleted and re-created (new
    offsets and epochs from 0) while the application was down is not read on as if the
    new records at the stored offset followed the old ones."""
    store = (
        SqliteOffsetStore(tmp_path / "pos.db")
        if kind == "sqlite"
        else JsonFileOffsetStore(tmp_path / "pos.json")
    )
    cluster.create_topic("t", replication_factor=2)
    cluster.append("t", 0, [b"old-%d" % i for i in range(5)])
    old_id = cluster.topic_id("t")
    with make_consumer(cluster, offset_store=store, enable_auto_commit=True) as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 5)) == 5
    stored = store.load()[TP0]
    assert stored == EpochOffset(5, 0) and stored.topic_id == str(old_id)

    cluster.delete_topic("t")
    cluster.create_topic("t", replication_factor=2)
    cluster.append("t", 0, [b"new-%d" % i for i in range(8)])  # offsets 0..7 again, epoch 0
    assert cluster.topic_id("t") != old_id

    with make_consumer(cluster) as probe:
        validated = probe.validate_offsets({TP0: stored})[TP0]
    assert not validated.valid and validated.report is not None
    assert validated.report.detected_by is DetectedBy.TOPIC_RECREATED

    with make_consumer(cluster, offset_store=store, on_truncation="rewind") as consumer:
        consumer.assign([TP0])
        got = read(consumer, 8)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]
        [rep] = consumer.truncation_reports()
        assert rep.detected_by is DetectedBy.TOPIC_RECREATED
        assert (rep.consumed_to, rep.divergence, rep.lost_count) == (
            EpochOffset(5, 0),
            EpochOffset(0),
            5,
        )
        assert rep.position_source == "offset_store"
        position = consumer.position_with_epoch(TP0)
        assert position == EpochOffset(8, 0) and position.topic_id == cluster.topic_id("t")


def test_a_position_without_topic_id_cannot_tell_a_recreated_topic(cluster) -> None:
    """The documented limit: a bare (offset, epoch) from before topic ids were stored."""
    cluster.create_topic("t", replication_factor=2)
    cluster.append("t", 0, [b"new-%d" % i for i in range(8)])
    with make_consumer(cluster) as consumer:
        result = consumer.validate_offsets({TP0: EpochOffset(5, 0)})[TP0]
    assert result.valid
