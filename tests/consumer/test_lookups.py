"""Offset lookups (end_offsets & co.) against the embedded cluster."""

from __future__ import annotations

from epochguard.testing import EmbeddedCluster

from .conftest import TP0, make_consumer

LIST_OFFSETS, METADATA = 2, 3


def _seen(cluster: EmbeddedCluster, api_key: int) -> int:
    return sum(n for (key, _version), n in cluster.requests_seen().items() if key == api_key)


def test_a_lookup_with_stale_epoch_0_is_fenced_and_refreshes_metadata(
    cluster: EmbeddedCluster,
) -> None:
    """The consumer knows the leader at epoch 0; the same broker leads again at epoch 2.
    The lookup must carry epoch 0 (not -1, "unknown"), so the leader fences it and the
    consumer refreshes its metadata before asking again."""
    cluster.create_topic("t", replication_factor=2)
    first, second = cluster.replicas("t", 0)[:2]
    cluster.append("t", 0, [b"x"] * 5)
    consumer = make_consumer(cluster, metadata_max_age_ms=600_000)
    try:
        assert consumer.end_offsets([TP0]) == {TP0: 5}
        assert cluster.leader("t", 0) == first and cluster.leader_epoch("t", 0) == 0
        cluster.elect_leader("t", 0, second)
        cluster.elect_leader("t", 0, first)
        cluster.settle()
        assert cluster.leader("t", 0) == first and cluster.leader_epoch("t", 0) == 2
        lookups, refreshes = _seen(cluster, LIST_OFFSETS), _seen(cluster, METADATA)
        assert consumer.end_offsets([TP0]) == {TP0: 5}
        assert _seen(cluster, LIST_OFFSETS) - lookups == 2  # fenced at epoch 0, then at 2
        assert _seen(cluster, METADATA) > refreshes
    finally:
        consumer.close()
