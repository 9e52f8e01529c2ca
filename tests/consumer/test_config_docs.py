"""docs/reference/configuration.md lists every configuration key with its default, as the code
has it, and every key the consumer accepts without effect says so."""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

from epochguard.consumer.config import DEFAULT_CONFIG, IGNORED_KEYS

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"

_SOCKET_NAMES = {
    socket.IPPROTO_TCP: "IPPROTO_TCP",
    socket.TCP_NODELAY: "TCP_NODELAY",
}


def render_default(value: Any) -> str:
    """A default as the reference's table shows it (in backticks)."""
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, float) and math.isinf(value):
        return "`inf`"
    if isinstance(value, tuple) and all(isinstance(v, type) for v in value):
        return "`(" + ", ".join(v.__name__ for v in value) + ")`"
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        inner = ", ".join(
            "(" + ", ".join(_SOCKET_NAMES.get(x, str(x)) for x in t[:2]) + f", {t[2]})"
            for t in value
        )
        return f"`[{inner}]`"
    return f"`{value!r}`"


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_every_key_is_listed_with_its_default() -> None:
    rows = _rows()
    for key, default in DEFAULT_CONFIG.items():
        assert key in rows, f"{key} is not in {DOC.name}"
        assert rows[key][0] == render_default(default), (key, rows[key][0])


def test_no_key_is_listed_that_the_consumer_refuses() -> None:
    assert set(_rows()) <= set(DEFAULT_CONFIG)


def test_keys_without_effect_say_so() -> None:
    rows = _rows()
    for key in IGNORED_KEYS:
        assert "no effect" in rows[key][1], key


def test_the_renderer_can_tell_defaults_apart() -> None:
    assert render_default("latest") == '`"latest"`'
    assert render_default(None) == "`None`" != render_default("None")
    assert render_default(float("inf")) == "`inf`"
    assert render_default(500) == "`500`" != render_default(5000)
    assert render_default((int, str)) == "`(int, str)`"
