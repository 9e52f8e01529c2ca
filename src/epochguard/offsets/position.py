"""``EpochOffset``: a consumer position that remembers which leader epoch it belongs to."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from epochguard.offsets.errors import InvalidPositionError

if TYPE_CHECKING:
    from epochguard.offsets.reopened import UndecidedTransaction

#: Kafka's sentinel for "no epoch" on the wire.
UNDEFINED_EPOCH = -1
#: Kafka's sentinel for "no offset" in OffsetForLeaderEpoch answers.
UNDEFINED_EPOCH_OFFSET = -1


def _check_offset(_inst: object, _attr: object, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPositionError(f"offset must be an int, got {value!r}")
    if value < 0:
        raise InvalidPositionError(f"offset must be >= 0, got {value}")


def normalise_epoch(value: object) -> int | None:
    """``None`` and Kafka's ``-1`` both mean "no epoch"; anything below -1 is an error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPositionError(f"leader_epoch must be an int or None, got {value!r}")
    if value < UNDEFINED_EPOCH:
        raise InvalidPositionError(f"leader_epoch must be >= -1 (or None), got {value}")
    return None if value == UNDEFINED_EPOCH else value


def normalise_topic_id(value: object) -> str | None:
    """A topic id as text (``uuid.UUID`` or its string); the all-zero id means none."""
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return None if value.int == 0 else str(value)
    if isinstance(value, str) and value:
        try:
            if uuid.UUID(value).int == 0:
                return None
        except ValueError:
            pass  # not a UUID: an opaque id (the sans-IO core never looks inside)
        return value
    raise InvalidPositionError(f"topic_id must be a UUID, a non-empty str or None, got {value!r}")


@attrs.frozen(order=False, repr=False)
class EpochOffset:
    """The next offset to read and the leader epoch of the record just before it.

    ``leader_epoch`` is ``None`` when unknown (old message format, a seek by bare offset).
    ``topic_id`` (optional) names the incarnation of the topic the position belongs to: a
    topic deleted and re-created under the same name gets a new id and restarts its offsets
    and epochs, so only the id tells a position in the old log from one in the new log. A
    seek to a position whose ``topic_id`` is not the topic's id now reports the re-creation.
    ``epoch_exact`` says the record before ``offset`` was read in exactly ``leader_epoch``
    (a consumer's position after reading it), not that the epoch is an upper bound (a
    position from ``auto_offset_reset``, or a bare commit). Seeking to an exact position
    is validated more strictly: a leader that lacks that epoch has lost the record even if
    an older epoch of its log reaches the offset. ``undecided_transactions``: under
    ``read_committed``, transactions the reader read records of below ``offset`` without
    reading their marker (:class:`~epochguard.offsets.reopened.UndecidedTransaction`);
    a group commit carries them to the partition's next reader. All three are provenance,
    not part of the position: they take no part in ``==`` or ``hash``, and JSON keeps the
    first two.
    Positions are deliberately not ordered: offset 10 in epoch 3 and offset 10 in epoch 5 can
    be different records, so ``<`` between positions would be a lie.
    """

    offset: int = attrs.field(validator=_check_offset)
    leader_epoch: int | None = attrs.field(default=None, converter=normalise_epoch)
    topic_id: str | None = attrs.field(
        default=None, kw_only=True, converter=normalise_topic_id, eq=False
    )
    epoch_exact: bool = attrs.field(
        default=False, kw_only=True, eq=False, validator=attrs.validators.instance_of(bool)
    )
    undecided_transactions: tuple[UndecidedTransaction, ...] = attrs.field(
        default=(), kw_only=True, eq=False
    )

    @property
    def wire_epoch(self) -> int:
        """The epoch as Kafka encodes it (``-1`` for none)."""
        return UNDEFINED_EPOCH if self.leader_epoch is None else self.leader_epoch

    def to_json(self) -> dict[str, int | str | bool | None]:
        out: dict[str, int | str | bool | None] = {
            "offset": self.offset,
            "leader_epoch": self.leader_epoch,
        }
        if self.topic_id is not None:
            out["topic_id"] = self.topic_id
        if self.epoch_exact:
            out["epoch_exact"] = True
        return out

    def to_json_str(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | bytes) -> EpochOffset:
        """Parse what :meth:`to_json` or :meth:`to_json_str` produced."""
        if isinstance(data, str | bytes):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise InvalidPositionError(f"not a JSON position: {data!r}") from exc
        if not isinstance(data, Mapping) or "offset" not in data:
            raise InvalidPositionError(f"not a position mapping: {data!r}")
        unknown = set(data) - {"offset", "leader_epoch", "topic_id", "epoch_exact"}
        if unknown:
            raise InvalidPositionError(f"unknown keys in position {data!r}: {sorted(unknown)}")
        exact = data.get("epoch_exact", False)
        if not isinstance(exact, bool):
            raise InvalidPositionError(f"epoch_exact must be true or false, got {exact!r}")
        return cls(
            data["offset"],
            data.get("leader_epoch"),
            topic_id=data.get("topic_id"),
            epoch_exact=exact,
        )

    def __repr__(self) -> str:
        # The provenance fields only when set: reports and logs stay readable.
        extra = "" if self.topic_id is None else f", topic_id={self.topic_id!r}"
        extra += ", epoch_exact=True" if self.epoch_exact else ""
        return f"EpochOffset(offset={self.offset}, leader_epoch={self.leader_epoch}{extra})"

    def __str__(self) -> str:
        epoch = "?" if self.leader_epoch is None else str(self.leader_epoch)
        return f"{self.offset}@e{epoch}"
