"""``epochguard spark-compile-zips``: compiled modules in Spark's zips, used by zipimport,
checked against their source, ignored by another Python, and the original put back."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from epochguard.__main__ import main
from epochguard.spark_connector.compile_zips import (
    compile_zips,
    restore_zips,
    spark_zips,
    zip_state,
)

MOD_V1 = b"def answer():\n    raise ValueError('from the zip, version one')\n"
MOD_V2 = b"def answer():\n    raise ValueError('from the zip, version two')\n"


def _spark_home(tmp_path: Path, mod: bytes = MOD_V1) -> Path:
    lib = tmp_path / "home" / "python" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    _write_zip(lib / "fakespark.zip", mod)
    with zipfile.ZipFile(lib / "fakepy4j-src.zip", "w") as zf:
        zf.writestr("fakepy4j/__init__.py", b"NAME = 'py4j'\n")
    return tmp_path / "home"


def _write_zip(path: Path, mod: bytes) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("fakespark/__init__.py", b"VERSION = 1\n")
        zf.writestr("fakespark/mod.py", mod)
        zf.writestr("fakespark/broken.py", b"def (:\n")
        zf.writestr("fakespark/data.txt", b"not python\n")


def _import_answer(zip_path: Path) -> tuple[str, str]:
    """Import fakespark.mod from ``zip_path`` in a fresh interpreter: its ``__file__`` and
    the traceback of ``answer()``."""
    program = (
        "import traceback, fakespark.mod as m\n"
        "print(m.__file__)\n"
        "try:\n    m.answer()\nexcept ValueError:\n    print(traceback.format_exc())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "PYTHONPATH": str(zip_path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    first, _, rest = out.partition("\n")
    return first, rest


def test_compiled_modules_are_imported_and_tracebacks_show_the_source(tmp_path: Path) -> None:
    home = _spark_home(tmp_path)
    zip_path = home / "python" / "lib" / "fakespark.zip"
    shipped = zip_path.read_bytes()
    assert _import_answer(zip_path)[0].endswith("mod.py")

    assert main(["spark-compile-zips", "--spark-home", str(home)]) == 0

    with zipfile.ZipFile(zip_path) as zf:
        names = set(zf.namelist())
    assert {"fakespark/__init__.pyc", "fakespark/mod.pyc"} <= names
    assert "fakespark/broken.pyc" not in names  # does not compile: left to fail on import
    assert (home / "python" / "lib" / "fakespark.zip.orig").read_bytes() == shipped
    file, trace = _import_answer(zip_path)
    assert file.endswith("mod.pyc")
    assert f"{zip_path}{os.sep}fakespark/mod.py" in trace
    assert "raise ValueError('from the zip, version one')" in trace
    assert zip_state(zip_path).done


def test_a_changed_source_is_compiled_again_and_another_python_ignores_the_files(
    tmp_path: Path,
) -> None:
    home = _spark_home(tmp_path)
    zip_path = home / "python" / "lib" / "fakespark.zip"
    compile_zips([zip_path])
    with zipfile.ZipFile(zip_path) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist()}

    # The source changed, its compiled file not: the hash check refuses the stale file.
    changed = tmp_path / "changed.zip"
    with zipfile.ZipFile(changed, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, MOD_V2 if name == "fakespark/mod.py" else data)
    file, trace = _import_answer(changed)
    assert file.endswith("mod.py")
    assert "version two" in trace

    # Compiled by another Python (another magic number): its source is compiled instead.
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, b"\x00\x00\r\n" + data[4:] if name.endswith(".pyc") else data)
    assert _import_answer(other)[0].endswith("mod.py")
    assert zip_state(other).compiled == 0


def test_compiling_twice_changes_nothing_and_restore_puts_the_original_back(
    tmp_path: Path,
) -> None:
    home = _spark_home(tmp_path)
    zips = spark_zips(home)
    assert [z.name for z in zips] == ["fakepy4j-src.zip", "fakespark.zip"]
    shipped = {z: z.read_bytes() for z in zips}
    first = compile_zips(zips)
    assert all(s.done and s.has_original for s in first)
    compiled = {z: (z.read_bytes(), z.stat().st_mtime_ns) for z in zips}
    assert compile_zips(zips) == first
    assert {z: (z.read_bytes(), z.stat().st_mtime_ns) for z in zips} == compiled

    assert main(["spark-compile-zips", "--spark-home", str(home), "--restore"]) == 0
    assert {z: z.read_bytes() for z in zips} == shipped
    assert not any(z.with_name(z.name + ".orig").exists() for z in zips)
    # Nothing compiled now: a second restore leaves the zips as they are.
    assert restore_zips(zips) == []


def test_an_upgraded_zip_is_kept_as_the_new_original(tmp_path: Path) -> None:
    home = _spark_home(tmp_path)
    zip_path = home / "python" / "lib" / "fakespark.zip"
    compile_zips([zip_path])
    # An upgrade replaces the compiled zip with its new version, as shipped.
    _write_zip(zip_path, MOD_V2)
    upgraded = zip_path.read_bytes()
    compile_zips([zip_path])
    assert zip_path.with_name("fakespark.zip.orig").read_bytes() == upgraded
    file, trace = _import_answer(zip_path)
    assert file.endswith("mod.pyc")
    assert "version two" in trace


def test_check_writes_nothing_and_a_home_without_zips_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = _spark_home(tmp_path)
    before = {p: p.read_bytes() for p in (home / "python" / "lib").iterdir()}
    assert main(["spark-compile-zips", "--spark-home", str(home), "--check"]) == 0
    assert "0 of 3 modules compiled" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in (home / "python" / "lib").iterdir()} == before

    assert main(["spark-compile-zips", "--spark-home", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("epochguard spark-compile-zips: no zip in ")
    assert str(tmp_path / "nowhere" / "python" / "lib") in err


def test_pyspark_imports_from_its_compiled_zip(tmp_path: Path) -> None:
    """The zips of the installed pyspark, copied and compiled: the source runner's module
    imports with pyspark's modules from their compiled files."""
    pytest.importorskip("pyspark")
    home = tmp_path / "home"
    lib = home / "python" / "lib"
    lib.mkdir(parents=True)
    for z in spark_zips(_installed_spark_home()):
        (lib / z.name).write_bytes(z.read_bytes())
    states = compile_zips(spark_zips(home))
    assert all(s.done for s in states), states
    program = (
        "import pyspark.sql.streaming.python_streaming_source_runner as r, pyspark.sql.session\n"
        "print(r.__file__); print(pyspark.sql.session.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(str(z) for z in spark_zips(home))},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(str(lib) in f and f.endswith(".pyc") for f in out), out


def _installed_spark_home() -> Path:
    # Not $SPARK_HOME: the suite sets that to its own compiled Spark home (tests/conftest.py).
    import pyspark

    return Path(pyspark.__file__).parent
