from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from epochguard.offsets import EpochOffset, OffsetStoreError, TopicPartition
from epochguard.offsets.stores import JsonFileOffsetStore, OffsetStore, SqliteOffsetStore

A0 = TopicPartition("a", 0)
A1 = TopicPartition("a", 1)
B0 = TopicPartition("b", 0)


def stores(tmp_path: Path) -> list[OffsetStore]:
    return [SqliteOffsetStore(tmp_path / "o.db"), JsonFileOffsetStore(tmp_path / "o.json")]


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_round_trip_and_upsert(tmp_path: Path, kind: str) -> None:
    store = stores(tmp_path)[0 if kind == "sqlite" else 1]
    assert isinstance(store, OffsetStore)
    assert store.load() == {}
    store.save({A0: EpochOffset(5, 2), A1: EpochOffset(7)})
    store.save({A1: EpochOffset(9, 3), B0: EpochOffset(0)})
    loaded = store.load()
    assert loaded == {A0: EpochOffset(5, 2), A1: EpochOffset(9, 3), B0: EpochOffset(0)}
    assert all(type(k) is TopicPartition for k in loaded)


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_rejects_bad_input_without_writing(tmp_path: Path, kind: str) -> None:
    store = stores(tmp_path)[0 if kind == "sqlite" else 1]
    store.save({A0: EpochOffset(1, 1)})
    with pytest.raises(OffsetStoreError):
        store.save({A1: EpochOffset(2), B0: 3})  # type: ignore[dict-item]
    with pytest.raises(OffsetStoreError):
        store.save({("a", "x"): EpochOffset(2)})  # type: ignore[dict-item]
    assert store.load() == {A0: EpochOffset(1, 1)}


def test_sqlite_namespaces_are_separate(tmp_path: Path) -> None:
    one = SqliteOffsetStore(tmp_path / "o.db", namespace="one")
    two = SqliteOffsetStore(tmp_path / "o.db", namespace="two")
    one.save({A0: EpochOffset(1)})
    assert two.load() == {}
    assert one.load() == {A0: EpochOffset(1)}


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    store = SqliteOffsetStore(tmp_path / "o.db")
    mode = store.connection.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_sqlite_commits_with_the_applications_own_rows(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("CREATE TABLE results (v TEXT)")
    conn.commit()
    store = SqliteOffsetStore(conn)
    with store.transaction() as tx:
        tx.execute("INSERT INTO results VALUES ('r1')")
        store.save({A0: EpochOffset(11, 4)}, connection=tx)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.execute("INSERT INTO results VALUES ('r2')")
        store.save({A0: EpochOffset(12, 4)}, connection=tx)
        raise RuntimeError("crash before commit")
    # Another connection sees exactly the committed pair.
    other = sqlite3.connect(tmp_path / "app.db")
    assert other.execute("SELECT v FROM results").fetchall() == [("r1",)]
    assert SqliteOffsetStore(other).load() == {A0: EpochOffset(11, 4)}


def test_sqlite_save_inside_callers_plain_transaction(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db")
    store = SqliteOffsetStore(conn)
    conn.execute("CREATE TABLE results (v TEXT)")
    conn.execute("INSERT INTO results VALUES ('x')")  # Python opens the transaction here
    store.save({A0: EpochOffset(3)}, connection=conn)
    conn.rollback()
    assert store.load() == {}
    with pytest.raises(OffsetStoreError, match="open transaction"):
        store.save({A0: EpochOffset(3)}, connection=conn)


TOPIC_ID = uuid.UUID("5f0c2a8e-8d3b-4c1e-9a7f-0123456789ab")
OTHER_TOPIC_ID = uuid.UUID("0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")


def test_sqlite_failed_save_leaves_old_content(tmp_path: Path) -> None:
    store = SqliteOffsetStore(tmp_path / "o.db")
    store.save({A0: EpochOffset(1, 1), A1: EpochOffset(1, 1)})
    # A row that violates the table's CHECK fails the whole batch.
    bad = {A0: EpochOffset(2, 2), A1: EpochOffset.__new__(EpochOffset)}
    object.__setattr__(bad[A1], "offset", -5)
    object.__setattr__(bad[A1], "leader_epoch", None)
    object.__setattr__(bad[A1], "topic_id", None)
    object.__setattr__(bad[A1], "epoch_exact", False)
    with pytest.raises(OffsetStoreError):
        store.save(bad)
    assert store.load() == {A0: EpochOffset(1, 1), A1: EpochOffset(1, 1)}


def test_sqlite_corrupt_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(OffsetStoreError, match="not a usable SQLite database"):
        SqliteOffsetStore(path)


def test_sqlite_foreign_table_is_an_error(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "o.db")
    conn.execute("CREATE TABLE epochguard_offsets (id INTEGER, blob TEXT)")
    conn.commit()
    with pytest.raises(OffsetStoreError, match="not an epochguard offset table"):
        SqliteOffsetStore(conn)


def test_sqlite_corrupt_row_is_an_error(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "o.db")
    SqliteOffsetStore(conn)
    # Rows written by something that ignored the CHECKs (another tool, manual edit).
    conn.execute("PRAGMA ignore_check_constraints=ON")
    conn.execute("INSERT INTO epochguard_offsets VALUES ('default', 'a', 0, 5, -7, NULL, 0)")
    conn.commit()
    with pytest.raises(OffsetStoreError, match="corrupt row"):
        SqliteOffsetStore(conn).load()


def test_sqlite_errors_name_the_database_file(tmp_path: Path) -> None:
    path = tmp_path / "positions.db"
    with SqliteOffsetStore(path) as store:
        store.save({A0: EpochOffset(5, 1)})
        # A malformed table page: the header and schema still read, the rows do not.
        conn = store.connection
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (root_page,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name='epochguard_offsets'"
        ).fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    with open(path, "r+b") as fh:
        fh.seek((root_page - 1) * page_size)
        fh.write(b"\xff" * page_size)
    with pytest.raises(OffsetStoreError) as info:
        SqliteOffsetStore(path).load()
    assert str(path) in str(info.value) and "'epochguard_offsets'" in str(info.value)
    # The application's own connection: the file it has open is named.
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE epochguard_offsets (id INTEGER, blob TEXT)")
    conn.commit()
    with pytest.raises(OffsetStoreError, match="not an epochguard offset table") as info:
        SqliteOffsetStore(conn)
    assert str(other) in str(info.value)
    memory = sqlite3.connect(":memory:")
    memory.execute("CREATE TABLE epochguard_offsets (id INTEGER)")
    with pytest.raises(OffsetStoreError, match="application's connection, no file"):
        SqliteOffsetStore(memory)


def test_json_store_in_a_missing_directory_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "no-such-dir" / "o.json"
    with pytest.raises(OffsetStoreError, match="does not exist") as info:
        JsonFileOffsetStore(path)
    assert str(path) in str(info.value)
    # A missing file in an existing directory is still an empty store.
    assert JsonFileOffsetStore(tmp_path / "new.json").load() == {}


def test_json_store_whose_directory_went_away_raises_typed_errors(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    store = JsonFileOffsetStore(directory / "o.json")
    directory.rmdir()
    with pytest.raises(OffsetStoreError, match="does not exist"):
        store.load()  # not an empty store
    with pytest.raises(OffsetStoreError) as info:
        store.save({A0: EpochOffset(1, 1)})
    assert str(directory / "o.json") in str(info.value)


def test_sqlite_rejects_unsafe_table_names(tmp_path: Path) -> None:
    with pytest.raises(OffsetStoreError):
        SqliteOffsetStore(tmp_path / "o.db", table='x"; DROP TABLE y; --')


def test_json_file_format(tmp_path: Path) -> None:
    store = JsonFileOffsetStore(tmp_path / "o.json")
    store.save({A0: EpochOffset(5, 2), A1: EpochOffset(3, 1, topic_id=TOPIC_ID)})
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc == {
        "format": "epochguard-offsets",
        "version": 2,
        "offsets": [
            {"topic": "a", "partition": 0, "offset": 5, "leader_epoch": 2},
            {
                "topic": "a",
                "partition": 1,
                "offset": 3,
                "leader_epoch": 1,
                "topic_id": str(TOPIC_ID),
            },
        ],
    }
    assert [p.name for p in tmp_path.iterdir()] == ["o.json"]  # no temp files left
    assert store.load()[A1].topic_id == str(TOPIC_ID)


def test_json_version_1_files_are_read(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text(
        '{"format": "epochguard-offsets", "version": 1, "offsets": '
        '[{"topic": "a", "partition": 0, "offset": 5, "leader_epoch": 2}]}'
    )
    loaded = JsonFileOffsetStore(path).load()
    assert loaded == {A0: EpochOffset(5, 2)} and loaded[A0].topic_id is None


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_topic_ids_round_trip(tmp_path: Path, kind: str) -> None:
    store: SqliteOffsetStore | JsonFileOffsetStore = (
        SqliteOffsetStore(tmp_path / "o.db")
        if kind == "sqlite"
        else JsonFileOffsetStore(tmp_path / "o.json")
    )
    store.save({A0: EpochOffset(5, 2, topic_id=TOPIC_ID), A1: EpochOffset(1, 0)})
    store.save({A0: EpochOffset(6, 2, topic_id=OTHER_TOPIC_ID, epoch_exact=True)})
    loaded = store.load()
    assert loaded[A0].topic_id == str(OTHER_TOPIC_ID) and loaded[A1].topic_id is None
    assert loaded[A0].epoch_exact and not loaded[A1].epoch_exact


def test_sqlite_version_1_table_gains_the_topic_id_column(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "o.db", isolation_level=None)
    conn.execute(
        "CREATE TABLE epochguard_offsets (namespace TEXT NOT NULL, topic TEXT NOT NULL, "
        'partition INTEGER NOT NULL, "offset" INTEGER NOT NULL CHECK ("offset" >= 0), '
        "leader_epoch INTEGER CHECK (leader_epoch IS NULL OR leader_epoch >= 0), "
        "PRIMARY KEY (namespace, topic, partition))"
    )
    conn.execute("INSERT INTO epochguard_offsets VALUES ('default', 'a', 0, 5, 2)")
    store = SqliteOffsetStore(conn)
    assert store.load() == {A0: EpochOffset(5, 2)}
    store.save({A1: EpochOffset(2, 1, topic_id=TOPIC_ID, epoch_exact=True)})
    reloaded = SqliteOffsetStore(conn).load()
    assert reloaded[A1].topic_id == str(TOPIC_ID) and reloaded[A1].epoch_exact
    assert not reloaded[A0].epoch_exact
    assert conn.execute("PRAGMA user_version").fetchone() == (2,)


@pytest.mark.parametrize(
    "content",
    [
        b'{"format": "epochguard-offsets", "version": 1, "offsets": [{"topic": "a"',
        b"",
        b'{"something": "else"}',
        b'{"format": "epochguard-offsets", "version": 99, "offsets": []}',
        b'{"format": "epochguard-offsets", "version": 1, "offsets": [{"topic": "a", '
        b'"partition": 0, "offset": -3}]}',
        b"\x00\x01\x02",
    ],
)
def test_json_corrupt_or_foreign_file_is_an_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "o.json"
    path.write_bytes(content)
    store = JsonFileOffsetStore(path)
    with pytest.raises(OffsetStoreError):
        store.load()
    with pytest.raises(OffsetStoreError):
        store.save({A0: EpochOffset(1)})  # never overwrite what we cannot read
    assert path.read_bytes() == content


def test_json_crash_before_rename_keeps_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonFileOffsetStore(tmp_path / "o.json")
    store.save({A0: EpochOffset(1, 1)})

    def crash(src: str, dst: str) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OffsetStoreError, match="power cut"):
        store.save({A0: EpochOffset(2, 2)})
    monkeypatch.undo()
    assert store.load() == {A0: EpochOffset(1, 1)}
    assert [p.name for p in tmp_path.iterdir()] == ["o.json"]


def test_json_leftover_partial_temp_file_is_ignored(tmp_path: Path) -> None:
    store = JsonFileOffsetStore(tmp_path / "o.json")
    store.save({A0: EpochOffset(1, 1)})
    (tmp_path / ".o.json.abc.tmp").write_bytes(b'{"format": "epochguard-off')  # torn write
    assert store.load() == {A0: EpochOffset(1, 1)}


WRITER = textwrap.dedent(
    """
    import sys
    from epochguard.offsets import EpochOffset, TopicPartition
    from epochguard.offsets.stores import JsonFileOffsetStore, SqliteOffsetStore
    kind, path = sys.argv[1], sys.argv[2]
    store = SqliteOffsetStore(path) if kind == "sqlite" else JsonFileOffsetStore(path)
    i = 1
    print("ready", flush=True)
    while True:
        # Both partitions always move together: a torn save would show them apart.
        store.save({TopicPartition("a", 0): EpochOffset(i, 7), TopicPartition("a", 1):
                    EpochOffset(i, 7)})
        i += 1
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_kill_during_saves_leaves_a_consistent_store(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("o.db" if kind == "sqlite" else "o.json")
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, kind, str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2 + 0.1 * attempt)
        proc.kill()
        proc.wait(timeout=10)
        store = SqliteOffsetStore(path) if kind == "sqlite" else JsonFileOffsetStore(path)
        loaded = store.load()
        assert set(loaded) == {A0, A1}
        assert loaded[A0] == loaded[A1] and loaded[A0].offset >= 1
