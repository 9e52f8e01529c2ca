"""A deserializer that raises stops only its partition, at the record it failed on (Java's
RecordDeserializationException, KIP-334): the records before it are delivered, ``poll`` raises
a typed error naming partition and offset once, the other partitions keep flowing, and a seek
past the record goes on."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecordsBuilder
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer, RecordDeserializationError
from epochguard.consumer import records as records_module
from epochguard.consumer.errors import CorruptRecordError
from epochguard.consumer.records import ConsumerRecord, decode_records
from epochguard.testing import EmbeddedCluster

pytestmark = pytest.mark.timeout(60)

GOOD, BAD = TopicPartition("ds", 0), TopicPartition("ds", 1)


class Refused(Exception):
    pass


def _refusing(kind: type[Exception]) -> Any:
    def deserialize(topic: str, headers: Any, data: bytes | None) -> str:
        if data == b"bad":
            raise kind(f"cannot read {data!r}")
        assert data is not None
        return data.decode()

    return deserialize


def _batch(values: list[bytes]) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for v in values:
        builder.append(timestamp=0, key=None, value=v, headers=[])
    builder.close()
    return bytes(builder.buffer())


@pytest.fixture(params=["c", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(records_module, "_native", None)
    elif records_module._native is None:
        pytest.fail(f"the C decoder is not built: {records_module._native_reason}")
    return str(request.param)


# IndexError too: the decoders' own "truncated record" signal, which must not swallow it.
@pytest.mark.parametrize("kind", [Refused, ValueError, IndexError, UnicodeDecodeError])
def test_decoder_names_the_record_and_keeps_those_before(decoder: str, kind: type) -> None:
    data = _batch([b"a", b"b", b"c", b"bad", b"d"]) + _batch([b"e"])
    if kind is UnicodeDecodeError:
        data = _batch([b"a", b"b", b"c", b"\xff", b"d"])

        def des(topic: str, headers: Any, value: bytes | None) -> str:
            assert value is not None
            return value.decode()
    else:
        des = _refusing(kind)
    with pytest.raises(RecordDeserializationError) as info:
        decode_records(data, "ds", 1, 1, value_deserializer=des)
    err = info.value
    assert err.offset == 3
    assert [(r.offset, r.value) for r in err.records] == [(1, "b"), (2, "c")]
    assert isinstance(err.__cause__, kind)
    assert "ds-1" in str(err) and "offset 3" in str(err) and kind.__name__ in str(err)


def test_decoder_still_names_corrupt_bytes_with_a_deserializer(decoder: str) -> None:
    data = bytearray(_batch([b"a", b"b"]))
    data[65] = 0x40  # the first value's length (32) now runs past the batch
    with pytest.raises(CorruptRecordError):
        decode_records(
            bytes(data), "ds", 0, 0, check_crcs=False, value_deserializer=_refusing(Refused)
        )


def test_key_deserializer_failures_are_named_too(decoder: str) -> None:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for k in (b"k0", b"bad"):
        builder.append(timestamp=0, key=k, value=b"v", headers=[])
    builder.close()
    with pytest.raises(RecordDeserializationError) as info:
        decode_records(bytes(builder.buffer()), "ds", 0, 0, key_deserializer=_refusing(Refused))
    assert info.value.offset == 1 and [r.key for r in info.value.records] == ["k0"]


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=1) as c:
        yield c


def _refusing_consumer(cluster: EmbeddedCluster) -> dict[str, Any]:
    """Settings of a consumer whose value deserializer refuses ``b"bad"``."""
    return {
        "bootstrap_servers": cluster.bootstrap_servers,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 50,
        # kafka-python's deserializer signature: the value alone (aiokafka's too).
        "value_deserializer": lambda value: _refusing(Refused)("ds", [], value),
    }


def test_only_the_partition_stops_at_the_record(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("ds", partitions=2, replication_factor=1)
    cluster.append("ds", 0, [b"g-%d" % i for i in range(10)], batch_size=5)
    # The bad record in the middle of a batch: 0..2 before it in the same batch.
    cluster.append("ds", 1, [b"p-0", b"p-1", b"p-2", b"bad", b"p-4"], batch_size=5)
    cluster.append("ds", 1, [b"p-%d" % i for i in range(5, 10)], batch_size=5)
    got: list[ConsumerRecord] = []
    errors: list[RecordDeserializationError] = []

    def poll(c: EpochConsumer) -> None:
        try:
            for recs in c.poll(timeout_ms=50).values():
                got.extend(recs)
        except RecordDeserializationError as exc:
            errors.append(exc)

    with EpochConsumer(**_refusing_consumer(cluster)) as c:
        c.assign([BAD, GOOD])
        deadline = time.monotonic() + 20
        while not errors or len([r for r in got if r.partition == 0]) < 10:
            assert time.monotonic() < deadline, (got, errors)
            poll(c)
        # More keeps coming on the good partition while the bad one stays stopped.
        cluster.append("ds", 0, [b"h-%d" % i for i in range(5)])
        while len([r for r in got if r.partition == 0]) < 15:
            assert time.monotonic() < deadline, (got, errors)
            poll(c)
        for _ in range(5):
            poll(c)
        assert [r.offset for r in got if r.partition == 0] == list(range(15))
        assert [r.value for r in got if r.partition == 1] == ["p-0", "p-1", "p-2"]
        (err,) = errors  # once
        assert err.tp == BAD and err.offset == 3
        assert isinstance(err.__cause__, Refused)
        assert "ds-1" in str(err) and "offset 3" in str(err)
        assert c.position(BAD) == 3  # neither skipped nor re-read
        assert c.metrics(raw=True)["fetch_errors"] >= 1
        c.seek(BAD, err.offset + 1)
        while len([r for r in got if r.partition == 1]) < 9:
            assert time.monotonic() < deadline, (got, errors)
            poll(c)
        assert [r.offset for r in got if r.partition == 1] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
        assert len(errors) == 1


@pytest.mark.parametrize("bad_at", [3, 37])
def test_the_asyncio_consumer_stops_at_the_record_in_whichever_piece(
    cluster: EmbeddedCluster,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    bad_at: int,
) -> None:
    """AIOEpochConsumer decodes an answer in pieces as its reads reach them (here of 10
    records): a record its deserializer refuses in a later piece stops the partition at
    that record as in the first, the records before it delivered once."""
    import asyncio

    from epochguard import AIOEpochConsumer
    from epochguard.consumer import fetcher

    monkeypatch.setattr(fetcher, "DECODE_PIECE_RECORDS", 10)
    values = [b"bad" if i == bad_at else b"p-%d" % i for i in range(60)]
    cluster.create_topic("ds", partitions=1, replication_factor=1)
    cluster.append("ds", 0, values, batch_size=5)
    tp = TopicPartition("ds", 0)

    async def main() -> tuple[list[Any], list[RecordDeserializationError], int]:
        got: list[Any] = []
        errors: list[RecordDeserializationError] = []
        async with AIOEpochConsumer(**_refusing_consumer(cluster)) as c:
            c.assign([tp])
            deadline = time.monotonic() + 20
            while not errors:
                assert time.monotonic() < deadline, (got, errors)
                try:
                    for recs in (await c.getmany(timeout_ms=50, max_records=7)).values():
                        got.extend(recs)
                except RecordDeserializationError as exc:
                    errors.append(exc)
            for _ in range(3):
                assert not await c.getmany(timeout_ms=50)
            return got, errors, await c.position(tp)

    caplog.set_level(logging.DEBUG, logger="epochguard.consumer")
    got, errors, position = asyncio.run(main())
    # Beyond the first piece, the piece ended its answer (the fetch from 30 reported it).
    ended = [
        r.msg["offset"]
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg["event"] == "fetched_piece_not_decoded"
    ]
    assert ended == ([] if bad_at < 10 else [30])
    assert [r.offset for r in got] == list(range(bad_at))
    (err,) = errors
    assert err.tp == tp and err.offset == bad_at and isinstance(err.__cause__, Refused)
    assert position == bad_at
