"""How many hypothesis examples a property runs.

``make test`` runs each property's own count. ``make test-fast`` sets
``EPOCHGUARD_EXAMPLES_SCALE`` (a fraction) to run fewer, for day-to-day work; the explicit
``EPOCHGUARD_FUZZ_EXAMPLES`` / ``EPOCHGUARD_MODEL_EXAMPLES`` of ``make fuzz`` and ``make
explore`` still win where they apply.
"""

from __future__ import annotations

import os

SCALE_ENV = "EPOCHGUARD_EXAMPLES_SCALE"
#: No property runs fewer than this, however small the scale.
FLOOR = 10


def scaled(count: int) -> int:
    """``count`` examples times the scale (1 when unset), never fewer than :data:`FLOOR`."""
    raw = os.environ.get(SCALE_ENV, "")
    if not raw:
        return count
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV} must be a number, got {raw!r}") from None
    if not 0 < scale <= 1:
        raise ValueError(f"{SCALE_ENV} must be in (0, 1], got {raw!r}")
    return max(FLOOR, round(count * scale))
