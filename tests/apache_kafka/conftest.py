"""Fixtures for tests against real Apache Kafka brokers.

Skip rule (``epochguard.testing.apache_kafka.pytest_support``): without java/javac/mvn these
tests skip naming what is missing, but fail in CI (``EPOCHGUARD_REQUIRE_REAL_KAFKA=1`` or
``CI=true``). A failed test's broker logs are copied to ``build/kafka-logs/<test>``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from epochguard.testing.apache_kafka import ApacheKafkaCluster, KafkaJars
from epochguard.testing.apache_kafka.pytest_support import (
    archive_logs_if_failed,
    record_report,
    require_real_kafka,
)

from ..shared_kafka import module_share

ROOT = Path(__file__).resolve().parents[2]
LOG_ARCHIVE = ROOT / "build" / "kafka-logs"
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real_kafka)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    record_report(item, report)
    return report


@pytest.fixture(autouse=True)
def _keep_kafka_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    archive_logs_if_failed(request.node, LOG_ARCHIVE)


@pytest.fixture(scope="session")
def kafka_jars() -> KafkaJars:
    return require_real_kafka()


@pytest.fixture(scope="module")
def module_cluster(
    kafka_jars: KafkaJars, shared_apache_cluster: ApacheKafkaCluster
) -> Iterator[ApacheKafkaCluster]:
    """Three brokers for the module: the process's shared cluster (start-up is the expensive
    part), given back with every broker running and the module's topics deleted."""
    with module_share(shared_apache_cluster) as cluster:
        yield cluster


@pytest.fixture
def cluster(module_cluster: ApacheKafkaCluster) -> Iterator[ApacheKafkaCluster]:
    """The module's cluster, with every broker running again after the test."""
    yield module_cluster
    stopped = [b for b in module_cluster.broker_ids if not module_cluster.is_running(b)]
    if stopped:
        module_cluster.start_brokers(*stopped)
