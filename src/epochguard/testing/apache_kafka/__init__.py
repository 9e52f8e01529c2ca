"""Real Apache Kafka (KRaft) brokers from Maven Central jars, for tests."""

from __future__ import annotations

from epochguard.testing.apache_kafka.cluster import (
    ApacheKafkaCluster,
    ClusterError,
    ClusterTimeoutError,
    ElectionError,
    EpochEndOffset,
    OffsetAndEpoch,
    PartitionState,
)
from epochguard.testing.apache_kafka.group_member import (
    JavaCommit,
    JavaException,
    JavaGroupMember,
    JavaMemberConfigError,
    JavaPoll,
    JavaRebalance,
    JavaRecord,
)
from epochguard.testing.apache_kafka.jars import (
    KafkaJars,
    KafkaUnavailableError,
    ensure_kafka_jars,
    missing_tools,
    real_kafka_required,
)
from epochguard.testing.apache_kafka.probe import JavaTruncationProbe, ProbeError
from epochguard.testing.telemetry import TelemetryPush, read_telemetry_pushes

__all__ = [
    "ApacheKafkaCluster",
    "ClusterError",
    "ClusterTimeoutError",
    "ElectionError",
    "EpochEndOffset",
    "JavaCommit",
    "JavaException",
    "JavaGroupMember",
    "JavaMemberConfigError",
    "JavaPoll",
    "JavaRebalance",
    "JavaRecord",
    "JavaTruncationProbe",
    "KafkaJars",
    "KafkaUnavailableError",
    "OffsetAndEpoch",
    "PartitionState",
    "ProbeError",
    "TelemetryPush",
    "ensure_kafka_jars",
    "missing_tools",
    "read_telemetry_pushes",
    "real_kafka_required",
]
