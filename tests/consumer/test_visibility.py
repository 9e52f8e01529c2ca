"""Nothing stalls or fails silently: partitions awaiting a seek are logged and counted,
missing topics and partitions fail fast, subscriptions that match nothing are warned about;
and the smaller kafka-python parity points (futures, metrics, group metadata, ``with``)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.errors import KafkaError, UnknownTopicOrPartitionError
from kafka.serializer import Deserializer
from kafka.structs import ConsumerGroupMetadata, MemberState, OffsetAndMetadata, TopicPartition

from epochguard.consumer import (
    ConsumerConfigError,
    EpochConsumer,
    LogTruncationError,
    NoOffsetForPartitionError,
)
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.stores import SqliteOffsetStore
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, diverge, make_consumer, poll_until, read, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


class _Collect(logging.Handler):
    def __init__(self, into: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            self.into.append({**record.msg, "log_level": record.levelname.lower()})


@contextlib.contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """The library's events as dicts (the stdlib records' ``msg``), with their level."""
    logs: list[dict[str, Any]] = []
    logger = logging.getLogger("epochguard")
    handler = _Collect(logs)
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield logs
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


# ---------------------------------------------------------------------- awaiting a seek


def test_a_partition_stopped_by_a_truncation_is_logged_every_interval_until_seek(
    cluster: EmbeddedCluster,
) -> None:
    now = [0.0]
    with make_consumer(
        cluster, on_truncation="raise", awaiting_seek_log_interval_ms=1000
    ) as consumer:
        consumer._engine._clock = lambda: now[0]
        old, new = setup_topic(cluster)
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        diverge(cluster, old, new)
        assert len(read(consumer, 5)) == 5
        unclean_elect(cluster, old, new)
        with pytest.raises(LogTruncationError):
            poll_until(consumer, lambda: False)
        m = consumer.metrics()
        assert m is not None and m["epochguard-metrics"]["partitions-awaiting-seek"] == 1
        warned: list[float] = []
        with capture_logs() as logs:
            for t in (0.0, 0.5, 0.999, 1.0, 1.5, 2.0, 2.0, 3.5):
                now[0] = t
                before = len(_events(logs, "partition_awaiting_seek"))
                assert consumer.poll(timeout_ms=0) == {}
                if len(_events(logs, "partition_awaiting_seek")) > before:
                    warned.append(t)
        assert warned == [1.0, 2.0, 3.5]
        event = _events(logs, "partition_awaiting_seek")[0]
        assert event["log_level"] == "warning"
        assert (event["topic"], event["partition"]) == ("t", 0)
        assert event["divergence_offset"] == 10 and event["state"] == "truncated"
        consumer.seek(TP0, EpochOffset(10, 0))
        with capture_logs() as logs:
            now[0] = 100.0
            got = read(consumer, 8)
        assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]
        assert _events(logs, "partition_awaiting_seek") == []
        raw = consumer.metrics(raw=True)
        assert raw is not None and raw["partitions_awaiting_seek"] == 0


def test_a_partition_without_a_valid_offset_is_logged_until_seek(
    cluster: EmbeddedCluster,
) -> None:
    now = [0.0]
    cluster.create_topic("t", partitions=1)
    cluster.append("t", 0, [b"a"])
    with make_consumer(
        cluster, auto_offset_reset="none", awaiting_seek_log_interval_ms=30000
    ) as consumer:
        consumer._engine._clock = lambda: now[0]
        consumer.assign([TP0])
        with pytest.raises(NoOffsetForPartitionError):
            consumer.poll(timeout_ms=1000)
        with capture_logs() as logs:
            now[0] = 29.9
            consumer.poll(timeout_ms=0)
            assert _events(logs, "partition_awaiting_seek") == []
            now[0] = 30.0
            consumer.poll(timeout_ms=0)
        [event] = _events(logs, "partition_awaiting_seek")
        assert event["state"] == "no_valid_offset" and event["divergence"] is None
        assert "t" in event["error"]
        raw = consumer.metrics(raw=True)
        assert raw is not None and raw["partitions_awaiting_seek"] == 1
        consumer.seek_to_beginning(TP0)
        assert [r.value for r in read(consumer, 1)] == [b"a"]
        raw = consumer.metrics(raw=True)
        assert raw is not None and raw["partitions_awaiting_seek"] == 0


def test_awaiting_seek_interval_is_validated() -> None:
    with pytest.raises(ConsumerConfigError, match="awaiting_seek_log_interval_ms"):
        EpochConsumer(awaiting_seek_log_interval_ms=0)


# ---------------------------------------------------------------------- missing topics


def test_missing_topic_or_partition_fails_fast(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    missing, no_such_partition = TopicPartition("missing", 0), TopicPartition("t", 5)
    # A timeout would raise KafkaTimeoutError after 30 s instead.
    with make_consumer(cluster) as consumer:
        consumer.assign([missing])
        with pytest.raises(UnknownTopicOrPartitionError, match="missing"):
            consumer.position(missing, timeout_ms=30000)
        for lookup in (consumer.end_offsets, consumer.beginning_offsets):
            with pytest.raises(UnknownTopicOrPartitionError, match="missing"):
                lookup([missing], timeout_ms=30000)
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition 5"):
            consumer.end_offsets([no_such_partition], timeout_ms=30000)
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.offsets_for_times({missing: 0}, timeout_ms=30000)
        assert consumer.end_offsets([TopicPartition("t", 0)]) == {TopicPartition("t", 0): 0}
    reference = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers)
    try:
        reference.assign([missing])
        with pytest.raises(UnknownTopicOrPartitionError):
            reference.position(missing, timeout_ms=30000)
    finally:
        reference.close()


def test_a_topic_created_after_a_failed_lookup_is_found(cluster: EmbeddedCluster) -> None:
    with make_consumer(cluster) as consumer:
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.end_offsets([TopicPartition("later", 0)])
        cluster.create_topic("later", partitions=1)
        cluster.append("later", 0, [b"x"])
        assert consumer.end_offsets([TopicPartition("later", 0)]) == {TopicPartition("later", 0): 1}


@pytest.mark.parametrize(
    ("subscribe", "event", "key"),
    [
        ({"topics": ["nope"]}, "subscribed_topic_missing", ("topic", "nope")),
        ({"pattern": "^zzz-"}, "subscription_matches_nothing", ("pattern", "^zzz-")),
    ],
)
def test_a_subscription_that_matches_nothing_is_warned_about_once(
    cluster: EmbeddedCluster, subscribe: dict[str, Any], event: str, key: tuple[str, str]
) -> None:
    cluster.create_topic("t", partitions=1)
    with make_consumer(cluster, group_id="g") as consumer, capture_logs() as logs:
        consumer.subscribe(**subscribe)
        poll_until(consumer, lambda: bool(_events(logs, event)))
        for _ in range(5):
            consumer.poll(timeout_ms=50)
    [warning] = _events(logs, event)
    assert warning["log_level"] == "warning" and warning[key[0]] == key[1]


# ---------------------------------------------------------------------- smaller parity points


def test_commit_async_future_runs_kafka_style_callbacks(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    cluster.append("t", 0, [b"a", b"b"])
    with make_consumer(cluster, group_id="g") as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 2)) == 2
        done = threading.Event()
        values: list[Any] = []
        future = consumer.commit_async()
        future.add_callback(lambda v: (values.append(v), done.set()))
        future.add_errback(lambda e: (values.append(e), done.set()))
        assert done.wait(10)
        assert values == [None] and future.succeeded() and not future.failed()
        assert consumer.committed(TP0, metadata=True) == OffsetAndMetadata(2, "", 0)


def test_committed_through_an_offset_store(cluster: EmbeddedCluster, tmp_path: Any) -> None:
    cluster.create_topic("t", partitions=1)
    cluster.append("t", 0, [b"a", b"b", b"c"])
    store = SqliteOffsetStore(tmp_path / "o.db", "app")
    with make_consumer(cluster, offset_store=store) as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 3)) == 3
        assert consumer.committed(TP0) is None
        consumer.commit()
        assert consumer.committed(TP0) == 3
        assert consumer.committed(TP0, metadata=True) == OffsetAndMetadata(3, "", 0)
        assert consumer.committed_with_epoch(TP0) == EpochOffset(3, 0)
        with pytest.raises(TypeError):
            consumer.committed("t-0")  # type: ignore[arg-type]


def test_leaving_a_with_block_by_an_exception_does_not_commit(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    cluster.append("t", 0, [b"a", b"b"])
    with (
        pytest.raises(RuntimeError),
        make_consumer(
            cluster, group_id="g", enable_auto_commit=True, auto_commit_interval_ms=60000
        ) as consumer,
    ):
        consumer.assign([TP0])
        assert len(read(consumer, 2)) == 2
        raise RuntimeError("processing failed")
    with make_consumer(cluster, group_id="g", enable_auto_commit=True) as consumer:
        assert consumer.committed(TP0) is None
        consumer.assign([TP0])
        assert len(read(consumer, 2)) == 2
    with make_consumer(cluster, group_id="g") as consumer:
        assert consumer.committed(TP0) == 2


def test_metrics_shape_and_metrics_enabled(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    cluster.append("t", 0, [b"a", b"b"])
    with make_consumer(cluster) as consumer:
        consumer.assign([TP0])
        assert len(read(consumer, 2)) == 2
        m = consumer.metrics()
        assert m is not None
        assert m["consumer-fetch-manager-metrics"]["records-consumed-total"] == 2
        assert m["consumer-coordinator-metrics"]["assigned-partitions"] == 1
        assert m["epochguard-metrics"]["truncations-detected"] == 0
        assert consumer.highwater(TP0) == 2
    with make_consumer(cluster, metrics_enabled=False) as consumer:
        assert consumer.metrics() is None


def test_group_metadata(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    with make_consumer(cluster) as consumer:
        assert consumer.group_metadata() == ConsumerGroupMetadata(group_id=None)
    with make_consumer(cluster, group_id="gm", heartbeat_interval_ms=200) as consumer:
        assert consumer.group_metadata().state == MemberState.UNJOINED
        consumer.subscribe(["t"])
        poll_until(consumer, lambda: bool(consumer.assignment()))
        meta = consumer.group_metadata()
        assert meta.group_id == "gm" and meta.state == MemberState.STABLE
        assert meta.generation_id >= 1 and meta.member_id


def test_cooperative_only_assignors_are_refused() -> None:
    with pytest.raises(ConsumerConfigError, match="cooperative"):
        EpochConsumer(partition_assignment_strategy=[CooperativeStickyAssignor])


def test_poll_argument_errors_match_kafka_python(cluster: EmbeddedCluster) -> None:
    with make_consumer(cluster) as consumer:
        with pytest.raises(ValueError):
            consumer.poll(timeout_ms=-1)
        with pytest.raises(TypeError):
            consumer.poll(max_records="5")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            consumer.seek_to_end()  # nothing assigned
        with pytest.raises(TypeError):
            consumer.highwater("t")  # type: ignore[arg-type]
    with pytest.raises(KafkaError):
        consumer.poll()


class _ClosableDeserializer(Deserializer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.closed = False

    def deserialize(self, topic: str, headers: Any, data: bytes | None) -> bytes | None:
        return data

    def close(self) -> None:
        self.closed = True


def test_argument_errors_and_close_match_kafka_python(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    calls: list[tuple[str, Any]] = [
        ("subscribe()", lambda c: c.subscribe()),
        ("subscribe(topics, pattern)", lambda c: c.subscribe(["t"], pattern="^t")),
        ("subscribe([''])", lambda c: c.subscribe([""])),
        ("subscribe(['a b'])", lambda c: c.subscribe(["a b"])),
        ("subscribe([None])", lambda c: c.subscribe([None])),
        ("subscribe(listener=object())", lambda c: c.subscribe(["t"], listener=object())),
        ("poll(timeout_ms=-1)", lambda c: c.poll(timeout_ms=-1)),
        ("poll(max_records='5')", lambda c: c.poll(max_records="5")),
        ("poll(max_records=0)", lambda c: c.poll(max_records=0)),
        ("seek_to_end() unassigned", lambda c: c.seek_to_end()),
        ("seek(other, 1)", lambda c: c.seek(TopicPartition("t", 3), 1)),
        ("seek(str, 1)", lambda c: c.seek("t", 1)),
        ("position(str)", lambda c: c.position("t")),
        ("highwater(str)", lambda c: c.highwater("t")),
        ("committed(str)", lambda c: c.committed("t")),
    ]
    outcomes: dict[str, list[Any]] = {}
    deserializers = []
    for cls in (KafkaConsumer, EpochConsumer):
        des = _ClosableDeserializer()
        deserializers.append(des)
        consumer = cls(
            bootstrap_servers=cluster.bootstrap_servers,
            group_id="args",
            value_deserializer=des,
            request_timeout_ms=5000,
        )
        try:
            for name, call in calls:
                try:
                    call(consumer)
                except Exception as exc:
                    outcomes.setdefault(name, []).append(exc)
                else:
                    outcomes.setdefault(name, []).append(None)
        finally:
            consumer.close()
        with pytest.raises(KafkaError):  # IllegalStateError in both
            consumer.poll()
    assert all(d.closed for d in deserializers)
    mismatched = {
        name: (type(kafka_exc).__name__, type(ours).__name__)
        for name, (kafka_exc, ours) in outcomes.items()
        if kafka_exc is None or not isinstance(ours, type(kafka_exc))
    }
    assert mismatched == {}


def test_bootstrap_and_empty_assign_as_kafka_python(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=1)
    for cls in (KafkaConsumer, EpochConsumer):
        consumer = cls(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=5000)
        try:
            # kafka-python 3.0's meaning: a bootstrap is in progress (done by now).
            assert consumer.bootstrap_connected() is False, cls
            consumer.bootstrap(timeout_ms=5000, refresh=True)
            assert "t" in consumer.topics()
            consumer.assign([TP0])
            assert consumer.assignment() == {TP0}
            consumer.assign([])  # an empty assignment unsubscribes
            assert consumer.assignment() == set() and consumer.subscription() is None
        finally:
            consumer.close()


def test_subscribe_without_a_group_assigns_every_partition_and_follows_metadata(
    cluster: EmbeddedCluster,
) -> None:
    cluster.create_topic("local-a", partitions=1)
    cluster.append("local-a", 0, [b"a0"])
    with make_consumer(cluster) as consumer:  # no group_id
        consumer.subscribe(pattern="^local-")
        got = read(consumer, 1)
        assert [(r.topic, r.value) for r in got] == [("local-a", b"a0")]
        cluster.create_partitions("local-a", 2)
        cluster.append("local-a", 1, [b"a1"])
        cluster.create_topic("local-b", partitions=1)
        cluster.append("local-b", 0, [b"b0"])
        got = read(consumer, 2)
        assert sorted((r.topic, r.partition, r.value) for r in got) == [
            ("local-a", 1, b"a1"),
            ("local-b", 0, b"b0"),
        ]
        assert consumer.assignment() == {
            TopicPartition("local-a", 0),
            TopicPartition("local-a", 1),
            TopicPartition("local-b", 0),
        }
        consumer.unsubscribe()
        assert consumer.assignment() == set()
