"""Shared by the fuzz tests: example counts and the decoders side by side.

Every property runs ``examples(default)`` hypothesis examples: the default keeps
``make test`` short, ``EPOCHGUARD_FUZZ_EXAMPLES=N`` (what ``make fuzz`` sets) runs N per
property instead.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

from ..examples import scaled

FUZZ_ENV = "EPOCHGUARD_FUZZ_EXAMPLES"


def examples(default: int) -> int:
    raw = os.environ.get(FUZZ_ENV, "")
    if not raw:
        return scaled(default)
    n = int(raw)
    if n <= 0:
        raise ValueError(f"{FUZZ_ENV} must be a positive integer, got {raw!r}")
    return n


def fuzz(default: int) -> Any:
    """The hypothesis settings of one fuzz property."""
    return settings(
        max_examples=examples(default),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
