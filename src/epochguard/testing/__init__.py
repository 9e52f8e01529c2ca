"""epochguard.testing: test clusters and the ``Cluster`` protocol that scenarios use.

``EmbeddedCluster`` is a pure-Python multi-broker cluster in this process;
``ApacheKafkaCluster`` runs real Apache Kafka KRaft brokers as local ``java`` processes.
"""

from typing import TYPE_CHECKING

from epochguard.testing.apache_kafka import ApacheKafkaCluster
from epochguard.testing.cluster import Cluster
from epochguard.testing.embedded.cluster import EmbeddedCluster, EmbeddedClusterError, ReplicaLog
from epochguard.testing.helpers import WaitTimeout, produce, recreate_topic, wait_until

__all__ = [
    "ApacheKafkaCluster",
    "Cluster",
    "EmbeddedCluster",
    "EmbeddedClusterError",
    "ReplicaLog",
    "WaitTimeout",
    "produce",
    "recreate_topic",
    "wait_until",
]

if TYPE_CHECKING:
    # mypy proves both clusters satisfy the protocol scenarios are written against.
    def _both_are_clusters(e: EmbeddedCluster, a: ApacheKafkaCluster) -> tuple[Cluster, Cluster]:
        return e, a
