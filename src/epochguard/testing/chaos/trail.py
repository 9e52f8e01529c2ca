"""Trails: the last inputs and outputs of every ``PartitionTracker``, for reading a chaos
failure that shows nothing else (a stall leaves a tracker waiting, not an error).

A trail entry is one call into a tracker (an input such as ``on_validation``, or an action
``next_action`` handed out) with its arguments, its result and the tracker's generation,
in-flight flag and state after it, plus the events it emitted. Session 6 found three bugs
this way that no replay had explained (a former leader's late answer dropping the current
fetch's records; a partition handed back taking its former tracker's answers).

Installing wraps the tracker class's methods for the whole process, so it is for the chaos
command line (``--trail``) and tests of this module only: nothing installs it by default.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from epochguard.offsets.state import PartitionTracker

__all__ = ["TRACED_METHODS", "install", "installed", "trail_of", "uninstall"]

#: The methods recorded: every input and every output. ``next_action`` is recorded only when
#: it hands something out (it is asked on every poll).
TRACED_METHODS = (
    "next_action",
    "cancel",
    "on_metadata",
    "on_records",
    "on_empty_fetch",
    "on_fetch_error",
    "on_diverging_epoch",
    "on_preferred_replica",
    "on_validation",
    "on_list_offsets",
    "on_request_failed",
    "restore",
    "seek",
    "request_reset",
    "pause",
    "resume",
)
#: Entries kept per tracker.
TRAIL_LENGTH = 300
_ARG_CHARS = 160

_lock = threading.Lock()
_originals: dict[str, Callable[..., Any]] = {}
# Keyed by id(): the tracker class has __slots__ without __weakref__. A tracker made later
# at the same address starts a fresh trail (see _traced_init).
_trails: dict[int, collections.deque[str]] = {}


def installed() -> bool:
    return bool(_originals)


def trail_of(tracker: PartitionTracker) -> list[str]:
    """The recorded entries of ``tracker``, oldest first (empty when not installed)."""
    return list(_trails.get(id(tracker), ()))


def _record(tracker: PartitionTracker, text: str) -> None:
    trail = _trails.get(id(tracker))
    if trail is None:
        trail = _trails[id(tracker)] = collections.deque(maxlen=TRAIL_LENGTH)
    trail.append(
        f"{time.monotonic():.3f} {threading.current_thread().name} {text} -> "
        f"gen={tracker._gen} in_flight={tracker._in_flight} {tracker.state.value}"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _ARG_CHARS else text[: _ARG_CHARS - 3] + "..."


def _traced(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def traced(self: PartitionTracker, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if name == "next_action" and result is None:
            return result
        shown = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
        _record(self, f"{name}({', '.join(shown)}) = {_short(result)}")
        return result

    return traced


def _traced_init(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def init(self: PartitionTracker, *args: Any, **kwargs: Any) -> None:
        method(self, *args, **kwargs)
        _trails[id(self)] = collections.deque(maxlen=TRAIL_LENGTH)
        _record(self, f"created for {self.tp}")

    return init


def _traced_drain(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def drain(self: PartitionTracker) -> Any:
        events = method(self)
        for event in events:
            _record(self, f"event {_short(event)}")
        return events

    return drain


def install() -> None:
    """Record every tracker of this process from now on (idempotent)."""
    with _lock:
        if _originals:
            return
        for name in (*TRACED_METHODS, "__init__", "drain_events"):
            original = getattr(PartitionTracker, name)
            _originals[name] = original
            if name == "__init__":
                wrapped = _traced_init(original)
            elif name == "drain_events":
                wrapped = _traced_drain(original)
            else:
                wrapped = _traced(name, original)
            setattr(PartitionTracker, name, wrapped)


def uninstall() -> None:
    """Put the tracker class back and forget every trail."""
    with _lock:
        for name, original in _originals.items():
            setattr(PartitionTracker, name, original)
        _originals.clear()
        _trails.clear()
