"""Fixtures for tests against real Apache Kafka brokers.

Skip rule: without java/javac/mvn (or when Maven cannot resolve the jars) these tests skip with
a message naming what is missing, except in CI (``EPOCHGUARD_REQUIRE_REAL_KAFKA=1`` or
``CI=true``), where they fail instead. A failed test's broker logs are copied to
``build/kafka-logs/<test>``.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from epochguard.testing.apache_kafka import (
    ApacheKafkaCluster,
    KafkaJars,
    KafkaUnavailableError,
    ensure_kafka_jars,
    missing_tools,
    real_kafka_required,
)
from epochguard.testing.apache_kafka.jars import ensure_probe_classes

ROOT = Path(__file__).resolve().parents[2]
LOG_ARCHIVE = ROOT / "build" / "kafka-logs"
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real_kafka)


def _unavailable(reason: str) -> None:
    if real_kafka_required():
        pytest.fail(f"real Apache Kafka required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(f"real Apache Kafka unavailable: {reason}")


@pytest.fixture(scope="session")
def kafka_jars() -> KafkaJars:
    missing = missing_tools()
    if missing:
        _unavailable(f"{', '.join(missing)} not installed")
    try:
        jars = ensure_kafka_jars()
        ensure_probe_classes(jars)
    except KafkaUnavailableError as exc:
        _unavailable(str(exc))
    return jars


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _clusters(request: pytest.FixtureRequest) -> Iterator[ApacheKafkaCluster]:
    seen: set[int] = set()
    for value in getattr(request.node, "funcargs", {}).values():
        if isinstance(value, ApacheKafkaCluster) and id(value) not in seen:
            seen.add(id(value))
            yield value


@pytest.fixture(autouse=True)
def _keep_kafka_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    failed = any(
        getattr(getattr(request.node, f"report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )
    if failed:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
        for index, cluster in enumerate(_clusters(request)):
            cluster.copy_logs(LOG_ARCHIVE / name / f"cluster-{index}")


@pytest.fixture(scope="module")
def module_cluster(kafka_jars: KafkaJars) -> Iterator[ApacheKafkaCluster]:
    """Three brokers shared by one test module (start-up is the expensive part)."""
    with ApacheKafkaCluster(num_brokers=3, jars=kafka_jars) as cluster:
        yield cluster


@pytest.fixture
def cluster(module_cluster: ApacheKafkaCluster) -> Iterator[ApacheKafkaCluster]:
    """The module's cluster, with every broker running again after the test."""
    yield module_cluster
    for broker_id in module_cluster.broker_ids:
        if broker_id not in module_cluster.running_broker_ids:
            module_cluster.start_broker(broker_id)
