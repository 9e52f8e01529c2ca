"""offset_store=: positions (with epochs) loaded and saved through an OffsetStore."""

from __future__ import annotations

import pytest

from epochguard.offsets.position import EpochOffset
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
        assert consumer.committed(TP0) == EpochOffset(18, 2)
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
