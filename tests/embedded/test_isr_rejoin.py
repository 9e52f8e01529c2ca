"""A follower joins the ISR after it has caught up, not when it starts (Kafka's
Partition.maybeExpandIsr through AlterPartition), and the ISR and elections keep Kafka's
order: a follower that joins goes last, and the controller elects the first replica of the
assignment that may lead."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epochguard.testing import EmbeddedCluster, EmbeddedClusterError, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def slow_join() -> Iterator[EmbeddedCluster]:
    # A delay long enough that the checks before it are never late.
    with EmbeddedCluster(brokers=3, isr_join_delay_s=1.0) as c:
        yield c


def _stop_follower_and_write(c: EmbeddedCluster) -> int:
    c.create_topic("t", replication_factor=3)
    assert c.replicas("t", 0) == [1, 2, 3] and c.leader("t", 0) == 1
    c.append("t", 0, [b"a", b"b"])
    c.stop_broker(3)
    assert c.isr("t", 0) == [1, 2]
    c.append("t", 0, [b"c", b"d", b"e"])
    return c.log_end_offset("t", 0)


def test_a_restarted_follower_joins_the_isr_after_catching_up(slow_join: EmbeddedCluster) -> None:
    c = slow_join
    end = _stop_follower_and_write(c)
    c.start_broker(3)
    c.settle()
    # It fetched what it missed (replication is in-process), but the leader has not added it.
    assert c.log_end_offset("t", 0, broker=3) == end
    assert c.isr("t", 0) == [1, 2]
    with pytest.raises(EmbeddedClusterError, match="not in the ISR"):
        c.elect_leader("t", 0, 3)
    c.append("t", 0, [b"f"])  # it keeps up meanwhile
    wait_until("broker 3 back in the ISR", lambda: 3 in c.isr("t", 0), timeout=10)
    assert c.isr("t", 0) == [1, 2, 3]
    assert c.high_watermark("t", 0) == end + 1
    c.settle()
    view = c.broker_view("t", 0, 1)
    assert view is not None and view.isr == (1, 2, 3)
    c.elect_leader("t", 0, 3)  # in sync now: cleanly electable
    assert c.leader("t", 0) == 3


def test_a_follower_that_stops_again_before_joining_does_not_join(
    slow_join: EmbeddedCluster,
) -> None:
    c = slow_join
    _stop_follower_and_write(c)
    c.start_broker(3)
    c.stop_broker(3)
    c.start_broker(3)  # a later run: joins a full delay after this start
    c.stop_broker(3)
    wait_until("two delays", lambda: c.call(lambda: not c.state._isr_joins_due), timeout=10)
    assert c.isr("t", 0) == [1, 2]
    c.start_broker(3)
    wait_until("broker 3 back in the ISR", lambda: 3 in c.isr("t", 0), timeout=10)


def test_a_follower_resuming_replication_joins_after_catching_up(
    slow_join: EmbeddedCluster,
) -> None:
    c = slow_join
    c.create_topic("t", replication_factor=3)
    c.pause_replication(2)
    assert c.isr("t", 0) == [1, 3]
    c.append("t", 0, [b"a", b"b"])
    c.resume_replication(2)
    assert c.log_end_offset("t", 0, broker=2) == 2
    assert c.isr("t", 0) == [1, 3]
    wait_until("broker 2 back in the ISR", lambda: c.isr("t", 0) == [1, 3, 2], timeout=10)


def test_with_no_delay_a_restarted_follower_is_in_sync_when_start_broker_returns() -> None:
    with EmbeddedCluster(brokers=3, isr_join_delay_s=0) as c:
        _stop_follower_and_write(c)
        c.start_broker(3)
        c.settle()
        assert c.isr("t", 0) == [1, 2, 3]


def test_the_controller_elects_in_assignment_order_not_isr_order(
    slow_join: EmbeddedCluster,
) -> None:
    c = slow_join
    c.create_topic("t", replication_factor=3)
    c.stop_broker(1)  # the leader: broker 2 is the first replica of the ISR [2, 3]
    assert (c.leader("t", 0), c.isr("t", 0)) == (2, [2, 3])
    c.start_broker(1)
    wait_until("broker 1 back in the ISR", lambda: c.isr("t", 0) == [2, 3, 1], timeout=10)
    c.stop_broker(2)
    # Kafka's controller tries the replicas in assignment order [1, 2, 3]: broker 1, though
    # it comes after broker 3 in the ISR.
    assert (c.leader("t", 0), c.isr("t", 0)) == (1, [3, 1])
    c.stop_broker(1, controlled=True, grace_s=0)
    assert c.leader("t", 0) == 3


def test_a_bad_isr_join_delay_is_refused() -> None:
    for bad in (-1, float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="isr_join_delay_s"):
            EmbeddedCluster(isr_join_delay_s=bad)  # type: ignore[arg-type]
