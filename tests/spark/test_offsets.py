"""Checkpointed offsets: sorted JSON, EpochOffset's fields, Spark's bare form, named errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from epochguard.offsets import EpochOffset
from epochguard.spark_connector.errors import OffsetsJsonError
from epochguard.spark_connector.offsets import SourceOffset
from epochguard.spark_connector.options import (
    Assign,
    Subscribe,
    SubscribePattern,
    check_checkpoint,
)

TID = "5b0c3e9e-7f43-4d39-9a6e-0f3f8c1b2a11"

positions = st.builds(
    EpochOffset,
    st.integers(0, 2**62),
    st.none() | st.integers(0, 2**31 - 1),
    topic_id=st.none() | st.uuids().map(str),
    epoch_exact=st.booleans(),
)
tps = st.builds(TopicPartition, st.text(min_size=1, max_size=8), st.integers(0, 200))
offsets = st.dictionaries(tps, positions, max_size=12).map(SourceOffset)


def test_json_form_is_sorted_and_uses_epoch_offset_fields() -> None:
    off = SourceOffset(
        {
            TopicPartition("b", 10): EpochOffset(7, 2),
            TopicPartition("b", 2): EpochOffset(5, None),
            TopicPartition("a", 0): EpochOffset(120, 3, topic_id=TID, epoch_exact=True),
        }
    )
    text = off.to_json_str()
    assert text == (
        '{"a": {"0": {"epoch_exact": true, "leader_epoch": 3, "offset": 120, '
        f'"topic_id": "{TID}"}}}}, '
        '"b": {"2": {"leader_epoch": null, "offset": 5}, '
        '"10": {"leader_epoch": 2, "offset": 7}}}'
    )
    back = SourceOffset.from_json(text)
    assert back == off
    assert back.as_dict()[TopicPartition("a", 0)].topic_id == TID


@given(offsets)
def test_round_trip_keeps_positions_and_provenance(off: SourceOffset) -> None:
    back = SourceOffset.from_json(off.to_json_str())
    assert back == off
    for (_, a), (_, b) in zip(off.positions, back.positions, strict=True):
        assert (a.topic_id, a.epoch_exact) == (b.topic_id, b.epoch_exact)


@given(st.dictionaries(tps, positions, max_size=12), st.randoms())
def test_equal_offsets_give_equal_text_whatever_the_insertion_order(
    mapping: dict[TopicPartition, EpochOffset], rnd: object
) -> None:
    items = list(mapping.items())
    shuffled = items[:]
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert SourceOffset(dict(items)).to_json_str() == SourceOffset(dict(shuffled)).to_json_str()
    # What Spark stores is json.dumps of to_json(): the same text.
    assert (
        json.dumps(SourceOffset(dict(shuffled)).to_json())
        == SourceOffset(dict(items)).to_json_str()
    )


def test_sparks_own_form_is_accepted() -> None:
    off = SourceOffset.from_json('{"t": {"0": 23, "1": 0}}')
    assert off.as_dict() == {
        TopicPartition("t", 0): EpochOffset(23),
        TopicPartition("t", 1): EpochOffset(0),
    }
    assert off.as_dict()[TopicPartition("t", 0)].leader_epoch is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"t": [1]}', "topic 't' must map partitions"),
        ('{"t": {"x": 1}}', "partition 'x' of topic 't'"),
        ('{"t": {"-1": 1}}', "partition '-1' of topic 't'"),
        ('{"t": {"0": -1}}', "t-0: offset -1 is negative"),
        ('{"t": {"0": "5"}}', "t-0: '5' is neither an offset nor a position"),
        ('{"t": {"0": true}}', "t-0: True is not an offset"),
        ('{"t": {"0": {"offset": 1, "leader_epoch": -5}}}', "t-0: leader_epoch must be >= -1"),
        ('{"t": {"0": {"leader_epoch": 1}}}', "t-0: not a position mapping"),
        ('{"t": {"0": {"offset": 1, "colour": 1}}}', "t-0: unknown keys"),
        ('{"": {"0": 1}}', "topic names must be non-empty"),
    ],
)
def test_corrupt_json_names_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(OffsetsJsonError) as info:
        SourceOffset.from_json(text)
    assert needle in str(info.value)


def test_checkpoint_for_other_topics_is_named() -> None:
    off = SourceOffset(
        {TopicPartition("a", 0): EpochOffset(1), TopicPartition("z", 0): EpochOffset(1)}
    )
    check_checkpoint(off, Subscribe(("a", "z", "extra")))
    with pytest.raises(OffsetsJsonError) as info:
        check_checkpoint(off, Subscribe(("a",)))
    assert "topics ['z']" in str(info.value)
    assert "subscribe=a" in str(info.value)
    with pytest.raises(OffsetsJsonError):
        check_checkpoint(off, SubscribePattern("a.*"))
    check_checkpoint(off, SubscribePattern("[az]"))
    assign = Assign(frozenset({TopicPartition("a", 0), TopicPartition("a", 1)}))
    with pytest.raises(OffsetsJsonError) as info:
        check_checkpoint(off, assign)
    message = str(info.value)
    assert "has partitions [z-0] the query does not assign" in message
    assert "lacks assigned partitions [a-1]" in message


def test_source_offset_rejects_wrong_types() -> None:
    with pytest.raises(TypeError):
        SourceOffset({("t", 0): EpochOffset(1)})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        SourceOffset({TopicPartition("t", 0): 5})  # type: ignore[dict-item]
