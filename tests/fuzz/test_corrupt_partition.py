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
        assert str(first).count("CorruptRecordError") == 1, str(first)  # as the guide shows it
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


def test_an_answer_of_batches_ending_below_the_fetch_offset_stops_the_partition_not_a_loop(
    cluster: EmbeddedCluster,
) -> None:
    """Valid batches (CRCs fine) that all end below the offset asked for: no broker sends
    that, and asking again gets the same answer as fast as the broker can send it. The
    partition stops at its position with a typed error naming it, as for damaged bytes."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20, offset=0)
    for i in range(2):
        builder.append(timestamp=1000, key=None, value=b"old-%d" % i, headers=[])
    builder.close()
    cluster.create_topic("cp", partitions=2, replication_factor=1)
    for p in (0, 1):
        cluster.append("cp", p, [b"a-%d" % i for i in range(10)], batch_size=5)
    got: list[ConsumerRecord] = []
    errors: list[Exception] = []
    with _consumer(cluster) as c:
        c.assign([BAD, GOOD])
        c.seek(BAD, 5)
        cluster.faults.corrupt_fetches("cp", 1, garbage=bytes(builder.buffer()))
        deadline = time.monotonic() + 20
        while not errors or len([r for r in got if r.partition == 0]) < 10:
            assert time.monotonic() < deadline, (got, errors)
            _poll(c, got, errors)
        [error] = errors
        assert error.tp == BAD and error.offset == 5
        assert "cp-1" in str(error) and "below the fetch offset" in str(error)
        fetches = sum(n for (key, _), n in cluster.requests_seen().items() if key == 1)
        for _ in range(10):
            _poll(c, got, errors)
        # Stopped: the bad partition is not asked again (one fetch per poll at most, for
        # the good one, not thousands).
        assert sum(n for (key, _), n in cluster.requests_seen().items() if key == 1) - fetches < 30
        assert [r for r in got if r.partition == 1] == [] and c.position(BAD) == 5
        cluster.faults.clear()
        c.seek(BAD, 5)
        while len([r for r in got if r.partition == 1]) < 5:
            assert time.monotonic() < deadline, (got, errors)
            _poll(c, got, errors)
        assert [r.offset for r in got if r.partition == 1] == list(range(5, 10))
