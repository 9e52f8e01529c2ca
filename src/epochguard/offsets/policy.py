"""The two policies: what to do without a valid offset, and what to do on truncation.

``auto_offset_reset`` only governs "there is no valid offset": first start without a committed
position, or a position that retention moved the log start past. It never hides a truncation.
``on_truncation`` governs detected truncation; its default ``"auto"`` is KIP-320's behaviour.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeAlias

import attrs

from epochguard.offsets.errors import InvalidPolicyError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport


class ResetStrategy(enum.StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"


class TruncationDecision(enum.StrEnum):
    """What a truncation handler may answer (besides a seek target ``EpochOffset``)."""

    RAISE = "raise"  # stop the partition; the application must seek
    REWIND = "rewind"  # seek to the divergence point (reset policy if unknown)


#: A user callback deciding one truncation.
TruncationHandler: TypeAlias = Callable[[TruncationReport], "TruncationDecision | EpochOffset"]

_NAMED_TRUNCATION_POLICIES = ("auto", "raise", "rewind")


def _to_reset(value: object) -> ResetStrategy:
    if isinstance(value, ResetStrategy):
        return value
    if isinstance(value, str):
        try:
            return ResetStrategy(value.lower())
        except ValueError:
            pass
    raise InvalidPolicyError(
        f"auto_offset_reset must be one of 'earliest', 'latest', 'none'; got {value!r}"
    )


def _to_truncation(value: object) -> str | TruncationHandler:
    if isinstance(value, str) and value.lower() in _NAMED_TRUNCATION_POLICIES:
        return value.lower()
    if isinstance(value, TruncationDecision):
        return value.value
    if callable(value) and not isinstance(value, str | type):
        return value
    raise InvalidPolicyError(
        "on_truncation must be 'auto', 'raise', 'rewind' or a callable "
        f"(TruncationReport) -> TruncationDecision | EpochOffset; got {value!r}"
    )


@attrs.frozen
class RetryBackoff:
    """Exponential, capped retry delay in seconds (no jitter: the core is deterministic)."""

    initial: float = 0.1
    maximum: float = 10.0
    multiplier: float = 2.0

    def __attrs_post_init__(self) -> None:
        if not (self.initial > 0 and self.maximum >= self.initial and self.multiplier >= 1):
            raise InvalidPolicyError(
                f"RetryBackoff needs initial > 0, maximum >= initial, multiplier >= 1; got {self!r}"
            )

    def delay(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (0-based)."""
        if attempt <= 0:
            return self.initial
        # Cap the exponent so huge attempt counts cannot overflow a float.
        return min(self.maximum, self.initial * self.multiplier ** min(attempt, 64))


@attrs.frozen
class OffsetPolicy:
    """Both policies plus retry timing, validated at construction.

    ``on_truncation``:
      - ``"auto"`` (KIP-320): rewind when ``auto_offset_reset`` is earliest/latest, raise
        when it is ``"none"``;
      - ``"raise"``: stop the partition (``LogTruncationError``) until the application seeks;
      - ``"rewind"``: seek to the divergence point and report; with the divergence unknown,
        apply ``auto_offset_reset`` (raise if that is ``"none"``);
      - a callable taking the :class:`TruncationReport` and returning a
        :class:`TruncationDecision` or an :class:`EpochOffset` to seek to.
    """

    auto_offset_reset: ResetStrategy = attrs.field(
        default=ResetStrategy.LATEST, converter=_to_reset
    )
    on_truncation: str | TruncationHandler = attrs.field(default="auto", converter=_to_truncation)
    retry_backoff: RetryBackoff = attrs.field(factory=RetryBackoff)

    @retry_backoff.validator
    def _check_backoff(self, _attr: object, value: object) -> None:
        if not isinstance(value, RetryBackoff):
            raise InvalidPolicyError(f"retry_backoff must be a RetryBackoff, got {value!r}")

    def decide(self, report: TruncationReport) -> TruncationDecision | EpochOffset:
        """The decision for one truncation (before the divergence-unknown fallback)."""
        handler = self.on_truncation
        if handler == "auto":
            if self.auto_offset_reset is ResetStrategy.NONE:
                return TruncationDecision.RAISE
            return TruncationDecision.REWIND
        if handler == "raise":
            return TruncationDecision.RAISE
        if handler == "rewind":
            return TruncationDecision.REWIND
        assert callable(handler)
        answer: Any = handler(report)
        if isinstance(answer, EpochOffset):
            return answer
        if isinstance(answer, str):
            try:
                return TruncationDecision(answer.lower())
            except ValueError:
                pass
        raise InvalidPolicyError(
            f"on_truncation handler {handler!r} returned {answer!r}; expected a "
            "TruncationDecision or an EpochOffset"
        )
