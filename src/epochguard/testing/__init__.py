"""epochguard.testing: test clusters and the ``Cluster`` protocol that scenarios use.

``EmbeddedCluster`` is a pure-Python multi-broker cluster in this process;
``ApacheKafkaCluster`` runs real Apache Kafka KRaft brokers as local ``java`` processes.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epochguard.testing.apache_kafka import ApacheKafkaCluster
    from epochguard.testing.cluster import Cluster
    from epochguard.testing.embedded.cluster import (
        EmbeddedCluster,
        EmbeddedClusterError,
        ReplicaLog,
    )
    from epochguard.testing.helpers import WaitTimeout, produce, recreate_topic, wait_until

#: Each name's module, imported on first use: ``epochguard cluster-ctl`` and the Spark
#: source's workers import parts of this package without paying for all of it.
_LAZY = {
    "ApacheKafkaCluster": "epochguard.testing.apache_kafka",
    "Cluster": "epochguard.testing.cluster",
    "EmbeddedCluster": "epochguard.testing.embedded.cluster",
    "EmbeddedClusterError": "epochguard.testing.embedded.cluster",
    "ReplicaLog": "epochguard.testing.embedded.cluster",
    "WaitTimeout": "epochguard.testing.helpers",
    "produce": "epochguard.testing.helpers",
    "recreate_topic": "epochguard.testing.helpers",
    "wait_until": "epochguard.testing.helpers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
