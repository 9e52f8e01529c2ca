from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochguard.offsets import EpochOffset, InvalidPositionError


def test_minus_one_epoch_means_none() -> None:
    assert EpochOffset(5, -1).leader_epoch is None
    assert EpochOffset(5, -1) == EpochOffset(5)
    assert EpochOffset(5).wire_epoch == -1
    assert EpochOffset(5, 3).wire_epoch == 3


@pytest.mark.parametrize(
    ("offset", "epoch", "named"),
    [(-1, None, "-1"), (-7, 2, "-7"), (0, -2, "-2"), (3, -100, "-100")],
)
def test_rejects_impossible_values_naming_them(offset: int, epoch: int | None, named: str) -> None:
    with pytest.raises(InvalidPositionError, match=named) as info:
        EpochOffset(offset, epoch)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", ["3", 1.5, True, None])
def test_rejects_non_int_offsets(bad: object) -> None:
    with pytest.raises(InvalidPositionError):
        EpochOffset(bad)  # type: ignore[arg-type]


def test_rejects_non_int_epoch() -> None:
    with pytest.raises(InvalidPositionError):
        EpochOffset(1, "2")  # type: ignore[arg-type]


def test_is_frozen_and_hashable() -> None:
    pos = EpochOffset(1, 2)
    with pytest.raises(AttributeError):
        pos.offset = 3  # type: ignore[misc]
    assert {pos: 1}[EpochOffset(1, 2)] == 1


def test_not_ordered() -> None:
    with pytest.raises(TypeError):
        _ = EpochOffset(1, 5) < EpochOffset(2, 1)  # type: ignore[operator]


@given(st.integers(min_value=0, max_value=2**63 - 1), st.none() | st.integers(-1, 2**31 - 1))
def test_json_round_trip(offset: int, epoch: int | None) -> None:
    pos = EpochOffset(offset, epoch)
    assert EpochOffset.from_json(pos.to_json()) == pos
    assert EpochOffset.from_json(pos.to_json_str()) == pos
    assert json.loads(pos.to_json_str()) == pos.to_json()


@pytest.mark.parametrize(
    "bad",
    ["not json", "[]", '{"leader_epoch": 1}', '{"offset": -1}', '{"offset": 1, "x": 2}', 7],
)
def test_from_json_rejects_garbage(bad: object) -> None:
    with pytest.raises(InvalidPositionError):
        EpochOffset.from_json(bad)  # type: ignore[arg-type]


def test_str_is_readable() -> None:
    assert str(EpochOffset(10, 3)) == "10@e3"
    assert str(EpochOffset(10)) == "10@e?"


def test_topic_id_is_provenance_not_identity() -> None:
    tid = uuid.UUID("5f0c2a8e-8d3b-4c1e-9a7f-0123456789ab")
    pos = EpochOffset(5, 2, topic_id=tid)
    assert pos.topic_id == str(tid)
    assert pos == EpochOffset(5, 2) and hash(pos) == hash(EpochOffset(5, 2))
    assert EpochOffset(5, 2, topic_id=str(tid)).topic_id == str(tid)
    assert EpochOffset(5, 2, topic_id=uuid.UUID(int=0)).topic_id is None  # Kafka's "no id"
    assert EpochOffset(5, 2, topic_id=str(uuid.UUID(int=0))).topic_id is None
    for bad in ("", 7, b"x"):
        with pytest.raises(InvalidPositionError, match="topic_id"):
            EpochOffset(5, 2, topic_id=bad)  # type: ignore[arg-type]


def test_topic_id_json_round_trip() -> None:
    pos = EpochOffset(5, 2, topic_id="5f0c2a8e-8d3b-4c1e-9a7f-0123456789ab")
    assert pos.to_json() == {
        "offset": 5,
        "leader_epoch": 2,
        "topic_id": "5f0c2a8e-8d3b-4c1e-9a7f-0123456789ab",
    }
    back = EpochOffset.from_json(pos.to_json_str())
    assert back == pos and back.topic_id == pos.topic_id
    assert "topic_id" not in EpochOffset(5, 2).to_json()


def test_epoch_exact_is_provenance_and_round_trips() -> None:
    pos = EpochOffset(5, 2, epoch_exact=True)
    assert pos == EpochOffset(5, 2) and pos.epoch_exact
    assert pos.to_json() == {"offset": 5, "leader_epoch": 2, "epoch_exact": True}
    assert EpochOffset.from_json(pos.to_json_str()).epoch_exact
    assert "epoch_exact" not in EpochOffset(5, 2).to_json()
    with pytest.raises(InvalidPositionError, match="epoch_exact"):
        EpochOffset.from_json({"offset": 5, "leader_epoch": 2, "epoch_exact": "yes"})


def test_repr_shows_provenance_only_when_set() -> None:
    assert repr(EpochOffset(5, 0)) == "EpochOffset(offset=5, leader_epoch=0)"
    assert repr(EpochOffset(5, 0, topic_id="t-1", epoch_exact=True)) == (
        "EpochOffset(offset=5, leader_epoch=0, topic_id='t-1', epoch_exact=True)"
    )
