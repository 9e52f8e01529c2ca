"""The Java group member's driver without a JVM: settings refused before Java starts, and the
JSON events turned into typed values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard.offsets.position import EpochOffset
from epochguard.testing.apache_kafka import JavaException, JavaGroupMember, JavaMemberConfigError
from epochguard.testing.apache_kafka.group_member import _exception, _java_props


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"group_id": ""}, "group_id"),
        ({"protocol": "eager"}, "protocol must be 'classic' or 'consumer'"),
        ({"protocol": "classic", "assignor": "uniform"}, "classic assignor 'uniform' unknown"),
        ({"assignor": ""}, "assignor must be a non-empty name"),
        ({"instance_id": ""}, "instance_id"),
        ({"auto_offset_reset": "smallest"}, "auto_offset_reset"),
        ({"props": {"group.protocol": "classic"}}, "group.protocol are set through"),
        ({"props": {"enable.auto.commit": "true"}}, "enable.auto.commit are set through"),
    ],
)
def test_bad_settings_are_refused_before_java_starts(
    tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    args: dict[str, Any] = {"group_id": "g", "log_dir": tmp_path, **kwargs}
    group_id = args.pop("group_id")
    with pytest.raises(JavaMemberConfigError, match=match):
        JavaGroupMember("127.0.0.1:1", group_id, **args)
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_each_protocol_maps_to_java_settings() -> None:
    assert _java_props("classic", "range", None) == {
        "group.protocol": "classic",
        "partition.assignment.strategy": "org.apache.kafka.clients.consumer.RangeAssignor",
    }
    assert _java_props("classic", "cooperative-sticky", "i1") == {
        "group.protocol": "classic",
        "partition.assignment.strategy": (
            "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
        ),
        "group.instance.id": "i1",
    }
    # A broker-side assignor is the coordinator's to accept or refuse.
    assert _java_props("consumer", "nope", None) == {
        "group.protocol": "consumer",
        "group.remote.assignor": "nope",
    }
    assert _java_props("consumer", None, None) == {"group.protocol": "consumer"}


def test_a_log_truncation_event_becomes_a_typed_exception() -> None:
    event = {
        "event": "exception",
        "type": "LogTruncationException",
        "class": "org.apache.kafka.clients.consumer.LogTruncationException",
        "divergent_offsets": [
            {"topic": "t-1", "partition": 0, "offset": 5, "leader_epoch": 0},
            {"topic": "t-1", "partition": 1, "offset": None, "leader_epoch": None},
        ],
        "fetch_offsets": [{"topic": "t-1", "partition": 0, "offset": 8, "leader_epoch": None}],
        "message": "Truncated",
    }
    assert _exception(event) == JavaException(
        type="LogTruncationException",
        java_class="org.apache.kafka.clients.consumer.LogTruncationException",
        message="Truncated",
        divergent_offsets={
            TopicPartition("t-1", 0): EpochOffset(5, 0),
            TopicPartition("t-1", 1): None,
        },
        fetch_offsets={TopicPartition("t-1", 0): 8},
    )
