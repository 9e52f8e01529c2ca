"""Offset stores: where an application keeps its positions, epochs included.

``save`` upserts the given partitions atomically (all or none); ``load`` returns everything.
A store that cannot be read (corrupt file, someone else's table or file) raises
:class:`~epochguard.offsets.errors.OffsetStoreError`; it never answers "no offsets", since that
would silently restart every partition from ``auto_offset_reset``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from epochguard._topic_partition import topic_partition
from epochguard.offsets.errors import InvalidPositionError, OffsetStoreError
from epochguard.offsets.position import EpochOffset

if TYPE_CHECKING:
    from kafka.structs import TopicPartition

JSON_FORMAT: Final = "epochguard-offsets"
#: Version 2 added ``topic_id`` and ``epoch_exact``; version 1 files are still read.
JSON_VERSION: Final = 2
_JSON_READABLE: Final = (1, 2)
#: Version 2 added the ``topic_id`` and ``epoch_exact`` columns; version 1 tables get them
#: on open.
SQLITE_SCHEMA_VERSION: Final = 2
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_COLUMNS_V1: Final = ("namespace", "topic", "partition", "offset", "leader_epoch")
#: The columns version 2 added, as created and as added to a version 1 table.
_V2_COLUMNS: Final = (
    "topic_id TEXT",
    "epoch_exact INTEGER NOT NULL DEFAULT 0 CHECK (epoch_exact IN (0, 1))",
)
_COLUMNS: Final = (*_COLUMNS_V1, *(c.split()[0] for c in _V2_COLUMNS))


@runtime_checkable
class OffsetStore(Protocol):
    """What a consumer needs to restore and persist positions."""

    def load(self) -> dict[TopicPartition, EpochOffset]:
        """Every stored position, keyed by ``TopicPartition``."""
        ...

    def save(self, mapping: Mapping[TopicPartition, EpochOffset]) -> None:
        """Store these positions atomically (other partitions stay as they are)."""
        ...


def _check_mapping(
    mapping: Mapping[TopicPartition, EpochOffset],
) -> list[tuple[str, int, EpochOffset]]:
    rows = []
    for tp, pos in mapping.items():
        if not isinstance(pos, EpochOffset):
            raise OffsetStoreError(f"position for {tp!r} must be an EpochOffset, got {pos!r}")
        try:
            topic, partition = tp.topic, tp.partition
        except AttributeError:
            raise OffsetStoreError(f"key {tp!r} is not a TopicPartition") from None
        if (
            not isinstance(topic, str)
            or isinstance(partition, bool)
            or not isinstance(partition, int)
        ):
            raise OffsetStoreError(f"key {tp!r} is not a TopicPartition(str, int)")
        rows.append((topic, partition, pos))
    return rows


# ------------------------------------------------------------------------------- sqlite


class SqliteOffsetStore:
    """Positions in a SQLite table, one row per (namespace, topic, partition).

    ``target`` is a path (opened in WAL mode) or an open ``sqlite3.Connection`` of the
    application. To commit output rows and offsets together, either pass your connection
    and call ``save(mapping, connection=conn)`` inside your own transaction, or use::

        with store.transaction() as conn:
            conn.execute("INSERT INTO results ...")
            store.save(positions, connection=conn)

    ``namespace`` separates several consumers sharing one table.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | sqlite3.Connection,
        namespace: str = "default",
        table: str = "epochguard_offsets",
    ) -> None:
        if not _IDENTIFIER.match(table):
            raise OffsetStoreError(f"table name {table!r} is not a plain SQL identifier")
        if not isinstance(namespace, str) or not namespace:
            raise OffsetStoreError(f"namespace must be a non-empty string, got {namespace!r}")
        self.namespace = namespace
        self.table = table
        self._owns = not isinstance(target, sqlite3.Connection)
        if isinstance(target, sqlite3.Connection):
            self._conn = target
            self.path: str | None = None
        else:
            self.path = os.fspath(target)
            try:
                # Autocommit mode: transactions are explicit (BEGIN ... COMMIT) below.
                self._conn = sqlite3.connect(self.path, isolation_level=None)
            except sqlite3.Error as exc:
                raise OffsetStoreError(f"cannot open offset store {self.path!r}: {exc}") from exc
        try:
            self._prepare()
        # A damaged page can also hold text that is not UTF-8.
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise OffsetStoreError(
                f"offset store {self._database} is not a usable SQLite database: {exc}"
            ) from exc

    @property
    def _database(self) -> str:
        """The database file, for error messages (an application's connection may hold one
        too, or be in memory)."""
        if self.path is not None:
            return self.path
        try:
            row = self._conn.execute("PRAGMA database_list").fetchone()
        except sqlite3.Error:
            row = None
        if row is not None and row[2]:
            return str(row[2])
        return "(the application's connection, no file)"

    @property
    def _where(self) -> str:
        """The table and its database file, for error messages."""
        return f"table {self.table!r} in {self._database}"

    def _prepare(self) -> None:
        conn = self._conn
        if self._owns and self.path not in (None, ":memory:", ""):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
        existing = conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name=?", (self.table,)
        ).fetchone()
        if existing is None:
            with self._maybe_transaction(conn):
                conn.execute(
                    f'CREATE TABLE IF NOT EXISTS "{self.table}" ('
                    "namespace TEXT NOT NULL, topic TEXT NOT NULL, "
                    "partition INTEGER NOT NULL, "
                    '"offset" INTEGER NOT NULL CHECK ("offset" >= 0), '
                    "leader_epoch INTEGER CHECK (leader_epoch IS NULL OR leader_epoch >= 0), "
                    + "".join(f"{c}, " for c in _V2_COLUMNS)
                    + "PRIMARY KEY (namespace, topic, partition))"
                )
                conn.execute(f"PRAGMA user_version={SQLITE_SCHEMA_VERSION}")
            return
        cols = tuple(row[1] for row in conn.execute(f'PRAGMA table_info("{self.table}")'))
        if cols == _COLUMNS_V1:
            # Written by an older epochguard: positions without topic ids stay valid.
            with self._maybe_transaction(conn):
                for column in _V2_COLUMNS:
                    conn.execute(f'ALTER TABLE "{self.table}" ADD COLUMN {column}')
                conn.execute(f"PRAGMA user_version={SQLITE_SCHEMA_VERSION}")
            return
        if cols != _COLUMNS:
            raise OffsetStoreError(
                f"{self._where} exists but is not an epochguard offset table "
                f"(columns {cols}, expected {_COLUMNS})"
            )

    @contextlib.contextmanager
    def _maybe_transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        if conn.in_transaction:
            yield  # the caller's transaction decides
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on the store's connection: commit on success, roll back on
        any exception. Put your own writes and ``save(..., connection=conn)`` inside."""
        conn = self._conn
        if conn.in_transaction:
            raise OffsetStoreError("a transaction is already open on this connection")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @property
    def connection(self) -> sqlite3.Connection:
        return self._conn

    def load(self) -> dict[TopicPartition, EpochOffset]:
        try:
            rows = self._conn.execute(
                f'SELECT topic, partition, "offset", leader_epoch, topic_id, epoch_exact '
                f'FROM "{self.table}" WHERE namespace=?',
                (self.namespace,),
            ).fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise OffsetStoreError(f"cannot read offsets from {self._where}: {exc}") from exc
        out: dict[TopicPartition, EpochOffset] = {}
        for topic, partition, offset, epoch, topic_id, exact in rows:
            try:
                # SQLite keeps whatever type was written: a row from another tool may hold
                # text in ``partition``.
                if not isinstance(topic, str) or not topic or type(partition) is not int:
                    raise InvalidPositionError(
                        f"topic must be a non-empty string and partition an integer, got "
                        f"{topic!r} and {partition!r}"
                    )
                out[topic_partition(topic, partition)] = EpochOffset(
                    offset, epoch, topic_id=topic_id, epoch_exact=bool(exact)
                )
            except InvalidPositionError as exc:
                raise OffsetStoreError(
                    f"corrupt row for {topic}-{partition} in {self._where}: {exc}"
                ) from exc
        return out

    def save(
        self,
        mapping: Mapping[TopicPartition, EpochOffset],
        connection: sqlite3.Connection | None = None,
    ) -> None:
        """Upsert ``mapping`` in one transaction, or inside the open transaction of
        ``connection`` (which then commits or rolls back with the caller's own writes)."""
        rows = _check_mapping(mapping)
        conn = self._conn if connection is None else connection
        params = [
            (self.namespace, t, p, pos.offset, pos.leader_epoch, pos.topic_id, int(pos.epoch_exact))
            for t, p, pos in rows
        ]
        sql = (
            f'INSERT INTO "{self.table}" '
            '(namespace, topic, partition, "offset", leader_epoch, topic_id, epoch_exact) '
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, topic, partition) "
            'DO UPDATE SET "offset"=excluded."offset", leader_epoch=excluded.leader_epoch, '
            "topic_id=excluded.topic_id, epoch_exact=excluded.epoch_exact"
        )
        try:
            if connection is not None:
                if not conn.in_transaction:
                    raise OffsetStoreError(
                        "save(connection=...) expects the caller's open transaction; use "
                        "store.transaction() or BEGIN first"
                    )
                conn.executemany(sql, params)
                return
            with self._maybe_transaction(conn):
                conn.executemany(sql, params)
        except sqlite3.DatabaseError as exc:
            raise OffsetStoreError(f"cannot save offsets to {self._where}: {exc}") from exc

    def close(self) -> None:
        if self._owns:
            self._conn.close()

    def __enter__(self) -> SqliteOffsetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------- json


class JsonFileOffsetStore:
    """Positions in a JSON file, replaced atomically (temp file, fsync, rename, fsync dir).

    A crash at any point leaves either the old or the new file, never a mix. A file that is
    not an epochguard offsets file raises :class:`OffsetStoreError`; a missing file is empty,
    but its directory must exist (checked at construction, as ``SqliteOffsetStore`` opens its
    file): a mistyped directory would otherwise look like a store with no positions.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._check_directory()

    def _check_directory(self) -> None:
        directory = self.path.parent
        if not directory.is_dir():
            raise OffsetStoreError(
                f"cannot open offset file {self.path}: directory {directory} does not exist"
            )

    def load(self) -> dict[TopicPartition, EpochOffset]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._check_directory()  # removed since construction: not an empty store
            return {}
        except OSError as exc:
            raise OffsetStoreError(f"cannot read offset file {self.path}: {exc}") from exc
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise OffsetStoreError(f"offset file {self.path} is corrupt: {exc}") from exc
        if (
            not isinstance(doc, dict)
            or doc.get("format") != JSON_FORMAT
            or not isinstance(doc.get("offsets"), list)
        ):
            raise OffsetStoreError(f"{self.path} is not an epochguard offsets file")
        if doc.get("version") not in _JSON_READABLE:
            raise OffsetStoreError(
                f"{self.path} has offsets format version {doc.get('version')!r}; "
                f"this epochguard reads versions {', '.join(map(str, _JSON_READABLE))}"
            )
        out: dict[TopicPartition, EpochOffset] = {}
        for entry in doc["offsets"]:
            try:
                topic, partition = entry["topic"], entry["partition"]
                if not isinstance(topic, str) or not isinstance(partition, int):
                    raise TypeError("topic/partition types")
                pos = EpochOffset.from_json(
                    {
                        "offset": entry["offset"],
                        "leader_epoch": entry.get("leader_epoch"),
                        "topic_id": entry.get("topic_id"),
                        "epoch_exact": entry.get("epoch_exact", False),
                    }
                )
            except (KeyError, TypeError, InvalidPositionError) as exc:
                raise OffsetStoreError(f"{self.path}: bad entry {entry!r}: {exc}") from exc
            out[topic_partition(topic, partition)] = pos
        return out

    def save(self, mapping: Mapping[TopicPartition, EpochOffset]) -> None:
        rows = _check_mapping(mapping)
        merged = self.load()
        for topic, partition, pos in rows:
            merged[topic_partition(topic, partition)] = pos
        doc = {
            "format": JSON_FORMAT,
            "version": JSON_VERSION,
            "offsets": [
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "offset": pos.offset,
                    "leader_epoch": pos.leader_epoch,
                    **({"topic_id": pos.topic_id} if pos.topic_id is not None else {}),
                    **({"epoch_exact": True} if pos.epoch_exact else {}),
                }
                for tp, pos in sorted(merged.items(), key=lambda kv: (kv[0][0], kv[0][1]))
            ],
        }
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise OffsetStoreError(f"cannot save offsets to {self.path}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise OffsetStoreError(f"cannot save offsets to {self.path}: {exc}") from exc
            raise
        # The rename itself must reach the disk, or a crash can bring the old file back.
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
