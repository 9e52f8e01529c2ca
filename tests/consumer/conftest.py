from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.consumer.records import ConsumerRecord
from epochguard.testing import EmbeddedCluster

TP0 = TopicPartition("t", 0)


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=3) as c:
        yield c


def make_consumer(cluster: EmbeddedCluster, **kw: Any) -> EpochConsumer:
    return EpochConsumer(**consumer_config(cluster, **kw))


def consumer_config(cluster: EmbeddedCluster, **kw: Any) -> dict[str, Any]:
    """Settings for a quick consumer on ``cluster`` (either driver), ``kw`` on top."""
    cfg: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 100,
        "metadata_max_age_ms": 300,
        "retry_backoff_ms": 20,
        "request_timeout_ms": 5000,
    }
    cfg.update(kw)
    return cfg


def read(
    consumer: EpochConsumer, n: int, timeout: float = 10.0, max_records: int | None = None
) -> list[ConsumerRecord]:
    """Poll until ``n`` records arrived (or the timeout)."""
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=100, max_records=max_records).values():
            got += recs
    return got


async def aread(consumer: Any, n: int, timeout: float = 10.0) -> list[Any]:
    """:func:`read` for an asyncio consumer: ``getmany`` until ``n`` records arrived (or the
    timeout)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=100)).values():
            got += records
    return got


def poll_until(
    consumer: EpochConsumer,
    cond: Callable[[], bool],
    timeout: float = 10.0,
    sink: list[ConsumerRecord] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        for recs in consumer.poll(timeout_ms=50).values():
            if sink is not None:
                sink += recs


def diverge(
    cluster: EmbeddedCluster,
    old: int,
    new: int,
    lost: int = 5,
    fresh: int = 8,
    restart_old: bool = True,
) -> None:
    """From a log of ``kept`` records replicated on ``old`` and ``new``: ``old`` alone
    appends ``lost`` records, then ``new`` is elected uncleanly and appends ``fresh``."""
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"maybe-lost-%d" % i for i in range(lost)], batch_size=1)
    return None


def setup_topic(cluster: EmbeddedCluster, kept: int = 10) -> tuple[int, int]:
    cluster.create_topic("t", replication_factor=2)
    old = cluster.leader("t", 0)
    assert old is not None
    new = next(b for b in cluster.replicas("t", 0) if b != old)
    if kept:
        cluster.append("t", 0, [b"kept-%d" % i for i in range(kept)], batch_size=1)
    return old, new


def unclean_elect(
    cluster: EmbeddedCluster, old: int, new: int, fresh: int = 8, restart_old: bool = True
) -> None:
    cluster.stop_broker(old)
    cluster.start_broker(new)
    cluster.elect_leader("t", 0, new, unclean=True)
    cluster.append("t", 0, [b"new-%d" % i for i in range(fresh)], batch_size=1)
    if restart_old:
        cluster.start_broker(old)
