"""Importing epochguard logs one warning when the C record decoder is missing, saying how to
get it; none when it is built or when the pure-Python decoder is chosen on purpose."""

from __future__ import annotations

import os
import subprocess
import sys

from epochguard.consumer import records

# Each program imports the package the way an application does, with a logging
# configuration that shows level and logger name, then imports and uses it some more.
PROGRAM = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
if sys.argv[1] == "missing":
    # What an install without a compiler has: no epochguard.consumer._crecords module.
    sys.modules["epochguard.consumer._crecords"] = None
import epochguard
import epochguard.consumer.records
from epochguard import EpochConsumer
from epochguard.consumer import records
import importlib
importlib.import_module("epochguard.consumer.columns")
print("DECODER", records.DECODER)
"""


def run(mode: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != records.PURE_PYTHON_ENV}
    return subprocess.run(
        [sys.executable, "-P", "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**environ, **env},
    )


def test_missing_c_decoder_logs_one_warning_with_the_remedy() -> None:
    proc = run("missing")
    assert "DECODER python" in proc.stdout
    warnings = [ln for ln in proc.stderr.splitlines() if "record_decoder_fallback" in ln]
    assert len(warnings) == 1, proc.stderr
    (line,) = warnings
    assert line.startswith("WARNING epochguard.consumer record_decoder_fallback")
    assert "C extension not importable" in line
    assert "--no-binary epochguard" in line and "C compiler" in line


def test_missing_c_decoder_warns_without_any_logging_configuration() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            "import sys; sys.modules['epochguard.consumer._crecords'] = None; import epochguard",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != records.PURE_PYTHON_ENV},
    )
    # Python's last-resort handler shows warnings on stderr: the user sees it.
    assert proc.stderr.count("record_decoder_fallback") == 1, proc.stderr


def test_no_warning_when_the_c_decoder_is_built() -> None:
    proc = run("built")
    assert "DECODER c" in proc.stdout, proc.stdout + proc.stderr
    assert "record_decoder_fallback" not in proc.stderr


def test_no_warning_when_pure_python_is_chosen() -> None:
    proc = run("built", **{records.PURE_PYTHON_ENV: "1"})
    assert "DECODER python" in proc.stdout
    assert "record_decoder_fallback" not in proc.stderr
