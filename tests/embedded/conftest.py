from __future__ import annotations

from collections.abc import Iterator

import pytest

from epochguard.testing import EmbeddedCluster


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=3) as c:
        yield c
