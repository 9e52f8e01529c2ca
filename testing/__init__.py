"""epochguard.testing: clusters for tests (``EmbeddedCluster``) and the ``Cluster`` protocol."""

from epochguard.testing.cluster import Cluster
from epochguard.testing.embedded.cluster import EmbeddedCluster, EmbeddedClusterError, ReplicaLog

__all__ = ["Cluster", "EmbeddedCluster", "EmbeddedClusterError", "ReplicaLog"]
