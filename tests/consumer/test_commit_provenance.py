"""Group commits carry what OffsetCommit has no field for (the epoch is exact, the topic's
id) in the commit metadata, when the application gave none, and a restart reads it back."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.structs import OffsetAndMetadata, TopicPartition

from epochguard.consumer.group import (
    PROVENANCE_PREFIX,
    committed_position,
    provenance_metadata,
)
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.reopened import UndecidedTransaction

from .conftest import make_consumer, read

pytestmark = pytest.mark.timeout(60)

TOPIC_ID = "5f2d3c1a-9b8e-4f70-a1b2-c3d4e5f60718"


def test_exact_position_round_trips() -> None:
    pos = EpochOffset(10, 3, topic_id=TOPIC_ID, epoch_exact=True)
    metadata = provenance_metadata(pos, "")
    assert metadata.startswith(PROVENANCE_PREFIX)
    back, app_metadata = committed_position(10, 3, metadata)
    assert app_metadata == ""
    assert back == pos and back.epoch_exact and back.topic_id == TOPIC_ID


def test_undecided_transactions_round_trip() -> None:
    """Under read_committed, the transactions read below the position without their marker
    go to the partition's next reader with the commit."""
    txns = (UndecidedTransaction(7, 0, 4, 8, True), UndecidedTransaction(9, 2, 6, 9, False, False))
    pos = EpochOffset(10, 3, undecided_transactions=txns)
    metadata = provenance_metadata(pos, "")
    back, app_metadata = committed_position(10, 3, metadata)
    assert app_metadata == "" and back == pos
    assert back.undecided_transactions == txns and not back.epoch_exact
    assert len(provenance_metadata(EpochOffset(10, 3, undecided_transactions=txns * 8), "")) < 4096
    # The application's own metadata wins: no room for them.
    assert provenance_metadata(pos, "mine") == "mine"
    # Corrupt: the whole provenance is not ours to read.
    bad = metadata.replace("[7,0,4,8,1,1]", "[7,0,9,8,1,1]")
    assert committed_position(10, 3, bad) == (EpochOffset(10, 3), bad)


def test_inexact_position_without_topic_id_writes_nothing() -> None:
    assert provenance_metadata(EpochOffset(10, 3), "") == ""
    back, app_metadata = committed_position(10, 3, "")
    assert not back.epoch_exact and back.topic_id is None and app_metadata == ""


def test_an_epoch_exact_flag_without_an_epoch_is_not_kept() -> None:
    back, _ = committed_position(10, None, PROVENANCE_PREFIX + '{"epoch_exact":true}')
    assert not back.epoch_exact


@pytest.mark.parametrize(
    "metadata",
    ["the application's own", PROVENANCE_PREFIX + "{not json", PROVENANCE_PREFIX + "[1, 2]"],
)
def test_other_metadata_is_the_applications(metadata: str) -> None:
    pos = EpochOffset(10, 3, epoch_exact=True)
    if not metadata.startswith(PROVENANCE_PREFIX):
        assert provenance_metadata(pos, metadata) == metadata
    back, app_metadata = committed_position(10, 3, metadata)
    assert app_metadata == metadata
    assert not back.epoch_exact and back.topic_id is None


def test_a_consumer_commits_and_restores_its_provenance(cluster: Any) -> None:
    cluster.create_topic("prov", partitions=1, replication_factor=1)
    cluster.append("prov", 0, [b"a", b"b", b"c"])
    tp = TopicPartition("prov", 0)
    with make_consumer(cluster, group_id="g-prov") as c:
        c.assign([tp])
        assert len(read(c, 3)) == 3
        c.commit()
        stored = c.committed_with_epoch(tp)
        assert stored is not None and stored.offset == 3
        assert stored.epoch_exact and stored.topic_id == cluster.topic_id("prov")
        # The application sees no metadata of ours.
        meta = c.committed(tp, metadata=True)
        assert meta is not None and meta.metadata == ""
        # Its own metadata is kept as given, and then there is no provenance.
        c.commit({tp: OffsetAndMetadata(2, "mine", 0)})
        meta = c.committed(tp, metadata=True)
        assert meta is not None and (meta.offset, meta.metadata) == (2, "mine")
        restored = c.committed_with_epoch(tp)
        assert restored is not None and not restored.epoch_exact
        c.commit()
    # Other clients see the metadata string itself.
    other = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id="g-prov")
    try:
        raw = other.committed(tp, metadata=True)
    finally:
        other.close()
    assert raw is not None and raw.offset == 3
    assert raw.metadata.startswith(PROVENANCE_PREFIX) and cluster.topic_id("prov") in raw.metadata
    # A restart restores the exact position: the first records come from where it left.
    cluster.append("prov", 0, [b"d"])
    with make_consumer(cluster, group_id="g-prov") as c:
        c.assign([tp])
        assert [r.value for r in read(c, 1)] == [b"d"]
