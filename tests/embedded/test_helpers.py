"""epochguard.testing.produce / wait_until, the helpers scenarios share."""

from __future__ import annotations

import pytest

from epochguard.testing import EmbeddedCluster, WaitTimeout, produce, recreate_topic, wait_until


def test_produce_writes_one_batch_per_value_in_order(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("h", partitions=2, replication_factor=2)
    produce(cluster, "h", ["a", b"b", "c"], partition=1)
    assert [v for _o, _k, v in cluster.read_records("h", 1)] == [b"a", b"b", b"c"]
    leader = cluster.leader("h", 1)
    assert leader is not None
    assert [(first, last) for first, last, _e in cluster.replica_log("h", 1, leader).batches] == [
        (0, 0),
        (1, 1),
        (2, 2),
    ]
    assert cluster.read_records("h", 0) == []


def test_wait_until_returns_the_value_and_names_what_it_waited_for() -> None:
    calls = iter([None, False, 7])
    assert wait_until("seven", lambda: next(calls), timeout=5, interval=0.01) == 7

    def failing() -> int:
        raise RuntimeError("not yet")

    with pytest.raises(WaitTimeout, match=r"waiting for the thing \(last error: RuntimeError"):
        wait_until("the thing", failing, timeout=0.05, interval=0.01)


def test_recreate_topic_gives_a_new_topic_id_and_an_empty_log(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("r", replication_factor=2)
    produce(cluster, "r", ["old"])
    old_id = cluster.topic_id("r")
    leader = recreate_topic(cluster, "r", replication_factor=2)
    assert leader == cluster.leader("r", 0)
    assert cluster.topic_id("r") != old_id and cluster.read_records("r", 0) == []
