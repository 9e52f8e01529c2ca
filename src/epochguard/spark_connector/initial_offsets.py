"""A stream's resolved starting offsets, kept in a file the user names (``initialOffsetsPath``).

Spark calls a Python source's ``initialOffset()`` again whenever a query starts with no
committed batch, and gives it no checkpoint location: a ``latest`` (or timestamp) start
resolved again after a restart lands past the records that arrived in between. Spark's own
Kafka source writes its initial offsets into the checkpoint (``sources/0``) for this
reason; this module is the same idea at a location the user gives. The first start writes
the offsets it resolved; every later start reads them back.

Paths are local paths or URIs of any file system pyarrow reaches (``s3://``, ``gs://``,
``hdfs://``, ``file://``): the file must be reachable from the driver, where Spark runs the
source's planning.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from epochguard.spark_connector.errors import OffsetsJsonError, SourceOptionError

__all__ = ["OPTION", "load_initial_offsets", "store_initial_offsets"]

#: The option that names the file.
OPTION = "initialOffsetsPath"
_FORMAT = "epochguard-initial-offsets"
_VERSION = 1


def _filesystem(path: str) -> tuple[Any, str]:
    from pyarrow import fs

    if "://" not in path:
        # A plain path: pyarrow takes absolute local paths only.
        path = os.path.abspath(path)
    try:
        filesystem, where = fs.FileSystem.from_uri(path)
    except (ValueError, OSError) as exc:
        raise SourceOptionError(OPTION, f"cannot open {path!r}: {exc}") from exc
    return filesystem, str(where)


def load_initial_offsets(path: str) -> dict[str, Any] | None:
    """The offsets stored at ``path`` (as Spark's offset JSON), or None when there is no
    file yet. A file that is not one this module wrote raises :class:`OffsetsJsonError`
    naming it: starting anywhere else could skip or re-read records."""
    from pyarrow import fs

    filesystem, where = _filesystem(path)
    try:
        if filesystem.get_file_info(where).type == fs.FileType.NotFound:
            return None
        with filesystem.open_input_stream(where) as stream:
            raw = stream.read()
    except OSError as exc:
        raise SourceOptionError(OPTION, f"cannot read {path!r}: {exc}") from exc
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise OffsetsJsonError(
            f"the initial offsets in {path!r} are not valid JSON ({exc})"
        ) from exc
    if (
        not isinstance(doc, dict)
        or doc.get("format") != _FORMAT
        or doc.get("version") != _VERSION
        or not isinstance(doc.get("offsets"), dict)
    ):
        raise OffsetsJsonError(
            f"{path!r} does not hold initial offsets written by the epochguard source "
            f"(expected {{'format': {_FORMAT!r}, 'version': {_VERSION}, 'offsets': ...}})"
        )
    offsets: dict[str, Any] = doc["offsets"]
    return offsets


def store_initial_offsets(path: str, offsets: dict[str, Any]) -> None:
    """Write ``offsets`` (Spark's offset JSON) to ``path``: to a new file beside it first,
    then moved into place, so a crash leaves the old state (no file) or the whole file."""
    filesystem, where = _filesystem(path)
    parent = where.rpartition("/")[0]
    staged = f"{where}.{uuid.uuid4().hex}.tmp"
    doc = {"format": _FORMAT, "version": _VERSION, "offsets": offsets}
    try:
        if parent:
            filesystem.create_dir(parent, recursive=True)
        with filesystem.open_output_stream(staged) as stream:
            stream.write(json.dumps(doc, sort_keys=True).encode())
        filesystem.move(staged, where)
    except OSError as exc:
        raise SourceOptionError(OPTION, f"cannot write {path!r}: {exc}") from exc
