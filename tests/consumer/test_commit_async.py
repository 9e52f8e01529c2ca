"""``commit_async``: returns before the coordinator answers; callbacks in call order, on the
application's thread, during ``poll``/``commit``/``close``; errors go to the callback."""

from __future__ import annotations

import threading
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka.structs import OffsetAndMetadata, TopicPartition

from epochguard.offsets.position import EpochOffset
from epochguard.offsets.stores import SqliteOffsetStore
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer, poll_until, read

pytestmark = pytest.mark.timeout(60)

OFFSET_COMMIT = 8
TP = TopicPartition("ca", 0)


def _consumer(cluster: EmbeddedCluster, **kw: Any) -> Any:
    cluster.create_topic("ca", partitions=1, replication_factor=2)
    cluster.append("ca", 0, [b"v%d" % i for i in range(6)], batch_size=2)
    c = make_consumer(cluster, group_id="ca-group", **kw)
    c.assign([TP])
    assert len(read(c, 6)) == 6
    return c


def test_commit_async_returns_before_the_answer_and_calls_back_during_poll(
    cluster: EmbeddedCluster,
) -> None:
    c = _consumer(cluster)
    calls: list[tuple[Any, Any, str]] = []
    try:
        c.committed_with_epoch(TP)  # the coordinator is known: the delay below is the commit's own
        cluster.faults.delay_responses(0.8, api_key=OFFSET_COMMIT, count=1)
        future = c.commit_async(
            callback=lambda offsets, exc: calls.append(
                (offsets, exc, threading.current_thread().name)
            )
        )
        assert not future.is_done and calls == []
        poll_until(c, lambda: bool(calls))
        [(offsets, exc, thread)] = calls
        assert exc is None and thread == threading.current_thread().name
        epoch = cluster.leader_epoch("ca", 0)
        assert offsets == {TP: OffsetAndMetadata(6, "", epoch)}
        # kafka-python's Future: succeeds with None; the offsets went to the callback.
        assert future.succeeded() and future.value is None
        assert c.committed_with_epoch(TP) == EpochOffset(6, epoch)
    finally:
        c.close()


def test_commits_complete_in_call_order_and_commit_waits_for_earlier_async_ones(
    cluster: EmbeddedCluster,
) -> None:
    c = _consumer(cluster)
    order: list[int] = []
    try:
        c.committed_with_epoch(TP)
        cluster.faults.delay_responses(0.5, api_key=OFFSET_COMMIT, count=1)
        c.commit_async({TP: 2}, callback=lambda o, e: order.append(o[TP].offset))
        c.commit_async({TP: 4}, callback=lambda o, e: order.append(o[TP].offset))
        # The synchronous commit is not overtaken by the delayed async ones: their
        # callbacks have run, in order, when it returns, and its offset is the one kept.
        c.commit({TP: 5})
        assert order == [2, 4]
        assert c.committed_with_epoch(TP) == EpochOffset(5)
    finally:
        c.close()


def test_a_failed_async_commit_reaches_the_callback_not_the_caller(
    cluster: EmbeddedCluster,
) -> None:
    c = _consumer(cluster)
    calls: list[Any] = []
    try:
        c.committed_with_epoch(TP)
        cluster.faults.inject_error(OFFSET_COMMIT, 30, count=1)  # GROUP_AUTHORIZATION_FAILED
        future = c.commit_async(callback=lambda o, e: calls.append(e))
        poll_until(c, lambda: bool(calls))
        assert isinstance(calls[0], kerrors.GroupAuthorizationFailedError)
        assert future.failed()
        assert isinstance(future.exception, kerrors.GroupAuthorizationFailedError)
        assert c.committed_with_epoch(TP) is None
    finally:
        c.close()


def test_close_runs_the_callbacks_of_pending_commits(cluster: EmbeddedCluster) -> None:
    c = _consumer(cluster, default_offset_commit_callback=None)
    calls: list[Any] = []
    c.committed_with_epoch(TP)
    cluster.faults.delay_responses(0.3, api_key=OFFSET_COMMIT, count=1)
    c.commit_async(callback=lambda o, e: calls.append((o, e)))
    c.close()
    assert [e for _o, e in calls] == [None]
    with make_consumer(cluster, group_id="ca-group") as again:
        assert again.committed_with_epoch(TP) == EpochOffset(6, cluster.leader_epoch("ca", 0))


def test_commit_async_to_an_offset_store_uses_the_default_callback(
    cluster: EmbeddedCluster,
    tmp_path: Any,
) -> None:
    calls: list[Any] = []
    store = SqliteOffsetStore(tmp_path / "offsets.db", "app")
    c = _consumer(
        cluster,
        offset_store=store,
        default_offset_commit_callback=lambda o, e: calls.append((o, e)),
    )
    try:
        future = c.commit_async()
        assert future.is_done and future.succeeded()
        epoch = cluster.leader_epoch("ca", 0)
        assert store.load() == {TP: EpochOffset(6, epoch)}
        c.poll(timeout_ms=0)
        assert calls == [({TP: OffsetAndMetadata(6, "", epoch)}, None)]
    finally:
        c.close()


@pytest.mark.parametrize(
    ("error_code", "name"), [(3, "UNKNOWN_TOPIC_OR_PARTITION"), (7, "REQUEST_TIMED_OUT")]
)
@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_a_retriable_commit_error_is_asked_again_within_the_timeout(
    cluster: EmbeddedCluster, error_code: int, name: str, group_protocol: str
) -> None:
    """A coordinator whose metadata lags a restart answers UNKNOWN_TOPIC_OR_PARTITION for a
    topic it does not know yet: Java's commitSync asks again until its timeout, and so does
    commit(). Raising instead loses the commit, and with it what a later truncation report
    would say."""
    c = _consumer(cluster, group_protocol=group_protocol)
    try:
        c.committed_with_epoch(TP)
        cluster.faults.inject_error(OFFSET_COMMIT, error_code, count=2)
        c.commit({TP: 4})
        assert c.committed_with_epoch(TP) == EpochOffset(4), name
        commits = sum(n for (key, _), n in cluster.requests_seen().items() if key == 8)
        assert commits == 3
    finally:
        c.close()


def test_a_retriable_commit_error_past_the_timeout_reaches_the_caller(
    cluster: EmbeddedCluster,
) -> None:
    c = _consumer(cluster)
    try:
        c.committed_with_epoch(TP)
        cluster.faults.inject_error(OFFSET_COMMIT, 3, count=1000)
        with pytest.raises(kerrors.UnknownTopicOrPartitionError):
            c.commit({TP: 4}, timeout_ms=300)
    finally:
        cluster.faults.clear()
        c.close()
