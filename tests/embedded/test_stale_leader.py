"""A broker that learns about a new leader late keeps acting as the old leader."""

from __future__ import annotations

import pytest

from epochguard.testing import EmbeddedCluster

from .test_protocol import fetch

pytestmark = pytest.mark.timeout(30)

UNKNOWN_LEADER_EPOCH = 75


def test_stale_leader_serves_old_epoch_then_truncates(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=3)
    old, new, third = cluster.replicas("t", 0)
    cluster.append("t", 0, [b"%d" % i for i in range(10)])
    cluster.set_metadata_delay(old, 0.5)
    cluster.elect_leader("t", 0, new)  # clean, epoch 1; the old leader does not know yet

    # The stale leader still answers as leader of epoch 0 and fences newer clients.
    (p,) = fetch(cluster, old, "t", [(0, 1, 0, -1)])
    assert p.error_code == UNKNOWN_LEADER_EPOCH
    (p,) = fetch(cluster, old, "t", [(0, 0, 0, -1)])
    assert p.error_code == 0 and p.high_watermark == 10
    # A producer with stale metadata writes to it; nobody replicates that.
    cluster.call(
        lambda: cluster.state.append(cluster.state.partition("t", 0), old, _batch(b"stale"), 0)
    )
    assert cluster.log_end_offset("t", 0, old) == 11
    cluster.append("t", 0, [b"new-1", b"new-2"])
    # The high watermark waits for the ISR member that is not following yet.
    assert cluster.high_watermark("t", 0) == 10
    assert cluster.log_end_offset("t", 0, third) == 12

    view = cluster.broker_view("t", 0, old)
    assert view is not None and (view.leader, view.leader_epoch) == (old, 0)
    cluster.settle()
    view = cluster.broker_view("t", 0, old)
    assert view is not None and (view.leader, view.leader_epoch) == (new, 1)
    a, b = cluster.replica_log("t", 0, old), cluster.replica_log("t", 0, new)
    assert a.batches == b.batches and a.log_end_offset == 12
    assert [v for _, _, v in cluster.read_records("t", 0, old)][10:] == [b"new-1", b"new-2"]
    assert cluster.high_watermark("t", 0) == 12


def _batch(value: bytes) -> bytes:
    from epochguard.testing.embedded.records import build_batch

    return build_batch([value])


@pytest.mark.parametrize("epochs", ["kafka", "raft"])
def test_a_restarted_broker_never_learns_metadata_sent_before_its_stop(epochs: str) -> None:
    """Found by the Raft-term chaos runs (seed 888): an image sent to a broker with late
    metadata before it stopped arrived after its restart, in which it still led under the
    old epoch; it answered as that leader from the log its power cut left, and a consumer
    was told of a loss down to the log start."""
    import time

    with EmbeddedCluster(brokers=3, epochs=epochs) as cluster:
        cluster.create_topic("t", replication_factor=3)
        leader = cluster.leader("t", 0)
        assert leader is not None
        other = next(b for b in cluster.replicas("t", 0) if b != leader)
        cluster.append("t", 0, [b"a", b"b"])
        cluster.set_metadata_delay(leader, 0.4)
        cluster.elect_leader("t", 0, leader)  # a new epoch, on its way to the leader
        time.sleep(0.2)
        cluster.stop_broker(leader)
        cluster.start_broker(leader)
        cluster.elect_leader("t", 0, other)
        # The image sent before the stop is due 0.2 s before those of the new run.
        deadline = time.monotonic() + 0.8
        while time.monotonic() < deadline:
            view = cluster.broker_view("t", 0, leader)
            assert view is None or view.leader != leader, view
            time.sleep(0.02)
        cluster.settle()
        view = cluster.broker_view("t", 0, leader)
        assert view is not None and view.leader == other
