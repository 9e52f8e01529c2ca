"""Unit tests of one replica log: offsets, epoch cache, KIP-101 answers, truncation."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from epochguard.testing.embedded.partition_log import (
    EpochEntry,
    InvalidRecordBatchError,
    PartitionLog,
    split_batches,
)
from epochguard.testing.embedded.records import build_batch

from ..examples import scaled


def batch(n: int, tag: str = "v") -> bytes:
    return build_batch([f"{tag}{i}".encode() for i in range(n)], timestamp_ms=1_000)


def log_with(*epochs_and_counts: tuple[int, int]) -> PartitionLog:
    """A leader log that appended ``count`` single-record batches under each epoch."""
    log = PartitionLog()
    for epoch, count in epochs_and_counts:
        log.assign_epoch(epoch)
        for _ in range(count):
            log.append_as_leader(batch(1), epoch)
    return log


def test_append_assigns_offsets_and_stamps_epoch_without_breaking_crc() -> None:
    log = PartitionLog()
    assert log.append_as_leader(batch(3), 5) == (0, 2)
    assert log.append_as_leader(batch(2) + batch(4), 5) == (3, 8)
    assert log.log_end_offset == 9
    stored = log.read(0, 10_000)
    offsets = []
    for raw, _ in split_batches(stored):
        b = DefaultRecordBatch(raw)
        assert b.validate_crc()
        assert b.leader_epoch == 5
        offsets += [r.offset for r in b]
    assert offsets == list(range(9))
    assert log.epoch_cache == [EpochEntry(5, 0)]


def test_read_respects_max_bytes_but_returns_at_least_one_batch() -> None:
    log = PartitionLog()
    for _ in range(10):
        log.append_as_leader(batch(10), 0)
    one = len(log.read(0, 1))
    assert one == len(batch(10))
    assert len(log.read(0, one * 3 + 5)) == one * 3
    # From the middle of a batch: the whole batch holding the offset comes back.
    assert struct.unpack_from(">q", log.read(15, 1))[0] == 10
    # Nothing at or above the upper bound.
    assert log.read(0, 10**9, upper=30) == log.read(0, one * 3)
    assert log.read(30, 10**9, upper=30) == b""


def test_end_offset_for_epoch_follows_kafka() -> None:
    # Epoch 1 at [0, 3), epoch 3 at [3, 5), epoch 4 from 5, LEO 7.
    log = log_with((1, 3), (3, 2), (4, 2))
    assert log.epoch_cache == [EpochEntry(1, 0), EpochEntry(3, 3), EpochEntry(4, 5)]
    assert log.end_offset_for_epoch(4) == (4, 7)  # latest: the log end offset
    assert log.end_offset_for_epoch(3) == (3, 5)
    assert log.end_offset_for_epoch(2) == (1, 3)  # largest epoch <= 2 is 1; ends where 3 starts
    assert log.end_offset_for_epoch(1) == (1, 3)
    assert log.end_offset_for_epoch(9) == (-1, -1)  # newer than anything known
    assert log.end_offset_for_epoch(-1) == (-1, -1)
    # Older than the first cached epoch: Kafka answers (requested, first start offset).
    assert log.end_offset_for_epoch(0) == (0, 0)
    assert PartitionLog().end_offset_for_epoch(0) == (-1, -1)


def test_new_leader_epoch_entry_exists_before_any_append() -> None:
    log = log_with((0, 4))
    log.assign_epoch(1)
    assert log.epoch_cache == [EpochEntry(0, 0), EpochEntry(1, 4)]
    assert log.end_offset_for_epoch(0) == (0, 4)
    assert log.end_offset_for_epoch(1) == (1, 4)
    log.assign_epoch(1)  # idempotent
    log.assign_epoch(0)  # never goes back
    assert log.epoch_cache == [EpochEntry(0, 0), EpochEntry(1, 4)]


def test_truncate_to_removes_records_and_epoch_entries() -> None:
    log = log_with((0, 3), (2, 3))
    log.high_watermark = 6
    log.truncate_to(4)
    assert log.log_end_offset == 4
    assert log.high_watermark == 4
    assert log.epoch_cache == [EpochEntry(0, 0), EpochEntry(2, 3)]
    log.truncate_to(3)
    assert log.epoch_cache == [EpochEntry(0, 0)]
    assert log.end_offset_for_epoch(0) == (0, 3)
    log.truncate_to(10)  # above the end: nothing happens
    assert log.log_end_offset == 3


def test_truncate_inside_a_batch_drops_the_whole_batch() -> None:
    log = PartitionLog()
    log.append_as_leader(batch(5), 0)
    log.append_as_leader(batch(5), 0)
    log.truncate_to(7)
    assert log.log_end_offset == 5
    assert len(log) == 1


def test_delete_before_moves_log_start_and_epoch_cache() -> None:
    log = log_with((0, 3), (1, 3))
    log.high_watermark = 6
    log.delete_before(4)
    assert log.log_start_offset == 4
    assert log.epoch_cache == [EpochEntry(1, 4)]
    assert struct.unpack_from(">q", log.read(4, 1))[0] == 4
    log.delete_before(2)  # never moves backwards
    assert log.log_start_offset == 4
    log2 = log_with((0, 3), (1, 3))
    log2.delete_before(1)
    assert log2.epoch_cache == [EpochEntry(0, 1), EpochEntry(1, 3)]
    assert log2.epoch_for_offset(2) == 0 and log2.epoch_for_offset(5) == 1


def test_kip101_follower_truncation_of_divergent_logs() -> None:
    """The rule the cluster's replication applies when an old leader rejoins."""
    old_leader = log_with((0, 3), (1, 3))  # wrote 3..5 under epoch 1 alone
    new_leader = log_with((0, 3))  # unclean election: new leader had only 0..2
    new_leader.assign_epoch(2)
    new_leader.append_as_leader(batch(1, "new"), 2)
    epoch, end = new_leader.end_offset_for_epoch(old_leader.latest_epoch)
    assert (epoch, end) == (0, 3)  # largest epoch <= 1 is 0, it ends at 3
    _, own_end = old_leader.end_offset_for_epoch(epoch)
    old_leader.truncate_to(min(end, own_end))
    assert old_leader.log_end_offset == 3
    for raw in new_leader.batches_from(old_leader.log_end_offset):
        old_leader.append_replicated(raw)
    assert old_leader.epoch_cache == new_leader.epoch_cache
    assert old_leader.read(0, 10**6) == new_leader.read(0, 10**6)


def test_malformed_batches_are_rejected() -> None:
    with pytest.raises(InvalidRecordBatchError):
        split_batches(b"\x00" * 10)
    good = batch(2)
    with pytest.raises(InvalidRecordBatchError):
        split_batches(good[:-1])
    bad_magic = bytearray(good)
    bad_magic[16] = 1
    with pytest.raises(InvalidRecordBatchError):
        split_batches(bytes(bad_magic))
    with pytest.raises(InvalidRecordBatchError):
        PartitionLog().append_as_leader(b"", 0)


def test_retried_idempotent_batch_is_not_written_twice() -> None:
    def idempotent(seq: int) -> bytes:
        raw = bytearray(batch(2))
        struct.pack_into(">qhi", raw, 43, 4242, 0, seq)  # producer id, epoch, base sequence
        return bytes(raw)  # CRC is not checked by the log

    log = PartitionLog()
    assert log.append_as_leader(idempotent(0), 0) == (0, 1)
    assert log.append_as_leader(idempotent(2), 0) == (2, 3)
    assert log.append_as_leader(idempotent(0), 0) == (0, 1)  # a retry: same offsets
    assert log.log_end_offset == 4
    assert log.append_as_leader(idempotent(4), 0) == (4, 5)


# -- model-based check of the epoch cache against a plain list of (offset, epoch) ----------

Op = tuple[str, int]
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("new_epoch"), st.integers(1, 3)),
        st.tuples(st.just("truncate"), st.integers(0, 30)),
        st.tuples(st.just("delete"), st.integers(0, 30)),
    ),
    max_size=25,
)


def model_end_offset(entries: list[tuple[int, int]], leo: int, requested: int) -> tuple[int, int]:
    """Kafka's endOffsetFor written the slow, obvious way over (epoch, start) entries."""
    if requested < 0 or not entries:
        return -1, -1
    latest = entries[-1][0]
    if requested == latest:
        return requested, leo
    if requested > latest:
        return -1, -1
    floor = [e for e in entries if e[0] <= requested]
    higher = [e for e in entries if e[0] > requested]
    if not floor:
        return requested, higher[0][1]
    return floor[-1][0], higher[0][1]


@settings(max_examples=scaled(400), deadline=None)
@given(ops_strategy)
def test_epoch_cache_matches_a_model(ops: list[Op]) -> None:
    log = PartitionLog()
    epoch = 0
    log.assign_epoch(epoch)
    entries: list[tuple[int, int]] = [(0, 0)]
    start, leo = 0, 0
    for op, arg in ops:
        if op == "append":
            log.append_as_leader(batch(arg), epoch)
            leo += arg
        elif op == "new_epoch":
            epoch += arg
            log.assign_epoch(epoch)
            entries = [e for e in entries if e[1] < leo] + [(epoch, leo)]
        elif op == "truncate" and max(arg, start) < leo:
            # Truncation lands on a batch boundary at or below ``arg``.
            log.truncate_to(max(arg, start))
            leo = log.log_end_offset
            entries = [e for e in entries if e[1] < leo]
        elif op == "delete" and start < arg <= leo:
            log.delete_before(arg)
            start = arg
            kept = [e for e in entries if e[1] >= start]
            older = [e for e in entries if e[1] < start]
            if older and (not kept or kept[0][1] > start):
                kept.insert(0, (older[-1][0], start))
            entries = kept
        if not entries or entries[-1][0] != epoch:
            # A truncated leader keeps leading its epoch: it is re-assigned at the end.
            log.assign_epoch(epoch)
            entries = [e for e in entries if e[1] < leo] + [(epoch, leo)]
        assert [(e.epoch, e.start_offset) for e in log.epoch_cache] == entries
        assert (log.log_start_offset, log.log_end_offset) == (start, leo)
        for requested in range(-1, epoch + 3):
            assert log.end_offset_for_epoch(requested) == model_end_offset(entries, leo, requested)


def test_epoch_without_records_is_superseded_like_kafka() -> None:
    log = log_with((0, 3))
    log.assign_epoch(1)  # a leadership that never wrote
    log.assign_epoch(2)
    assert log.epoch_cache == [EpochEntry(0, 0), EpochEntry(2, 3)]
    assert log.end_offset_for_epoch(1) == (0, 3)


def test_truncating_to_the_log_start_empties_the_log() -> None:
    log = PartitionLog()
    log.append_as_leader(batch(4), 0)
    log.delete_before(2)  # the batch 0..3 stays, log start 2
    log.truncate_to(2)
    assert (log.log_start_offset, log.log_end_offset, len(log)) == (2, 2, 0)
    assert log.epoch_cache == []
