"""Cost of one library log call, disabled and enabled, against what it cost before.

The fetch path logs at debug. ``structlog_proxy_filtered_ns`` is the old set-up: a
module-level ``structlog.get_logger`` proxy (it binds a new logger on every call) with a
level filter, as the benchmarks used to configure it. ``disabled_debug_ns`` is the same call
through ``epochguard._log`` with debug off (Python's default WARNING); ``enabled_debug_ns``
formats and hands the record to a handler writing to /dev/null.
"""

from __future__ import annotations

import logging
import os
import timeit
from typing import Any

import structlog

from epochguard._log import get_logger

N = 200_000


def _per_call_ns(fn: Any) -> float:
    return round(min(timeit.repeat(fn, number=N, repeat=5)) / N * 1e9, 1)


def run() -> dict[str, Any]:
    name = "epochguard.bench_logging"
    target = logging.getLogger(name)
    with open(os.devnull, "w") as devnull:
        old = structlog.wrap_logger(
            structlog.PrintLogger(devnull),
            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        )
        new = get_logger(name)
        before = _per_call_ns(lambda: old.debug("fetch_failed", node=1, error="e"))
        disabled = _per_call_ns(lambda: new.debug("fetch_failed", node=1, error="e"))
        handler = logging.StreamHandler(devnull)
        target.addHandler(handler)
        target.setLevel(logging.DEBUG)
        target.propagate = False
        try:
            enabled = _per_call_ns(lambda: new.debug("fetch_failed", node=1, error="e"))
        finally:
            target.removeHandler(handler)
            target.setLevel(logging.NOTSET)
            target.propagate = True
    return {
        "structlog_proxy_filtered_ns": before,
        "disabled_debug_ns": disabled,
        "enabled_debug_ns": enabled,
        "calls": N,
    }
