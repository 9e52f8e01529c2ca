"""Fuzzing what users and files hand the library: position JSON, Spark offset JSON, offset
store files (JSON and SQLite: corrupted, cut, wrong version) and configuration values.
Each either parses or raises the module's typed error with a message; nothing else escapes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from epochguard.consumer.config import DEFAULT_CONFIG, build_config
from epochguard.consumer.errors import ConsumerConfigError
from epochguard.offsets.errors import InvalidPositionError, OffsetStoreError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.stores import JsonFileOffsetStore, SqliteOffsetStore
from epochguard.spark_connector.errors import OffsetsJsonError, SourceOptionError
from epochguard.spark_connector.offsets import (
    SourceOffset,
    parse_partition_offsets,
    parse_partition_timestamps,
    parse_partitions,
)
from epochguard.spark_connector.options import OPTIONS, parse_options

from .conftest import fuzz

_scalars = (
    st.none()
    | st.booleans()
    | st.sampled_from([-(2**63), -2, -1, 0, 1, 7, 2**31, 2**63, 2**64])
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["", "-1", "0", "earliest", "latest", "x" * 40, "00000000-0000-0000"])
)
_json = st.recursive(
    _scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=12,
)
_position_keys = st.sampled_from(["offset", "leader_epoch", "topic_id", "epoch_exact", "extra"])
_position_like = st.dictionaries(_position_keys, _json, max_size=5)


def _message(exc: BaseException) -> str:
    text = str(exc)
    assert text, f"{type(exc).__name__} without a message"
    return text


# ------------------------------------------------------------------ EpochOffset JSON


@fuzz(300)
@given(data=_position_like | _json)
def test_epoch_offset_json(data: Any) -> None:
    for form in (data, json.dumps(data), json.dumps(data).encode()):
        try:
            pos = EpochOffset.from_json(form)
        except InvalidPositionError as exc:
            _message(exc)
        else:
            assert EpochOffset.from_json(pos.to_json_str()) == pos


@fuzz(100)
@given(text=st.text(max_size=60) | st.binary(max_size=60).map(bytes))
def test_epoch_offset_json_text(text: str | bytes) -> None:
    try:
        EpochOffset.from_json(text)
    except InvalidPositionError as exc:
        _message(exc)


# ------------------------------------------------------------------ Spark offset JSON

_spark_docs = st.dictionaries(
    st.text(max_size=6),
    st.dictionaries(
        st.sampled_from(["0", "1", "-1", "x", "01", " 2", "99999999999999999999"]),
        _json | _position_like | st.sampled_from([-2, -1, 0, 5]),
        max_size=3,
    )
    | _json,
    max_size=3,
)


@fuzz(300)
@given(data=_spark_docs | _json)
def test_spark_offset_json(data: Any) -> None:
    text = json.dumps(data)
    for parse in (
        SourceOffset.from_json,
        lambda t: parse_partition_offsets(t, "startingOffsets"),
        lambda t: parse_partition_timestamps(t, "startingOffsetsByTimestamp"),
        lambda t: parse_partitions(t, "assign"),
    ):
        try:
            out = parse(text)
        except OffsetsJsonError as exc:
            _message(exc)
        else:
            if isinstance(out, SourceOffset):
                assert SourceOffset.from_json(out.to_json_str()) == out


# ------------------------------------------------------------------ offset store files


def _valid_json_file(path: Path) -> bytes:
    JsonFileOffsetStore(path).save(
        {
            TopicPartition("t", 0): EpochOffset(5, 2),
            TopicPartition("t", 1): EpochOffset(7, None, topic_id="AAAAAAAAAAAAAAAAAAAAAA"),
        }
    )
    return path.read_bytes()


@fuzz(200)
@given(
    edit=st.sampled_from(["bytes", "cut", "field", "random"]),
    at=st.integers(0, 10**6),
    value=st.integers(0, 255),
    field=st.sampled_from(["format", "version", "offsets", "topic", "partition", "offset"]),
    replacement=_json,
)
def test_json_store_files(
    tmp_path_factory: pytest.TempPathFactory,
    edit: str,
    at: int,
    value: int,
    field: str,
    replacement: Any,
) -> None:
    path = tmp_path_factory.mktemp("js") / "offsets.json"
    raw = bytearray(_valid_json_file(path))
    if edit == "bytes":
        raw[at % len(raw)] = value
    elif edit == "cut":
        del raw[at % len(raw) :]
    elif edit == "random":
        raw = bytearray(json.dumps(replacement).encode())
    else:
        doc = json.loads(raw)
        if field in ("format", "version", "offsets"):
            doc[field] = replacement
        else:
            doc["offsets"][0][field] = replacement
        raw = bytearray(json.dumps(doc).encode())
    path.write_bytes(bytes(raw))
    try:
        got = JsonFileOffsetStore(path).load()
    except OffsetStoreError as exc:
        assert str(path) in _message(exc)
    else:
        assert all(isinstance(v, EpochOffset) for v in got.values())


def test_json_store_newer_version_is_named(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    doc = json.loads(_valid_json_file(path))
    doc["version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(OffsetStoreError, match="offsets format version 99"):
        JsonFileOffsetStore(path).load()


def _valid_sqlite(path: Path) -> bytes:
    with SqliteOffsetStore(path) as s:
        s.save({TopicPartition("t", p): EpochOffset(10 + p, 1) for p in range(50)})
    # Fold the WAL into the main file so the bytes below are the whole database.
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    return path.read_bytes()


@fuzz(50)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.none() | st.integers(0, 10**6),
)
def test_sqlite_store_files(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, int]], cut: int | None
) -> None:
    path = tmp_path_factory.mktemp("sq") / "offsets.db"
    raw = bytearray(_valid_sqlite(path))
    for at, value in edits:
        raw[at % len(raw)] = value
    if cut is not None:
        del raw[cut % len(raw) :]
    path.write_bytes(bytes(raw))
    try:
        with SqliteOffsetStore(path) as s:
            got = s.load()
    except OffsetStoreError as exc:
        _message(exc)
    else:
        assert all(isinstance(v, EpochOffset) for v in got.values())


@pytest.mark.parametrize("content", [b"", b"\x00" * 100, b"SQLite format 3\x00" + b"\xff" * 200])
def test_sqlite_store_garbage_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "o.db"
    path.write_bytes(content)
    try:
        with SqliteOffsetStore(path) as s:
            got = s.load()
    except OffsetStoreError as exc:
        assert "o.db" in _message(exc) or "offset" in _message(exc)
    else:
        assert got == {}  # an empty file is an empty database


@pytest.mark.parametrize(
    "assignment",
    ["leader_epoch = -7", "partition = 'abc'", "\"offset\" = 'x'", '"offset" = -1'],
)
def test_sqlite_rows_written_by_someone_else_are_named(tmp_path: Path, assignment: str) -> None:
    """Rows that bypassed the table's CHECKs (another tool, an old bug) are refused by
    load with the bad row named, not passed on as positions."""
    path = tmp_path / "o.db"
    _valid_sqlite(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA ignore_check_constraints=ON")
    conn.execute(f"UPDATE epochguard_offsets SET {assignment} WHERE partition = 3")
    conn.commit()
    conn.close()
    with pytest.raises(OffsetStoreError) as info, SqliteOffsetStore(path) as s:
        s.load()
    assert "3" in _message(info.value) or "abc" in _message(info.value)


# ------------------------------------------------------------------ configuration

_config_values = (
    _json
    | st.sampled_from([object(), lambda: None, b"x", float("inf"), -0.5, (), [], {}])
    | st.builds(type, st.just("X"), st.just(()), st.just({}))
)


@fuzz(300)
@given(
    items=st.dictionaries(
        st.sampled_from(sorted(DEFAULT_CONFIG)) | st.text(max_size=12), _config_values, max_size=3
    )
)
def test_consumer_config_values(items: dict[str, Any]) -> None:
    try:
        build_config(items)
    except ConsumerConfigError as exc:
        assert exc.key in _message(exc)


_option_names = st.sampled_from(sorted(OPTIONS)) | st.sampled_from(
    ["kafka.bootstrap.servers", "kafka.group.id", "kafka.auto.offset.reset", "kafka.nope", "x"]
)
_option_values = (
    st.text(max_size=20)
    | _spark_docs.map(json.dumps)
    | st.sampled_from(["true", "false", "-1", "0", "10", "1.5", "earliest", "latest", "t", "{}"])
)


@fuzz(150)
@given(
    options=st.dictionaries(_option_names, _option_values, max_size=4),
    streaming=st.booleans(),
)
def test_spark_source_options(options: dict[str, str], streaming: bool) -> None:
    try:
        parse_options(options, streaming=streaming)
    except (SourceOptionError, OffsetsJsonError) as exc:
        _message(exc)
