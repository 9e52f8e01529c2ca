"""Typed errors of the Spark source.

Only an exception's message text reaches a Spark user (the class is lost on the way through
the JVM), so each message starts with a stable code or with the option it is about.
"""

from __future__ import annotations

from epochguard.offsets.errors import EpochGuardError

__all__ = [
    "LOG_TRUNCATION_CODE",
    "OffsetsJsonError",
    "SourceOptionError",
    "SparkDataLossError",
    "SparkLogTruncationError",
]

#: Prefix of every truncation failure's message: the part users and alerting match on.
LOG_TRUNCATION_CODE = "KAFKA_LOG_TRUNCATION"


class SourceOptionError(EpochGuardError, ValueError):
    """An unknown, misspelt, invalid or contradictory option; ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"option '{option}': {message}")


class OffsetsJsonError(EpochGuardError, ValueError):
    """Offsets JSON (an option value or a checkpoint) that is corrupt or does not fit the
    query; the message says where and what differs."""


class SparkLogTruncationError(EpochGuardError):
    """A partition's log was truncated under the query (``onTruncation=fail``)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{LOG_TRUNCATION_CODE}: {message}")


class SparkDataLossError(EpochGuardError):
    """Records the query still had to read are gone (aged out, topic deleted) and
    ``failOnDataLoss`` is true; the message is Spark's."""
