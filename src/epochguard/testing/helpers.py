"""Small helpers for tests written against the ``Cluster`` protocol (either cluster)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kafka import KafkaProducer

from epochguard.testing.cluster import Cluster

if TYPE_CHECKING:
    from epochguard.testing.embedded.cluster import EmbeddedCluster

__all__ = [
    "KEPT",
    "LOST",
    "WaitTimeout",
    "describe_consumer",
    "produce",
    "recreate_topic",
    "stage_unreplicated_tail",
    "unclean_refill",
    "wait_until",
]

#: What :func:`stage_unreplicated_tail` writes by default: kept-0..9 on both replicas, then
#: lost-0..4 (offsets 10..14) on the leader alone.
KEPT = [b"kept-%d" % i for i in range(10)]
LOST = [b"lost-%d" % i for i in range(5)]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """``wait_until`` gave up; the message names what it waited for and the last error."""


def wait_until(
    what: str, probe: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.1
) -> T:
    """Call ``probe`` until it returns something other than ``None``/``False``; return it.

    Exceptions from ``probe`` count as "not yet" (clusters raise while they catch up); the
    last one is named if ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"timed out after {timeout:.0f}s waiting for {what}"
                + (f" (last error: {last!r})" if last is not None else "")
            )
        time.sleep(interval)


def produce(
    cluster: Cluster,
    topic: str,
    values: Sequence[str | bytes],
    partition: int = 0,
    timeout: float = 15.0,
) -> None:
    """Write ``values`` in order to one partition through its leader, as a producer with
    ``acks=1`` (one request, so one batch, per record), waiting for each acknowledgement.

    ``acks=1`` is what lets a leader accept records its followers never get: the way to
    stage an unclean election with lost records.
    """
    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap_servers,
        acks=1,
        enable_idempotence=False,
        linger_ms=0,
        retries=5,
    )
    try:
        for value in values:
            data = value.encode() if isinstance(value, str) else value
            producer.send(topic, data, partition=partition).get(timeout=timeout)
    finally:
        producer.close(timeout=5)


def recreate_topic(
    cluster: Cluster,
    name: str,
    partitions: int = 1,
    replication_factor: int | None = None,
    timeout: float = 30.0,
    delete: bool = True,
) -> int:
    """Delete ``name`` (unless ``delete=False``: the caller already did) and create it
    again (a new topic id; offsets and epochs start over), retrying the creation while the
    deletion is still in progress (real Kafka deletes asynchronously). Returns the new
    leader of partition 0."""
    if delete:
        cluster.delete_topic(name)

    def create() -> bool:
        cluster.create_topic(name, partitions=partitions, replication_factor=replication_factor)
        return True

    wait_until(f"{name} re-created", create, timeout)
    return wait_until(f"a leader for {name}-0", lambda: cluster.leader(name, 0), timeout)


def describe_consumer(consumer: Any) -> str:
    """An ``EpochConsumer``'s inner state, for a test's failure message when it stops
    moving: each partition's tracker, what each broker's fetch source holds (requests in
    flight, buffers, prefetches), the metadata view and the counters."""
    fetcher = consumer._engine.fetcher
    sources = {
        node: {
            "in_flight": src.in_flight,
            "buffers": sorted(str(tp) for tp in src.buffers),
            "caught_up": {str(tp): v for tp, v in src.caught_up.items()},
            "prefetches": {
                str(tp): {"answered": p.answer is not None, "waited": p.waiting is not None}
                for tp, p in src.prefetches.items()
            },
        }
        for node, src in fetcher._sources.items()
    }
    # Every field, sub-states included (offsets.state.SUB_STATES): a stall hides in them.
    trackers = {
        str(tp): {slot: getattr(t, slot, None) for slot in type(t).__slots__}
        for tp, t in fetcher.trackers.items()
    }
    leaders = {str(tp): fetcher.metadata.leaders.get(tp) for tp in fetcher.trackers}
    return (
        f"trackers={trackers} sources={sources} leaders={leaders} "
        f"corrupt={sorted(str(tp) for tp in fetcher.corrupt)} "
        f"metadata_ok_at={fetcher.metadata.ok_at:.1f} now={time.monotonic():.1f} "
        f"metrics={consumer.metrics(raw=True)}"
    )


def stage_unreplicated_tail(
    cluster: EmbeddedCluster,
    topic: str,
    kept: Sequence[bytes] = KEPT,
    lost: Sequence[bytes] = LOST,
) -> tuple[int, int]:
    """The start of every unclean-election scenario on an ``EmbeddedCluster``: ``topic``
    (one partition, two replicas) gets ``kept`` on both replicas, then the follower stops
    and ``lost`` goes to the leader alone, one batch per record. Returns ``(leader,
    stopped follower)``."""
    cluster.create_topic(topic, partitions=1, replication_factor=2)
    old = cluster.leader(topic, 0)
    assert old is not None
    new = next(b for b in cluster.replicas(topic, 0) if b != old)
    if kept:
        cluster.append(topic, 0, list(kept), batch_size=1)
    cluster.stop_broker(new)
    if lost:
        cluster.append(topic, 0, list(lost), batch_size=1)
    return old, new


def unclean_refill(
    cluster: EmbeddedCluster, topic: str, old: int, new: int, refill: Sequence[bytes]
) -> None:
    """``old`` stops; ``new`` (without the tail only ``old`` had) is elected uncleanly and
    gets ``refill``; ``old`` comes back as its follower (and truncates to it)."""
    cluster.stop_broker(old)
    cluster.start_broker(new)
    cluster.elect_leader(topic, 0, new, unclean=True)
    if refill:
        cluster.append(topic, 0, list(refill), batch_size=1)
    cluster.start_broker(old)
