"""epochguard.testing"""

from epochguard.testing.apache_kafka import ApacheKafkaCluster
from epochguard.testing.cluster import Cluster

__all__ = ["ApacheKafkaCluster", "Cluster"]
