"""The unclean-election example in docs/testing.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_quick_start_runs() -> None:
    exec(compile(python_blocks()[0], "docs/testing.md:quick-start", "exec"), {})


def test_unclean_election_example_runs() -> None:
    (block,) = [b for b in python_blocks() if "unclean=True" in b]
    exec(compile(block, "docs/testing.md:unclean", "exec"), {})
