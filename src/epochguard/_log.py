"""Loggers for the library: structlog's stdlib integration, without any global configuration.

Every event goes to a stdlib :class:`logging.Logger` named ``epochguard.*``, so the
application's logging configuration (levels, handlers, formatters) decides what is shown.
The library never calls ``structlog.configure`` or ``logging.basicConfig``: that belongs to
the application. With no configuration at all, Python's last-resort handler shows warnings
and errors on stderr and nothing else.

Each record carries the structured event: ``record.msg`` is a dict (``event`` is the event
name, the other keys are the event's fields) that renders as ``name key=value ...`` with a
plain :class:`logging.Formatter`, and that structlog's ``ProcessorFormatter`` reads as an
event dict (``record._logger`` / ``record._name`` are set as ``wrap_for_formatter`` sets
them), so ``ProcessorFormatter(processor=JSONRenderer())`` gives one JSON object per event.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import structlog

__all__ = ["EpochguardLogger", "EventDict", "cli_output", "get_logger"]

_STRUCTURAL = frozenset({"event", "exc_info", "stack_info"})


class EventDict(dict[str, Any]):
    """An event as stored in ``LogRecord.msg``: a dict that prints as ``name key=value``."""

    def __str__(self) -> str:
        fields = " ".join(f"{k}={v!r}" for k, v in self.items() if k not in _STRUCTURAL)
        name = str(self.get("event", ""))
        return f"{name} {fields}" if fields else name


def _to_record(logger: Any, method_name: str, event_dict: Any) -> Any:
    """Final processor: ``(args, kwargs)`` for ``logging.Logger.log``."""
    for key, value in event_dict.items():
        # Fields log plain values: an enum (PositionSource.RESET_EARLIEST, a StrEnum too)
        # as its value, the same text and JSON as a field given as a plain string.
        if isinstance(value, enum.Enum):
            event_dict[key] = value.value
    kwargs: dict[str, Any] = {"extra": {"_logger": logger, "_name": method_name}}
    exc_info = event_dict.get("exc_info")
    if exc_info:
        # Resolved now: a handler that formats later would see another (or no) exception.
        if exc_info is True:
            exc_info = sys.exc_info()
        elif isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        event_dict["exc_info"] = exc_info
        kwargs["exc_info"] = exc_info
    if event_dict.get("stack_info"):
        kwargs["stack_info"] = True
    return (EventDict(event_dict),), kwargs


_PROCESSORS = (_to_record,)


class EpochguardLogger(structlog.stdlib.BoundLogger):
    """A stdlib-backed structlog logger whose level check comes first.

    structlog's own ``BoundLogger`` builds the event dict and runs the processors before the
    stdlib logger looks at its level; the fetch path logs at debug, so a disabled call here
    costs one cached ``isEnabledFor`` and nothing else.
    """

    def _emit(self, level: int, method_name: str, event: str | None, kw: dict[str, Any]) -> None:
        args, kwargs = self._process_event(method_name, event, kw)
        # stacklevel 3: the record names the library code that logged, not this module.
        self._logger.log(level, *args, stacklevel=3, **kwargs)

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, "debug", event, _positional(args, kw))

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.INFO):
            self._emit(logging.INFO, "info", event, _positional(args, kw))

    def warning(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, "warning", event, _positional(args, kw))

    warn = warning

    def error(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, "error", event, _positional(args, kw))

    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.ERROR):
            kw.setdefault("exc_info", True)
            self._emit(logging.ERROR, "error", event, _positional(args, kw))

    def critical(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.CRITICAL):
            self._emit(logging.CRITICAL, "critical", event, _positional(args, kw))

    fatal = critical

    def log(self, level: int, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(level):
            name = logging.getLevelName(level).lower()
            self._emit(level, name, event, _positional(args, kw))


def _positional(args: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    if args:
        kw["positional_args"] = args
    return kw


def get_logger(name: str) -> EpochguardLogger:
    """The logger for ``name`` (an ``epochguard.*`` name): stdlib-routed, level-checked first."""
    if name != "epochguard" and not name.startswith("epochguard."):
        raise ValueError(f"library logger names start with 'epochguard.', got {name!r}")
    return EpochguardLogger(logging.getLogger(name), processors=_PROCESSORS, context={})


@contextlib.contextmanager
def cli_output(stream: TextIO, level: int = logging.INFO) -> Iterator[None]:
    """For the command-line entry points only: show ``epochguard`` events on ``stream``.

    Attaches a handler to the ``epochguard`` logger for the duration and restores the
    logger's level afterwards, so an in-process call (tests) leaves logging as it found it.
    """
    root = logging.getLogger("epochguard")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s"))
    saved = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
