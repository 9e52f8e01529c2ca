"""Client metrics push (KIP-714): the broker asks for metrics, the consumer pushes them.

:class:`TelemetryState` is the sans-IO core: given ``now`` and the answers, it says what to
send next (:class:`AskSubscription` or :class:`PushMetrics`) and when. It never sends,
sleeps or reads a clock. :func:`encode_metrics` turns the consumer's counters into OTLP
``MetricsData`` bytes (the ``opentelemetry-proto`` messages), keeping only the metrics the
subscription names. :class:`TelemetryReporter` is the engine's glue: it sends what the
state asks for through the broker client, queues the answers from the I/O thread and
applies them in the next :meth:`TelemetryReporter.tick`, on the driver's thread, as the
hanging-transaction monitor does.

The flow (KIP-714): ask the subscription at start; a subscription that requests no metric
is asked again after its push interval; otherwise the first push goes out after a random
part (0.5 to 1.5) of the push interval, so that clients started together spread their
pushes, and every further push one interval after the last. ``UNKNOWN_SUBSCRIPTION_ID``
and ``UNSUPPORTED_COMPRESSION_TYPE`` ask for the subscription again at once;
``TELEMETRY_TOO_LARGE`` and throttling wait the interval; an unsupported version, an
invalid request or record and a refused authorization stop telemetry for this consumer.
On close, a consumer that holds a subscription sends one last push marked terminating.
"""

from __future__ import annotations

import collections
import gzip
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs
import kafka.errors as kerrors

from epochguard._log import get_logger

__all__ = [
    "COMPRESSION_GZIP",
    "COMPRESSION_NONE",
    "AskSubscription",
    "PushAnswer",
    "PushMetrics",
    "SubscriptionAnswer",
    "TelemetryReporter",
    "TelemetryState",
    "TelemetrySubscription",
    "encode_metrics",
    "metric_points",
]

log = get_logger("epochguard.consumer")

COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1
#: Prefix of every metric name (KIP-714: the client's metrics under its own namespace).
METRIC_PREFIX: Final = "org.apache.kafka.consumer."
#: Before a subscription arrives, and after a failed request: how long until asking again.
_RETRY_S: Final = 30.0
#: Errors after which this consumer pushes nothing more (KIP-714's "stop" rows).
_STOPS: Final = (
    kerrors.UnsupportedVersionError,
    kerrors.InvalidRequestError,
    kerrors.InvalidRecordError,
    kerrors.ClusterAuthorizationFailedError,
)
#: Errors answered by asking for the subscription again at once.
_RESUBSCRIBE: Final = (
    kerrors.UnknownSubscriptionIdError,
    kerrors.UnsupportedCompressionTypeError,
)


@attrs.frozen
class TelemetrySubscription:
    """What the broker asks this client to push (a GetTelemetrySubscriptions answer)."""

    client_instance_id: uuid.UUID
    subscription_id: int
    accepted_compression_types: tuple[int, ...]
    push_interval_ms: int
    telemetry_max_bytes: int
    delta_temporality: bool
    #: Metric name prefixes; empty: no metric; one empty string: every metric.
    requested_metrics: tuple[str, ...]

    def wants(self, name: str) -> bool:
        return any(name.startswith(prefix) for prefix in self.requested_metrics)

    @property
    def wants_any(self) -> bool:
        return bool(self.requested_metrics)


@attrs.frozen
class SubscriptionAnswer:
    error: type[kerrors.KafkaError] | None
    throttle_time_ms: int
    #: ``None`` when ``error`` is set.
    subscription: TelemetrySubscription | None


@attrs.frozen
class PushAnswer:
    error: type[kerrors.KafkaError] | None
    throttle_time_ms: int


@attrs.frozen
class AskSubscription:
    """Send GetTelemetrySubscriptions; the zero UUID asks the broker to assign an id."""

    client_instance_id: uuid.UUID


@attrs.frozen
class PushMetrics:
    """Send PushTelemetry with the metrics ``subscription`` asks for."""

    subscription: TelemetrySubscription
    terminating: bool


class TelemetryState:
    """Which telemetry request is due, given ``now`` and the answers (see the module doc).

    ``jitter`` returns a number in [0, 1): the first push after a subscription waits
    ``(0.5 + jitter()) * push interval``. Tests pass a fixed one."""

    SUBSCRIPTION_NEEDED: Final = "subscription_needed"
    SUBSCRIPTION_IN_FLIGHT: Final = "subscription_in_flight"
    PUSH_NEEDED: Final = "push_needed"
    PUSH_IN_FLIGHT: Final = "push_in_flight"
    TERMINATING_PUSH_IN_FLIGHT: Final = "terminating_push_in_flight"
    TERMINATED: Final = "terminated"
    STOPPED: Final = "stopped"

    def __init__(self, now: float, jitter: Callable[[], float] = random.random) -> None:
        self._jitter = jitter
        self.state: str = self.SUBSCRIPTION_NEEDED
        self.subscription: TelemetrySubscription | None = None
        self.client_instance_id: uuid.UUID = uuid.UUID(int=0)
        self._due = now
        # Set on the first push after each new subscription, for the jitter.
        self._first_push = True
        #: Why telemetry stopped (an error name), once it has.
        self.stopped_by: str | None = None

    @property
    def wake_at(self) -> float | None:
        """When :meth:`due` next has something to send; ``None``: only an answer moves it."""
        if self.state in (self.SUBSCRIPTION_NEEDED, self.PUSH_NEEDED):
            return self._due
        return None

    def due(self, now: float) -> AskSubscription | PushMetrics | None:
        """The request to send now, if any; the state then waits for its answer."""
        if now < self._due:
            return None
        if self.state == self.SUBSCRIPTION_NEEDED:
            self.state = self.SUBSCRIPTION_IN_FLIGHT
            return AskSubscription(self.client_instance_id)
        if self.state == self.PUSH_NEEDED:
            assert self.subscription is not None
            self.state = self.PUSH_IN_FLIGHT
            return PushMetrics(self.subscription, terminating=False)
        return None

    def close(self) -> PushMetrics | None:
        """The consumer closes: the terminating push to send, if a subscription asks for
        metrics; after it no request is due."""
        sub = self.subscription
        was = self.state
        self.state = self.TERMINATED
        if sub is None or not sub.wants_any or was in (self.STOPPED, self.TERMINATED):
            return None
        self.state = self.TERMINATING_PUSH_IN_FLIGHT
        return PushMetrics(sub, terminating=True)

    def _interval_s(self) -> float:
        return _RETRY_S if self.subscription is None else self.subscription.push_interval_ms / 1000

    def _stop(self, error: type[kerrors.KafkaError]) -> None:
        self.state = self.STOPPED
        self.stopped_by = error.__name__

    def on_subscription(self, answer: SubscriptionAnswer, now: float) -> None:
        if self.state != self.SUBSCRIPTION_IN_FLIGHT:
            return
        throttle_s = answer.throttle_time_ms / 1000
        if answer.error is not None:
            if issubclass(answer.error, _STOPS):
                self._stop(answer.error)
                return
            self.state = self.SUBSCRIPTION_NEEDED
            self._due = now + max(self._interval_s(), throttle_s)
            return
        sub = answer.subscription
        assert sub is not None
        self.subscription = sub
        self.client_instance_id = sub.client_instance_id
        interval_s = sub.push_interval_ms / 1000
        if not sub.wants_any:
            # Nothing to push: look again after the interval, in case an operator adds
            # a subscription meanwhile.
            self.state = self.SUBSCRIPTION_NEEDED
            self._due = now + max(interval_s, throttle_s)
            return
        self.state = self.PUSH_NEEDED
        wait_s = interval_s * (0.5 + self._jitter()) if self._first_push else interval_s
        self._first_push = False
        self._due = now + max(wait_s, throttle_s)

    def on_push(self, answer: PushAnswer, now: float) -> None:
        if self.state == self.TERMINATING_PUSH_IN_FLIGHT:
            self.state = self.TERMINATED
            return
        if self.state != self.PUSH_IN_FLIGHT:
            return
        throttle_s = answer.throttle_time_ms / 1000
        error = answer.error
        if error is not None and issubclass(error, _STOPS):
            self._stop(error)
            return
        if error is not None and issubclass(error, _RESUBSCRIBE):
            self.state = self.SUBSCRIPTION_NEEDED
            self._first_push = True
            self._due = now + throttle_s
            return
        # Pushed, too large (the next push has other values) or throttled: one interval on.
        self.state = self.PUSH_NEEDED
        self._due = now + max(self._interval_s(), throttle_s)

    def on_unsupported(self) -> None:
        """The broker does not know the telemetry APIs at all."""
        self._stop(kerrors.UnsupportedVersionError)

    def on_failure(self, now: float) -> None:
        """The request got no answer (timeout, connection lost, no broker)."""
        if self.state == self.SUBSCRIPTION_IN_FLIGHT:
            self.state = self.SUBSCRIPTION_NEEDED
            self._due = now + min(self._interval_s(), _RETRY_S)
        elif self.state == self.PUSH_IN_FLIGHT:
            self.state = self.PUSH_NEEDED
            self._due = now + self._interval_s()
        elif self.state == self.TERMINATING_PUSH_IN_FLIGHT:
            self.state = self.TERMINATED


# ---------------------------------------------------------------------- payload

#: ``(metric name, kind)`` of each counter the consumer pushes, by its key in
#: ``metrics(raw=True)``; "sum" counts up from the consumer's start, "gauge" is a level.
PUSHED_COUNTERS: Final[Mapping[str, tuple[str, str]]] = {
    "records_consumed": ("fetch.manager.records.consumed.total", "sum"),
    "bytes_fetched": ("fetch.manager.bytes.consumed.total", "sum"),
    "fetch_requests": ("fetch.manager.fetch.total", "sum"),
    "assigned_partitions": ("coordinator.assigned.partitions", "gauge"),
    "heartbeats_sent": ("coordinator.heartbeat.total", "sum"),
    "rebalances": ("coordinator.join.total", "sum"),
    "truncations_detected": ("epochguard.truncations.detected", "sum"),
    "records_lost": ("epochguard.records.lost", "sum"),
    "partitions_awaiting_seek": ("epochguard.partitions.awaiting.seek", "gauge"),
}


@attrs.frozen
class MetricPoint:
    name: str
    kind: str
    value: int


def metric_points(
    counters: Mapping[str, Any], subscription: TelemetrySubscription
) -> list[MetricPoint]:
    """The consumer's counters under their KIP-714 names, only those the subscription asks."""
    points = []
    for key, (suffix, kind) in PUSHED_COUNTERS.items():
        value = counters.get(key)
        name = METRIC_PREFIX + suffix
        if value is not None and subscription.wants(name):
            points.append(MetricPoint(name, kind, int(value)))
    return points


def encode_metrics(
    points: Iterable[MetricPoint],
    *,
    delta: bool,
    start_ns: int,
    now_ns: int,
    previous: Mapping[str, int],
    resource: Mapping[str, str],
) -> bytes:
    """OTLP ``MetricsData`` bytes: sums as monotonic counters (deltas since ``start_ns``
    against ``previous`` when ``delta``, else cumulative), gauges as gauges."""
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.metrics.v1 import metrics_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2

    temporality = (
        metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
        if delta
        else metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    )
    metrics = []
    for p in points:
        if p.kind == "sum":
            value = p.value - previous.get(p.name, 0) if delta else p.value
            point = metrics_pb2.NumberDataPoint(
                start_time_unix_nano=start_ns, time_unix_nano=now_ns, as_int=value
            )
            metrics.append(
                metrics_pb2.Metric(
                    name=p.name,
                    sum=metrics_pb2.Sum(
                        data_points=[point],
                        aggregation_temporality=temporality,
                        is_monotonic=True,
                    ),
                )
            )
        else:
            point = metrics_pb2.NumberDataPoint(time_unix_nano=now_ns, as_int=p.value)
            metrics.append(
                metrics_pb2.Metric(name=p.name, gauge=metrics_pb2.Gauge(data_points=[point]))
            )
    attributes = [
        common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))
        for k, v in sorted(resource.items())
    ]
    data = metrics_pb2.MetricsData(
        resource_metrics=[
            metrics_pb2.ResourceMetrics(
                resource=resource_pb2.Resource(attributes=attributes),
                scope_metrics=[metrics_pb2.ScopeMetrics(metrics=metrics)],
            )
        ]
    )
    return bytes(data.SerializeToString())


def compress(payload: bytes, accepted: Iterable[int]) -> tuple[int, bytes]:
    """``(compression type, bytes)``: gzip when the broker accepts it, else none."""
    if COMPRESSION_GZIP in tuple(accepted):
        return COMPRESSION_GZIP, gzip.compress(payload)
    return COMPRESSION_NONE, payload


# ---------------------------------------------------------------------- engine glue


class TelemetryReporter:
    """Sends what a :class:`TelemetryState` asks for (see the module doc).

    ``counters`` returns the consumer's counters (``metrics(raw=True)``'s names);
    ``wake`` is set when an answer arrives, so a waiting driver applies it."""

    def __init__(
        self,
        client: Any,
        counters: Callable[[], Mapping[str, Any]],
        resource: Mapping[str, str],
        request_timeout_ms: int,
        wake: Any,
    ) -> None:
        # wire.py builds its answers from this module's value types: imported here, not
        # at the top, so that either module can be imported first.
        from epochguard.consumer import wire

        self._wire = wire
        self._client = client
        self._counters = counters
        self._resource = dict(resource)
        self._request_timeout_ms = request_timeout_ms
        self._wake = wake
        self.state = TelemetryState(time.monotonic())
        self._answers: collections.deque[tuple[Any, Any]] = collections.deque()
        # Delta temporality: what the last push reported, and when.
        self._start_ns = time.time_ns()
        self._last_push_ns = self._start_ns
        self._last_values: dict[str, int] = {}
        self.pushes_sent = 0

    def tick(self, now: float) -> None:
        while self._answers:
            self._apply(*self._answers.popleft())
        action = self.state.due(now)
        if action is not None:
            self._send(action)

    def close_request(self) -> Any | None:
        """The terminating push request to send on close (``None``: nothing to push)."""
        while self._answers:
            self._apply(*self._answers.popleft())
        action = self.state.close()
        return None if action is None else self._push_request(action)

    def _send(self, action: AskSubscription | PushMetrics) -> None:
        wire = self._wire
        if isinstance(action, AskSubscription):
            request = wire.get_telemetry_subscriptions_request(action.client_instance_id)
        else:
            request = self._push_request(action)
            if request is None:
                return
        future = self._client.send(None, request, self._request_timeout_ms)

        def done(_value: Any) -> None:
            self._answers.append((action, future))
            self._wake.set()

        future.add_both(done)

    def _push_request(self, action: PushMetrics) -> Any | None:
        sub = action.subscription
        now_ns = time.time_ns()
        points = metric_points(self._counters(), sub)
        start_ns = self._last_push_ns if sub.delta_temporality else self._start_ns
        payload = encode_metrics(
            points,
            delta=sub.delta_temporality,
            start_ns=start_ns,
            now_ns=now_ns,
            previous=self._last_values,
            resource=self._resource,
        )
        codec, body = compress(payload, sub.accepted_compression_types)
        if sub.telemetry_max_bytes > 0 and len(body) > sub.telemetry_max_bytes:
            log.warning("telemetry_too_large", size=len(body), max_bytes=sub.telemetry_max_bytes)
            self.state.on_push(PushAnswer(kerrors.TelemetryTooLargeError, 0), time.monotonic())
            return None
        self._last_push_ns = now_ns
        self._last_values = {p.name: p.value for p in points if p.kind == "sum"}
        self.pushes_sent += 1
        log.debug(
            "telemetry_pushed",
            subscription_id=sub.subscription_id,
            metrics=len(points),
            terminating=action.terminating,
        )
        return self._wire.push_telemetry_request(sub, action.terminating, codec, body)

    def _apply(self, action: AskSubscription | PushMetrics, future: Any) -> None:
        now = time.monotonic()
        state = self.state
        if future.exception is not None:
            if isinstance(future.exception, kerrors.UnsupportedVersionError):
                # The broker has no KIP-714 APIs (older than Kafka 3.7).
                state.on_unsupported()
            else:
                log.debug("telemetry_request_failed", error=repr(future.exception))
                state.on_failure(now)
            return
        if isinstance(action, AskSubscription):
            answer = self._wire.read_get_telemetry_subscriptions(future.value)
            state.on_subscription(answer, now)
            if answer.subscription is not None:
                log.debug(
                    "telemetry_subscription",
                    subscription_id=answer.subscription.subscription_id,
                    push_interval_ms=answer.subscription.push_interval_ms,
                    requested_metrics=list(answer.subscription.requested_metrics),
                )
        else:
            push = self._wire.read_push_telemetry(future.value)
            if push.error is not None:
                log.info("telemetry_push_refused", error=push.error.__name__)
            state.on_push(push, now)
        if state.state == state.STOPPED:
            log.info("telemetry_stopped", error=state.stopped_by)
