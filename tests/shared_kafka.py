"""One real Kafka cluster (three brokers) for the test modules that need no special one.

Starting three brokers costs seconds and CPU on the 2-core CI machine, so the modules of
tests/apache_kafka and the real-Kafka runs of tests/scenarios share one per test process
(``shared_apache_cluster``). Each module takes it through :func:`module_share`, which gives
it back as the module found it: every broker running, and the topics the module created
deleted (a topic's committed offsets go with it), so names may repeat across modules.
Modules that need their own brokers (security, racks, telemetry, fault proxies, a single
broker) still start them.

An idle three-broker cluster still uses about a fifth of a core (heartbeats, replica and
metadata fetches), so the cluster does not wait for the end of the session: it stops as soon
as the next test's module does not run on it (:func:`pytest_runtest_teardown`), and starts
again if a later module needs it. tests/work_groups.py runs a lane's modules that use it
before those that start their own brokers, so it starts once per lane.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from epochguard.testing import Cluster
from epochguard.testing.apache_kafka import ApacheKafkaCluster

FIXTURE = "shared_apache_cluster"


class _SharedCluster:
    """The process's shared cluster, started when a module first asks for it."""

    def __init__(self) -> None:
        self._cluster: ApacheKafkaCluster | None = None

    def get(self) -> ApacheKafkaCluster:
        if self._cluster is None:
            from epochguard.testing.apache_kafka.pytest_support import require_real_kafka

            self._cluster = ApacheKafkaCluster(brokers=3, jars=require_real_kafka()).start()
        return self._cluster

    def close(self) -> None:
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.close()


_SHARED = _SharedCluster()


@pytest.fixture(scope="module")
def shared_apache_cluster() -> ApacheKafkaCluster:
    """Three real Kafka brokers shared by the modules of this test process that need no
    special cluster; take it through :func:`module_share`."""
    return _SHARED.get()


def uses_shared_cluster(item: pytest.Item) -> bool:
    """Whether the test runs on the shared cluster: it asks for the fixture, or it is a
    scenario on the "apache" module cluster, which takes the fixture by name
    (tests/scenarios/conftest.py)."""
    if FIXTURE in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return (
        item.nodeid.startswith("tests/scenarios/")
        and callspec is not None
        and callspec.params.get("module_cluster") == "apache"
    )


def unit(item: pytest.Item) -> str:
    """The module, and the clusters its module-scoped fixtures are parametrised over: what
    sets up and tears down the shared cluster's module fixtures together."""
    group = item.nodeid.split("::", 1)[0]
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        clusters = [str(v) for k, v in sorted(callspec.params.items()) if k.endswith("_cluster")]
        if clusters:
            group += f"[{'-'.join(clusters)}]"
    return group


_UNITS_ON_SHARED = pytest.StashKey[frozenset[str]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_UNITS_ON_SHARED] = frozenset(
        unit(item) for item in session.items if uses_shared_cluster(item)
    )


def module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # trylast: after pytest tore down the module fixtures the next test does not share, which
    # give the cluster back. Within a module a fixture parametrised over clusters is torn down
    # only as the next test sets up, so the cluster stops at the next change of module.
    if nextitem is None:
        _SHARED.close()
        return
    on_shared = item.config.stash.get(_UNITS_ON_SHARED, frozenset())
    if unit(nextitem) not in on_shared and module(nextitem) != module(item):
        _SHARED.close()


def pytest_sessionfinish() -> None:
    _SHARED.close()


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
