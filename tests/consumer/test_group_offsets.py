"""GroupCoordinator's offset calls against answers built with kafka-python's classes."""

from __future__ import annotations

import time
from typing import Any

from kafka.protocol.consumer import OffsetFetchResponse
from kafka.structs import TopicPartition

from epochguard.consumer.config import build_config
from epochguard.consumer.group import GroupCoordinator
from epochguard.offsets.position import EpochOffset

TP = TopicPartition("t", 0)


def _offset_fetch(error_code: int, offset: int = 5, epoch: int = 0) -> Any:
    T = OffsetFetchResponse.OffsetFetchResponseTopic
    P = T.OffsetFetchResponsePartition
    part = P(
        partition_index=0,
        committed_offset=offset,
        committed_leader_epoch=epoch,
        metadata="",
        error_code=error_code,
    )
    return OffsetFetchResponse(
        version=7, throttle_time_ms=0, error_code=0, topics=[T(name="t", partitions=[part])]
    )


def test_unstable_offset_commit_is_asked_again(mocker: Any) -> None:
    """UNSTABLE_OFFSET_COMMIT (88: a transaction is committing offsets) is retried, and the
    committed epoch 0 comes back as 0."""
    coord = GroupCoordinator(mocker.Mock(), build_config({"group_id": "g"}))
    answers = [_offset_fetch(88), _offset_fetch(0)]
    call = mocker.patch.object(coord, "_call", side_effect=lambda *_a, **_k: answers.pop(0))
    got = coord.fetch_committed([TP], time.monotonic() + 60)
    assert got == {TP: EpochOffset(5, 0)}
    assert call.call_count == 2


def test_nothing_committed_is_none(mocker: Any) -> None:
    coord = GroupCoordinator(mocker.Mock(), build_config({"group_id": "g"}))
    mocker.patch.object(coord, "_call", return_value=_offset_fetch(0, offset=-1, epoch=-1))
    assert coord.fetch_committed([TP], time.monotonic() + 60) == {TP: None}
