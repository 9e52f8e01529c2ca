"""Unit tests without a cluster: config validation, the record decoder, errors."""

from __future__ import annotations

import socket

import pytest
from kafka.errors import (
    KafkaConfigurationError,
    KafkaConnectionError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
)
from kafka.record import MemoryRecordsBuilder
from kafka.structs import TopicPartition

import epochguard
from epochguard.consumer import (
    ConsumerConfigError,
    CorruptRecordError,
    EpochConsumer,
    LogTruncationError,
    LogTruncationException,
)
from epochguard.consumer.config import build_config
from epochguard.consumer.records import as_deserializer, decode_records
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import DetectedBy, TruncationReport


def _batch(
    values: list[bytes | None],
    base: int = 0,
    epoch: int = 0,
    codec: int = 0,
    headers: list[tuple[str, bytes | None]] | None = None,
    key: bytes | None = None,
) -> bytes:
    b = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=10**8, offset=base)
    for i, v in enumerate(values):
        b.append(timestamp=1000 + i, key=key, value=v, headers=headers or [])
    b.close()
    raw = bytearray(b.buffer())
    raw[12:16] = epoch.to_bytes(4, "big", signed=True)  # partitionLeaderEpoch, not in CRC
    return bytes(raw)


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("auto_offset_reset", "smallest-ish"),
        ("max_poll_records", 0),
        ("fetch_max_wait_ms", -1),
        ("fetch_max_wait_ms", "500"),
        ("enable_auto_commit", "yes"),
        ("isolation_level", "serializable"),
        ("partition_assignment_strategy", [object]),
        ("max_fetch_version", 18),
        ("offset_store", object()),
    ],
)
def test_invalid_config_value_names_the_key(key: str, value: object) -> None:
    with pytest.raises(ConsumerConfigError) as info:
        build_config({key: value})
    assert info.value.key == key and key in str(info.value)
    assert isinstance(info.value, KafkaConfigurationError)


def test_unknown_key_is_rejected_at_construction_before_connecting() -> None:
    with pytest.raises(ConsumerConfigError, match="fetch_max_wait") as info:
        EpochConsumer(bootstrap_servers="127.0.0.1:1", fetch_max_wait=5)
    assert info.value.key == "fetch_max_wait"
    # It points at what a pip user has (not a file of the repository) and at the likely key.
    message = str(info.value)
    assert "docs/" not in message
    assert "EpochConsumer.DEFAULT_CONFIG" in message
    assert "did you mean 'fetch_max_wait_ms'?" in message


def test_unknown_key_far_from_any_key_gets_no_suggestion() -> None:
    with pytest.raises(ConsumerConfigError) as info:
        build_config({"zzzzzz": 1})
    assert "did you mean" not in str(info.value)
    assert "EpochConsumer.DEFAULT_CONFIG" in str(info.value)


def test_bad_truncation_policy_is_a_config_error() -> None:
    with pytest.raises(ConsumerConfigError, match="on_truncation") as info:
        EpochConsumer(bootstrap_servers="127.0.0.1:1", on_truncation="ignore")
    assert info.value.key == "on_truncation"
    # The key is named once: "on_truncation: must be ...".
    assert str(info.value).count("on_truncation") == 1, str(info.value)
    assert "on_truncation: must be 'auto', 'raise', 'rewind'" in str(info.value)


def test_kafka_python_names_are_accepted() -> None:
    cfg = build_config(
        {
            "auto_offset_reset": "smallest",
            "security_protocol": "SSL",
            "ssl_cafile": "/x",
            "sasl_mechanism": "PLAIN",
            "client_rack": "r1",
            "enable_incremental_fetch_sessions": False,
        }
    )
    assert cfg["auto_offset_reset"] == "earliest"
    assert cfg["receive_message_max_bytes"] >= cfg["fetch_max_bytes"]


# ------------------------------------------------------------------ records


def test_decoder_reads_fields_epoch_and_skips_below_fetch_offset() -> None:
    data = _batch(
        [b"a", None, b"c" * 300], base=5, epoch=3, key=b"k", headers=[("h", b"v"), ("n", None)]
    )
    out = decode_records(data, "t", 0, 6)
    assert [r.offset for r in out.records] == [6, 7]
    r = out.records[0]
    assert (r.topic, r.partition, r.leader_epoch, r.value, r.key) == ("t", 0, 3, None, b"k")
    assert r.serialized_value_size == -1 and r.serialized_key_size == 1
    assert r.headers == [("h", b"v"), ("n", None)] and r.serialized_header_size == 3
    assert out.records[1].value == b"c" * 300 and out.records[1].timestamp == 1002
    assert (out.next_offset, out.last_epoch) == (8, 3)


def test_decoder_matches_kafka_python_on_many_batches() -> None:
    from kafka.record import MemoryRecords

    data = b"".join(
        _batch([b"v%d" % i * (i % 90) for i in range(200)], base=200 * j, epoch=j) for j in range(5)
    )
    mine = decode_records(data, "t", 0, 0).records
    theirs = []
    mr = MemoryRecords(data)
    while (b := mr.next_batch()) is not None:
        theirs += [(r.offset, r.timestamp, r.key, r.value) for r in b]
    assert [(r.offset, r.timestamp, r.key, r.value) for r in mine] == theirs
    assert [r.leader_epoch for r in mine] == [i // 200 for i in range(1000)]


def test_decoder_ignores_partial_trailing_batch_and_detects_corruption() -> None:
    data = _batch([b"x"] * 3) + _batch([b"y"] * 3, base=3)[:-5]
    out = decode_records(data, "t", 0, 0)
    assert [r.offset for r in out.records] == [0, 1, 2] and out.next_offset == 3
    bad = bytearray(_batch([b"x"] * 3))
    bad[-2] ^= 0x01  # the last record's value byte: parseable, but the CRC no longer matches
    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_records(bytes(bad), "t", 0, 0)
    assert decode_records(bytes(bad), "t", 0, 0, check_crcs=False).records[2].value == b"y"


@pytest.mark.parametrize("codec", [1, 2, 3, 4])  # gzip, snappy, lz4, zstd
def test_decoder_handles_compression(codec: int) -> None:
    out = decode_records(_batch([b"z%d" % i for i in range(50)], codec=codec), "t", 0, 0)
    assert [r.value for r in out.records] == [b"z%d" % i for i in range(50)]


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("codec", [2, 4], ids=["snappy", "zstd"])
def test_large_compressed_batches_decode_in_place(
    codec: int, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 200 KB of values: kafka-python writes snappy as xerial blocks of 32 KB, each inflated
    # into its slot of one buffer; the codecs read the batch from the fetched bytes.
    from epochguard.consumer import records

    if not native:
        monkeypatch.setattr(records, "_native", None)
    values = [(b"%05d-" % i) * 200 for i in range(170)]
    data = memoryview(bytearray(_batch(values, codec=codec)))
    out = decode_records(data, "t", 0, 0)
    assert [r.value for r in out.records] == values
    assert all(type(r.value) is bytes for r in out.records)


def test_snappy_block_not_matching_its_length_is_corrupt() -> None:
    import struct

    import cramjam

    from epochguard.consumer import records

    raw = b"hello world " * 100
    block = bytes(cramjam.snappy.compress_raw(raw))
    assert block[:2] == bytes([0xB0, 0x09])  # varint 1200
    lying = bytes([0xB1, 0x09]) + block[2:]  # says 1201
    head = records._XERIAL_MAGIC + struct.pack(">ii", 1, 1)

    def xerial(*blocks: bytes) -> bytes:
        return head + b"".join(struct.pack(">i", len(b)) + b for b in blocks)

    assert bytes(records._decompress(2, xerial(block, block), "b")) == raw * 2
    for data in (xerial(block, lying), lying, xerial(block[:-3])):
        with pytest.raises(CorruptRecordError, match="at 7: snappy data does not decompress"):
            records._decompress(2, memoryview(data), "at 7")


def test_deserializers_both_styles() -> None:
    from kafka.serializer import Deserializer

    class Up(Deserializer):  # type: ignore[misc]
        def deserialize(self, topic, headers, data):  # type: ignore[no-untyped-def]
            return data.upper()

    data = _batch([b"ab"], key=b"k")
    out = decode_records(
        data,
        "t",
        0,
        0,
        key_deserializer=as_deserializer(bytes.decode),
        value_deserializer=as_deserializer(Up()),
    )
    assert (out.records[0].key, out.records[0].value) == ("k", b"AB")


# ------------------------------------------------------------------ errors


def test_log_truncation_error_types_and_offsets() -> None:
    tp = TopicPartition("t", 0)
    rep = TruncationReport(tp, EpochOffset(15, 0), EpochOffset(10, 0), DetectedBy.METADATA, 2)
    err = LogTruncationError({tp: rep})
    assert isinstance(err, OffsetOutOfRangeError)
    assert isinstance(err, epochguard.offsets.errors.LogTruncationError)
    assert LogTruncationException is LogTruncationError is epochguard.LogTruncationError
    assert err.truncation_offsets() == {tp: EpochOffset(10, 0)}
    assert "[10, 15)" in str(err)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()  # nothing listens there: every connection is refused
    return port


def test_bootstrap_fails_fast_when_every_server_refuses() -> None:
    servers = f"127.0.0.1:{_closed_port()},127.0.0.1:{_closed_port()}"
    # A bootstrap timeout far longer than the test: only the refusals can end it.
    with pytest.raises(KafkaConnectionError) as info:
        EpochConsumer(bootstrap_servers=servers, bootstrap_timeout_ms=300_000)
    text = str(info.value)
    assert servers in text and "refused" in text and "ECONNREFUSED" in text, text


def test_bootstrap_waits_while_one_server_does_not_refuse() -> None:
    silent = socket.socket()  # accepts connections (the kernel's backlog), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        servers = f"127.0.0.1:{_closed_port()},127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(KafkaTimeoutError) as info:
            EpochConsumer(bootstrap_servers=servers, bootstrap_timeout_ms=800)
    finally:
        silent.close()
    text = str(info.value)
    assert servers in text and "last connection error" in text, text
