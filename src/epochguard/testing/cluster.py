"""The control interface that scenarios are written against.

Both ``EmbeddedCluster`` (pure Python, in process) and ``ApacheKafkaCluster`` (real
Apache Kafka KRaft brokers as local ``java`` processes) implement it, so one scenario
runs unchanged on both and the embedded cluster can be held to what real Kafka answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Protocol, Self, runtime_checkable


@runtime_checkable
class Cluster(Protocol):
    """A multi-broker Kafka cluster that a test can drive into unclean elections."""

    @property
    def bootstrap_servers(self) -> str:
        """``host:port,host:port`` of the brokers that are running."""
        ...

    @property
    def all_bootstrap_servers(self) -> str:
        """Every broker, running or stopped: for clients that must outlive the brokers now up."""
        ...

    @property
    def broker_ids(self) -> list[int]:
        """Every broker id of the cluster, running or stopped."""
        ...

    @property
    def running_broker_ids(self) -> list[int]: ...

    def broker_address(self, broker_id: int) -> str:
        """``host:port`` of one broker's listener."""
        ...

    def is_running(self, broker_id: int) -> bool: ...

    def start(self) -> Self: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, str] | None = None,
    ) -> None: ...

    def delete_topic(self, name: str) -> None: ...

    def leader(self, topic: str, partition: int) -> int | None:
        """Broker id of the current leader, None when the partition has none."""
        ...

    def leader_epoch(self, topic: str, partition: int) -> int: ...

    def replicas(self, topic: str, partition: int) -> list[int]: ...

    def isr(self, topic: str, partition: int) -> list[int]: ...

    def log_end_offset(self, topic: str, partition: int, broker: int | None = None) -> int:
        """Log end offset of the leader's log, or of ``broker``'s replica."""
        ...

    def epoch_cache(self, topic: str, partition: int, broker: int) -> list[tuple[int, int]]:
        """``[(epoch, start_offset), ...]`` of ``broker``'s replica: its leader-epoch cache."""
        ...

    def stop_broker(self, broker_id: int, *, controlled: bool = ...) -> None:
        """Stop a broker: ``controlled`` moves its leaderships away first (Kafka's controlled
        shutdown), otherwise it is killed; each cluster keeps its own default."""
        ...

    def start_broker(self, broker_id: int) -> None: ...

    def elect_leader(
        self, topic: str, partition: int, broker_id: int, unclean: bool = False
    ) -> None: ...

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None: ...
