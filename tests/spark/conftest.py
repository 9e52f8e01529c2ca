"""The EmbeddedCluster the Spark tests read from.

``cluster`` is a fresh two-broker cluster per test. A module whose tests each use their own
topics marks itself ``pytestmark = pytest.mark.shared_cluster`` to share one cluster per
module instead (starting one per test is what that saves).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epochguard.testing import EmbeddedCluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "shared_cluster: the module's tests share one EmbeddedCluster"
    )


@pytest.fixture(scope="module")
def module_cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=2) as c:
        yield c


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    if request.node.get_closest_marker("shared_cluster") is not None:
        shared: EmbeddedCluster = request.getfixturevalue("module_cluster")
        yield shared
        return
    with EmbeddedCluster(brokers=2) as c:
        yield c
