"""Typed errors of the Spark source.

Only an exception's message text reaches a Spark user (the class is lost on the way through
the JVM), so each message starts with a stable code or with the option it is about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epochguard.offsets.errors import EpochGuardError

if TYPE_CHECKING:
    from kafka.structs import TopicPartition

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
    "data_loss_message",
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


def data_loss_message(tp: TopicPartition, detail: str) -> str:
    """Spark's wording for lost records under ``failOnDataLoss=true``, about ``tp``."""
    return (
        f"Some data may have been lost because they are not available in Kafka any more; "
        f"either the data was aged out by Kafka or the topic may have been deleted before all "
        f"the data in the topic was processed. {tp.topic}-{tp.partition}: {detail}. If you "
        f"don't want your streaming query to fail on such cases, set the source option "
        f'"failOnDataLoss" to "false".'
    )
