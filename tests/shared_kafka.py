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

from epochguard.testing.apache_kafka import ApacheKafkaCluster


def _all_running(cluster: ApacheKafkaCluster) -> None:
    for broker_id in cluster.broker_ids:
        if not cluster.is_running(broker_id):
            cluster.start_broker(broker_id)


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
