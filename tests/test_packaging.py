"""The distribution installs as one namespace, ``epochguard``, from a wheel and editable."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("offsets", "consumer", "spark_connector", "testing")
# One worker runs both modules that build from the source tree (build/, src/*.egg-info).
pytestmark = pytest.mark.xdist_group("builds-from-the-source-tree")
#: Not copied into the build's own tree: what a build or a developer leaves behind.
_LEFT_BEHIND = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # A copy of the tree: setuptools builds in ./build, where an interrupted build leaves
    # files that make the next one fail ("File exists").
    tree = tmp_path_factory.mktemp("tree") / "epochguard"
    shutil.copytree(ROOT, tree, ignore=_LEFT_BEHIND)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",  # offline: the venv's own setuptools builds it
            "--quiet",
            "-w",
            str(out),
            str(tree),
        ],
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

    assert (
        Path(epochguard.offsets.__file__).resolve().parent
        == ROOT / "src" / "epochguard" / "offsets"
    )


def test_version_is_defined_once() -> None:
    import epochguard

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert importlib.metadata.version("epochguard") == epochguard.__version__


def test_wheel_carries_the_version_and_the_license(wheel: Path) -> None:
    import epochguard

    assert wheel.name.startswith(f"epochguard-{epochguard.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    text = zipfile.ZipFile(wheel).read(license_file).decode()
    assert text == (ROOT / "LICENSE").read_text()


def test_license_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in text
    assert text.rstrip().endswith("limitations under the License.")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]


def test_venv_can_build_without_network() -> None:
    """--no-build-isolation builds use the venv's setuptools/wheel: they must be new enough."""
    from packaging.requirements import Requirement

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for spec in requires:
        req = Requirement(spec)
        installed = importlib.metadata.version(req.name)
        assert req.specifier.contains(installed, prereleases=True), (spec, installed)
