"""How ``pytest -n N --dist loadgroup --no-loadscope-reorder`` (``make test``) shares the tests out.

Four lanes, each run by one worker from start to end, so that the long JVM work overlaps
instead of queueing: every test that starts Spark is one unit of work ("lane-spark"); the
real-Kafka runs of the scenario suite are another ("lane-kafka-scenarios"); the modules of
tests/apache_kafka that start brokers of their own a third ("lane-kafka-own-brokers"), and
every other test that starts a JVM (real Kafka brokers, the Java client) a fourth ("lane-
kafka"). The lanes with real Kafka modules on a shared cluster each have their own (the
cluster is per worker). A worker takes further units only once its own is nearly done, so
the workers that finish their lane first run the tests that need no Java, one test module
per unit. The builds from the source tree (the install matrix, the wheel:
tests/test_install.py and tests/test_packaging.py) share a group of their own ("builds-
from-the-source-tree"), so no two builds run at once.

Each test module is one unit of work, so a module-scoped fixture (an EmbeddedCluster) starts
once, on the one worker that runs the module. A module whose cluster fixture
(``module_cluster``, ``rack_cluster``) is parametrised over clusters (tests/scenarios) is one
unit per cluster, and those units can run at the same time on several workers (its
real-Kafka unit joins lane-kafka-scenarios). A module marked ``independent`` (its tests
share no fixture beyond one test) lets each test be its own unit.

Units start longest first (the lanes, then modules marked ``slow``, then the rest), so the
run does not end on one worker still busy with a long module while the others idle. Within
a lane, the modules that run on the worker's shared real Kafka cluster come first, so it
can stop when they are done (tests/shared_kafka.py).
"""

from __future__ import annotations

import pytest

from . import shared_kafka
from .jvm_markers import JVM_FIXTURES, JVM_MARKERS

#: The lanes (see above), and the explicit groups that join one.
SPARK_LANE, KAFKA_LANE = "lane-spark", "lane-kafka"
#: The real-Kafka modules of tests/apache_kafka that start brokers of their own (fault
#: proxies, security, telemetry): no shared cluster, so they need not wait for lane-kafka.
KAFKA_OWN_BROKERS_LANE = "lane-kafka-own-brokers"
#: The real-Kafka runs of the scenario suite: a lane of their own, with a cluster of their own
#: (the session's shared cluster is per worker), beside tests/apache_kafka's.
KAFKA_SCENARIOS_LANE = "lane-kafka-scenarios"


def _lane(item: pytest.Item, modules_on_shared: frozenset[str]) -> str | None:
    # Markers, and the fixtures that start a JVM: some directories mark their tests in a
    # conftest hook that may run after this one (tests/jvm_markers.py checks they agree).
    needs = {JVM_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in JVM_FIXTURES}
    needs.update(m for m in JVM_MARKERS if item.get_closest_marker(m) is not None)
    if "spark" in needs:
        return SPARK_LANE
    if needs:
        if item.nodeid.startswith("tests/scenarios/"):
            return KAFKA_SCENARIOS_LANE
        if shared_kafka.module(item) not in modules_on_shared:
            return KAFKA_OWN_BROKERS_LANE
        return KAFKA_LANE
    return None


def _group(item: pytest.Item, modules_on_shared: frozenset[str]) -> str:
    lane = _lane(item, modules_on_shared)
    if lane is not None:
        return lane
    if item.get_closest_marker("independent") is not None:
        return item.nodeid
    # A module-scoped cluster fixture parametrised over clusters: one unit per cluster.
    return shared_kafka.unit(item)


def _weight(item: pytest.Item) -> int:
    if any(item.get_closest_marker(m) is not None for m in JVM_MARKERS):
        return 0
    if item.get_closest_marker("slow") is not None:
        return 1
    return 2


def _group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    assert marker is not None
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Before xdist's own hook, which turns the xdist_group marker into the "@group" suffix of
    # the node id that loadgroup distributes by.
    modules_on_shared = frozenset(
        shared_kafka.module(item) for item in items if shared_kafka.uses_shared_cluster(item)
    )
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item, modules_on_shared)))


def check_groups_applied(config: pytest.Config, ids: list[str]) -> None:
    """On the controller of ``--dist loadgroup``, the node ids a worker collected: each test's
    group must have become its id's "@group" suffix, or xdist shares the tests out one by one
    and every lane runs on every worker (each starting its own brokers and Spark), with no
    error. tests/conftest.py calls it for each worker."""
    if config.getvalue("dist") != "loadgroup":
        return
    # Every test has a group here (its lane, module or own id), and xdist tags all or none.
    if ids and not any("@" in i for i in ids):
        raise pytest.UsageError(
            f"pytest-xdist applied no xdist_group to the {len(ids)} tests collected (the "
            f"first: {ids[0]}); pytest {pytest.__version__} with this pytest-xdist ignores "
            "groups (pytest-dev/pytest-xdist#1386): install the versions pyproject.toml names"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    # After every conftest has added its markers (tests/apache_kafka marks its tests
    # real_kafka), before xdist's own hook sends the order to the controller.
    items = session.items
    weight: dict[str, int] = {}
    first: dict[str, int] = {}
    first_of_unit: dict[str, int] = {}
    on_shared: set[str] = set()
    for index, item in enumerate(items):
        group = _group_of(item)
        weight[group] = min(weight.get(group, 2), _weight(item))
        first.setdefault(group, index)
        unit = shared_kafka.unit(item)
        first_of_unit.setdefault(unit, index)
        if shared_kafka.uses_shared_cluster(item):
            on_shared.add(unit)

    def order(item: pytest.Item) -> tuple[int, int, bool, int]:
        group, unit = _group_of(item), shared_kafka.unit(item)
        # In a lane, the modules on the shared cluster first: it stops after the last.
        return (weight[group], first[group], unit not in on_shared, first_of_unit[unit])

    # Stable: a module's tests keep their order (and so its fixtures' scopes).
    items.sort(key=order)
