"""One partition serves a damaged batch: the application gets a typed error naming it, the
other partitions keep delivering, and the bad one is neither skipped nor re-read."""

from __future__ import annotations

import time

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.consumer.errors import CorruptRecordError
from epochguard.consumer.records import ConsumerRecord
from epochguard.testing import EmbeddedCluster

pytestmark = pytest.mark.timeout(60)

GOOD, BAD = TopicPartition("cp", 0), TopicPartition("cp", 1)


@pytest.fixture
def cluster():
    with EmbeddedCluster(brokers=1) as c:
        yield c


def _consumer(cluster: EmbeddedCluster) -> EpochConsumer:
    return EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        retry_backoff_ms=20,
        request_timeout_ms=5000,
    )


def _poll(c: EpochConsumer, got: list[ConsumerRecord], errors: list[Exception]) -> None:
    try:
        for recs in c.poll(timeout_ms=50).values():
            got += recs
    except CorruptRecordError as exc:
        errors.append(exc)


@pytest.mark.parametrize("garbage", [None, b"\x00" * 20, b"\xff" * 80], ids=["crc", "zeros", "ff"])
def test_other_partitions_flow_while_one_serves_garbage(
    cluster: EmbeddedCluster, garbage: bytes | None
) -> None:
    cluster.create_topic("cp", partitions=2, replication_factor=1)
    for p in (0, 1):
        cluster.append("cp", p, [b"a-%d" % i for i in range(10)], batch_size=5)
    # Every answer for the bad partition is damaged until the rule is cleared.
    cluster.faults.corrupt_fetches("cp", 1, garbage=garbage)
    got: list[ConsumerRecord] = []
    errors: list[Exception] = []
    with _consumer(cluster) as c:
        c.assign([BAD, GOOD])  # the bad one first in every Fetch
        deadline = time.monotonic() + 20
        while len([r for r in got if r.partition == 0]) < 10:
            assert time.monotonic() < deadline, (got, errors)
            _poll(c, got, errors)
        # More data keeps coming on the good partition while the bad one stays stopped.
        cluster.append("cp", 0, [b"b-%d" % i for i in range(10)], batch_size=5)
        while len([r for r in got if r.partition == 0]) < 20 or not errors:
            assert time.monotonic() < deadline, (got, errors)
            _poll(c, got, errors)
        assert [r.offset for r in got if r.partition == 0] == list(range(20))
        assert [r for r in got if r.partition == 1] == []
        # Raised once, naming the partition and the offset it stopped at; not again.
        first = errors[0]
        assert first.tp == BAD and first.offset == 0
        assert "cp-1" in str(first) and "offset 0" in str(first)
        for _ in range(5):
            _poll(c, got, errors)
        assert len(errors) == 1
        # Not skipped: the position is still the bad offset.
        assert c.position(BAD) == 0
        # Once the broker serves good bytes again, a seek resumes exactly there.
        cluster.faults.clear()
        c.seek(BAD, 0)
        while len([r for r in got if r.partition == 1]) < 10:
            assert time.monotonic() < deadline, (got, errors)
            _poll(c, got, errors)
        assert [r.offset for r in got if r.partition == 1] == list(range(10))
        assert len(errors) == 1
