"""kafka-python's ``TopicPartition``, imported on first use.

kafka-python's package ``__init__`` imports its consumer, producer and admin client, about a
third of a second of CPU. Modules that only name partitions (the sans-IO core, the Spark
source's planner processes) reach the class through here, so importing them does not
import kafka-python; the consumer imports it anyway.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka.structs import TopicPartition


@functools.cache
def topic_partition_class() -> type[TopicPartition]:
    """``kafka.structs.TopicPartition`` (the same class, so keys mix with kafka-python's)."""
    from kafka import structs

    cls: type[TopicPartition] = structs.TopicPartition
    return cls


def topic_partition(topic: str, partition: int) -> TopicPartition:
    """``TopicPartition(topic, partition)``."""
    return topic_partition_class()(topic, partition)
