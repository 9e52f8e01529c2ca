"""Checks that hold for every test of the run."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from . import jvm_markers, shared_kafka, work_groups

#: Options for the Spark JVMs tests start through spark-submit (every local SparkSession and
#: the Spark Connect server) and for a standalone master and worker. Test JVMs live for
#: seconds to minutes on small data: the optimising compiler and the parallel collector cost
#: more CPU than they give back there (a module of Spark tests took 30 % less CPU without
#: them). Benchmarks run without these options.
SPARK_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: Where the run's Spark home with compiled pyspark zips is built (once per pyspark and
#: Python version, shared by the workers).
_BUILD = Path(__file__).resolve().parent.parent / "build"


def _compiled_spark_home() -> None:
    """Spark for the tests starts from a Spark home whose pyspark zips hold compiled modules
    (``compiled_spark_home``; the installation is left as it is): each streaming query's
    source runner, and each Python daemon, would compile pyspark's sources again otherwise
    (docs/guides/spark.md, "Performance"). Benchmarks measure the zips as shipped.
    ``EPOCHGUARD_TEST_SPARK_ZIPS=shipped`` runs the tests on those too."""
    if os.environ.get("EPOCHGUARD_TEST_SPARK_ZIPS") == "shipped" or "SPARK_HOME" in os.environ:
        return
    try:
        import pyspark
    except ImportError:
        return
    from epochguard.spark_connector.compile_zips import compiled_spark_home

    tag = f"pyspark-{pyspark.__version__}-py{sys.version_info.major}{sys.version_info.minor}"
    home = _BUILD / f"spark-home-{tag}"
    _BUILD.mkdir(exist_ok=True)
    with open(_BUILD / f".spark-home-{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker builds it, the others wait for it
        if not home.joinpath(".built").exists():
            shutil.rmtree(home, ignore_errors=True)
            compiled_spark_home(home)
            home.joinpath(".built").touch()
    os.environ["SPARK_HOME"] = str(home)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(jvm_markers, "epochguard-jvm-markers")
    config.pluginmanager.register(work_groups, "epochguard-work-groups")
    config.pluginmanager.register(shared_kafka, "epochguard-shared-kafka")
    os.environ.setdefault("SPARK_SUBMIT_OPTS", SPARK_TEST_JVM_OPTIONS)
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", SPARK_TEST_JVM_OPTIONS)
    _compiled_spark_home()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    work_groups.check_groups_applied(node.config, ids)


# `make test` (and so CI) replays the same hypothesis examples on every run: its verdict
# depends on the code alone, and a counterexample found at random cannot block an unrelated
# change. Exploration is its own run: EPOCHGUARD_HYPOTHESIS=explore draws new examples
# (`make fuzz` and `make explore` set it); every counterexample found there is kept as an
# @example next to its property.
settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("EPOCHGUARD_HYPOTHESIS", "repeatable"))


@pytest.fixture
def empty_pool() -> Iterator[None]:
    """Closes the consumers the Spark source's executor side pooled in this process (they
    outlive the test that made them)."""
    yield
    from epochguard.spark_connector import executor

    for consumers in executor._POOL.values():
        for c in consumers:
            c.close(autocommit=False)
    executor._POOL.clear()
