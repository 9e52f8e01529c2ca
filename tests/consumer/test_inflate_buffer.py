"""Compressed batches inflate into one buffer per thread, kept between batches
(``records._scratch``): every batch still decodes to its own records, whatever the
batches before it, on any thread, with or without cramjam, and the limit still holds."""

from __future__ import annotations

import sys
import threading

import pytest

from epochguard.consumer import records
from epochguard.consumer.errors import CorruptRecordError
from epochguard.consumer.records import decode_records

from .test_crecords import _build

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _fetch(codec: int, base: int, values: list[bytes]) -> bytes:
    return _build(base, 0, codec, False, 0, [(i, 1, b"k", v, []) for i, v in enumerate(values)])


def _values(tag: str, n: int, size: int) -> list[bytes]:
    return [f"{tag}-{i}-".encode().ljust(size, tag[0].encode()) for i in range(n)]


def _decoded_values(data: bytes) -> list[bytes]:
    return [r.value for r in decode_records(data, "t", 0, 0, check_crcs=True).records]


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_consecutive_batches_of_other_sizes_keep_their_own_records(codec: int) -> None:
    # Large, small, then larger than the kept buffer's first size (1 MiB): each batch reads
    # only its own bytes, though the buffer still holds the tail of a larger one before it.
    shapes = [("a", 300, 1000), ("b", 3, 10), ("c", 1500, 1000), ("d", 40, 100)]
    base = 0
    data = b""
    expected: list[bytes] = []
    for tag, n, size in shapes:
        values = _values(tag, n, size)
        data += _fetch(codec, base, values)
        expected += values
        base += n
    for native in (records._native, None):
        saved = records._native
        records._native = native
        try:
            assert _decoded_values(data) == expected
            # And again, one batch per call, in another order.
            for tag, n, size in reversed(shapes):
                assert _decoded_values(_fetch(codec, 0, _values(tag, n, size))) == _values(
                    tag, n, size
                )
        finally:
            records._native = saved


@pytest.mark.parametrize("codec", [1, 3], ids=["gzip", "lz4"])
def test_a_batch_past_the_buffer_inflates_and_the_buffer_grows_for_the_next(codec: int) -> None:
    values = _values("x", 3000, 1000)  # 3 MB inflated: past the first buffer
    data = _fetch(codec, 0, values)
    assert _decoded_values(data) == values
    kept = records._scratch()
    assert len(kept) >= 3_000_000
    assert _decoded_values(data) == values


@pytest.mark.parametrize("codec", [1, 3], ids=["gzip", "lz4"])
def test_the_limit_holds_below_the_buffer_size(codec: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _fetch(codec, 0, _values("y", 10, 500))
    assert len(_decoded_values(data)) == 10  # fits the buffer
    monkeypatch.setattr(records, "MAX_DECOMPRESSED_BATCH_BYTES", 1000)
    name = {1: "gzip", 3: "lz4"}[codec]
    with pytest.raises(CorruptRecordError, match=f"{name} data inflates past 1000 bytes"):
        _decoded_values(data)


@pytest.mark.parametrize("codec", [1, 3], ids=["gzip", "lz4"])
def test_without_cramjam_the_codec_library_inflates(
    codec: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cramjam", None)  # import cramjam raises ImportError
    values = _values("z", 200, 300)
    assert _decoded_values(_fetch(codec, 0, values)) == values


def _outcome(data: bytes) -> str | list[bytes]:
    try:
        return [r.value for r in decode_records(data, "t", 0, 0, check_crcs=False).records]
    except CorruptRecordError as exc:
        return str(exc)


@pytest.mark.parametrize("at", [0, 5, 20, -3])
@pytest.mark.parametrize("codec", [1, 3], ids=["gzip", "lz4"])
def test_bad_data_fails_as_with_the_codec_library_alone(
    codec: int, at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CRC is not checked, so the damaged bytes reach the inflater: what it says, or
    # what the records then are (damaged bytes may inflate), is unchanged.
    raw = bytearray(_fetch(codec, 0, _values("w", 50, 200)))
    raw[61 + at if at >= 0 else at] ^= 0xFF
    data = bytes(raw)
    with_buffer = _outcome(data)
    monkeypatch.setitem(sys.modules, "cramjam", None)
    assert with_buffer == _outcome(data)
    if at == 0:  # the frame's magic or the gzip header: refused by the inflater
        assert isinstance(with_buffer, str) and "data does not decompress" in with_buffer


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_threads_inflating_at_once_each_keep_their_records(codec: int) -> None:
    fetches = {tag: _fetch(codec, 0, _values(tag, 400, 700)) for tag in "pqrs"}
    wrong: list[str] = []

    def read(tag: str) -> None:
        for _ in range(20):
            if _decoded_values(fetches[tag]) != _values(tag, 400, 700):
                wrong.append(tag)

    threads = [threading.Thread(target=read, args=(tag,)) for tag in fetches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
