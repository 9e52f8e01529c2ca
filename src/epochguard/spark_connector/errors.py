"""Typed errors of the Spark source.

Only an exception's message text reaches a Spark user (the class is lost on the way through
the JVM), so each message starts with a stable code or with the option it is about.
"""

from __future__ import annotations

from epochguard.offsets.errors import EpochGuardError

__all__ = [
    "LOG_TRUNCATION_CODE",
    "MISSING_TOPIC_CODE",
    "UNREACHABLE_CODE",
    "OffsetsJsonError",
    "SourceOptionError",
    "SparkDataLossError",
    "SparkLogTruncationError",
    "SparkMissingTopicError",
    "SparkUnreachableError",
]

#: Prefix of every truncation failure's message: the part users and alerting match on.
LOG_TRUNCATION_CODE = "KAFKA_LOG_TRUNCATION"
#: Prefix of a failure to reach any bootstrap server.
UNREACHABLE_CODE = "KAFKA_UNREACHABLE"
#: Prefix of the failure for a subscribed topic that does not exist (``failOnMissingTopic``).
MISSING_TOPIC_CODE = "KAFKA_MISSING_TOPIC"


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


class SparkUnreachableError(EpochGuardError):
    """No bootstrap server could be reached; the message names them and the cause."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{UNREACHABLE_CODE}: {message}")


class SparkMissingTopicError(EpochGuardError):
    """A subscribed topic does not exist and ``failOnMissingTopic`` is true."""

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics
        names = ", ".join(topics)
        super().__init__(
            f"{MISSING_TOPIC_CODE}: subscribed topic {names} does not exist "
            "(failOnMissingTopic=true)"
            if len(topics) == 1
            else f"{MISSING_TOPIC_CODE}: subscribed topics {names} do not exist "
            "(failOnMissingTopic=true)"
        )
