"""Without Java/Maven the real-Kafka tests skip for a user, but fail in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TARGET = f"{HERE / 'test_apache_cluster.py'}::test_cluster_implements_the_protocol"


def run_without_java(tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"  # a PATH with python only: no java, javac or mvn
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"CI", "EPOCHGUARD_REQUIRE_REAL_KAFKA", "PYTEST_ADDOPTS"}
    }
    env.update(PATH=str(bin_dir), EPOCHGUARD_KAFKA_CACHE=str(tmp_path / "cache"), **extra_env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rsf", "-q", TARGET],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


@pytest.mark.timeout(150)
def test_skips_naming_the_missing_tools(tmp_path: Path) -> None:
    result = run_without_java(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "java, javac, mvn not installed" in result.stdout


@pytest.mark.timeout(150)
@pytest.mark.parametrize("env", [{"EPOCHGUARD_REQUIRE_REAL_KAFKA": "1"}, {"CI": "true"}])
def test_fails_in_ci(tmp_path: Path, env: dict[str, str]) -> None:
    result = run_without_java(tmp_path, **env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 error" in result.stdout or "1 failed" in result.stdout
    assert "real Apache Kafka required in CI but unavailable" in result.stdout
