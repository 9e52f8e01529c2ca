"""What the fault proxy tests share: one client reading partition 0, whichever client."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from epochguard.consumer import EpochConsumer

FETCH = 1
RECORDS = 60
#: Enough for every fault below to end and a client to time out once and reconnect, with room
#: for a loaded machine (a run at load 40 took over 20 s for the last record before any
#: fault): a client that hangs still fails here, only later.
DEADLINE_S = 45.0
CLIENT_CONFIG: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "request_timeout_ms": 1500,
    "reconnect_backoff_max_ms": 200,
    "retry_backoff_ms": 20,
    "fetch_max_wait_ms": 100,
    "metadata_max_age_ms": 1000,
}


class Reader:
    """One client reading partition 0: what it has delivered, by offset."""

    def __init__(self, kind: str, bootstrap: str, topic: str) -> None:
        self.kind = kind
        self.tp = TopicPartition(topic, 0)
        self.offsets: list[int] = []
        self.values: list[bytes] = []
        if kind == "confluent-kafka":
            import confluent_kafka

            self.consumer: Any = confluent_kafka.Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"netfault-{topic}",
                    "enable.auto.commit": False,
                    "socket.timeout.ms": 1500,
                    "reconnect.backoff.max.ms": 200,
                    "fetch.wait.max.ms": 100,
                    "topic.metadata.refresh.interval.ms": 1000,
                }
            )
            self.consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
            return
        cls: Callable[..., Any] = EpochConsumer if kind == "epochguard" else KafkaConsumer
        self.consumer = cls(bootstrap_servers=bootstrap, **CLIENT_CONFIG)
        self.consumer.assign([self.tp])

    def poll(self) -> None:
        if self.kind == "confluent-kafka":
            for m in self.consumer.consume(100, 0.1):
                assert m.error() is None, m.error()
                self.offsets.append(m.offset())
                self.values.append(m.value())
            return
        for records in self.consumer.poll(timeout_ms=100).values():
            for r in records:
                self.offsets.append(r.offset)
                self.values.append(r.value)

    def read_until(self, count: int, deadline_s: float = DEADLINE_S) -> float:
        started = time.monotonic()
        while len(self.offsets) < count:
            assert time.monotonic() - started < deadline_s, (
                f"{self.kind} hung: {len(self.offsets)} of {count} records in {deadline_s} s"
            )
            self.poll()
        return time.monotonic() - started

    def settle(self) -> None:
        """Poll a little more: a client that re-reads would deliver again now."""
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            self.poll()

    def reports(self) -> list[Any]:
        if self.kind == "epochguard":
            reports: list[Any] = self.consumer.truncation_reports()
            return reports
        return []

    def close(self) -> None:
        self.consumer.close()


CLIENTS = ["epochguard", "kafka-python", "confluent-kafka"]
