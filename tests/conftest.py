"""Checks that hold for every test of the run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator

import pytest
from hypothesis import settings

# `make test` (and so CI) replays the same hypothesis examples on every run: its verdict
# depends on the code alone, and a counterexample found at random cannot block an unrelated
# change. Exploration is its own run: EPOCHGUARD_HYPOTHESIS=explore draws new examples
# (`make fuzz` and `make explore` set it); every counterexample found there is kept as an
# @example next to its property.
settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("EPOCHGUARD_HYPOTHESIS", "repeatable"))

#: The repository's top-level directories that are packages of ``epochguard`` (through the
#: src/epochguard symlinks). Imported under their bare names they would be second copies
#: with distinct classes (an ``isinstance`` against the other copy silently fails).
ALIASED_PACKAGES = frozenset({"consumer", "offsets", "testing", "spark_connector"})


def aliased_modules(names: Iterable[str]) -> list[str]:
    """The module names that are a bare (non-``epochguard.``) copy of our packages."""
    return sorted(n for n in names if n.partition(".")[0] in ALIASED_PACKAGES)


@pytest.fixture(autouse=True)
def _no_top_level_package_copies() -> Iterator[None]:
    yield
    leaked = aliased_modules(list(sys.modules))
    for name in leaked:
        del sys.modules[name]  # blame this test only, not every test after it
    assert not leaked, (
        f"imported outside the epochguard namespace: {leaked}; import epochguard.<name>"
    )
