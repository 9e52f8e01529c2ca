"""``epochguard --version`` and the changelog agree with the package's version."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import epochguard
from epochguard.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
# Semantic Versioning 2.0.0's core (pre-release and build suffixes included).
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
)


def test_version_flag_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--version", "-V"):
        assert main([flag]) == 0
        out = capsys.readouterr().out
        assert out == f"epochguard {epochguard.__version__}\n"


def test_console_script_prints_the_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "epochguard", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert proc.stdout.strip() == f"epochguard {epochguard.__version__}"


def test_version_is_semantic() -> None:
    assert SEMVER.match(epochguard.__version__), epochguard.__version__


def test_changelog_latest_release_is_the_package_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d[^\]]*)\] - (\d{4}-\d{2}-\d{2})$", text, re.MULTILINE)
    assert releases, "no released version in CHANGELOG.md"
    assert releases[0][0] == epochguard.__version__
    assert releases[-1][0] == "0.1.0"
    versions = [tuple(int(p) for p in v.split(".")) for v, _ in releases]
    assert versions == sorted(versions, reverse=True), "releases newest first"
    dates = [d for _, d in releases]
    assert dates == sorted(dates, reverse=True)
    assert all(SEMVER.match(v) for v, _ in releases)
    # Keep a Changelog: an Unreleased section on top, standard change types only.
    assert text.index("## [Unreleased]") < text.index(f"## [{epochguard.__version__}]")
    kinds = set(re.findall(r"^### (.+)$", text, re.MULTILINE))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds


def test_install_instructions_name_the_current_version() -> None:
    for doc in ("README.md", "docs/install.md"):
        named = set(re.findall(r"epochguard-(\d+\.\d+\.\d+)", (ROOT / doc).read_text()))
        assert named == {epochguard.__version__}, (doc, named)
