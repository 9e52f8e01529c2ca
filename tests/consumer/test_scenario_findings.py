"""Bugs the scenario suite (tests/scenarios/test_epoch_consumer.py) found, pinned down on the
EmbeddedCluster with the consumer's default metadata age."""

from __future__ import annotations

import time

import kafka.errors as kerrors
import pytest
from kafka.structs import TopicPartition

import epochguard
from epochguard.consumer import LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, make_consumer, read, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)


def test_topic_recreated_while_polling_is_seen_without_waiting_for_metadata_max_age(
    cluster,
) -> None:
    """A fetch answered UNKNOWN_TOPIC holds the topic's fetches until fresh metadata shows it
    again; that metadata must be asked for, not left to ``metadata_max_age_ms`` (5 min)."""
    tp = TopicPartition("re", 0)
    cluster.create_topic("re", replication_factor=2)
    cluster.append("re", 0, [b"old-%d" % i for i in range(5)])
    with make_consumer(
        cluster, metadata_max_age_ms=300_000, on_truncation="rewind", allow_auto_create_topics=False
    ) as c:
        c.assign([tp])
        assert len(read(c, 5)) == 5
        cluster.delete_topic("re")
        assert read(c, 1, timeout=0.5) == []  # the fetch meets the missing topic
        cluster.create_topic("re", replication_factor=2)
        cluster.append("re", 0, [b"new-%d" % i for i in range(8)])
        got = read(c, 8, timeout=5)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]
        [rep] = c.truncation_reports()
        assert rep.detected_by is DetectedBy.TOPIC_RECREATED
        assert (rep.divergence, rep.lost_count) == (EpochOffset(0, None), 5)


def test_out_of_range_without_reset_policy_is_kafkas_error(cluster) -> None:
    """kafka-python code catches ``kafka.errors.OffsetOutOfRangeError`` (the migration guide):
    what poll() and position() raise must be one, and still epochguard's."""
    setup_topic(cluster, kept=3)
    with make_consumer(cluster, auto_offset_reset="none") as c:
        c.assign([TP0])
        c.seek(TP0, 10)  # past the log end, no epoch: out of range, nothing to validate
        with pytest.raises(kerrors.OffsetOutOfRangeError) as info:
            read(c, 1, timeout=5)
        assert isinstance(info.value, epochguard.OffsetOutOfRangeError)
        assert not isinstance(info.value, LogTruncationError)
        assert (info.value.tp, info.value.offset) == (TP0, 10)
        with pytest.raises(kerrors.OffsetOutOfRangeError):
            c.position(TP0, timeout_ms=500)


def test_no_committed_offset_without_reset_policy_is_kafkas_error(cluster) -> None:
    setup_topic(cluster, kept=3)
    with make_consumer(cluster, auto_offset_reset="none", group_id="g-none") as c:
        c.assign([TP0])
        with pytest.raises(kerrors.NoOffsetForPartitionError) as info:
            read(c, 1, timeout=5)
        assert isinstance(info.value, epochguard.NoOffsetForPartitionError)
        assert info.value.tp == TP0


def test_position_of_a_truncated_partition_raises_the_consumers_log_truncation_error(
    cluster,
) -> None:
    with make_consumer(cluster, on_truncation="raise") as c:
        old, new = setup_topic(cluster)
        c.assign([TP0])
        assert len(read(c, 10)) == 10
        cluster.stop_broker(new)
        cluster.append("t", 0, [b"lost-%d" % i for i in range(3)])
        assert len(read(c, 3)) == 3
        unclean_elect(cluster, old, new, fresh=2)
        with pytest.raises(LogTruncationError):
            read(c, 1, timeout=10)
        with pytest.raises(LogTruncationError) as info:
            c.position(TP0, timeout_ms=500)
        assert isinstance(info.value, kerrors.OffsetOutOfRangeError)
        assert info.value.truncation_offsets() == {TP0: EpochOffset(10, 0)}


def test_topic_recreated_while_not_polling_is_not_read_as_the_old_log() -> None:
    """Deleted and re-created under the same name, same leader, refilled past the position,
    while the application was not polling: a by-name fetch (v12) at 5 returned new-5..new-7
    as if they followed old-4. Fetch v13 names the topic by id: UNKNOWN_TOPIC_ID, metadata,
    one ``topic_recreated`` report."""
    tp = TopicPartition("re", 0)
    with EmbeddedCluster(brokers=1) as cluster:  # one broker: the same leader, surely
        cluster.create_topic("re")
        cluster.append("re", 0, [b"old-%d" % i for i in range(5)])
        with make_consumer(
            cluster,
            metadata_max_age_ms=300_000,
            on_truncation="rewind",
            allow_auto_create_topics=False,
        ) as c:
            c.assign([tp])
            assert len(read(c, 5)) == 5
            assert read(c, 1, timeout=0.5) == []  # idle: metadata and fetches settle
            time.sleep(0.3)  # the last long-poll fetch comes back empty; no poll after it
            cluster.delete_topic("re")
            cluster.create_topic("re")
            cluster.append("re", 0, [b"new-%d" % i for i in range(8)])
            got = read(c, 8, timeout=5)
            assert [(r.offset, r.value) for r in got] == [(i, b"new-%d" % i) for i in range(8)]
            [rep] = c.truncation_reports()
            assert rep.detected_by is DetectedBy.TOPIC_RECREATED
            assert (rep.divergence, rep.lost_count) == (EpochOffset(0, None), 5)
