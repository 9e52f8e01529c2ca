"""The I/O driver against fake answers (pytest-mock): no broker needed."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace as NS
from typing import Any

import pytest
from kafka.future import Future
from kafka.structs import TopicPartition

from epochguard.consumer.config import build_config
from epochguard.consumer.effects import run_blocking
from epochguard.consumer.fetcher import Fetcher, FetchSent, MetadataSent
from epochguard.consumer.session import SessionState
from epochguard.offsets.events import FetchAction, ValidateAction
from epochguard.offsets.policy import OffsetPolicy
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.state import PartitionState

TP = TopicPartition("t", 0)
TID = uuid.uuid4()


def _metadata(leader: int, epoch: int) -> Any:
    part = NS(partition_index=0, leader_id=leader, leader_epoch=epoch, error_code=0)
    topic = NS(name="t", error_code=0, topic_id=TID, is_internal=False, partitions=[part])
    return NS(topics=[topic], brokers=[])


def _fetcher(mocker: Any, events: list[Any] | None = None) -> tuple[Fetcher, Any]:
    client = mocker.Mock()
    sink = events if events is not None else []
    f = Fetcher(
        client,
        build_config({}),
        OffsetPolicy(auto_offset_reset="earliest", on_truncation="raise"),
        None,
        None,
        sink.append,
    )
    return f, client


def _answer(f: Fetcher, handler: Any, context: Any, value: Any) -> None:
    handler(context, Future().success(value))


def test_older_metadata_epoch_is_rejected_and_counted(mocker: Any) -> None:
    f, _client = _fetcher(mocker)
    tracker = f.add_partition(TP)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=2, epoch=5))
    assert tracker.leader_epoch == 5 and tracker.leader_id == 2
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=4))
    assert tracker.leader_epoch == 5 and tracker.leader_id == 2
    assert f.metrics.stale_metadata_ignored == 1


def test_diverging_epoch_is_acted_on_without_offset_for_leader_epoch(mocker: Any) -> None:
    events: list[Any] = []
    f, client = _fetcher(mocker, events)
    tracker = f.add_partition(TP)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=3))
    tracker.seek(EpochOffset(15, 3))  # validation first
    f.after_input(TP)
    client.send.return_value = Future()
    f.send_requests(0.0)
    node, req = client.send.call_args.args[:2]
    assert node == 1 and req.__class__.__name__ == "OffsetForLeaderEpochRequest"
    validate = ValidateAction(TP, 1, 3, 3, EpochOffset(15, 3), _token(tracker))
    tracker.on_validation(validate, 0, 3, 20, 0.0)
    f.after_input(TP)
    assert tracker.state is PartitionState.FETCHING
    client.send.reset_mock()
    f.send_requests(0.0)
    node, req = client.send.call_args.args[:2]
    fp = req.topics[0].partitions[0]
    assert (fp.fetch_offset, fp.last_fetched_epoch, fp.current_leader_epoch) == (15, 3, 3)
    action = FetchAction(TP, 1, 15, 3, 3, _token(tracker))
    div = NS(epoch=3, end_offset=12)
    part = NS(
        partition_index=0,
        error_code=0,
        diverging_epoch=div,
        records=b"",
        high_watermark=20,
        aborted_transactions=None,
    )
    resp = NS(API_VERSION=12, error_code=0, responses=[NS(topic="t", partitions=[part])])
    client.send.reset_mock()
    f._on_fetch(FetchSent(1, {TP: action}, {}), Future().success(resp))
    assert tracker.state is PartitionState.TRUNCATED
    assert f.metrics.diverging_epoch_responses == 1
    client.send.assert_not_called()  # no OffsetForLeaderEpoch round trip
    [det] = [e for e in events if e.name == "truncation_detected"]
    assert det.report.divergence.offset == 12 and det.report.lost_count == 3


def _token(tracker: Any) -> int:
    return int(tracker._gen)


def test_buffered_records_are_dropped_when_validation_starts(mocker: Any) -> None:
    from kafka.record import MemoryRecordsBuilder

    f, client = _fetcher(mocker)
    tracker = f.add_partition(TP)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=0))
    tracker.seek(0)
    f.after_input(TP)
    client.send.return_value = Future()
    f.send_requests(0.0)
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=10**6, offset=0)
    for i in range(10):
        b.append(timestamp=i, key=None, value=b"v", headers=[])
    b.close()
    part = NS(
        partition_index=0,
        error_code=0,
        diverging_epoch=None,
        records=b.buffer(),
        high_watermark=10,
        aborted_transactions=None,
    )
    resp = NS(API_VERSION=12, error_code=0, responses=[NS(topic="t", partitions=[part])])
    action = FetchAction(TP, 1, 0, 0, None, _token(tracker))
    f._on_fetch(FetchSent(1, {TP: action}, {}), Future().success(resp))
    got = f.fetched_records(4, lambda tp: True)
    assert [r.offset for r in got[TP]] == [0, 1, 2, 3]
    assert f.has_buffered()
    # A new leader epoch arrives: the rest of the prefetched records must not be returned.
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=2, epoch=1))
    assert tracker.state is PartitionState.AWAIT_VALIDATION
    assert not f.has_buffered()
    assert f.fetched_records(10, lambda tp: True) == {}


def _records(base: int, n: int, epoch: int = 0) -> bytes:
    from kafka.record import MemoryRecordsBuilder

    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=10**6, offset=base)
    for i in range(n):
        b.append(timestamp=i, key=None, value=b"v%d" % (base + i), headers=[])
    b.close()
    raw = bytearray(b.buffer())
    raw[12:16] = epoch.to_bytes(4, "big", signed=True)
    return bytes(raw)


def _fetch_answer(base: int, n: int, hw: int) -> Any:
    part = NS(
        partition_index=0,
        error_code=0,
        diverging_epoch=None,
        records=_records(base, n),
        high_watermark=hw,
        aborted_transactions=None,
    )
    return NS(API_VERSION=12, error_code=0, responses=[NS(topic="t", partitions=[part])])


def _recording_sends(client: Any) -> list[Any]:
    """Every ``client.send``: its arguments and the future handed back."""
    futures: list[Any] = []

    def send(*args: Any) -> Future:
        futures.append((args, Future()))
        return futures[-1][1]

    client.send.side_effect = send
    return futures


def _fetching(mocker: Any) -> tuple[Fetcher, Any, Any, list[Any]]:
    f, client = _fetcher(mocker)
    tracker = f.add_partition(TP)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=0))
    tracker.seek(0)
    f.after_input(TP)
    return f, client, tracker, _recording_sends(client)


def test_prefetch_answers_the_trackers_next_fetch(mocker: Any) -> None:
    f, _client, tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    (_args, fut) = futures[0]
    fut.success(_fetch_answer(0, 10, hw=30))
    f.process_completions()
    assert f.has_buffered()
    f.send_requests(0.0)  # buffered, not caught up: prefetch what comes next
    assert len(futures) == 2
    part = futures[1][0][1].topics[0].partitions[0]
    assert (part.fetch_offset, part.last_fetched_epoch, part.current_leader_epoch) == (10, 0, 0)
    futures[1][1].success(_fetch_answer(10, 10, hw=30))
    f.process_completions()
    got = f.fetched_records(100, lambda tp: True)[TP]
    assert [r.offset for r in got] == list(range(10))
    f.send_requests(0.0)  # the tracker asks for offset 10: answered by the prefetch
    assert f.metrics.prefetches_used == 1
    got = f.fetched_records(100, lambda tp: True)[TP]
    assert [r.offset for r in got] == list(range(10, 20))
    assert tracker.position == EpochOffset(20, 0)


def test_prefetch_is_discarded_after_a_seek(mocker: Any) -> None:
    f, _client, tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    futures[0][1].success(_fetch_answer(0, 10, hw=30))
    f.process_completions()
    f.send_requests(0.0)
    assert len(futures) == 2  # prefetch of offset 10 in flight
    tracker.seek(3)
    f.drop_buffer(TP)
    f.after_input(TP)
    futures[1][1].success(_fetch_answer(10, 10, hw=30))
    f.process_completions()
    f.send_requests(0.0)
    assert len(futures) == 3  # a real fetch from 3, the prefetch was not used
    assert futures[2][0][1].topics[0].partitions[0].fetch_offset == 3
    futures[2][1].success(_fetch_answer(0, 10, hw=30))
    f.process_completions()
    got = f.fetched_records(100, lambda tp: True)[TP]
    assert [r.offset for r in got] == list(range(3, 10))
    assert f.metrics.prefetches_used == 0 and f.metrics.prefetches_discarded == 1


def test_the_prefetch_goes_out_before_the_answer_is_decoded(mocker: Any) -> None:
    # With one fetch in flight per broker, the broker serves the next answer while this
    # one is decoded and handed out only if the next fetch is sent first.
    f, _client, _tracker, futures = _fetching(mocker)
    sent_before_decoding: list[int] = []
    decode = f._decode

    def watching(*args: Any, **kwargs: Any) -> Any:
        sent_before_decoding.append(len(futures))
        return decode(*args, **kwargs)

    f._decode = watching  # type: ignore[method-assign]
    f.send_requests(0.0)
    futures[0][1].success(_fetch_answer(0, 10, hw=30))
    f.process_completions()
    assert sent_before_decoding == [2]
    part = futures[1][0][1].topics[0].partitions[0]
    assert (part.fetch_offset, part.last_fetched_epoch, part.current_leader_epoch) == (10, 0, 0)
    futures[1][1].success(_fetch_answer(10, 10, hw=30))
    f.process_completions()
    assert [r.offset for r in f.fetched_records(100, lambda tp: True)[TP]] == list(range(10))
    f.send_requests(0.0)
    assert f.metrics.prefetches_used == 1
    assert [r.offset for r in f.fetched_records(100, lambda tp: True)[TP]] == list(range(10, 20))


def _fetching_from_zero(f: Any, count: int) -> list[TopicPartition]:
    """``count`` partitions of topic t, led by broker 1 in epoch 0, each at offset 0."""
    tps = [TopicPartition("t", i) for i in range(count)]
    trackers = [f.add_partition(tp) for tp in tps]
    parts = [NS(partition_index=i, leader_id=1, leader_epoch=0, error_code=0) for i in range(count)]
    topic = NS(name="t", error_code=0, topic_id=TID, is_internal=False, partitions=parts)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), NS(topics=[topic], brokers=[]))
    for tp, tracker in zip(tps, trackers, strict=True):
        tracker.seek(0)
        f.after_input(tp)
    return tps


def _first_fetch_of(
    mocker: Any, count: int, budget: int | None = None
) -> tuple[Fetcher, list[TopicPartition], list[Any]]:
    """A fetcher (with ``budget`` as its decode budget) whose ``count`` partitions, from
    offset 0, have sent their first fetch; the sends recorded."""
    f, client = _fetcher(mocker)
    f.decode_budget_bytes = budget
    tps = _fetching_from_zero(f, count)
    futures = _recording_sends(client)
    f.send_requests(0.0)
    return f, tps, futures


def test_early_prefetches_of_one_answer_go_out_in_one_request(mocker: Any) -> None:
    # A prefetch per partition, each its own request, would hold the others back (one
    # request in flight per broker) and multiply the per-request cost.
    f, _tps, futures = _first_fetch_of(mocker, 2)
    assert len(futures) == 1
    answer = _fetch_answer(0, 10, hw=30)
    second = NS(**vars(answer.responses[0].partitions[0]))
    second.partition_index = 1
    answer.responses[0].partitions.append(second)
    futures[0][1].success(answer)
    f.process_completions()
    assert len(futures) == 2
    early = futures[1][0][1].topics[0].partitions
    assert sorted((q.partition, q.fetch_offset) for q in early) == [(0, 10), (1, 10)]


@pytest.mark.parametrize(
    ("budget", "calls"),
    [
        (None, [[0, 1, 2], [], []]),
        (1, [[0], [1], [2]]),
        # One partition's records and half another's: one partition a call, not two.
        (1.5, [[0], [1], [2]]),
        (2, [[0, 1], [2], []]),
    ],
)
def test_a_decode_budget_spreads_one_answer_over_several_calls(
    mocker: Any, budget: float | None, calls: list[list[int]]
) -> None:
    # The asyncio driver bounds the decoding per read: a large answer for many partitions
    # would otherwise stall the event loop. The answer's prefetches still go out at once,
    # and the partitions not decoded yet stay awaited (nothing is fetched for them again).
    answer = _fetch_answer(0, 10, hw=30)
    size = len(answer.responses[0].partitions[0].records)
    f, tps, futures = _first_fetch_of(
        mocker, 3, None if budget is None else max(1, int(budget * size))
    )
    for i in (1, 2):
        more = NS(**vars(answer.responses[0].partitions[0]))
        more.partition_index = i
        answer.responses[0].partitions.append(more)
    futures[0][1].success(answer)
    decoded: list[list[TopicPartition]] = []
    for _ in range(3):
        f.process_completions()
        got = f.fetched_records(100, lambda tp: True)
        decoded.append(sorted(got))
        assert all([r.offset for r in rs] == list(range(10)) for rs in got.values())
        f.send_requests(0.0)
    assert len(futures) == 2  # one request of prefetches for all three, nothing fetched again
    early = futures[1][0][1].topics[0].partitions
    assert sorted((q.partition, q.fetch_offset) for q in early) == [(0, 10), (1, 10), (2, 10)]
    assert decoded == [[tps[i] for i in call] for call in calls]
    assert not f.has_completions()


@pytest.mark.parametrize(
    ("wanted", "paused", "calls"),
    [
        # No reader's count: the budget alone (three partitions' worth) decodes them all.
        (0, set(), [[0, 1, 2], [], []]),
        # Ten records buffered answer a read of five: one partition a read, on demand.
        (5, set(), [[0], [1], [2]]),
        # Fifteen wanted: a second partition is decoded for them, the third waits.
        (15, set(), [[0, 1], [2], []]),
        # Records of a partition the reader does not take do not count for it (this
        # fetcher's reader takes everything, to show what was decoded).
        (5, {0}, [[0, 1], [2], []]),
    ],
)
def test_a_reader_decodes_what_it_takes_not_the_whole_answer(
    mocker: Any, wanted: int, paused: set[int], calls: list[list[int]]
) -> None:
    # Decoded records wait in the buffers as many small objects (what a collection of the
    # garbage collector walks, and more memory than the bytes they came from); undecoded,
    # a partition's data is one slice of its answer.
    answer = _fetch_answer(0, 10, hw=30)
    size = len(answer.responses[0].partitions[0].records)
    f, tps, futures = _first_fetch_of(mocker, 3, 3 * size)
    for i in (1, 2):
        more = NS(**vars(answer.responses[0].partitions[0]))
        more.partition_index = i
        answer.responses[0].partitions.append(more)
    futures[0][1].success(answer)
    held = {tps[i] for i in paused}

    def deliverable(tp: TopicPartition) -> bool:
        return tp not in held

    decoded: list[list[TopicPartition]] = []
    for _ in range(3):
        f.process_completions(wanted, deliverable)
        got = f.fetched_records(100, lambda tp: True)
        decoded.append(sorted(got))
        assert all([r.offset for r in rs] == list(range(10)) for rs in got.values())
        f.send_requests(0.0)
    assert decoded == [[tps[i] for i in call] for call in calls]
    assert not f.has_completions()


def _offsets_asked(futures: list[Any], i: int) -> list[int]:
    return [q.fetch_offset for q in futures[i][0][1].topics[0].partitions]


def _pieced(
    mocker: Any, data: bytes, hw: int = 100, piece: int = 10
) -> tuple[Fetcher, Any, list[Any]]:
    """A fetcher decoding in pieces of ``piece`` records (as the asyncio driver, with a
    budget) that has the answer ``data`` (offsets from 0) for its first fetch in hand."""
    f, _client, tracker, futures = _fetching(mocker)
    f.decode_budget_bytes = 1 << 20
    f.decode_piece_records = piece
    f.send_requests(0.0)
    answer = _fetch_answer(0, 1, hw=hw)
    answer.responses[0].partitions[0].records = data
    futures[0][1].success(answer)
    f.process_completions()
    return f, tracker, futures


def _held(f: Fetcher) -> int:
    buf = f._source_of[TP].buffers[TP]
    return len(buf.records) - buf.pos


def test_an_answer_is_decoded_in_pieces_as_the_reads_reach_them(mocker: Any) -> None:
    # Decoding a partition's answer whole costs the read that does it in proportion to its
    # batches (a megabyte of one-record batches: about 100 ms on the event loop).
    data = b"".join(_records(base, 10) for base in (0, 10, 20, 30))
    f, tracker, futures = _pieced(mocker, data)
    assert _held(f) == 10  # the first piece only
    assert _offsets_asked(futures, 1) == [40]  # the answer's end, read from its headers
    got: list[int] = []
    for _ in range(8):
        got += [r.offset for r in f.fetched_records(7, lambda tp: True).get(TP, [])]
        assert TP not in f._source_of or TP not in f._source_of[TP].buffers or _held(f) <= 10
    assert got == list(range(40))
    assert tracker.position == EpochOffset(40, 0)
    f.send_requests(0.0)
    assert len(futures) == 2  # the tracker's fetch at 40 is the prefetch already sent
    futures[1][1].success(_fetch_answer(40, 10, hw=100))
    f.process_completions()
    got = [r.offset for r in f.fetched_records(100, lambda tp: True)[TP]]
    assert got == list(range(40, 50))
    assert f.metrics.prefetches_used == 1 and f.metrics.prefetches_discarded == 0


def test_a_piece_that_does_not_decode_ends_its_answer_where_the_pieces_before_ended(
    mocker: Any,
) -> None:
    # The records before it are delivered; the fetch from its first offset gets its bytes
    # back as an answer of their own, whose error is reported as any answer's.
    bad = bytearray(_records(20, 10))
    bad[-1] ^= 0xFF  # the CRC no longer holds
    data = _records(0, 10) + _records(10, 10) + bytes(bad) + _records(30, 10)
    f, tracker, futures = _pieced(mocker, data)
    got: list[int] = []
    for _ in range(6):
        got += [r.offset for r in f.fetched_records(7, lambda tp: True).get(TP, [])]
    assert got == list(range(20))
    assert tracker.position == EpochOffset(20, 0)
    assert f.metrics.prefetches_discarded == 1  # the one at 40, answered in vain
    futures[1][1].success(_fetch_answer(40, 10, hw=100))
    f.process_completions()
    f.send_requests(0.0)
    assert _offsets_asked(futures, 2) == [20]
    answer = _fetch_answer(20, 1, hw=100)
    answer.responses[0].partitions[0].records = bytes(bad) + _records(30, 10)
    futures[2][1].success(answer)
    f.process_completions()
    assert TP in f.corrupt and f.corrupt_errors[TP].offset == 20
    assert not f.fetched_records(100, lambda tp: True)


def test_an_answer_ended_early_by_a_piece_is_not_caught_up(mocker: Any) -> None:
    bad = bytearray(_records(20, 10))
    bad[-1] ^= 0xFF
    data = _records(0, 10) + _records(10, 10) + bytes(bad) + _records(30, 10)
    f, _tracker, futures = _pieced(mocker, data, hw=40)
    assert f._source_of[TP].caught_up[TP]  # the answer reaches the high watermark
    assert len(futures) == 1  # nothing prefetched past it
    got: list[int] = []
    for _ in range(6):
        got += [r.offset for r in f.fetched_records(7, lambda tp: True).get(TP, [])]
    assert got == list(range(20))
    assert not f._source_of[TP].caught_up[TP]  # it ended at 20: more to fetch
    f.send_requests(0.0)
    assert _offsets_asked(futures, 1) == [20]


def test_a_piece_whose_decoding_is_interrupted_is_decoded_again(mocker: Any) -> None:
    # Not a decoding error: the exception reaches the application, the piece stays.
    data = b"".join(_records(base, 10) for base in (0, 10, 20, 30))
    f, tracker, _futures = _pieced(mocker, data)
    decode = f._decode
    calls = [0]

    def interrupted_once(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise MemoryError
        return decode(*args, **kwargs)

    f._decode = interrupted_once
    got = [r.offset for r in f.fetched_records(7, lambda tp: True)[TP]]
    with pytest.raises(MemoryError):
        f.fetched_records(7, lambda tp: True)
    for _ in range(8):
        got += [r.offset for r in f.fetched_records(7, lambda tp: True).get(TP, [])]
    assert got == list(range(40))
    assert tracker.position == EpochOffset(40, 0)


def test_a_read_takes_from_every_partition_in_pieces(mocker: Any) -> None:
    # A partition with pieces left does not hold the others' answers back.
    f, _client = _fetcher(mocker)
    f.decode_budget_bytes = 1 << 20
    f.decode_piece_records = 10
    tps = _fetching_from_zero(f, 3)
    futures = _recording_sends(_client)
    f.send_requests(0.0)
    answer = _fetch_answer(0, 1, hw=100)
    data = b"".join(_records(base, 10) for base in (0, 10, 20, 30))
    answer.responses[0].partitions[0].records = data
    for i in (1, 2):
        more = NS(**vars(answer.responses[0].partitions[0]))
        more.partition_index = i
        answer.responses[0].partitions.append(more)
    futures[0][1].success(answer)
    f.process_completions(100, lambda tp: True)
    got = f.fetched_records(100, lambda tp: True)
    assert sorted(got) == tps
    assert all([r.offset for r in rs] == list(range(20)) for rs in got.values())


def test_the_position_epoch_does_not_depend_on_where_the_pieces_are_cut(mocker: Any) -> None:
    # Records of epoch 0, then a batch of the control kind written in epoch 1 (a marker):
    # decoded whole, the position ends with its last record's epoch; in pieces, the last
    # piece holds no record once the records before it are all handed out.
    from .test_fetch_end import _batch

    data = (
        _batch(0, 0, list(range(10)), 0, False)
        + _batch(10, 0, list(range(10)), 0, False)
        + _batch(20, 1, [0], 0, True)
    )
    positions = []
    for piece in (10**6, 10):
        f, tracker, _futures = _pieced(mocker, data, piece=piece)
        got: list[int] = []
        for _ in range(4):
            got += [r.offset for r in f.fetched_records(10, lambda tp: True).get(TP, [])]
        assert got == list(range(20))
        positions.append(tracker.position)
    assert positions[0] == positions[1] == EpochOffset(21, 0)


def test_a_prefetch_answered_early_has_what_follows_it_prefetched_at_once(mocker: Any) -> None:
    # With one request in flight per broker, a prefetch answered while the application is
    # still taking the records before it left the broker idle until the tracker asked for
    # it. What follows goes out as soon as the answer is in, and takes its place when used.
    f, _client, tracker, futures = _fetching(mocker)
    f.chain_prefetches = True  # as the asyncio driver has it
    f.send_requests(0.0)
    futures[0][1].success(_fetch_answer(0, 10, hw=50))
    f.process_completions()
    assert _offsets_asked(futures, 1) == [10]  # the early prefetch of the answer in hand
    futures[1][1].success(_fetch_answer(10, 10, hw=50))
    f.process_completions()
    assert len(futures) == 3 and _offsets_asked(futures, 2) == [20]
    got = f.fetched_records(100, lambda tp: True)[TP]
    assert [r.offset for r in got] == list(range(10))
    f.send_requests(0.0)  # the tracker asks for 10: the prefetch answers it
    assert len(futures) == 3  # 20 is on its way already
    futures[2][1].success(_fetch_answer(20, 10, hw=50))
    f.process_completions()
    assert len(futures) == 4 and _offsets_asked(futures, 3) == [30]
    for start in (10, 20):
        got = f.fetched_records(100, lambda tp: True)[TP]
        assert [r.offset for r in got] == list(range(start, start + 10))
        f.send_requests(0.0)
    assert tracker.position == EpochOffset(30, 0)
    assert f.metrics.prefetches_used == 2 and f.metrics.prefetches_discarded == 0


def test_without_chaining_the_next_prefetch_waits_for_the_tracker(mocker: Any) -> None:
    # The threaded driver's way (chain_prefetches off): what follows an early answer is
    # prefetched once the tracker has asked for it.
    f, _client, _tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    futures[0][1].success(_fetch_answer(0, 10, hw=50))
    f.process_completions()
    futures[1][1].success(_fetch_answer(10, 10, hw=50))
    f.process_completions()
    assert len(futures) == 2
    f.fetched_records(100, lambda tp: True)
    f.send_requests(0.0)
    assert len(futures) == 3 and _offsets_asked(futures, 2) == [20]


def test_a_seek_drops_a_chained_prefetch_with_the_one_before_it(mocker: Any) -> None:
    f, _client, tracker, futures = _fetching(mocker)
    f.chain_prefetches = True
    f.send_requests(0.0)
    futures[0][1].success(_fetch_answer(0, 10, hw=50))
    f.process_completions()
    futures[1][1].success(_fetch_answer(10, 10, hw=50))
    f.process_completions()
    assert len(futures) == 3  # 20 chained on the answer for 10
    tracker.seek(5)
    f.after_input(TP)
    futures[2][1].success(_fetch_answer(20, 10, hw=50))
    f.process_completions()
    assert f.fetched_records(100, lambda tp: True) == {}  # fetched for the old position
    f.send_requests(0.0)
    # Nothing of the dropped chain is used: the tracker fetches from its new position.
    assert len(futures) == 4 and _offsets_asked(futures, 3) == [5]
    assert f.metrics.prefetches_discarded == 1
    futures[-1][1].success(_fetch_answer(0, 10, hw=50))
    f.process_completions()
    got = f.fetched_records(100, lambda tp: True)[TP]
    assert [r.offset for r in got] == list(range(5, 10))


def _answer_for(parts: dict[int, tuple[int, int]], hw: int) -> Any:
    """A Fetch answer holding, for each partition, ``(base, n)`` records (``n == 0``: none,
    as for the partitions a broker leaves empty once ``fetch_max_bytes`` is reached)."""
    answer = _fetch_answer(0, 1, hw=hw)
    template = answer.responses[0].partitions[0]
    answer.responses[0].partitions = []
    for i, (base, n) in parts.items():
        part = NS(**vars(template))
        part.partition_index = i
        part.records = _records(base, n) if n else b""
        answer.responses[0].partitions.append(part)
    return answer


def _fetched(request: Any) -> list[tuple[int, int]]:
    return sorted((q.partition, q.fetch_offset) for q in request.topics[0].partitions)


@pytest.mark.parametrize("budget", [None, 1])
def test_partitions_left_empty_are_fetched_again_before_the_answer_is_decoded(
    mocker: Any, budget: int | None
) -> None:
    # An answer for many partitions reaches fetch_max_bytes and leaves the last ones
    # empty. Nothing to decode: they are fetched again at once, not after every other
    # partition of the answer was decoded (a decode budget spreads that over many reads).
    f, _tps, futures = _first_fetch_of(mocker, 4, budget)
    futures[0][1].success(_answer_for({0: (0, 10), 1: (0, 10), 2: (0, 0), 3: (0, 0)}, hw=10))
    f.process_completions()
    got = f.fetched_records(10, lambda tp: True)
    assert sorted(got) == [TopicPartition("t", 0)]
    f.send_requests(0.0)
    # Partition 0, at the end of its log, goes along with them; partition 1's records are
    # still to be handed out (or decoded).
    assert len(futures) == 2
    assert _fetched(futures[1][0][1]) == [(0, 10), (2, 0), (3, 0)]


@pytest.mark.parametrize("budget", [None, 1])
def test_a_caught_up_partition_waits_while_its_brokers_records_are_still_to_decode(
    mocker: Any, budget: int | None
) -> None:
    # A fetch of caught-up partitions alone long-polls for fetch_max_wait_ms, holding the
    # broker's one request slot. Records still to decode are records still to hand out, as
    # buffered ones are: the caught-up partition waits to go along with the others.
    f, _tps, futures = _first_fetch_of(mocker, 2, budget)
    futures[0][1].success(_answer_for({0: (0, 10), 1: (0, 10)}, hw=10))
    f.process_completions()
    assert sorted(f.fetched_records(10, lambda tp: True)) == [TopicPartition("t", 0)]
    f.send_requests(0.0)
    assert len(futures) == 1
    f.process_completions()
    assert sorted(f.fetched_records(10, lambda tp: True)) == [TopicPartition("t", 1)]
    f.send_requests(0.0)
    assert len(futures) == 2
    assert _fetched(futures[1][0][1]) == [(0, 10), (1, 10)]


def _control_batch(base: int, epoch: int) -> bytes:
    import crc32c
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        batch_size=10**6,
    )
    b.append(0, timestamp=1, key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x00", headers=[])
    raw = bytearray(b.build())
    raw[0:8] = base.to_bytes(8, "big")
    raw[12:16] = epoch.to_bytes(4, "big", signed=True)
    raw[21:23] = (int.from_bytes(raw[21:23], "big") | 0x20).to_bytes(2, "big")  # control
    raw[17:21] = crc32c.crc32c(bytes(raw[21:])).to_bytes(4, "big")
    return bytes(raw)


def test_an_early_prefetch_that_guessed_wrong_is_replaced(mocker: Any) -> None:
    # The headers end with a control batch of a later epoch than the last record's: the
    # tracker will ask with the record's epoch, so the early prefetch never matches; it is
    # dropped once the answer is decoded and the usual prefetch goes out instead.
    f, _client, _tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    answer = _fetch_answer(0, 10, hw=30)
    part = answer.responses[0].partitions[0]
    part.records = part.records + _control_batch(10, epoch=1)
    futures[0][1].success(answer)
    f.process_completions()
    early = futures[1][0][1].topics[0].partitions[0]
    assert (early.fetch_offset, early.last_fetched_epoch) == (11, 1)
    assert f.metrics.prefetches_discarded == 1
    f.send_requests(0.0)
    assert len(futures) == 2  # the dropped prefetch's request is still in flight
    futures[1][1].success(_fetch_answer(11, 5, hw=30))
    f.process_completions()
    f.send_requests(0.0)
    again = futures[2][0][1].topics[0].partitions[0]
    assert (again.fetch_offset, again.last_fetched_epoch) == (11, 0)
    assert [r.offset for r in f.fetched_records(100, lambda tp: True)[TP]] == list(range(10))


def test_caught_up_partitions_are_not_prefetched(mocker: Any) -> None:
    f, _client, _tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    futures[0][1].success(_fetch_answer(0, 10, hw=10))  # reached the high watermark
    f.process_completions()
    f.send_requests(0.0)
    assert len(futures) == 1


def test_list_offsets_lookup_at_leader_epoch_0_is_fenced_at_0(mocker: Any) -> None:
    """Epoch 0 is a real epoch: a lookup (end_offsets & co.) for a partition whose leader is
    at epoch 0 must send current_leader_epoch 0, not -1 ("unknown"), or the broker skips
    the fencing check and a stale leader answers."""
    from kafka.protocol.consumer import ListOffsetsResponse

    f, client = _fetcher(mocker)
    f.metadata_topics.add("t")
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=0))
    sent: list[Any] = []

    def send(node: Any, request: Any, *args: Any) -> Future:
        sent.append((node, request))
        LT = ListOffsetsResponse.ListOffsetsTopicResponse
        part = LT.ListOffsetsPartitionResponse(
            partition_index=0, error_code=0, timestamp=-1, offset=7, leader_epoch=0
        )
        return Future().success(
            ListOffsetsResponse(version=4, topics=[LT(name="t", partitions=[part])])
        )

    client.send.side_effect = send
    client.wait.side_effect = lambda fut, timeout: fut.value
    assert run_blocking(f.list_offsets({TP: -1}, 1.0)) == {TP: (7, 0, -1)}
    (node, request) = sent[0]
    assert node == 1
    assert request.topics[0].partitions[0].current_leader_epoch == 0


def test_pump_until_applies_answers_and_stops_at_the_predicate(mocker: Any) -> None:
    f, client = _fetcher(mocker)
    f.metadata_topics.add("t")
    pending: list[Future] = []

    def send(*_args: Any) -> Future:
        pending.append(Future())
        return pending[-1]

    client.send_metadata.side_effect = send
    # A deadline already past ends it at once, with the predicate's value, sending nothing.
    assert not run_blocking(f.pump_until(lambda: False, 0.0))
    assert run_blocking(f.pump_until(lambda: True, 0.0))
    assert pending == []
    # Otherwise it sends what is due (the metadata request) until the predicate holds.
    assert run_blocking(f.pump_until(lambda: bool(pending), time.monotonic() + 60))
    assert len(pending) == 1
    pending[0].success(_metadata(leader=1, epoch=0))
    assert run_blocking(f.pump_until(lambda: f.metadata.leader_of(TP) == 1, 0.0))
    assert f.metadata.epoch_of(TP) == 0  # epoch 0 is kept as 0, not "unknown"


def test_metadata_failures_back_off_with_retry_backoff(mocker: Any) -> None:
    from epochguard.consumer.metadata import Metadata

    config = build_config({"retry_backoff_ms": 100, "reconnect_backoff_max_ms": 1000})
    m = Metadata(config)
    m.topics.add("t")
    delays = []
    for _ in range(6):
        assert m.due(m.next_at) is not None
        m.on_failure(OSError("down"), 50.0)
        delays.append(round(m.next_at - 50.0, 3))
    assert delays == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert m.due(m.next_at) is not None  # still asking


def test_an_answer_for_a_partition_paused_meanwhile_does_not_hold_up_its_broker() -> None:
    """Found in review: the answer of a fetch in flight when its partition was paused was
    buffered and never drained, and a broker with buffered records holds back its caught-up
    partitions until those buffers empty: q was never fetched again until p was resumed."""
    import uuid
    from types import SimpleNamespace as NS
    from unittest import mock

    from kafka.future import Future
    from kafka.record import MemoryRecordsBuilder

    from epochguard.consumer.config import build_config
    from epochguard.offsets.policy import OffsetPolicy

    p, q = TopicPartition("t", 0), TopicPartition("t", 1)
    client = mock.Mock()
    client.send.return_value = Future()
    f = Fetcher(
        client,
        build_config({}),
        OffsetPolicy(auto_offset_reset="earliest"),
        None,
        None,
        lambda e: None,
    )
    sent: list[Any] = []
    f._complete = lambda h, ctx, fut: sent.append((h, ctx))  # type: ignore[method-assign]
    parts = [NS(partition_index=i, leader_id=1, leader_epoch=0, error_code=0) for i in (0, 1)]
    topic = NS(name="t", error_code=0, topic_id=uuid.uuid4(), is_internal=False, partitions=parts)
    for tp in (p, q):
        f.add_partition(tp)
    f._on_metadata(MetadataSent(0.0, ["t"]), Future().success(NS(topics=[topic], brokers=[])))
    for tp in (p, q):
        f.trackers[tp].seek(0)
        f.after_input(tp)

    def records(start: int, n: int) -> bytes:
        b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=10**6, offset=start)
        for i in range(n):
            b.append(timestamp=i, key=None, value=b"v", headers=[])
        b.close()
        return bytes(b.buffer())

    def part(i: int, recs: bytes, hw: int) -> Any:
        return NS(
            partition_index=i,
            error_code=0,
            diverging_epoch=None,
            records=recs,
            high_watermark=hw,
            last_stable_offset=hw,
            log_start_offset=0,
            aborted_transactions=None,
            preferred_read_replica=-1,
        )

    def answer(ctx: Any, answered: list[Any]) -> None:
        resp = NS(
            API_VERSION=12,
            error_code=0,
            session_id=0,
            throttle_time_ms=0,
            responses=[NS(topic="t", partitions=answered)],
        )
        f._on_fetch(ctx, Future().success(resp))

    def fetches() -> list[Any]:
        return [ctx for h, ctx in sent if h == f._on_fetch]

    now = 1.0
    f.send_requests(now)
    answer(fetches()[-1], [part(0, records(0, 10), 100), part(1, b"", 0)])
    assert len(f.fetched_records(500, lambda tp: True)[p]) == 10
    f.send_requests(now)
    in_flight = fetches()[-1]
    f.trackers[p].pause()  # EpochConsumer.pause(p) while that fetch is out
    f.after_input(p)
    answer(in_flight, [part(0, records(10, 10), 100), part(1, b"", 0)])
    before = len(fetches())
    for _ in range(20):
        now += 1.0
        f.fetched_records(500, lambda tp: tp != p)
        f.send_requests(now)
    assert len(fetches()) > before, "q was never fetched again"
    assert p not in f._sources[1].buffers


def test_a_former_leaders_late_answer_does_not_discard_the_current_fetchs_records(
    mocker: Any,
) -> None:
    """Found by the chaos runs (seeds 194, 211, 2982 stalled): the leader moves while a
    fetch to the old leader is out; the new leader's answer is buffered, then the old
    leader's late FENCED answer came in. Applying it took the partition from the new
    leader's source, buffered records included, while the tracker went on waiting for
    them: the partition was never fetched again."""
    f, _client, tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    assert [args[0] for args, _fut in futures] == [1]
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=2, epoch=1))
    f.send_requests(0.0)
    assert [args[0] for args, _fut in futures] == [1, 2]
    futures[1][1].success(_fetch_answer(0, 10, hw=10))
    fenced = NS(
        partition_index=0,
        error_code=74,  # FENCED_LEADER_EPOCH: the old leader heard of the new epoch
        diverging_epoch=None,
        records=b"",
        high_watermark=-1,
        aborted_transactions=None,
    )
    futures[0][1].success(
        NS(API_VERSION=12, error_code=0, responses=[NS(topic="t", partitions=[fenced])])
    )
    f.process_completions()
    got = f.fetched_records(100, lambda tp: True)
    assert [r.offset for r in got[TP]] == list(range(10))
    assert tracker.position == EpochOffset(10, 0)
    f.send_requests(0.0)
    assert [args[0] for args, _fut in futures] == [1, 2, 2], "not fetched again"
    assert f.metrics.fetch_errors == 0  # the stale answer is no error of the partition's


def test_a_partition_handed_back_takes_no_answer_meant_for_its_former_tracker(
    mocker: Any,
) -> None:
    """Chaos seed 72 through the driver: answers find their tracker by partition, so the
    OffsetForLeaderEpoch answer to a tracker since removed (a rebalance took the partition)
    reached the tracker made when the partition came back. It must be ignored there."""
    events: list[Any] = []
    f, client = _fetcher(mocker, events)
    sent: list[Any] = []
    f._complete = lambda h, ctx, fut: sent.append((h, ctx))  # type: ignore[method-assign]
    client.send.return_value = Future()
    first = f.add_partition(TP)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=0))
    first.seek(EpochOffset(5, 0))
    f.after_input(TP)
    f.send_requests(0.0)
    [(handler, old_actions)] = sent
    assert handler == f._on_validation
    f.remove_partition(TP)  # revoked with the request out
    again = f.add_partition(TP)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=0))
    again.restore(EpochOffset(23, 0))
    f.after_input(TP)
    end = NS(partition=0, error_code=0, leader_epoch=0, end_offset=5)  # about 5@e0, not 23
    answer = NS(topics=[NS(topic="t", partitions=[end])])
    f._on_validation(old_actions, Future().success(answer))
    assert again.state is PartitionState.AWAIT_VALIDATION and again.last_report is None
    assert not [e for e in events if e.name == "truncation_detected"]


def _fenced_answer(hint: Any) -> Any:
    """A Fetch v16 answer refusing the fetch (FENCED_LEADER_EPOCH) with a KIP-951 hint."""
    part = NS(
        partition_index=0,
        error_code=74,
        diverging_epoch=None,
        current_leader=hint,
        records=None,
        high_watermark=-1,
        last_stable_offset=-1,
        aborted_transactions=None,
    )
    return NS(API_VERSION=16, error_code=0, responses=[NS(topic_id=TID, partitions=[part])])


def _fetching_from(mocker: Any, leader: int, epoch: int) -> tuple[Fetcher, Any, Any]:
    f, client = _fetcher(mocker)
    tracker = f.add_partition(TP)
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=leader, epoch=epoch))
    tracker.seek(0)
    f.after_input(TP)
    client.send.return_value = Future()
    f.send_requests(0.0)
    return f, client, tracker


def test_a_newer_leader_hint_moves_the_partition_without_metadata(mocker: Any) -> None:
    """KIP-951: FENCED_LEADER_EPOCH naming leader 2 at epoch 4 moves the partition there
    and validates its position with that leader, before any metadata answer."""
    f, client, tracker = _fetching_from(mocker, leader=1, epoch=3)
    client.broker_known.return_value = True
    action = FetchAction(TP, 1, 0, None, 3, _token(tracker))
    f._on_fetch(
        FetchSent(1, {TP: action}, {TID: "t"}),
        Future().success(_fenced_answer(NS(leader_id=2, leader_epoch=4))),
    )
    assert (tracker.leader_id, tracker.leader_epoch) == (2, 4)
    assert f.metadata.leader_of(TP) == 2 and f.metadata.epoch_of(TP) == 4
    assert f.metrics.leader_hints_applied == 1
    client.send.reset_mock()
    f.send_requests(0.0)
    sent_to = [call.args[0] for call in client.send.call_args_list]
    assert 2 in sent_to  # the position goes to the new leader at once


@pytest.mark.parametrize(
    ("hint", "known"),
    [((1, 3), True), ((0, 2), True), ((2, 4), False), ((-1, -1), True)],
    ids=["same-epoch", "older-epoch", "unknown-broker", "no-leader"],
)
def test_a_leader_hint_not_newer_or_unreachable_is_left_to_metadata(
    mocker: Any, hint: tuple[int, int], known: bool
) -> None:
    f, client, tracker = _fetching_from(mocker, leader=1, epoch=3)
    client.broker_known.return_value = known
    action = FetchAction(TP, 1, 0, None, 3, _token(tracker))
    f._on_fetch(
        FetchSent(1, {TP: action}, {TID: "t"}),
        Future().success(_fenced_answer(NS(leader_id=hint[0], leader_epoch=hint[1]))),
    )
    assert (tracker.leader_id, tracker.leader_epoch) == (1, 3)
    assert f.metrics.leader_hints_applied == 0
    assert f.metadata.epoch_of(TP) == 3


def _offsets_answer(hw: int, lso: int) -> Any:
    """An answer without records: the partition's high watermark and last stable offset."""
    part = NS(
        partition_index=0,
        error_code=0,
        diverging_epoch=None,
        records=b"",
        high_watermark=hw,
        last_stable_offset=lso,
        aborted_transactions=None,
    )
    return NS(
        API_VERSION=12, error_code=0, session_id=7, responses=[NS(topic="t", partitions=[part])]
    )


def test_a_stale_answer_of_the_serving_broker_still_gives_its_offsets(mocker: Any) -> None:
    """Found by the transactional chaos runs: a fetch session leaves a partition out of its
    answers until its high watermark or log start moves (KIP-227). An answer the tracker no
    longer waited for (it had sought meanwhile) was dropped whole, so the last stable offset
    it carried was never known, and a hanging transaction there was never reported."""
    f, _client, tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    tracker.seek(3)  # the answer to the fetch out is stale now
    futures[0][1].success(_offsets_answer(hw=4, lso=0))
    f.process_completions()
    assert (f.highwaters[TP], f.last_stable_offsets[TP]) == (4, 0)
    # A late answer of a broker that no longer serves the partition says nothing.
    f.send_requests(0.0)
    assert futures[1][0][0] == 1
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=2, epoch=1))
    futures[1][1].success(_offsets_answer(hw=9, lso=9))
    f.process_completions()
    assert (f.highwaters[TP], f.last_stable_offsets[TP]) == (4, 0)


def test_a_partition_handed_back_within_its_fetch_session_is_asked_for_in_full(
    mocker: Any,
) -> None:
    """A rebalance hands a partition back before a request forgot it: the broker's session
    still holds it and would leave it out of every answer until its high watermark moves,
    so the new tracker would never hear its high watermark and last stable offset (found
    by the transactional chaos runs: a hanging transaction there was never reported). The
    next fetch to that broker is full."""
    f, _client, _tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    futures[0][1].success(_offsets_answer(hw=4, lso=1))
    f.process_completions()
    session = f._source(1).session
    assert session.holds(TP) and session.state is SessionState.OPEN
    f.remove_partition(TP)
    assert TP not in f.highwaters and TP not in f.last_stable_offsets
    f.add_partition(TP).seek(0)
    f.after_input(TP)
    assert session.state is SessionState.REOPEN
    f.send_requests(0.0)
    (node, req), _fut = futures[-1][0][:2], futures[-1][1]
    assert node == 1 and req.session_epoch == 0  # full: every partition is answered
    assert [p.partition for t in req.topics for p in t.partitions] == [0]


def test_a_partition_no_session_holds_leaves_the_sessions_alone(mocker: Any) -> None:
    f, _client, _tracker, futures = _fetching(mocker)
    f.send_requests(0.0)
    futures[0][1].success(_offsets_answer(hw=4, lso=1))
    f.process_completions()
    session = f._source(1).session
    other = TopicPartition("t", 1)
    f.add_partition(other)
    f.remove_partition(other)
    f.add_partition(other)
    assert session.state is SessionState.OPEN


def test_read_committed_answers_feed_the_transaction_ledger(mocker: Any) -> None:
    """Fed Fetch answers: a transaction read as committed (records and COMMIT marker), then
    an answer whose aborted-transaction list names its producer from below the fetch
    offset: the deliveries were reverted, and ``on_reopened`` hears of it."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from epochguard.offsets.reopened import ReopenCause
    from epochguard.testing.embedded.records import build_control_batch

    pid = 7000
    client = mocker.Mock()
    f = Fetcher(
        client,
        build_config({"isolation_level": "read_committed"}),
        OffsetPolicy(auto_offset_reset="earliest", on_truncation="raise"),
        None,
        None,
        lambda _event: None,
    )
    found: list[Any] = []
    f.on_reopened = found.append
    tracker = f.add_partition(TP)
    assert TP in f.ledgers
    _answer(f, f._on_metadata, MetadataSent(0.0, ["t"]), _metadata(leader=1, epoch=0))
    tracker.seek(0)
    f.after_input(TP)
    client.send.return_value = Future()
    f.send_requests(0.0)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=pid,
        producer_epoch=2,
        base_sequence=0,
        batch_size=1 << 20,
    )
    for i in range(2):
        builder.append(i, 0, None, b"v%d" % i, [])
    marker = bytearray(build_control_batch(pid, 2, commit=True, coordinator_epoch=0))
    marker[7] = 2  # base offset 2 (big-endian int64, outside the CRC)

    def part(records: bytes, aborted: Any) -> Any:
        return NS(
            partition_index=0,
            error_code=0,
            diverging_epoch=None,
            records=records,
            high_watermark=4,
            last_stable_offset=4,
            aborted_transactions=aborted,
        )

    resp = NS(
        API_VERSION=12,
        error_code=0,
        responses=[NS(topic="t", partitions=[part(bytes(builder.build()) + bytes(marker), None)])],
    )
    f._on_fetch(
        FetchSent(1, {TP: FetchAction(TP, 1, 0, 0, None, _token(tracker))}, {}),
        Future().success(resp),
    )
    got = f.fetched_records(10, lambda tp: True)
    assert [r.value for r in got[TP]] == [b"v0", b"v1"] and found == []
    assert tracker.position is not None and tracker.position.offset == 3
    # The next answer, from 3: Kafka lists an aborted transaction of the producer from 0.
    f.send_requests(0.0)
    plain = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    plain.append(0, 0, None, b"p", [])
    plain_batch = bytearray(plain.build())
    plain_batch[7] = 3
    aborted = [NS(producer_id=pid, first_offset=0)]
    resp = NS(
        API_VERSION=12,
        error_code=0,
        responses=[NS(topic="t", partitions=[part(bytes(plain_batch), aborted)])],
    )
    f._on_fetch(
        FetchSent(1, {TP: FetchAction(TP, 1, 3, 0, None, _token(tracker))}, {}),
        Future().success(resp),
    )
    (reverted,) = found
    assert reverted.cause is ReopenCause.ABORTED_LISTED
    assert (reverted.producer_id, reverted.producer_epoch) == (pid, 2)
    assert (reverted.first_offset, reverted.last_offset) == (0, 1)
    assert reverted.delivered and reverted.now_committed is False
    f.remove_partition(TP)
    assert TP not in f.ledgers
