"""KIP-714 metrics push by both drivers on the EmbeddedCluster (its GetTelemetrySubscriptions
and PushTelemetry handlers keep what arrived): the truncation counted in a push, a changed
subscription picked up after UNKNOWN_SUBSCRIPTION_ID, the terminating push on close, and
nothing sent with ``enable_metrics_push=False``."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from epochguard import AIOEpochConsumer
from epochguard.testing import EmbeddedCluster
from epochguard.testing.telemetry import TelemetryPush

from .conftest import (
    TP0,
    consumer_config,
    diverge,
    make_consumer,
    read,
    setup_topic,
    unclean_elect,
)

pytestmark = pytest.mark.timeout(60)

PREFIX = "org.apache.kafka.consumer."
TRUNCATIONS = PREFIX + "epochguard.truncations.detected"
LOST = PREFIX + "epochguard.records.lost"
GET_SUBSCRIPTIONS, PUSH = 71, 72


def _metrics(push: TelemetryPush) -> dict[str, int]:
    data = metrics_pb2.MetricsData()
    data.ParseFromString(push.data)
    out = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points = m.sum.data_points if m.HasField("sum") else m.gauge.data_points
                out[m.name] = int(points[0].as_int)
    return out


def _total(pushes: list[TelemetryPush], name: str) -> int:
    # The embedded brokers ask for delta temporality, as Kafka does by default.
    return sum(_metrics(p).get(name, 0) for p in pushes)


def _requests(cluster: EmbeddedCluster, api_key: int) -> int:
    return sum(n for (key, _v), n in cluster.requests_seen().items() if key == api_key)


def test_a_push_counts_the_truncation_and_close_pushes_once_more(
    cluster: EmbeddedCluster,
) -> None:
    cluster.set_client_metrics("all", [PREFIX], interval_ms=100)
    old, new = setup_topic(cluster)
    consumer = make_consumer(cluster, client_id="pusher", on_truncation="rewind")
    try:
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        diverge(cluster, old, new, lost=5)
        assert len(read(consumer, 5)) == 5  # read from the old leader only
        unclean_elect(cluster, old, new, fresh=3)
        got = read(consumer, 3)
        assert [r.value for r in got] == [b"new-0", b"new-1", b"new-2"]
        (report,) = consumer.truncation_reports()
        assert report.lost_count == 5
        deadline = time.monotonic() + 10
        while _total(cluster.telemetry_pushes(), TRUNCATIONS) < 1:
            assert time.monotonic() < deadline, cluster.telemetry_pushes()
            consumer.poll(timeout_ms=50)
        assert consumer.metrics(raw=True)["telemetry_pushes"] >= 1  # type: ignore[index]
    finally:
        consumer.close()
    pushes = cluster.telemetry_pushes()
    assert {p.client_id for p in pushes} == {"pusher"}
    assert len({p.client_instance_id for p in pushes}) == 1
    assert pushes[-1].terminating and not any(p.terminating for p in pushes[:-1])
    assert _total(pushes, TRUNCATIONS) == 1
    assert _total(pushes, LOST) == 5
    assert _total(pushes, PREFIX + "fetch.manager.records.consumed.total") == 18
    assert all(name.startswith(PREFIX) for p in pushes for name in _metrics(p))


def test_a_changed_subscription_is_asked_again_and_its_prefixes_followed(
    cluster: EmbeddedCluster,
) -> None:
    cluster.set_client_metrics("all", [PREFIX], interval_ms=100)
    cluster.create_topic("t")
    consumer = make_consumer(cluster)
    try:
        consumer.assign([TP0])
        deadline = time.monotonic() + 10
        while not cluster.telemetry_pushes():
            assert time.monotonic() < deadline
            consumer.poll(timeout_ms=50)
        asked = _requests(cluster, GET_SUBSCRIPTIONS)
        # A new subscription id: the next push is refused, the consumer asks again.
        cluster.set_client_metrics("all", [PREFIX + "epochguard."], interval_ms=150)
        seen = len(cluster.telemetry_pushes())
        while not any(
            all(n.startswith(PREFIX + "epochguard.") for n in _metrics(p))
            for p in cluster.telemetry_pushes()[seen:]
        ):
            assert time.monotonic() < deadline
            consumer.poll(timeout_ms=50)
        assert _requests(cluster, GET_SUBSCRIPTIONS) > asked
        assert set(_metrics(cluster.telemetry_pushes()[-1])) == {
            TRUNCATIONS,
            LOST,
            PREFIX + "epochguard.partitions.awaiting.seek",
        }
    finally:
        consumer.close()


def test_without_a_subscription_nothing_is_pushed(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t")
    consumer = make_consumer(cluster)
    try:
        consumer.assign([TP0])
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=50)
    finally:
        consumer.close()
    assert _requests(cluster, GET_SUBSCRIPTIONS) == 1  # asked once; again in 5 minutes
    assert _requests(cluster, PUSH) == 0


def test_enable_metrics_push_false_sends_nothing(cluster: EmbeddedCluster) -> None:
    cluster.set_client_metrics("all", [PREFIX], interval_ms=100)
    cluster.create_topic("t")
    consumer = make_consumer(cluster, enable_metrics_push=False)
    try:
        consumer.assign([TP0])
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=50)
    finally:
        consumer.close()
    assert _requests(cluster, GET_SUBSCRIPTIONS) == _requests(cluster, PUSH) == 0


def test_aio_consumer_pushes_and_terminates(cluster: EmbeddedCluster) -> None:
    cluster.set_client_metrics("all", [PREFIX], interval_ms=100)
    cluster.create_topic("t")
    cluster.append("t", 0, [b"a", b"b"])

    async def main() -> None:
        async with AIOEpochConsumer(**consumer_config(cluster, client_id="aio-pusher")) as c:
            c.assign([TP0])
            deadline = time.monotonic() + 10
            while not cluster.telemetry_pushes():
                assert time.monotonic() < deadline
                await c.getmany(timeout_ms=50)

    asyncio.run(main())
    pushes = cluster.telemetry_pushes()
    assert {p.client_id for p in pushes} == {"aio-pusher"}
    assert pushes[-1].terminating
    assert _total(pushes, PREFIX + "fetch.manager.records.consumed.total") == 2
