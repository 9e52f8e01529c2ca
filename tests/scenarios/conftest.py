"""One scenario, two clusters: real Apache Kafka (the reference) and the EmbeddedCluster.

``cluster`` is parametrised over both; the Apache parameter follows the real-Kafka skip rule
(skip without Java/Maven, fail in CI). Broker ids are 0..2 on both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from epochguard.testing import Cluster, EmbeddedCluster
from epochguard.testing.apache_kafka.pytest_support import (
    archive_logs_if_failed,
    record_report,
    require_real_kafka,
)
from epochguard.testing.franzgo import (
    GoProbeUnavailableError,
    ensure_go_probe,
    go_missing,
    go_probe_required,
)

from ..shared_kafka import module_share, start_stopped
from . import epoch_subjects
from .summary import write_summary

ROOT = Path(__file__).resolve().parents[2]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    record_report(item, report)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every run that recorded scenario results refreshes build/scenarios/summary.md.

    Under pytest-xdist only the controller writes it, once every worker has finished."""
    if hasattr(session.config, "workerinput"):
        return
    write_summary(ROOT / "build" / "scenarios")


@pytest.fixture(autouse=True)
def _keep_kafka_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    archive_logs_if_failed(request.node, ROOT / "build" / "kafka-logs")


CLUSTERS = ["embedded", pytest.param("apache", marks=[pytest.mark.real_kafka, pytest.mark.slow])]
#: The scenarios of EpochConsumer subjects also run on the asyncio driver (AIOEpochConsumer),
#: on the EmbeddedCluster, and on an EmbeddedCluster with Raft-term epochs (Redpanda's rules,
#: ``epochs="raft"``), where each scenario loses its records the Raft way.
CLUSTERS_AND_DRIVERS = [*CLUSTERS, "embedded-asyncio", "embedded-raft"]


@contextlib.contextmanager
def scenario_cluster(name: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The module's cluster: the process's shared real Kafka cluster for "apache" (given back
    as the module found it, tests/shared_kafka.py), else an EmbeddedCluster of its own. The
    fixtures that call it are named ``module_cluster``: tests/shared_kafka.py finds the
    modules that run on the shared cluster by that name."""
    if name == "apache":
        require_real_kafka()
        with module_share(request.getfixturevalue("shared_apache_cluster")) as shared:
            yield shared
        return
    epochs = "raft" if name == "embedded-raft" else "kafka"
    cluster = EmbeddedCluster(brokers=3, first_broker_id=0, epochs=epochs)
    driver = epoch_subjects.DRIVER
    if name.endswith("-asyncio"):
        epoch_subjects.DRIVER = "asyncio"
    try:
        with cluster:
            yield cluster
    finally:
        epoch_subjects.DRIVER = driver


@pytest.fixture(scope="module", params=CLUSTERS)
def module_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with scenario_cluster(request.param, request) as cluster:
        yield cluster


@pytest.fixture
def cluster(module_cluster: Cluster) -> Iterator[Cluster]:
    """The module's cluster, every broker running again after the test."""
    yield module_cluster
    start_stopped(module_cluster)


@pytest.fixture(scope="session")
def franzgo_probe() -> Path | None:
    """The franz-go probe binary (``make go-probe``), or None where Go is missing: the
    scenarios then go on without franz-go, except in CI, where a missing Go fails the test."""
    if go_missing() and not go_probe_required():
        return None
    try:
        return ensure_go_probe()
    except GoProbeUnavailableError as exc:
        pytest.fail(f"the franz-go probe is required but unavailable: {exc}", pytrace=False)
