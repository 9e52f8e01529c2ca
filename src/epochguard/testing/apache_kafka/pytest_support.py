"""Helpers for pytest suites that run against ApacheKafkaCluster (imported by conftest files).

The skip rule lives here once: without java/javac/mvn, or when Maven cannot resolve the jars,
real-Kafka tests skip with a message naming what is missing; in CI
(``EPOCHGUARD_REQUIRE_REAL_KAFKA=1`` or ``CI=true``) they fail instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from epochguard.testing.apache_kafka.cluster import ApacheKafkaCluster
from epochguard.testing.apache_kafka.jars import (
    KafkaJars,
    KafkaUnavailableError,
    ensure_kafka_jars,
    ensure_probe_classes,
    missing_tools,
    real_kafka_required,
)


def _unavailable(reason: str) -> None:
    if real_kafka_required():
        pytest.fail(f"real Apache Kafka required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(f"real Apache Kafka unavailable: {reason}")


def require_real_kafka() -> KafkaJars:
    """The resolved jars (probe compiled), or skip/fail the calling test by the rule above."""
    missing = missing_tools()
    if missing:
        _unavailable(f"{', '.join(missing)} not installed")
    try:
        jars = ensure_kafka_jars()
        ensure_probe_classes(jars)
    except KafkaUnavailableError as exc:
        _unavailable(str(exc))
    return jars


def record_report(item: pytest.Item, report: pytest.TestReport) -> None:
    """Keep each phase's report on the item (call from ``pytest_runtest_makereport``)."""
    setattr(item, f"report_{report.when}", report)


def _clusters(node: pytest.Item) -> Iterator[ApacheKafkaCluster]:
    seen: set[int] = set()
    for value in getattr(node, "funcargs", {}).values():
        if isinstance(value, ApacheKafkaCluster) and id(value) not in seen:
            seen.add(id(value))
            yield value


def archive_logs_if_failed(node: pytest.Item, archive: Path) -> None:
    """Copy the logs of every ApacheKafkaCluster the test used to ``archive/<test id>``."""
    failed = any(
        getattr(getattr(node, f"report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )
    if failed:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", node.nodeid)
        for index, cluster in enumerate(_clusters(node)):
            cluster.copy_logs(archive / name / f"cluster-{index}")
