"""The examples of docs/guides/testing.md run as written, and its table of advertised APIs is
the handler registry's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

DOC = Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_quick_start_runs() -> None:
    exec(compile(python_blocks()[0], "docs/guides/testing.md:quick-start", "exec"), {})


def test_unclean_election_example_runs() -> None:
    (block,) = [b for b in python_blocks() if "unclean=True" in b]
    exec(compile(block, "docs/guides/testing.md:unclean", "exec"), {})


def test_transactions_example_runs() -> None:
    (block,) = [b for b in python_blocks() if "transactional_id=" in b]
    exec(compile(block, "docs/testing.md:transactions", "exec"), {})


def test_advertised_api_table_matches_the_registry() -> None:
    from epochguard.testing.embedded.handlers import load_all

    text = DOC.read_text().split("## APIs and versions advertised", 1)[1]
    documented = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1].isdigit():
            low, _, high = cells[2].partition("-")
            documented[int(cells[1])] = (int(low), int(high or low))
    registry = {k: (e.min_version, e.max_version) for k, e in load_all().items()}
    # Group APIs (FindCoordinator included) belong to the group coordinator's module.
    group_apis = {8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47}
    assert {k: v for k, v in documented.items() if k not in group_apis} == {
        k: v for k, v in registry.items() if k not in group_apis
    }
