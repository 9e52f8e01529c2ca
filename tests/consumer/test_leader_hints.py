"""KIP-951 on the EmbeddedCluster: a clean leader change reaches the consumer through the
refused Fetch's hint (CurrentLeader, NodeEndpoints), not through a metadata refresh."""

from __future__ import annotations

import pytest

from epochguard.testing import EmbeddedCluster

from .conftest import TP0, make_consumer, read, setup_topic

pytestmark = pytest.mark.timeout(60)


def test_clean_leader_change_moves_through_the_fetch_hint(cluster: EmbeddedCluster) -> None:
    # Metadata is not refreshed on its own during the test: only a refusal can tell.
    with make_consumer(cluster, metadata_max_age_ms=600_000, on_truncation="raise") as c:
        _old, new = setup_topic(cluster)
        c.assign([TP0])
        assert [r.offset for r in read(c, 10)] == list(range(10))
        before = c.metrics(raw=True)
        cluster.elect_leader("t", 0, new)
        cluster.append("t", 0, [b"after-%d" % i for i in range(5)], batch_size=1)
        got = read(c, 5)
        assert [(r.offset, r.leader_epoch) for r in got] == [(10 + i, 1) for i in range(5)]
        after = c.metrics(raw=True)
        assert after["leader_hints_applied"] == before["leader_hints_applied"] + 1
        assert c.truncation_reports() == []
        assert c.position_with_epoch(TP0).leader_epoch == 1
