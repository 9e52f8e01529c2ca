"""epochguard.testing: clusters for tests (``EmbeddedCluster``, ``ApacheKafkaCluster``) and the
``Cluster`` protocol."""

from epochguard.testing.apache_kafka import ApacheKafkaCluster
from epochguard.testing.cluster import Cluster
from epochguard.testing.embedded.cluster import EmbeddedCluster, EmbeddedClusterError, ReplicaLog

__all__ = ["ApacheKafkaCluster", "Cluster", "EmbeddedCluster", "EmbeddedClusterError", "ReplicaLog"]
