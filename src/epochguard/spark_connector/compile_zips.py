"""Compiled modules inside Spark's ``pyspark.zip`` and ``py4j-*-src.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the py4j zip first on the
``PYTHONPATH`` of every Python process it starts, so those processes import pyspark from
the zips, which hold sources only: each process compiles every pyspark module it imports.
Processes forked from Spark's worker daemon pay that once per daemon, but each streaming
query of a Python source starts its source runner as a new process, which pays it again
(about a second of CPU on the machines measured here, docs/guides/spark.md).

:func:`compile_zips` adds a compiled file beside each module in the zips (``mod.pyc``
next to ``mod.py``, where ``zipimport`` looks), for the Python that runs it. The compiled
files are checked against a hash of their source at import, so a changed source is
compiled again as before; another Python version ignores them (their magic number differs)
and compiles the sources as before. The original zip is kept beside it as ``<name>.orig``,
and :func:`restore_zips` puts it back. ``epochguard spark-compile-zips`` runs it.

:func:`compiled_spark_home` leaves the installation as it is: it builds a Spark home of
symbolic links to it, with compiled copies of the zips, for a ``SPARK_HOME`` of one's own
(a test suite's, a benchmark's).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import tempfile
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path

import attrs

__all__ = [
    "ZipState",
    "compile_zips",
    "compiled_spark_home",
    "restore_zips",
    "spark_zips",
    "zip_state",
]

#: Flags of a hash-based ``.pyc`` whose hash the importer checks against the source (PEP 552).
_CHECKED_HASH = 0b11


@attrs.frozen
class ZipState:
    """One zip: its modules, and how many have a compiled file for this Python (a module
    that does not compile has none: its import fails as it did)."""

    path: Path
    modules: int
    compiled: int
    #: Compiled files of another Python (another magic number).
    other_python: int
    has_original: bool

    @property
    def done(self) -> bool:
        return self.compiled > 0 and self.other_python == 0


def spark_zips(spark_home: str | os.PathLike[str] | None = None) -> list[Path]:
    """The zips Spark puts on its Python processes' path: ``python/lib/*.zip`` under
    ``spark_home`` (default: ``$SPARK_HOME``, or the installed pyspark's own home)."""
    if spark_home is None:
        from pyspark.find_spark_home import _find_spark_home  # $SPARK_HOME first

        spark_home = _find_spark_home()
    home = Path(spark_home)
    lib = home / "python" / "lib"
    zips = sorted(lib.glob("*.zip"))
    if not zips:
        raise FileNotFoundError(f"no zip in {lib}: is {home} a Spark home?")
    return zips


def _pyc(source: bytes, filename: str) -> bytes:
    """A checked hash-based ``.pyc`` (PEP 552) of ``source``, compiled as ``zipimport``
    compiles a module's source: line endings normalised, ``filename`` its path in the zip."""
    text = source.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    with warnings.catch_warnings():
        # Spark's own test modules in the zip warn (``is`` with a literal): not ours to show.
        warnings.simplefilter("ignore")
        code = compile(text, filename, "exec", dont_inherit=True)
    return b"".join(
        (
            importlib.util.MAGIC_NUMBER,
            _CHECKED_HASH.to_bytes(4, "little"),
            importlib.util.source_hash(source),
            marshal.dumps(code),
        )
    )


def _is_current_pyc(zf: zipfile.ZipFile, name: str) -> bool:
    with zf.open(name) as f:
        return f.read(4) == importlib.util.MAGIC_NUMBER


def zip_state(path: Path) -> ZipState:
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        sources = [n for n in names if n.endswith(".py")]
        current = {n for n in sources if n + "c" in names and _is_current_pyc(zf, n + "c")}
        other = sum(1 for n in names if n.endswith(".pyc") and n[:-1] not in current)
    return ZipState(path, len(sources), len(current), other, _original(path).exists())


def _original(path: Path) -> Path:
    return path.with_name(path.name + ".orig")


def compile_zips(paths: Iterable[Path]) -> list[ZipState]:
    """Add compiled modules to each zip in ``paths`` (see the module's docstring); a zip
    already compiled for this Python is left as it is."""
    out = []
    for path in paths:
        state = zip_state(path)
        if not state.done:
            _compile_one(path)
            state = zip_state(path)
        out.append(state)
    return out


def _has_compiled(path: Path) -> bool:
    with zipfile.ZipFile(path) as zf:
        return any(n.endswith(".pyc") for n in zf.namelist())


def _compile_one(path: Path) -> None:
    if not _has_compiled(path):
        # As Spark ships it (also after an upgrade replaced a zip compiled before): kept.
        shutil.copy2(path, _original(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp, "w") as zout:
            for info in zin.infolist():
                if info.filename.endswith(".pyc"):
                    continue  # compiled again below, for this Python
                data = zin.read(info)
                zout.writestr(info, data)
                if not info.filename.endswith(".py"):
                    continue
                try:
                    # The path zipimport gives a module compiled from the zip's source.
                    pyc = _pyc(data, f"{path}{os.sep}{info.filename}")
                except SyntaxError:
                    continue  # its import fails as it did
                compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
                compiled.compress_type = info.compress_type
                zout.writestr(compiled, pyc)
        shutil.copymode(path, tmp)
        # Atomic: a process Spark starts meanwhile finds one zip or the other.
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def restore_zips(paths: Iterable[Path]) -> list[Path]:
    """Put back the original of each zip in ``paths`` that holds compiled modules and has
    its original beside it; the restored paths. A zip without compiled modules (as
    shipped, or replaced by an upgrade) is left as it is."""
    restored = []
    for path in paths:
        original = _original(path)
        if original.exists() and _has_compiled(path):
            os.replace(original, path)
            restored.append(path)
    return restored


def compiled_spark_home(where: Path, spark_home: str | os.PathLike[str] | None = None) -> Path:
    """A Spark home at ``where`` (which must not exist) that is ``spark_home`` (default as
    :func:`spark_zips`) but for compiled copies of its zips: every other entry is a
    symbolic link into it. Start Spark with ``SPARK_HOME`` set to it."""
    zips = spark_zips(spark_home)
    lib = zips[0].parent
    levels = ((lib.parent.parent, where, "python"), (lib.parent, where / "python", "lib"))
    for src, dst, own in levels:
        dst.mkdir(parents=True)
        for entry in src.iterdir():
            if entry.name != own:
                (dst / entry.name).symlink_to(entry)
    (where / "python" / "lib").mkdir()
    copies = [where / "python" / "lib" / z.name for z in zips]
    for z, copy in zip(zips, copies, strict=True):
        shutil.copyfile(z, copy)
    compile_zips(copies)
    return where
