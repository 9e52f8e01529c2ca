"""The driver side without Spark: the stream reader's offsets, limits and validation.

Spark calls these methods on one long-lived reader; calling them directly stages what
happens between two batches (or while the query is stopped) deterministically.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kafka.structs import TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from epochguard.consumer import EpochConsumer
from epochguard.offsets import EpochOffset
from epochguard.spark_connector import datasource, executor
from epochguard.spark_connector.errors import (
    OffsetsJsonError,
    SourceOptionError,
    SparkLogTruncationError,
    SparkMissingTopicError,
)
from epochguard.spark_connector.options import parse_options
from epochguard.testing import EmbeddedCluster
from epochguard.testing.helpers import recreate_topic, stage_unreplicated_tail, unclean_refill


def reader(cluster: EmbeddedCluster, **extra: str) -> datasource._StreamReader:
    opts = parse_options(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": "t",
            "startingOffsets": "earliest",
            "kafka.metadata.max.age.ms": "300",
            "kafka.retry.backoff.ms": "20",
            **extra,
        },
        streaming=True,
    )
    return datasource._StreamReader(opts)


def offsets(off: dict[str, Any]) -> dict[int, tuple[int, int | None]]:
    return {int(p): (v["offset"], v["leader_epoch"]) for p, v in off["t"].items()}


def test_max_offsets_per_trigger_plans_positions_with_epochs(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"x"] * 30)
    cluster.append("t", 1, [b"y"] * 10)
    r = reader(cluster, maxOffsetsPerTrigger="8")
    try:
        start = r.initialOffset()
        assert offsets(start) == {0: (0, None), 1: (0, None)}
        assert isinstance(r.getDefaultReadLimit(), ReadMaxRows)
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert offsets(end) == {0: (6, 0), 1: (2, 0)}  # 8 shared 30:10
        assert offsets(r.reportLatestOffset() or {}) == {0: (30, 0), 1: (10, 0)}
        parts = r.partitions(start, end)
        planned = [
            (p.partition, EpochOffset.from_json(p.start), EpochOffset.from_json(p.end))
            for p in parts
        ]
        assert planned == [
            (0, EpochOffset(0), EpochOffset(6, 0)),
            (1, EpochOffset(0), EpochOffset(2, 0)),
        ]
        rest = r.latestOffset(end, ReadAllAvailable())
        assert offsets(rest) == {0: (30, 0), 1: (10, 0)}
    finally:
        r.stop()


def test_truncation_while_stopped_fails_latest_offset(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=2)
    old = cluster.leader("t", 0)
    assert old is not None
    new = next(b for b in cluster.replicas("t", 0) if b != old)
    cluster.append("t", 0, [b"kept"] * 10, batch_size=1)
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"lost"] * 5, batch_size=1)
    r = reader(cluster)
    first = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    r.stop()
    assert offsets(first) == {0: (15, 0)}
    cluster.stop_broker(old)
    cluster.start_broker(new)
    cluster.elect_leader("t", 0, new, unclean=True)
    cluster.append("t", 0, [b"new"] * 8, batch_size=1)  # refilled past the checkpoint
    cluster.start_broker(old)
    restarted = reader(cluster)  # a new run of the query: only the checkpoint survives
    try:
        with pytest.raises(SparkLogTruncationError) as info:
            restarted.latestOffset(first, ReadAllAvailable())
    finally:
        restarted.stop()
    message = str(info.value)
    assert message.startswith("KAFKA_LOG_TRUNCATION: topic t partition 0 (t-0)")
    assert "lost range [10, 15) (5 records)" in message
    assert "on the driver" in message


def test_recreated_topic_is_a_truncation(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"old"] * 6)
    r = reader(cluster)
    checkpoint = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    r.stop()
    recreate_topic(cluster, "t", replication_factor=1)
    cluster.append("t", 0, [b"new"] * 9)  # past the checkpointed offset 6
    again = reader(cluster)
    try:
        with pytest.raises(SparkLogTruncationError) as info:
            again.latestOffset(checkpoint, ReadAllAvailable())
    finally:
        again.stop()
    assert "KAFKA_LOG_TRUNCATION: topic t partition 0" in str(info.value)


def test_checkpoint_of_other_topics_is_refused(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    r = reader(cluster)
    try:
        with pytest.raises(OffsetsJsonError) as info:
            r.latestOffset({"other": {"0": {"offset": 3, "leader_epoch": 0}}}, ReadAllAvailable())
        assert "topics ['other']" in str(info.value)
        with pytest.raises(OffsetsJsonError, match="t-0: offset -4 is negative"):
            r.partitions({"t": {"0": -4}}, {"t": {"0": 5}})
    finally:
        r.stop()


def test_min_offsets_per_trigger_holds_a_small_batch_back(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    try:
        start = r.initialOffset()
        first = r.latestOffset(start, r.getDefaultReadLimit())
        assert offsets(first) == {0: (3, 0)}  # the first batch is never held back
        cluster.append("t", 0, [b"x"] * 4)
        held = r.latestOffset(first, r.getDefaultReadLimit())
        assert held == first  # 4 < 5 waiting, an hour not passed: no batch
        cluster.append("t", 0, [b"x"])
        assert offsets(r.latestOffset(first, r.getDefaultReadLimit())) == {0: (8, 0)}
    finally:
        r.stop()


def test_available_now_reads_its_snapshot_whatever_min_offsets_says(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    try:
        start = r.initialOffset()
        first = r.latestOffset(start, r.getDefaultReadLimit())  # sets the last trigger time
        cluster.append("t", 0, [b"x"] * 2)
        r.prepareForTriggerAvailableNow()
        cluster.append("t", 0, [b"x"] * 4)  # after the snapshot: not for this run
        end = r.latestOffset(first, r.getDefaultReadLimit())
        assert offsets(end) == {0: (5, 0)}  # 2 < 5 waiting, but availableNow must finish
    finally:
        r.stop()


def test_commit_to_group_commits_end_positions_with_epochs(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"x"] * 7)
    leader = cluster.leader("t", 1)
    assert leader is not None
    cluster.elect_leader("t", 1, leader)  # partition 1 in epoch 1
    cluster.append("t", 1, [b"y"] * 3)
    r = reader(cluster, commitToGroup="true", **{"kafka.group.id": "spark-lag"})
    try:
        end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        r.commit(end)
    finally:
        r.stop()
    check = EpochConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id="spark-lag")
    try:
        committed = {p: check.committed_with_epoch(TopicPartition("t", p)) for p in (0, 1)}
    finally:
        check.close(autocommit=False)
    assert committed == {0: EpochOffset(7, 0), 1: EpochOffset(3, 1)}


def stage_truncation(cluster: EmbeddedCluster) -> tuple[int, int]:
    """10 records replicated, 5 more (offsets 10..14, epoch 0) on the leader only."""
    return stage_unreplicated_tail(cluster, "t")


def elect_and_refill(cluster: EmbeddedCluster, old: int, new: int, fresh: int) -> None:
    unclean_refill(cluster, "t", old, new, [b"new-%d" % i for i in range(fresh)])


def read_values(r: datasource._StreamReader, start: Any, end: Any) -> list[tuple[int, bytes, int]]:
    out: list[tuple[int, bytes, int]] = []
    for part in r.partitions(start, end):
        for batch in executor.read_range(r.opts, part.range()):
            d = batch.to_pydict()
            out += zip(d["offset"], d["value"], d["leaderEpoch"], strict=True)
    return out


@pytest.mark.usefixtures("empty_pool")
def test_rewind_after_truncation_while_stopped_reads_the_new_records(
    cluster: EmbeddedCluster,
) -> None:
    old, new = stage_truncation(cluster)
    r = reader(cluster, onTruncation="rewind")
    start = r.initialOffset()
    first = r.latestOffset(start, ReadAllAvailable())
    assert len(read_values(r, start, first)) == 15  # kept-0..9, lost-0..4
    r.stop()
    elect_and_refill(cluster, old, new, fresh=8)  # new-0..7 at offsets 10..17
    restarted = reader(cluster, onTruncation="rewind")
    try:
        end = restarted.latestOffset(first, ReadAllAvailable())
        epoch = cluster.leader_epoch("t", 0)
        assert epoch > 0
        assert offsets(end) == {0: (18, epoch)}
        got = read_values(restarted, first, end)
    finally:
        restarted.stop()
    # The surviving log was read before; the batch after the rewind adds the new records.
    assert got == [(10 + i, b"new-%d" % i, epoch) for i in range(8)]


@pytest.mark.usefixtures("empty_pool")
def test_rewind_on_a_replay_shrinks_the_batch_to_what_survived(cluster: EmbeddedCluster) -> None:
    old, new = stage_truncation(cluster)
    r = reader(cluster, onTruncation="rewind")
    start = r.initialOffset()
    planned = r.latestOffset(start, ReadAllAvailable())  # [0, 15) journaled, never read
    r.stop()
    elect_and_refill(cluster, old, new, fresh=8)
    replay = reader(cluster, onTruncation="rewind")  # Spark calls partitions() alone
    try:
        got = read_values(replay, start, planned)
        assert got == [(i, b"kept-%d" % i, 0) for i in range(10)]
        end = replay.latestOffset(planned, ReadAllAvailable())
        got = read_values(replay, planned, end)
    finally:
        replay.stop()
    epoch = cluster.leader_epoch("t", 0)
    assert got == [(10 + i, b"new-%d" % i, epoch) for i in range(8)]


def timestamped(cluster: EmbeddedCluster) -> None:
    """Offsets 0..4 at t=1000, 5..9 at t=2000, 10..14 at t=3000."""
    cluster.create_topic("t", replication_factor=1)
    for i, ts in enumerate((1000, 2000, 3000)):
        cluster.append("t", 0, [b"%d" % (5 * i + j) for j in range(5)], timestamp_ms=ts)


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("startingTimestamp", "2000", (5, 0)),
        ("startingTimestamp", "1", (0, None)),
        ("startingOffsetsByTimestamp", '{"t": {"0": 2500}}', (10, 0)),
    ],
)
def test_starting_by_timestamp(
    cluster: EmbeddedCluster, option: str, value: str, expected: tuple[int, int | None]
) -> None:
    timestamped(cluster)
    opts = parse_options(
        {"kafka.bootstrap.servers": cluster.bootstrap_servers, "subscribe": "t", option: value},
        streaming=True,
    )
    r = datasource._StreamReader(opts)
    try:
        assert offsets(r.initialOffset()) == {0: expected}
    finally:
        r.stop()


def test_starting_timestamp_after_every_record(cluster: EmbeddedCluster) -> None:
    timestamped(cluster)
    base = {"kafka.bootstrap.servers": cluster.bootstrap_servers, "subscribe": "t"}
    r = datasource._StreamReader(
        parse_options({**base, "startingTimestamp": "9999"}, streaming=True)
    )
    try:
        with pytest.raises(SourceOptionError) as info:
            r.initialOffset()
        assert info.value.option == "startingTimestamp"
        assert "t-0@9999" in str(info.value)
    finally:
        r.stop()
    latest = {**base, "startingTimestamp": "9999", "startingOffsetsByTimestampStrategy": "latest"}
    r = datasource._StreamReader(parse_options(latest, streaming=True))
    try:
        assert offsets(r.initialOffset()) == {0: (15, 0)}
    finally:
        r.stop()
    missing = {**base, "startingOffsetsByTimestamp": '{"t": {"1": 5}}'}
    r = datasource._StreamReader(parse_options(missing, streaming=True))
    try:
        with pytest.raises(SourceOptionError) as info:
            r.initialOffset()
        assert info.value.option == "startingOffsetsByTimestamp"
        assert "gives no timestamp for partitions t-0" in str(info.value)
    finally:
        r.stop()


def test_batch_ending_timestamp(cluster: EmbeddedCluster) -> None:
    timestamped(cluster)
    opts = parse_options(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": "t",
            "startingTimestamp": "2000",
            "endingTimestamp": "2500",
        },
        streaming=False,
    )
    (part,) = datasource._BatchReader(opts).partitions()
    assert (part.range().start.offset, part.range().end.offset) == (5, 10)
    ends_after_all = parse_options(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "subscribe": "t",
            "endingTimestamp": "9999",
        },
        streaming=False,
    )
    (part,) = datasource._BatchReader(ends_after_all).partitions()
    assert (part.range().start.offset, part.range().end.offset) == (0, 15)


def test_batch_ending_offset_past_the_log_end_is_refused(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 4)
    base = {"kafka.bootstrap.servers": cluster.bootstrap_servers, "subscribe": "t"}
    within = parse_options({**base, "endingOffsets": '{"t": {"0": 3}}'}, streaming=False)
    (part,) = datasource._BatchReader(within).partitions()
    assert part.range().end == EpochOffset(3, 0)  # the latest epoch bounds the given end
    past = parse_options({**base, "endingOffsets": '{"t": {"0": 9}}'}, streaming=False)
    with pytest.raises(SourceOptionError) as info:
        datasource._BatchReader(past).partitions()
    assert info.value.option == "endingOffsets"
    assert "ending offset 9 of t-0 is past the end of its log (4)" in str(info.value)


def test_subscribe_pattern_picks_up_topics_created_while_running(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("p-1", replication_factor=1)
    cluster.append("p-1", 0, [b"x"] * 3)
    opts = parse_options(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "subscribePattern": "p-[0-9]+",
            "startingOffsets": "earliest",
            "kafka.metadata.max.age.ms": "300",
            "kafka.retry.backoff.ms": "20",
        },
        streaming=True,
    )
    r = datasource._StreamReader(opts)
    try:
        start = r.initialOffset()
        assert set(start) == {"p-1"}
        cluster.create_topic("p-2", replication_factor=1)
        cluster.create_topic("other", replication_factor=1)
        cluster.append("p-2", 0, [b"y"] * 5)
        time.sleep(0.05)  # past retry.backoff.ms: the next listing asks the brokers again
        end = r.latestOffset(start, ReadAllAvailable())
        assert {t: {p: v["offset"] for p, v in parts.items()} for t, parts in end.items()} == {
            "p-1": {"0": 3},
            "p-2": {"0": 5},
        }
        # The new topic is read from its beginning.
        ranges = sorted(
            (p.topic, p.range().start.offset, p.range().end.offset)
            for p in r.partitions(start, end)
        )
        assert ranges == [("p-1", 0, 3), ("p-2", 0, 5)]
    finally:
        r.stop()


@pytest.mark.usefixtures("empty_pool")
def test_a_truncation_between_the_start_check_and_the_end_lookup_is_named(
    cluster: EmbeddedCluster,
) -> None:
    """latestOffset checked the start (15@e0) before an unclean election and read the log end
    (12) after it: the batch's end lies before its start. That is a truncation, not data
    lost to retention."""
    old, new = stage_truncation(cluster)
    r = reader(cluster)
    try:
        start = r.initialOffset()
        first = r.latestOffset(start, ReadAllAvailable())
        assert offsets(first) == {0: (15, 0)}
        elect_and_refill(cluster, old, new, fresh=2)  # the log now ends at 12
        raced = copy.deepcopy(first)
        raced["t"]["0"]["offset"] = 12
        raced["t"]["0"]["leader_epoch"] = cluster.leader_epoch("t", 0)
        with pytest.raises(SparkLogTruncationError, match=r"^KAFKA_LOG_TRUNCATION: topic t"):
            r.partitions(first, raced)
    finally:
        r.stop()


def test_the_driver_sends_no_fetch_that_would_hold_up_its_lookups(cluster: EmbeddedCluster) -> None:
    # A Fetch long-polling at the log end delays the next request on its connection by
    # fetch.max.wait.ms: the driver's partitions stay paused, so it never sends one.
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"x"] * 5)
    r = reader(cluster, **{"kafka.fetch.max.wait.ms": "5000"})
    try:
        start = r.initialOffset()
        r.prepareForTriggerAvailableNow()
        end = r.latestOffset(start, ReadAllAvailable())
        r.partitions(start, end)
        assert offsets(end) == {0: (5, 0), 1: (0, None)}
        assert r.driver.consumer.metrics(raw=True)["fetch_requests"] == 0
    finally:
        r.stop()


def test_the_initial_offset_is_resolved_once_per_query(cluster: EmbeddedCluster) -> None:
    # Spark asks for it twice for the first batch (its plan, then its start): with
    # "latest", two lookups around new records would start the batch past its plan.
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, startingOffsets="latest")
    try:
        first = r.initialOffset()
        cluster.append("t", 0, [b"y"] * 4)
        assert r.initialOffset() == first
        assert offsets(first) == {0: (3, 0)}
    finally:
        r.stop()
    again = reader(cluster, startingOffsets="latest")
    try:
        assert offsets(again.initialOffset()) == {0: (7, 0)}  # a new query looks again
    finally:
        again.stop()


def test_initial_offsets_path_keeps_a_latest_start_across_restarts(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    # A restart before the first commit asks a new reader for its initial offset again.
    cluster.create_topic("t", partitions=2, replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    path = tmp_path / "checkpoint" / "epochguard-initial-offsets.json"
    first = reader(cluster, startingOffsets="latest", initialOffsetsPath=str(path))
    try:
        resolved = first.initialOffset()
    finally:
        first.stop()
    assert offsets(resolved) == {0: (3, 0), 1: (0, None)}
    assert path.is_file() and not list(path.parent.glob("*.tmp"))
    cluster.append("t", 0, [b"y"] * 4)
    cluster.append("t", 1, [b"z"] * 2)
    # Other starting options too: the stored offsets win, as a checkpoint's do.
    restarted = reader(cluster, startingOffsets="earliest", initialOffsetsPath=str(path))
    try:
        assert restarted.initialOffset() == resolved
        end = restarted.latestOffset(resolved, ReadAllAvailable())
        parts = restarted.partitions(resolved, end)
        ranges = [
            (p.partition, EpochOffset.from_json(p.start), EpochOffset.from_json(p.end))
            for p in parts
        ]
        assert sorted((p, s.offset, e.offset) for p, s, e in ranges) == [(0, 3, 7), (1, 0, 2)]
    finally:
        restarted.stop()
    without = reader(cluster, startingOffsets="latest")
    try:
        again = without.initialOffset()
        assert offsets(again) == {0: (7, 0), 1: (2, 0)}  # the limit
        # A replay of the first batch (planned to end where the first start was) from
        # there cannot be: the error names the option, not retention.
        with pytest.raises(
            SourceOptionError, match=r"initialOffsetsPath.*t-0 at 7 \(planned end 3\)"
        ):
            without.partitions(again, resolved)
    finally:
        without.stop()


def test_initial_offsets_path_of_another_query_or_corrupt_is_refused(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    cluster.create_topic("t", replication_factor=1)
    cluster.create_topic("u", replication_factor=1)
    path = tmp_path / "initial.json"
    other = reader(cluster, subscribe="u", initialOffsetsPath=str(path))
    try:
        other.initialOffset()
    finally:
        other.stop()
    mine = reader(cluster, initialOffsetsPath=str(path))
    with pytest.raises(OffsetsJsonError, match=r"initial offsets in .*initial.json.*\['u'\]"):
        mine.initialOffset()
    path.write_text('{"t": {"0": 5}}')
    with pytest.raises(OffsetsJsonError, match="does not hold initial offsets written by"):
        reader(cluster, initialOffsetsPath=str(path)).initialOffset()
    path.write_text("{")
    with pytest.raises(OffsetsJsonError, match="not valid JSON"):
        reader(cluster, initialOffsetsPath=str(path)).initialOffset()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(SourceOptionError, match=r"initialOffsetsPath.*cannot write"):
        reader(cluster, initialOffsetsPath=str(blocked / "x.json")).initialOffset()


def test_listings_within_the_metadata_backoff_reuse_the_last_one(cluster: EmbeddedCluster) -> None:
    """prepareForTriggerAvailableNow and initialOffset both list the partitions; the second
    listing right after the first waited out the consumer's metadata backoff (93 ms a
    query). Within ``retry.backoff.ms`` the last listing is reused; past it, the brokers
    are asked again and a new partition is found."""
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, **{"kafka.retry.backoff.ms": "1000"})
    try:
        r.prepareForTriggerAvailableNow()
        metrics = r.driver.consumer.metrics(raw=True)
        asked = metrics["metadata_requests"]
        start = r.initialOffset()
        assert r.driver.consumer.metrics(raw=True)["metadata_requests"] == asked
        assert offsets(start) == {0: (0, None)}
    finally:
        r.stop()
    quick = reader(cluster, **{"kafka.retry.backoff.ms": "20"})
    try:
        assert quick.driver.partitions() == [TopicPartition("t", 0)]
        cluster.create_partitions("t", 2)
        time.sleep(0.05)
        assert quick.driver.partitions() == [TopicPartition("t", 0), TopicPartition("t", 1)]
    finally:
        quick.stop()


def test_available_now_resolves_a_latest_start_before_its_snapshot(
    cluster: EmbeddedCluster,
) -> None:
    """Spark calls prepareForTriggerAvailableNow before initialOffset: records arriving
    between the two must not put a ``latest`` start past the snapshot's end (the first
    batch then failed as data lost)."""
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 3)
    r = reader(cluster, startingOffsets="latest")
    try:
        r.prepareForTriggerAvailableNow()
        cluster.append("t", 0, [b"y"] * 4)
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        assert offsets(start) == offsets(end) == {0: (3, 0)}
        assert [p.range().size for p in r.partitions(start, end)] == []
    finally:
        r.stop()


def test_a_missing_topic_warns_at_each_listing_until_it_exists(
    cluster: EmbeddedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.create_topic("t", partitions=1, replication_factor=1)
    r = reader(cluster, subscribe="t,later")
    caplog.set_level(logging.WARNING, logger="epochguard.spark_connector")

    def warned() -> list[str]:
        events = [rec.msg for rec in caplog.records if isinstance(rec.msg, dict)]
        return [str(e["topic"]) for e in events if e.get("event") == "kafka_missing_topic"]

    try:
        start = r.initialOffset()
        assert warned() == ["later"]
        time.sleep(0.05)  # past the listing's reuse window (retry.backoff.ms=20)
        r.latestOffset(start, ReadAllAvailable())
        assert warned() == ["later", "later"]  # again at the next batch
        cluster.create_topic("later", partitions=1, replication_factor=1)
        cluster.append("later", 0, [b"x"])
        deadline = time.monotonic() + 10
        while True:
            time.sleep(0.05)
            end = r.latestOffset(start, ReadAllAvailable())
            if "later" in end:
                break
            assert time.monotonic() < deadline, "the new topic was never listed"
        caplog.clear()
        time.sleep(0.05)
        r.latestOffset(start, ReadAllAvailable())
        assert warned() == []
    finally:
        r.stop()


def test_fail_on_missing_topic_names_it(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1, replication_factor=1)
    r = reader(cluster, subscribe="t,nowhere", failOnMissingTopic="true")
    try:
        with pytest.raises(
            SparkMissingTopicError,
            match="KAFKA_MISSING_TOPIC: subscribed topic nowhere does not exist",
        ):
            r.initialOffset()
    finally:
        r.stop()


def test_invalid_stream_options_fail_at_the_first_call_not_in_stream_reader() -> None:
    # Spark's source runner calls stop() on what streamReader() returned, in a finally
    # around it: streamReader must return, and the first call raise the option's error.
    source = datasource.EpochGuardDataSource(
        {"kafka.bootstrap.servers": "localhost:9", "subscribe": "t", "endingOffsets": "latest"}
    )
    stream_reader = source.streamReader(schema=None)  # type: ignore[arg-type]
    stream_reader.stop()
    with pytest.raises(SourceOptionError, match="ending offset not valid in streaming"):
        stream_reader.initialOffset()
    copy.deepcopy(stream_reader)  # picklable, as Spark sends it to the planner
    # An error in every kind of query is raised by schema(), that is by load().
    bad = datasource.EpochGuardDataSource(
        {"kafka.bootstrap.servers": "localhost:9", "subscribe": "t", "startingOfsets": "x"}
    )
    with pytest.raises(SourceOptionError, match="did you mean 'startingOffsets'"):
        bad.schema()
    # One that concerns streams only waits for the stream reader.
    assert "leaderEpoch" in source.schema()


METADATA, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH = 3, 2, 23


def requests_of(cluster: EmbeddedCluster, api_key: int) -> int:
    return sum(n for (key, _version), n in cluster.requests_seen().items() if key == api_key)


def test_a_batch_in_the_leaders_epoch_is_planned_without_asking_for_its_epoch(
    cluster: EmbeddedCluster,
) -> None:
    """Between two batches under one leader, latestOffset sends one Metadata request (the
    listing) and one ListOffsets: a start in the epoch of the leader that just gave the log
    end is valid without OffsetForLeaderEpoch. After a leader change the start is asked
    about again (and found valid: a clean election loses nothing)."""
    cluster.create_topic("t", replication_factor=2)
    cluster.append("t", 0, [b"x"] * 5)
    r = reader(cluster)
    try:
        first = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        assert offsets(first) == {0: (5, 0)}
        cluster.append("t", 0, [b"y"] * 3)
        time.sleep(0.05)  # past retry.backoff.ms: the next batch lists the partitions again
        before = {k: requests_of(cluster, k) for k in (METADATA, LIST_OFFSETS)}
        validations = requests_of(cluster, OFFSET_FOR_LEADER_EPOCH)
        second = r.latestOffset(first, ReadAllAvailable())
        assert offsets(second) == {0: (8, 0)}
        assert requests_of(cluster, OFFSET_FOR_LEADER_EPOCH) == validations
        assert {k: requests_of(cluster, k) - n for k, n in before.items()} == {
            METADATA: 1,
            LIST_OFFSETS: 1,
        }
        leader = cluster.leader("t", 0)
        other = next(b for b in cluster.replicas("t", 0) if b != leader)
        cluster.elect_leader("t", 0, other)  # clean: the follower has every record
        cluster.append("t", 0, [b"z"] * 2)
        time.sleep(0.05)
        third = r.latestOffset(second, ReadAllAvailable())
        assert offsets(third) == {0: (10, 1)}
        assert requests_of(cluster, OFFSET_FOR_LEADER_EPOCH) > validations
    finally:
        r.stop()


def test_the_log_end_lookup_goes_out_with_the_listing(cluster: EmbeddedCluster) -> None:
    """The partitions of the last listing have their log end asked for before the new
    listing's Metadata answer: one round trip, not two. The Metadata answer is held back
    here; the ListOffsets request is sent meanwhile."""
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 5)
    r = reader(cluster)
    try:
        first = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        time.sleep(0.05)

        def lookups_sent() -> int:
            return int(r.driver.consumer.metrics(raw=True)["list_offsets_requests"])

        sent = lookups_sent()
        cluster.faults.delay_responses(3.0, api_key=METADATA, count=1)
        result: list[Any] = []
        batch = threading.Thread(
            target=lambda: result.append(r.latestOffset(first, ReadAllAvailable()))
        )
        batch.start()
        deadline = time.monotonic() + 2.0
        while lookups_sent() == sent and time.monotonic() < deadline:
            time.sleep(0.01)
        sent_meanwhile = lookups_sent() > sent
        answered_meanwhile = bool(result)
        batch.join(30)
        assert sent_meanwhile, "ListOffsets waited for the Metadata answer"
        assert not answered_meanwhile
        assert offsets(result[0]) == {0: (5, 0)}
    finally:
        cluster.faults.clear()
        r.stop()


def test_a_start_past_the_log_end_is_checked_even_in_the_leaders_epoch(
    cluster: EmbeddedCluster,
) -> None:
    # Only a position at or before the log end of the leader's epoch is valid untested.
    cluster.create_topic("t", replication_factor=1)
    cluster.append("t", 0, [b"x"] * 5)
    r = reader(cluster)
    try:
        end = r.latestOffset(r.initialOffset(), ReadAllAvailable())
        beyond = {"t": {"0": {**end["t"]["0"], "offset": 9}}}  # the topic id, epoch 0
        with pytest.raises(SparkLogTruncationError, match=r"lost range \[5, 9\)"):
            r.latestOffset(beyond, ReadAllAvailable())
    finally:
        r.stop()
