"""Every example runs on an EmbeddedCluster and checks its own outcome (exit code 0)."""

from __future__ import annotations

import importlib
import io
import sys
from pathlib import Path

import pytest

from epochguard.consumer.demo import run_demo

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "name",
    [
        "group_rewind",
        "raise_compensate",
        "exactly_once_sqlite",
        "asyncio_worker",
        "exactly_once_pipeline",
    ],
)
def test_example_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    module = importlib.import_module(name)
    try:
        assert module.main(["--seconds", "20"]) == 0
    finally:
        sys.modules.pop(name, None)


def test_demo_shows_report_and_continues() -> None:
    out = io.StringIO()
    assert run_demo(out, fast=True) == 0
    text = out.getvalue()
    assert "offsets [10, 15) (5 records)" in text
    # The replica timeline: the old leader's divergent suffix, then its KIP-101 truncation.
    assert "log [0..14]@e0" in text
    assert text.count("log [0..9]@e0  [10..17]@e2") >= 3
    assert "refund-0, refund-1" in text
