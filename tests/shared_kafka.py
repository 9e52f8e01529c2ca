"""One real Kafka cluster (three brokers) for the test modules that need no special one.

Starting three brokers costs about 12 s and 25 CPU-seconds on the 2-core CI machine; the
modules of tests/apache_kafka and the real-Kafka runs of tests/scenarios used to start one
each. They now share one per test process (``shared_apache_cluster``, session scope), and
each module takes it through :func:`module_share`, which gives it back as the module found
it: every broker running, and the topics the module created deleted (a topic's committed
offsets go with it), so names may repeat across modules. Modules that need their own
brokers (security, racks, telemetry, fault proxies, a single broker) still start them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from epochguard.testing import Cluster
from epochguard.testing.apache_kafka import ApacheKafkaCluster


def start_together(cluster: Cluster, broker_ids: list[int]) -> None:
    """Start the stopped ``broker_ids``: real Kafka brokers side by side (a JVM boots in
    seconds), embedded ones one after the other."""
    if isinstance(cluster, ApacheKafkaCluster):
        if broker_ids:
            cluster.start_brokers(*broker_ids)
        return
    for broker_id in broker_ids:
        cluster.start_broker(broker_id)


def start_stopped(cluster: Cluster) -> None:
    """Every broker of ``cluster`` running again."""
    start_together(cluster, [b for b in cluster.broker_ids if not cluster.is_running(b)])


def _all_running(cluster: ApacheKafkaCluster) -> None:
    start_stopped(cluster)


@contextlib.contextmanager
def module_share(cluster: ApacheKafkaCluster) -> Iterator[ApacheKafkaCluster]:
    """``cluster`` for one module, given back with every broker running and the module's
    topics deleted."""
    _all_running(cluster)
    before = cluster.topic_names()
    try:
        yield cluster
    finally:
        _all_running(cluster)
        for topic in sorted(cluster.topic_names() - before):
            cluster.delete_topic(topic)
