"""KIP-714 client metrics push on real Kafka 4.3.1: an operator's client-metrics subscription
makes EpochConsumer push its metrics, and the brokers' ClientTelemetry receiver (a plugin
compiled from Java, ``TelemetryReceiverPlugin``) records what arrived. The consumer meets a
truncation first (an unclean election, as in ``test_apache_unclean``), so the pushed
``truncations.detected`` and ``records.lost`` count it."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition
from opentelemetry.proto.metrics.v1 import metrics_pb2

from epochguard import EpochConsumer
from epochguard.consumer.telemetry_messages import (
    GetTelemetrySubscriptionsRequest,
    GetTelemetrySubscriptionsResponse,
)
from epochguard.testing import produce, wait_until
from epochguard.testing.apache_kafka import (
    ApacheKafkaCluster,
    KafkaJars,
    TelemetryPush,
    read_telemetry_pushes,
)
from epochguard.testing.apache_kafka.wire import call
from tests.apache_kafka.test_apache_unclean import A, B, drive_unclean_election, new_topic

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

PREFIX = "org.apache.kafka.consumer."
TRUNCATIONS = PREFIX + "epochguard.truncations.detected"
LOST = PREFIX + "epochguard.records.lost"
CONSUMED = PREFIX + "fetch.manager.records.consumed.total"


@pytest.fixture(scope="module")
def telemetry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("telemetry") / "pushes.jsonl"


@pytest.fixture(scope="module")
def cluster(kafka_jars: KafkaJars, telemetry_file: Path) -> Iterator[ApacheKafkaCluster]:
    with ApacheKafkaCluster(brokers=3, jars=kafka_jars, telemetry_file=telemetry_file) as c:
        yield c


def _subscribed_everywhere(cluster: ApacheKafkaCluster) -> bool:
    """Every broker has the subscription (client-metrics configs travel in the metadata log)."""
    for broker in cluster.running_broker_ids:
        host, port = cluster.broker_address(broker).rsplit(":", 1)
        req = GetTelemetrySubscriptionsRequest(client_instance_id=_ZERO)
        resp = call((host, int(port)), req, GetTelemetrySubscriptionsResponse, 0)
        if resp.error_code or PREFIX not in (resp.requested_metrics or []):
            return False
    return True


_ZERO = uuid.UUID(int=0)


def _metrics(push: TelemetryPush) -> dict[str, metrics_pb2.Metric]:
    data = push.data
    if data[:2] == b"\x1f\x8b":  # the broker handed it on still compressed
        data = gzip.decompress(data)
    parsed = metrics_pb2.MetricsData()
    parsed.ParseFromString(data)
    return {
        m.name: m for rm in parsed.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


def _value(metric: metrics_pb2.Metric) -> int:
    points = metric.sum.data_points if metric.HasField("sum") else metric.gauge.data_points
    return int(points[0].as_int)


def test_pushes_reach_the_broker_side_receiver_with_the_truncation_counted(
    cluster: ApacheKafkaCluster, telemetry_file: Path
) -> None:
    cluster.set_client_metrics("epochguard-test", [PREFIX], interval_ms=500)
    wait_until("the subscription on every broker", lambda: _subscribed_everywhere(cluster))
    topic = new_topic("telemetry")
    tp = TopicPartition(topic, 0)
    reports: list[Any] = []
    consumer = EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        client_id="epochguard-telemetry",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        on_truncation="rewind",
        on_truncation_report=reports.append,
        metadata_max_age_ms=500,
    )
    held: dict[int, str] = {}

    def poll() -> None:
        for records in consumer.poll(timeout_ms=200).values():
            for r in records:
                held[r.offset] = r.value.decode()

    def read_from_a() -> None:
        consumer.assign([tp])
        wait_until("a0..a4 and d0..d2 read from A", lambda: poll() or len(held) == 8)

    try:
        t = drive_unclean_election(cluster, topic, before_election=read_from_a)
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        wait_until("b0, b1 read from B", lambda: poll() or held.get(6) == "b1")
        (report,) = reports
        assert report.lost_count == 3
        assert t.unclean_epoch > t.first_epoch

        def pushed_truncation() -> bool:
            poll()
            return _totals(_ours(telemetry_file)).get(TRUNCATIONS) == 1

        wait_until("a push counting the truncation", pushed_truncation, timeout=30)
    finally:
        consumer.close()
    cluster.start_broker(A)

    ours = _ours(telemetry_file)
    assert ours and len({p.client_instance_id for p in ours}) == 1
    # Kafka hands its receivers the payload decompressed, named by content type "OTLP".
    assert all(p.content_type == "OTLP" and p.data[:2] != b"\x1f\x8b" for p in ours)
    # The terminating push on close comes last, after every periodic one.
    wait_until("the terminating push", lambda: _ours(telemetry_file)[-1].terminating)
    ours = _ours(telemetry_file)
    assert not any(p.terminating for p in ours[:-1])
    last = {name: _value(m) for name, m in _metrics(ours[-1]).items()}
    print(f"{len(ours)} pushes; the terminating one seen by the receiver: {last}")
    assert all(name.startswith(PREFIX) for name in last)
    totals = _totals(ours)
    assert totals[TRUNCATIONS] == 1
    assert totals[LOST] == 3
    assert totals[CONSUMED] == 10  # a0..a4, d0..d2, then b0, b1


def _ours(path: Path) -> list[TelemetryPush]:
    return [p for p in read_telemetry_pushes(path) if p.client_id == "epochguard-telemetry"]


def _totals(pushes: list[TelemetryPush]) -> dict[str, int]:
    """Each counter's total: delta points add up, a cumulative point is the total itself."""
    totals: dict[str, int] = {}
    for p in pushes:
        for name, m in _metrics(p).items():
            if not m.HasField("sum"):
                continue
            if m.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA:
                totals[name] = totals.get(name, 0) + _value(m)
            else:
                totals[name] = _value(m)
    return totals
