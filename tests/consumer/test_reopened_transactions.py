"""Transactions a read_committed consumer read as decided and a truncation reopened: the
decoder's view of transactional batches (fed bytes), and EpochConsumer on the
EmbeddedCluster reporting a lost COMMIT marker at once and the abort that decides the
transaction again."""

from __future__ import annotations

import logging
import struct
import time
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.record.default_records import DefaultRecordBatchBuilder

from epochguard import ReopenedTransactionError
from epochguard.consumer.columns import decode_columns
from epochguard.consumer.records import decode_records
from epochguard.offsets.reopened import BatchKind, ReopenCause, TxnBatch
from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.records import build_control_batch

from .conftest import TP0, make_consumer

pytestmark = pytest.mark.timeout(60)

PID, OTHER = 4000, 5000


def _at(batch: bytes, base_offset: int) -> bytes:
    """``batch`` placed at ``base_offset`` (outside the CRC, as a broker assigns it)."""
    out = bytearray(batch)
    struct.pack_into(">q", out, 0, base_offset)
    return bytes(out)


def _data(pid: int, epoch: int, base: int, values: list[bytes], txn: bool = True) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=txn,
        producer_id=pid if txn else -1,
        producer_epoch=epoch if txn else -1,
        base_sequence=0 if txn else -1,
        batch_size=1 << 20,
    )
    for i, v in enumerate(values):
        builder.append(i, 0, None, v, [])
    return _at(bytes(builder.build()), base)


def _marker(pid: int, epoch: int, offset: int, commit: bool) -> bytes:
    batch = build_control_batch(pid, epoch, commit=commit, coordinator_epoch=0, timestamp_ms=0)
    return _at(batch, offset)


#: PID's transaction 0..1 committed at 2; OTHER's 3 skipped (aborted at 5); a plain record 4.
FETCHED = (
    _data(PID, 3, 0, [b"a", b"b"])
    + _marker(PID, 3, 2, True)
    + _data(OTHER, 1, 3, [b"x"])
    + _data(0, 0, 4, [b"plain"], txn=False)
    + _marker(OTHER, 1, 5, False)
)
EXPECTED = [
    TxnBatch(PID, 3, 0, 1, BatchKind.DELIVERED),
    TxnBatch(PID, 3, 2, 2, BatchKind.COMMIT),
    TxnBatch(OTHER, 1, 3, 3, BatchKind.SKIPPED),
    TxnBatch(OTHER, 1, 5, 5, BatchKind.ABORT),
]


@pytest.mark.parametrize("decode", [decode_records, decode_columns])
def test_the_decoder_tells_the_transactional_batches_it_walked(decode: Any) -> None:
    decoded = decode(
        FETCHED,
        "t",
        0,
        0,
        aborted_producers=[(OTHER, 3)],
        read_committed=True,
        transactions=[],
    )
    assert list(decoded.transactions) == EXPECTED
    assert len(decoded.records) == 3 and decoded.next_offset == 6
    # From inside the first batch: its records below the fetch offset are not counted.
    mid = decode(
        FETCHED, "t", 0, 1, aborted_producers=[(OTHER, 3)], read_committed=True, transactions=[]
    )
    assert mid.transactions[0] == TxnBatch(PID, 3, 1, 1, BatchKind.DELIVERED)
    # Not asked: nothing collected (read_uncommitted consumers do not).
    assert decode(FETCHED, "t", 0, 0, read_committed=True).transactions == ()


def test_a_control_record_that_is_no_marker_is_left_out() -> None:
    odd = bytearray(_marker(PID, 3, 0, True))
    # The key's type field (after the record's length, attributes, two deltas and the key
    # length, one byte each here, and the key's version): 5 is no COMMIT or ABORT.
    key_type_at = 61 + 5 + 2
    assert struct.unpack_from(">h", odd, key_type_at)[0] == 1
    struct.pack_into(">h", odd, key_type_at, 5)

    decoded = decode_records(
        bytes(odd), "t", 0, 0, read_committed=True, transactions=[], check_crcs=False
    )
    assert decoded.transactions == ()


def _stage_lost_commit(cluster: EmbeddedCluster) -> tuple[int, int, int, int]:
    """Two records of a transaction reach both replicas; its COMMIT marker reaches the
    leader only. Returns (leader, follower, producer id, producer epoch)."""
    cluster.create_topic("t", replication_factor=2)
    leader = cluster.leader("t", 0)
    assert leader is not None
    follower = next(b for b in cluster.replicas("t", 0) if b != leader)
    p = KafkaProducer(bootstrap_servers=cluster.all_bootstrap_servers, transactional_id="tx")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"a", partition=0)
    p.send("t", b"b", partition=0)
    p.flush()
    cluster.pause_replication(follower)
    p.commit_transaction()
    p.close()
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        (state,) = admin.describe_producers([TP0])[TP0].active_producers
    finally:
        admin.close()
    return leader, follower, state.producer_id, state.producer_epoch


def _unclean(cluster: EmbeddedCluster, leader: int, follower: int) -> None:
    cluster.stop_broker(leader)
    cluster.elect_leader("t", 0, follower, unclean=True)
    cluster.resume_replication(follower)
    cluster.start_broker(leader)
    cluster.settle()


def _poll_for(c: Any, error: type[Exception], timeout: float = 10.0) -> tuple[Any, list[Any]]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for records in c.poll(timeout_ms=100).values():
                got += records
        except error as exc:
            return exc, got
    raise AssertionError(f"no {error.__name__} in {timeout} s; got {got}")


def test_a_lost_commit_marker_is_reported_at_once_and_its_abort_after(
    cluster: EmbeddedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    leader, follower, pid, epoch = _stage_lost_commit(cluster)
    with (
        caplog.at_level(logging.ERROR, logger="epochguard"),
        make_consumer(
            cluster,
            isolation_level="read_committed",
            on_truncation="rewind",
            transaction_max_timeout_ms=60_000,  # no hanging report within the test
        ) as c,
    ):
        c.assign([TP0])
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while c.position(TP0) < 3 and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=100).values():
                got += records
        assert [r.value for r in got] == [b"a", b"b"]  # read as committed, marker at 2
        _unclean(cluster, leader, follower)
        raised, _ = _poll_for(c, ReopenedTransactionError)
        found = raised.transaction
        assert found.cause is ReopenCause.MARKER_TRUNCATED
        assert (found.tp, found.producer_id, found.producer_epoch) == (TP0, pid, epoch)
        assert (found.first_offset, found.last_offset, found.divergence) == (0, 1, 2)
        assert found.delivered and found.now_committed is None and found.marker_offset == 2
        assert c.reopened_transactions() == [found]
        assert c.truncation_reports()[-1].lost_from == 2
        # The producer's next transaction on the partition joins the reopened one, and its
        # abort decides all of it: the records read as committed are aborted now.
        p = KafkaProducer(bootstrap_servers=cluster.all_bootstrap_servers, transactional_id="tx")
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"c", partition=0)
        p.flush()
        p.abort_transaction()
        p.close()
        again, after = _poll_for(c, ReopenedTransactionError)
        assert after == []  # nothing of the aborted transaction is delivered
        (reverted,) = again.reopened
        assert reverted.cause in (ReopenCause.ABORTED_LISTED, ReopenCause.DECIDED_AGAIN)
        assert (reverted.first_offset, reverted.last_offset) == (0, 1)
        assert reverted.delivered and reverted.now_committed is False
        assert c.reopened_transactions() == [found, reverted]
        metrics = c.metrics(raw=True)
        assert metrics is not None and metrics["reopened_transactions_detected"] == 2
    events = [
        r.msg
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg["event"] == "transaction_reopened"
    ]
    assert [e["cause"] for e in events] == ["marker_truncated", reverted.cause.value]
    assert events[0]["producer_id"] == pid and events[0]["was"] == "committed"
    assert events[1]["now"] == "aborted" and events[1]["decision"] == "raise"


def test_under_the_warn_policy_reports_are_kept_not_raised(cluster: EmbeddedCluster) -> None:
    leader, follower, pid, _epoch = _stage_lost_commit(cluster)
    with make_consumer(
        cluster,
        isolation_level="read_committed",
        on_truncation="rewind",
        on_hanging_transaction="warn",
        transaction_max_timeout_ms=60_000,
    ) as c:
        c.assign([TP0])
        deadline = time.monotonic() + 10
        while c.position(TP0) < 3 and time.monotonic() < deadline:
            c.poll(timeout_ms=100)
        _unclean(cluster, leader, follower)
        deadline = time.monotonic() + 10
        while not c.reopened_transactions() and time.monotonic() < deadline:
            c.poll(timeout_ms=100)
        (found,) = c.reopened_transactions()
        assert found.producer_id == pid and found.cause is ReopenCause.MARKER_TRUNCATED


def test_read_uncommitted_consumers_keep_no_ledger(cluster: EmbeddedCluster) -> None:
    leader, follower, _pid, _epoch = _stage_lost_commit(cluster)
    with make_consumer(cluster, on_truncation="rewind") as c:
        c.assign([TP0])
        deadline = time.monotonic() + 10
        while c.position(TP0) < 3 and time.monotonic() < deadline:
            c.poll(timeout_ms=100)
        _unclean(cluster, leader, follower)
        deadline = time.monotonic() + 5
        while not c.truncation_reports() and time.monotonic() < deadline:
            c.poll(timeout_ms=100)
        assert c.truncation_reports() and c.reopened_transactions() == []
