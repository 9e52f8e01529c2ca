"""Reference clients driven through a truncation: what each one does is recorded, not judged.

Each driver reads the records that are about to be lost, then, after the unclean election and
new writes, polls for a bounded time and records every record, error and exception it sees.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import OFFSET_STORED, Consumer, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import KafkaConsumer, TopicPartition

from epochguard.testing.apache_kafka.jars import KafkaJars
from epochguard.testing.apache_kafka.probe import JavaTruncationProbe
from epochguard.testing.franzgo import FranzGoProbe

Event = dict[str, Any]


class ReferenceClient(Protocol):
    name: str

    def read(self, count: int, timeout: float) -> list[Event]: ...

    def close(self) -> None: ...


class KafkaPythonClient:
    name = "kafka-python"

    def __init__(
        self, bootstrap: str, topic: str, group_id: str | None = None, from_committed: bool = False
    ) -> None:
        """Reads from offset 0, or (``from_committed``) from the group's committed offset,
        as a restarted application does."""
        self.tp = TopicPartition(topic, 0)
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            auto_offset_reset="none",
            enable_auto_commit=False,
            metadata_max_age_ms=500,
            request_timeout_ms=5000,
            reconnect_backoff_max_ms=500,
        )
        self.consumer.assign([self.tp])
        if not from_committed:
            self.consumer.seek(self.tp, 0)

    def commit(self) -> Any:
        """Commit the position; returns what the group then holds (offset, epoch)."""
        self.consumer.commit()
        c = self.consumer.committed(self.tp, metadata=True)
        return None if c is None else [c.offset, c.leader_epoch]

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

    def __init__(
        self, bootstrap: str, topic: str, group_id: str | None = None, from_committed: bool = False
    ) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group_id or f"scenario-{topic}",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "topic.metadata.refresh.interval.ms": 500,
                "log_level": 0,
            }
        )
        start = OFFSET_STORED if from_committed else 0
        self.consumer.assign([CTopicPartition(topic, 0, start)])

    def commit(self) -> Any:
        self.consumer.commit(asynchronous=False)
        [c] = self.consumer.committed([CTopicPartition(self.topic, 0)], timeout=10)
        return [c.offset, c.leader_epoch]

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

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        jars: KafkaJars,
        log_dir: Path,
        start: tuple[int, int | None] | None = (0, None),
        group: str | None = None,
    ) -> None:
        """``start``: (offset, leader epoch) to seek to; None restores the position from
        ``group``'s commit (Java validates a committed epoch before fetching)."""
        props = {"group.id": group} if group else None
        self.probe = JavaTruncationProbe(
            bootstrap, topic, 0, "none", props=props, jars=jars, log_dir=log_dir
        )
        if start is not None:
            self.probe.seek(*start)

    def commit(self) -> list[int | None]:
        return list(self.probe.commit())

    def position(self) -> int:
        return self.probe.position()

    def read(self, count: int, timeout: float) -> list[Event]:
        return self.probe.poll(count, int(timeout * 1000))

    def close(self) -> None:
        self.probe.close()


class FranzGoClient:
    """franz-go's kgo client on partition 0 with ``kgo.NoResetOffset`` (the Go probe)."""

    name = "franz-go"

    def __init__(
        self,
        binary: Path,
        bootstrap: str,
        topic: str,
        log_dir: Path,
        group: str | None = None,
        from_committed: bool = False,
    ) -> None:
        """Reads from offset 0, or (``from_committed``) from ``group``'s committed offset and
        leader epoch, as a restarted franz-go application that assigns its partition does."""
        self.probe = FranzGoProbe(
            binary,
            bootstrap,
            topic,
            start="committed" if from_committed else 0,
            group=group,
            log_dir=log_dir,
        )

    def commit(self) -> list[int | None]:
        return list(self.probe.commit())

    def read(self, count: int, timeout: float) -> list[Event]:
        return self.probe.poll(count, int(timeout * 1000))

    def close(self) -> None:
        self.probe.close()


def franzgo_seen(events: list[Event]) -> dict[str, list[Any]]:
    """What franz-go handed the application: ErrDataLoss (consumed to offset, epoch; reset to
    offset, epoch), other partition errors once each by code, then the records."""
    return {
        "data_loss": [
            [e["consumed_to"], e["consumed_to_epoch"], e["reset_to"], e["reset_to_epoch"]]
            for e in events
            if e["event"] == "data_loss"
        ],
        "fetch_errors": [e["code"] for e in events if e["event"] == "fetch_error"],
        "records": [
            [e["offset"], e["leader_epoch"], e["value"]] for e in events if e["event"] == "record"
        ],
    }


def read_all(clients: Sequence[ReferenceClient], count: int, timeout: float) -> dict[str, Any]:
    """Each client's ``read(count, timeout)``, all at once (one thread each), by name.

    The clients are independent of one another (their own connections, or processes of
    their own), and a read that does not reach ``count`` runs its whole ``timeout``: one after
    the other, four clients made a scenario wait four times as long for the same answers."""
    if not clients:
        return {}
    with ThreadPoolExecutor(len(clients), thread_name_prefix="reference-client") as pool:
        futures = {c.name: pool.submit(c.read, count, timeout) for c in clients}
        return {name: future.result() for name, future in futures.items()}
