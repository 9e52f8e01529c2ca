"""The sdist and a wheel per interpreter install into clean venvs of Python 3.11, 3.12 and
3.13 with only the runtime dependencies, and the install guide's program catches a
truncation there: with the C decoder, and with the pure-Python one a compiler-less build
gives (the import then warns once).

Interpreters come from pyenv (``pyenv root``/versions/3.X.*), or ``python3.X`` on the PATH.
pip's downloads (the build backend, the runtime dependencies) are cached across runs in
``~/.cache/epochguard-install-test``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.11", "3.12", "3.13")
DECODERS = ("c", "python")
RUNTIME = {
    "epochguard",
    "kafka-python",
    "attrs",
    "structlog",
    "crc32c",
    "opentelemetry-proto",
    "protobuf",
}
# What a fresh venv may hold besides (pip is left out below; 3.11's venv adds setuptools).
VENV_BASE = {"pip", "setuptools"}

# One worker runs both modules that build from the source tree (build/, src/*.egg-info).
pytestmark = [
    pytest.mark.install,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.xdist_group("builds-from-the-source-tree"),
]


def _guide_program() -> tuple[str, str]:
    """The install guide's check program and the ``caught:`` line it says it prints."""
    text = (ROOT / "docs" / "install.md").read_text().split("## Check the install", 1)[1]
    (program,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (caught,) = re.findall(r"^caught: .*$", text, flags=re.M)
    return program, caught


def _interpreter(version: str) -> Path:
    roots = []
    pyenv = shutil.which("pyenv")
    if pyenv:
        out = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        roots.append(Path(out.stdout.strip()))
    roots.append(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")))
    for root in roots:
        found = sorted(
            (root / "versions").glob(f"{version}.*/bin/python"),
            key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)],
        )
        if found:
            return found[-1]
    on_path = shutil.which(f"python{version}")
    if on_path and "shims" not in on_path:
        return Path(on_path)
    raise AssertionError(f"Python {version} not found (pyenv install {version}, or put it on PATH)")


def _env(**extra: str) -> dict[str, str]:
    """A plain environment: no PYTHON*/EPOCHGUARD_* settings of the test run leak in."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "PIP_INDEX_URL")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    env["PIP_CACHE_DIR"] = str(cache / "epochguard-install-test")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return {**env, **extra}


def _run(
    *cmd: str | Path,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    _run(
        sys.executable,
        "-m",
        "build",
        "--sdist",
        "--no-isolation",
        "--outdir",
        out,
        ROOT,
        env=_env(),
    )
    (built,) = out.glob("epochguard-*.tar.gz")
    with tarfile.open(built) as tar:
        names = set(tar.getnames())
    top = built.name.removesuffix(".tar.gz")
    for needed in ("setup.py", "pyproject.toml", "src/epochguard/consumer/_crecords.c"):
        assert f"{top}/{needed}" in names, needed
    assert f"{top}/docs/install.md" in names and f"{top}/CHANGELOG.md" in names
    return built


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("version", PYTHONS)
def test_install_and_catch_a_truncation(
    version: str, decoder: str, sdist: Path, tmp_path: Path
) -> None:
    python = _interpreter(version)
    tag = "cp" + version.replace(".", "")
    # Each build from its own copy of the sdist: pip caches wheels it builds by the
    # archive's location, and the compiler-less build must not get the other one's wheel.
    source = tmp_path / "src" / sdist.name
    source.parent.mkdir()
    shutil.copy(sdist, source)
    wheelhouse = tmp_path / "wheelhouse"
    # Without a compiler: setuptools' optional extension fails to build and is left out,
    # as on a machine with no gcc (CC=false fails every compile).
    build_env = _env(CC="false") if decoder == "python" else _env()
    _run(python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheelhouse, source, env=build_env)
    (wheel,) = wheelhouse.glob("epochguard-*.whl")
    assert f"-{tag}-{tag}-" in wheel.name, wheel.name
    extensions = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    if decoder == "c":
        assert len(extensions) == 1, extensions
        assert extensions[0].startswith(f"epochguard/consumer/_crecords.cpython-{tag[2:]}-")
    else:
        assert extensions == []

    venv = tmp_path / "venv"
    _run(python, "-m", "venv", "--without-pip", venv, env=_env())
    vpython = venv / "bin" / "python"
    # The test run's pip installs into the venv (pip --python): no pip in the venv itself.
    _run(sys.executable, "-m", "pip", "--python", vpython, "install", "-q", wheel, env=_env())
    installed = _run(
        vpython,
        "-I",
        "-c",
        "import importlib.metadata as m; print('\\n'.join(sorted({d.metadata['Name'].lower() "
        "for d in m.distributions()})))",
        env=_env(),
    ).stdout.split()
    assert set(installed) - VENV_BASE == RUNTIME, installed

    program, caught = _guide_program()
    (tmp_path / "check.py").write_text(program)
    proc = _run(vpython, "-I", "check.py", cwd=tmp_path, env=_env(), timeout=120)
    assert proc.stdout.splitlines() == [
        "read: " + ", ".join(f"order-{i}" for i in range(7)),
        caught,
    ], proc.stdout + proc.stderr
    fallback = proc.stderr.count("record_decoder_fallback")
    assert fallback == (1 if decoder == "python" else 0), proc.stderr

    which = _run(
        vpython,
        "-I",
        "-c",
        "import epochguard, epochguard.consumer.records as r; "
        "print(r.DECODER, epochguard.__file__)",
        cwd=tmp_path,
        env=_env(),
    ).stdout.split()
    assert which[0] == decoder
    assert Path(which[1]).is_relative_to(venv), which  # the venv's copy, not the repository's
    version_line = _run(venv / "bin" / "epochguard", "--version", env=_env()).stdout.strip()
    assert version_line == "epochguard " + sdist.name.removesuffix(".tar.gz").split("-", 1)[1]
