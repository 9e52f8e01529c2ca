"""The distribution installs as one namespace, ``epochguard``, from a wheel and editable."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("offsets", "consumer", "spark_connector", "testing")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
    )
    (built,) = out.glob("epochguard-*.whl")
    return built


def test_wheel_has_only_the_epochguard_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"epochguard"}
    for sub in SUBPACKAGES:
        assert f"epochguard/{sub}/__init__.py" in names
    assert "epochguard/py.typed" in names


def test_built_wheel_imports_in_isolation(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    assert not (target / "offsets").exists() and not (target / "consumer").exists()
    code = (
        "import epochguard, importlib;"
        + "".join(f"importlib.import_module('epochguard.{s}');" for s in SUBPACKAGES)
        + "print(epochguard.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    ).stdout.strip()
    assert out.startswith(str(target)), out


def test_editable_install_resolves_to_the_source_tree() -> None:
    import epochguard.offsets

    assert Path(epochguard.offsets.__file__).resolve().parent == ROOT / "offsets"
