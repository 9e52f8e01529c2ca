"""Every test that starts a JVM says so with a marker, so ``-m "not real_kafka and not spark"``
(``make test-fast``) selects exactly the tests that need no Java. Tests that run the franz-go
probe (a Go program) carry ``go`` the same way, checked the same way.

Two checks keep the markers complete:

- at collection, a test that requests a fixture known to start a JVM (``JVM_FIXTURES``) must
  carry that fixture's marker, or the run stops before any test runs, naming the tests;
- at run time, an audit hook refuses to launch ``java``, ``mvn`` or Spark's launch scripts
  (``JVM_COMMANDS``) while an unmarked test is set up, run or torn down: the test errors,
  naming the command and the marker it lacks.

A JVM launched by a grandchild process (a Python subprocess that starts Java itself) is not
seen by the audit hook; such a test needs its marker all the same.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Sequence
from typing import Any

import pytest

JVM_MARKERS = ("real_kafka", "spark")

#: Fixtures that start a JVM, and the marker a test requesting them must carry.
JVM_FIXTURES = {
    "kafka_jars": "real_kafka",  # real Kafka brokers, the Java probe and group members
    "shared_apache_cluster": "real_kafka",  # tests/shared_kafka.py
    "spark": "spark",  # a SparkSession (py4j gateway JVM)
    "master_url": "spark",  # a Spark standalone master and worker
}

#: Executables that are, or launch, a JVM.
JVM_COMMANDS = frozenset(
    {"java", "javac", "jshell", "mvn", "spark-submit", "spark-class", "pyspark", "spark-shell"}
)

GO_MARKER = "go"
#: Fixtures that build or run the franz-go probe, and the marker a test requesting them needs.
GO_FIXTURES = {"franzgo_probe": GO_MARKER}
#: The Go toolchain and the probe it builds.
GO_COMMANDS = frozenset({"go", "franzgo-probe"})

_current: pytest.Item | None = None


def _launches(executable: Any, args: Any, commands: frozenset[str]) -> str | None:
    candidates: list[Any] = [executable]
    if isinstance(args, (str, bytes, os.PathLike)):
        candidates.append(args)
    elif isinstance(args, Sequence) and args:
        candidates.append(args[0])
    for candidate in candidates:
        if candidate is None:
            continue
        name = os.path.basename(os.fsdecode(candidate).split()[0] if candidate else "")
        if name in commands:
            return name
    return None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or _current is None:
        return
    item = _current
    if item.get_closest_marker(GO_MARKER) is None:
        command = _launches(args[0], args[1], GO_COMMANDS)
        if command is not None:
            raise RuntimeError(
                f"{item.nodeid} runs {command!r} (Go, the franz-go probe) but is not marked "
                f"{GO_MARKER}: mark it so `make test-fast` leaves it out"
            )
    if any(item.get_closest_marker(m) is not None for m in JVM_MARKERS):
        return
    command = _launches(args[0], args[1], JVM_COMMANDS)
    if command is not None:
        raise RuntimeError(
            f"{item.nodeid} launches {command!r} (a JVM) but is marked neither "
            f"{' nor '.join(JVM_MARKERS)}: mark it so `make test-fast` leaves it out"
        )


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_audit)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing: list[str] = []
    for item in items:
        for fixture, marker in {**JVM_FIXTURES, **GO_FIXTURES}.items():
            if fixture in getattr(item, "fixturenames", ()) and not item.get_closest_marker(marker):
                missing.append(f"{item.nodeid} (uses {fixture!r}, needs @pytest.mark.{marker})")
    if missing:
        raise pytest.UsageError(
            "tests that start a JVM or run Go without their marker:\n  " + "\n  ".join(missing)
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    global _current
    _current = item
    try:
        return (yield)
    finally:
        _current = None
