"""Reference clients driven through a truncation: what each one does is recorded, not judged.

Each driver reads the records that are about to be lost, then, after the unclean election and
new writes, polls for a bounded time and records every record, error and exception it sees.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import KafkaConsumer, TopicPartition

from epochguard.testing.apache_kafka.jars import KafkaJars
from epochguard.testing.apache_kafka.probe import JavaTruncationProbe

Event = dict[str, Any]


class ReferenceClient(Protocol):
    name: str

    def read(self, count: int, timeout: float) -> list[Event]: ...

    def close(self) -> None: ...


class KafkaPythonClient:
    name = "kafka-python"

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.tp = TopicPartition(topic, 0)
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            auto_offset_reset="none",
            enable_auto_commit=False,
            metadata_max_age_ms=500,
            request_timeout_ms=5000,
            reconnect_backoff_max_ms=500,
        )
        self.consumer.assign([self.tp])
        self.consumer.seek(self.tp, 0)

    def read(self, count: int, timeout: float) -> list[Event]:
        events: list[Event] = []
        seen = 0
        deadline = time.monotonic() + timeout
        while seen < count and time.monotonic() < deadline:
            try:
                batch = self.consumer.poll(timeout_ms=200, max_records=count - seen)
            except Exception as exc:  # recorded, whatever kafka-python raises
                event = {"event": "exception", "type": type(exc).__name__, "text": str(exc)}
                if events and {**events[-1], "repeated": 0} == {**event, "repeated": 0}:
                    # It raises again on every poll: count instead of recording each one.
                    events[-1]["repeated"] = events[-1].get("repeated", 1) + 1
                    if events[-1]["repeated"] >= 5:
                        break
                else:
                    events.append(event)
                time.sleep(0.2)
                continue
            for records in batch.values():
                for r in records:
                    events.append(
                        {
                            "event": "record",
                            "offset": r.offset,
                            "leader_epoch": r.leader_epoch,
                            "value": r.value.decode(),
                        }
                    )
                    seen += 1
        events.append({"event": "position", "offset": self.consumer.position(self.tp)})
        return events

    def close(self) -> None:
        self.consumer.close()


class ConfluentClient:
    name = "confluent-kafka"

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"scenario-{topic}",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "topic.metadata.refresh.interval.ms": 500,
                "log_level": 0,
            }
        )
        self.consumer.assign([CTopicPartition(topic, 0, 0)])

    def read(self, count: int, timeout: float) -> list[Event]:
        events: list[Event] = []
        seen = 0
        deadline = time.monotonic() + timeout
        while seen < count and time.monotonic() < deadline:
            try:
                m = self.consumer.poll(0.2)
            except KafkaException as exc:
                events.append({"event": "exception", "text": str(exc)})
                continue
            if m is None:
                continue
            if m.error():
                events.append({"event": "error", "code": m.error().name(), "text": m.error().str()})
                if not m.error().retriable():
                    break  # librdkafka stops fetching the partition after such an error
                continue
            events.append(
                {
                    "event": "record",
                    "offset": m.offset(),
                    "leader_epoch": m.leader_epoch(),
                    "value": m.value().decode(),
                }
            )
            seen += 1
        return events

    def close(self) -> None:
        self.consumer.close()


class JavaClient:
    name = "java"

    def __init__(self, bootstrap: str, topic: str, jars: KafkaJars, log_dir: Path) -> None:
        self.probe = JavaTruncationProbe(bootstrap, topic, 0, "none", jars=jars, log_dir=log_dir)
        self.probe.seek(0)

    def read(self, count: int, timeout: float) -> list[Event]:
        return self.probe.poll(count, int(timeout * 1000))

    def close(self) -> None:
        self.probe.close()
