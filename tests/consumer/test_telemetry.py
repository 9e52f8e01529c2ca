"""KIP-714 client metrics push: the messages' bytes, the wire layer's reading of them, the
sans-IO state machine fed answers and ``now``, and the OTLP payload."""

from __future__ import annotations

import gzip
import uuid

import kafka.errors as kerrors
import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from epochguard.consumer import wire
from epochguard.consumer.config import build_config
from epochguard.consumer.errors import ConsumerConfigError
from epochguard.consumer.telemetry import (
    AskSubscription,
    PushAnswer,
    PushMetrics,
    SubscriptionAnswer,
    TelemetryState,
    TelemetrySubscription,
    compress,
    encode_metrics,
    metric_points,
)
from epochguard.consumer.telemetry_messages import (
    GetTelemetrySubscriptionsResponse,
    PushTelemetryRequest,
    PushTelemetryResponse,
)

CID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
CID_HEX = "00112233445566778899aabbccddeeff"


def _hex(*parts: str) -> bytes:
    return bytes.fromhex("".join(p.replace(" ", "") for p in parts))


# A subscription: no throttle, no error, id CID, subscription 7, gzip and zstd accepted,
# every 2000 ms, at most 1 MiB, delta, metrics under "org.apache.kafka.consumer.".
SUBSCRIPTION_V0 = _hex(
    "00000000",  # ThrottleTimeMs
    "0000",  # ErrorCode
    CID_HEX,  # ClientInstanceId
    "00000007",  # SubscriptionId
    "03 01 04",  # AcceptedCompressionTypes [1, 4] (compact array)
    "000007d0",  # PushIntervalMs 2000
    "00100000",  # TelemetryMaxBytes 1048576
    "01",  # DeltaTemporality
    "02 1b",
    b"org.apache.kafka.consumer.".hex(),  # RequestedMetrics ["org.apache.kafka.consumer."]
    "00",  # tagged fields
)


def _sub(**kw: object) -> TelemetrySubscription:
    values: dict[str, object] = {
        "client_instance_id": CID,
        "subscription_id": 7,
        "accepted_compression_types": (1,),
        "push_interval_ms": 2000,
        "telemetry_max_bytes": 1 << 20,
        "delta_temporality": False,
        "requested_metrics": ("org.apache.kafka.consumer.",),
    }
    values.update(kw)
    return TelemetrySubscription(**values)  # type: ignore[arg-type]


def test_subscription_answer_is_read_from_its_bytes() -> None:
    response = GetTelemetrySubscriptionsResponse.decode(SUBSCRIPTION_V0, version=0)
    answer = wire.read_get_telemetry_subscriptions(response)
    assert answer.error is None
    assert answer.subscription == _sub(accepted_compression_types=(1, 4), delta_temporality=True)


def test_subscription_error_and_bad_interval() -> None:
    bad = _hex("000003e8", "0023") + SUBSCRIPTION_V0[6:]  # throttled 1000 ms, error 35
    answer = wire.read_get_telemetry_subscriptions(
        GetTelemetrySubscriptionsResponse.decode(bad, version=0)
    )
    assert answer == SubscriptionAnswer(kerrors.UnsupportedVersionError, 1000, None)
    zero = SUBSCRIPTION_V0[:29] + _hex("00000000") + SUBSCRIPTION_V0[33:]
    with pytest.raises(kerrors.KafkaProtocolError, match="push interval"):
        wire.read_get_telemetry_subscriptions(
            GetTelemetrySubscriptionsResponse.decode(zero, version=0)
        )


def test_push_request_bytes() -> None:
    req = wire.push_telemetry_request(_sub(), True, 1, b"\x01\x02")
    assert req.encode(version=0) == _hex(CID_HEX, "00000007", "01", "01", "03 0102", "00")
    back = PushTelemetryRequest.decode(req.encode(version=0), version=0)
    assert back.terminating is True and back.metrics == b"\x01\x02"
    answer = wire.read_push_telemetry(PushTelemetryResponse.decode(_hex("00000032 0075 00"), 0))
    assert answer == PushAnswer(kerrors.UnknownSubscriptionIdError, 50)


def test_subscription_request_asks_for_an_id_with_the_zero_uuid() -> None:
    req = wire.get_telemetry_subscriptions_request(wire.ZERO_UUID)
    assert req.encode(version=0) == bytes(16) + b"\x00"


# ------------------------------------------------------------------ state machine


def _subscribed(jitter: float = 0.25, **kw: object) -> TelemetryState:
    state = TelemetryState(now=100.0, jitter=lambda: jitter)
    assert state.due(99.0) is None  # not before its time
    assert state.due(100.0) == AskSubscription(uuid.UUID(int=0))
    assert state.due(100.0) is None  # one request at a time
    state.on_subscription(SubscriptionAnswer(None, 0, _sub(**kw)), now=101.0)
    return state


def test_first_push_is_jittered_then_every_interval() -> None:
    state = _subscribed(jitter=0.25)  # 0.75 of the 2 s interval
    assert state.wake_at == pytest.approx(102.5)
    assert state.due(102.4) is None
    push = state.due(102.5)
    assert push == PushMetrics(_sub(), terminating=False)
    assert state.wake_at is None  # waits for the answer
    state.on_push(PushAnswer(None, 0), now=103.0)
    assert state.wake_at == pytest.approx(105.0)
    assert state.due(105.0) == push


def test_a_subscription_without_metrics_is_asked_again_after_its_interval() -> None:
    state = _subscribed(requested_metrics=())
    assert state.state == state.SUBSCRIPTION_NEEDED
    assert state.due(102.9) is None
    assert state.due(103.0) == AskSubscription(CID)  # keeps the id the broker gave
    # Nothing to push on close either.
    assert state.close() is None


def test_unknown_subscription_id_asks_again_at_once_and_jitters_again() -> None:
    state = _subscribed(jitter=0.0)
    assert state.due(102.0) is not None
    state.on_push(PushAnswer(kerrors.UnknownSubscriptionIdError, 0), now=102.1)
    assert state.due(102.1) == AskSubscription(CID)
    state.on_subscription(SubscriptionAnswer(None, 0, _sub(subscription_id=8)), now=102.2)
    assert state.wake_at == pytest.approx(103.2)  # 0.5 of the interval: a first push again


def test_too_large_and_throttled_wait_an_interval_or_the_throttle() -> None:
    state = _subscribed(jitter=0.0)
    assert state.due(102.0) is not None
    state.on_push(PushAnswer(kerrors.TelemetryTooLargeError, 0), now=102.0)
    assert state.state == state.PUSH_NEEDED and state.wake_at == pytest.approx(104.0)
    assert state.due(104.0) is not None
    state.on_push(PushAnswer(kerrors.ThrottlingQuotaExceededError, 9000), now=104.0)
    assert state.wake_at == pytest.approx(113.0)


@pytest.mark.parametrize(
    "error",
    [
        kerrors.UnsupportedVersionError,
        kerrors.InvalidRequestError,
        kerrors.InvalidRecordError,
        kerrors.ClusterAuthorizationFailedError,
    ],
)
def test_refusals_stop_telemetry(error: type[kerrors.KafkaError]) -> None:
    state = _subscribed(jitter=0.0)
    assert state.due(102.0) is not None
    state.on_push(PushAnswer(error, 0), now=102.0)
    assert state.state == state.STOPPED and state.stopped_by == error.__name__
    assert state.wake_at is None and state.due(1e9) is None
    assert state.close() is None


def test_unsupported_subscription_stops_and_other_errors_retry() -> None:
    state = TelemetryState(now=0.0)
    assert state.due(0.0) is not None
    state.on_subscription(SubscriptionAnswer(kerrors.UnknownError, 0, None), now=1.0)
    assert state.due(30.9) is None and state.due(31.0) is not None  # 30 s before any answer
    state.on_subscription(SubscriptionAnswer(kerrors.UnsupportedVersionError, 0, None), 32.0)
    assert state.state == state.STOPPED


def test_a_failed_request_is_retried() -> None:
    state = _subscribed(jitter=0.0)
    assert state.due(102.0) is not None
    state.on_failure(now=102.5)
    assert state.state == state.PUSH_NEEDED and state.wake_at == pytest.approx(104.5)
    fresh = TelemetryState(now=0.0)
    assert fresh.due(0.0) is not None
    fresh.on_failure(now=1.0)
    assert fresh.wake_at == pytest.approx(31.0)
    fresh.on_unsupported()
    assert fresh.state == fresh.STOPPED


def test_close_sends_one_terminating_push_and_then_nothing() -> None:
    state = _subscribed()
    push = state.close()
    assert push == PushMetrics(_sub(), terminating=True)
    assert state.due(1e9) is None
    state.on_push(PushAnswer(None, 0), now=200.0)
    assert state.state == state.TERMINATED
    assert state.close() is None
    # An answer to a push that was in flight when the consumer closed changes nothing.
    late = _subscribed(jitter=0.0)
    assert late.due(102.0) is not None
    assert late.close() is not None
    late.on_push(PushAnswer(None, 0), now=103.0)
    late.on_push(PushAnswer(None, 0), now=103.1)
    assert late.state == late.TERMINATED and late.due(1e9) is None


# ------------------------------------------------------------------ payload

COUNTERS = {
    "records_consumed": 120,
    "bytes_fetched": 4096,
    "fetch_requests": 9,
    "assigned_partitions": 3,
    "truncations_detected": 1,
    "records_lost": 5,
    "partitions_awaiting_seek": 0,
    "validations": 4,  # not pushed
}


def test_only_the_subscribed_prefixes_are_pushed() -> None:
    names = {p.name for p in metric_points(COUNTERS, _sub(requested_metrics=("",)))}
    assert "org.apache.kafka.consumer.epochguard.truncations.detected" in names
    assert "org.apache.kafka.consumer.fetch.manager.records.consumed.total" in names
    assert len(names) == 7  # no group: no heartbeat or join totals
    only = metric_points(COUNTERS, _sub(requested_metrics=("org.apache.kafka.consumer.epoch",)))
    assert [p.name for p in only] == [
        "org.apache.kafka.consumer.epochguard.truncations.detected",
        "org.apache.kafka.consumer.epochguard.records.lost",
        "org.apache.kafka.consumer.epochguard.partitions.awaiting.seek",
    ]
    assert metric_points(COUNTERS, _sub(requested_metrics=())) == []


def _decode(payload: bytes) -> dict[str, metrics_pb2.Metric]:
    data = metrics_pb2.MetricsData()
    data.ParseFromString(payload)
    (rm,) = data.resource_metrics
    assert {kv.key: kv.value.string_value for kv in rm.resource.attributes} == {"client_id": "c"}
    return {m.name: m for sm in rm.scope_metrics for m in sm.metrics}


def test_otlp_payload_cumulative_and_delta() -> None:
    points = metric_points(COUNTERS, _sub(requested_metrics=("",)))
    lost = "org.apache.kafka.consumer.epochguard.records.lost"
    cumulative = _decode(
        encode_metrics(
            points,
            delta=False,
            start_ns=1,
            now_ns=2,
            previous={lost: 2},
            resource={"client_id": "c"},
        )
    )
    m = cumulative[lost]
    assert m.sum.is_monotonic
    assert m.sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert m.sum.data_points[0].as_int == 5
    assert m.sum.data_points[0].start_time_unix_nano == 1
    gauge = cumulative["org.apache.kafka.consumer.coordinator.assigned.partitions"]
    assert gauge.gauge.data_points[0].as_int == 3
    delta = _decode(
        encode_metrics(
            points,
            delta=True,
            start_ns=1,
            now_ns=2,
            previous={lost: 2},
            resource={"client_id": "c"},
        )
    )
    assert delta[lost].sum.data_points[0].as_int == 3
    assert delta[lost].sum.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA


def test_compression_follows_what_the_broker_accepts() -> None:
    codec, body = compress(b"x" * 100, (4, 1))
    assert codec == 1 and gzip.decompress(body) == b"x" * 100
    assert compress(b"abc", ()) == (0, b"abc")


def test_enable_metrics_push_must_be_a_bool() -> None:
    assert build_config({})["enable_metrics_push"] is True
    assert build_config({"enable_metrics_push": False})["enable_metrics_push"] is False
    with pytest.raises(ConsumerConfigError, match="enable_metrics_push"):
        build_config({"enable_metrics_push": "no"})
