"""The source's offsets: per-partition positions with epochs, as Spark checkpoints them.

Sans-IO (no pyspark import). Spark stores an offset as the JSON text the source hands it and
compares offsets as strings, so :meth:`SourceOffset.to_json` always emits topics, partitions
and position fields in one sorted order: equal offsets give equal text.

The format is Spark's own ``{"topic": {"partition": ...}}`` with a position in place of the
bare offset, written with :meth:`EpochOffset.to_json`::

    {"orders": {"0": {"leader_epoch": 3, "offset": 120, "topic_id": "5b0c..."}}}

Spark's bare form ``{"orders": {"0": 120}}`` is read too (no epoch: the position is
validated by offset only), so a query can move over from Spark's Kafka source.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from epochguard._topic_partition import topic_partition, topic_partition_class
from epochguard.offsets.errors import InvalidPositionError
from epochguard.offsets.position import EpochOffset
from epochguard.spark_connector.errors import OffsetsJsonError

if TYPE_CHECKING:
    from kafka.structs import TopicPartition

__all__ = [
    "EARLIEST",
    "LATEST",
    "PartitionSpec",
    "SourceOffset",
    "parse_partition_offsets",
    "parse_partition_timestamps",
    "parse_partitions",
]

#: Spark's sentinels in ``startingOffsets``/``endingOffsets`` JSON.
EARLIEST = -2
LATEST = -1

#: A position, or one of the sentinels :data:`EARLIEST` / :data:`LATEST`.
PartitionSpec = EpochOffset | int


def _load(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise OffsetsJsonError(f"{what} is not valid JSON ({exc}): {text!r}") from exc


def _partition(topic: str, key: object, what: str) -> TopicPartition:
    if not isinstance(key, str) or not (key.isascii() and key.isdigit()):
        raise OffsetsJsonError(
            f"{what}: partition {key!r} of topic {topic!r} is not a non-negative integer"
        )
    return topic_partition(topic, int(key))


def _topics(data: Any, what: str) -> Iterable[tuple[str, Mapping[str, Any]]]:
    if not isinstance(data, Mapping):
        raise OffsetsJsonError(
            f'{what} must be a JSON object {{"topic": {{"partition": ...}}}}, got {data!r}'
        )
    for topic, parts in data.items():
        if not isinstance(topic, str) or not topic:
            raise OffsetsJsonError(f"{what}: topic names must be non-empty strings")
        if not isinstance(parts, Mapping):
            raise OffsetsJsonError(
                f"{what}: topic {topic!r} must map partitions to offsets, got {parts!r}"
            )
        yield topic, parts


def _position(tp: TopicPartition, value: object, what: str, sentinels: frozenset[int]) -> Any:
    where = f"{what}: {tp.topic}-{tp.partition}"
    if isinstance(value, bool):
        raise OffsetsJsonError(f"{where}: {value!r} is not an offset")
    if isinstance(value, int):
        if value >= 0:
            return EpochOffset(value)
        if value in sentinels:
            return value
        allowed = " or ".join(str(s) for s in sorted(sentinels)) or "no sentinel"
        raise OffsetsJsonError(f"{where}: offset {value} is negative (allowed here: {allowed})")
    if isinstance(value, Mapping):
        try:
            return EpochOffset.from_json(value)
        except InvalidPositionError as exc:
            raise OffsetsJsonError(f"{where}: {exc}") from exc
    raise OffsetsJsonError(f"{where}: {value!r} is neither an offset nor a position object")


def parse_partition_offsets(
    text: str | bytes, what: str, sentinels: Iterable[int] = (EARLIEST, LATEST)
) -> dict[TopicPartition, PartitionSpec]:
    """Parse ``startingOffsets``/``endingOffsets`` JSON: per partition a bare offset, a
    position object, or one of ``sentinels``. ``what`` names the option in errors."""
    allowed = frozenset(sentinels)
    out: dict[TopicPartition, PartitionSpec] = {}
    for topic, parts in _topics(_load(text, what), what):
        for key, value in parts.items():
            tp = _partition(topic, key, what)
            out[tp] = _position(tp, value, what, allowed)
    return out


def parse_partition_timestamps(text: str | bytes, what: str) -> dict[TopicPartition, int]:
    """Parse ``startingOffsetsByTimestamp`` JSON: ``{"topic": {"partition": ms}}``."""
    out: dict[TopicPartition, int] = {}
    for topic, parts in _topics(_load(text, what), what):
        for key, value in parts.items():
            tp = _partition(topic, key, what)
            if isinstance(value, bool) or not isinstance(value, int):
                raise OffsetsJsonError(
                    f"{what}: {tp.topic}-{tp.partition}: timestamp {value!r} is not an integer"
                )
            out[tp] = value
    return out


def parse_partitions(text: str | bytes, what: str) -> frozenset[TopicPartition]:
    """Parse ``assign`` JSON: ``{"topic": [0, 1]}``."""
    data = _load(text, what)
    if not isinstance(data, Mapping) or not data:
        raise OffsetsJsonError(f'{what} must be a JSON object {{"topic": [0, 1]}}, got {text!r}')
    out: set[TopicPartition] = set()
    for topic, parts in data.items():
        if not isinstance(topic, str) or not topic:
            raise OffsetsJsonError(f"{what}: topic names must be non-empty strings")
        if not isinstance(parts, list):
            raise OffsetsJsonError(
                f"{what}: topic {topic!r} must map to a list of partitions, got {parts!r}"
            )
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise OffsetsJsonError(
                    f"{what}: partition {p!r} of topic {topic!r} is not a non-negative integer"
                )
            out.add(topic_partition(topic, p))
    return frozenset(out)


def _sorted_positions(
    positions: Mapping[TopicPartition, EpochOffset] | Iterable[tuple[TopicPartition, EpochOffset]],
) -> tuple[tuple[TopicPartition, EpochOffset], ...]:
    items = positions.items() if isinstance(positions, Mapping) else positions
    out = []
    for tp, pos in items:
        if not isinstance(tp, topic_partition_class()) or not isinstance(pos, EpochOffset):
            raise TypeError(
                f"a SourceOffset maps TopicPartition to EpochOffset, got {tp!r}: {pos!r}"
            )
        out.append((tp, pos))
    out.sort(key=lambda item: (item[0].topic, item[0].partition))
    return tuple(out)


@attrs.frozen
class SourceOffset:
    """A Spark offset of this source: the next position of every partition read."""

    positions: tuple[tuple[TopicPartition, EpochOffset], ...] = attrs.field(
        converter=_sorted_positions
    )

    def as_dict(self) -> dict[TopicPartition, EpochOffset]:
        return dict(self.positions)

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(tp.topic for tp, _ in self.positions)

    def to_json(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The form handed to Spark (a dict it serialises): topics, partitions and fields
        in sorted order, so equal offsets serialise to equal text."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for tp, pos in self.positions:
            out.setdefault(tp.topic, {})[str(tp.partition)] = dict(sorted(pos.to_json().items()))
        return out

    def to_json_str(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | bytes) -> SourceOffset:
        """Read what :meth:`to_json` wrote, or Spark's ``{"t": {"0": 23}}`` form.

        Corrupt JSON, a negative offset or an unknown field raises :class:`OffsetsJsonError`
        naming the partition and the problem.
        """
        what = "offset JSON"
        if isinstance(data, str | bytes):
            data = _load(data, what)
        positions: dict[TopicPartition, EpochOffset] = {}
        for topic, parts in _topics(data, what):
            for key, value in parts.items():
                tp = _partition(topic, key, what)
                pos = _position(tp, value, what, frozenset())
                assert isinstance(pos, EpochOffset)  # no sentinels were allowed
                positions[tp] = pos
        return cls(positions)
