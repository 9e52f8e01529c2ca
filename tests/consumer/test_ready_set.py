"""The fetcher's ready set: ``send_requests`` asks only the partitions that may have
something to send, and no partition is ever left out while it does.

Two checks: a poll of a caught-up consumer asks a handful of trackers, not every assigned
one (the O(partitions) walk this replaced); and, through pauses, resumes, seeks, leader
changes, brokers going down and an unclean election, every partition outside the ready
set is really idle: a
copy of its tracker asked for its next action answers nothing, or a wait whose end is on
the fetcher's timer heap.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.consumer.fetcher import Fetcher
from epochguard.offsets.events import WaitAction
from epochguard.offsets.state import PartitionTracker
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer, poll_until, setup_topic, unclean_elect


def _forgotten(fetcher: Fetcher) -> list[str]:
    """Partitions outside the ready set whose tracker would act now: each one a bug (it
    would never be asked again, or only when some unrelated input wakes it)."""
    now = time.monotonic()
    timers = {tp: until for until, _seq, tp in fetcher._timers}
    out = []
    for tp, tracker in fetcher.trackers.items():
        if tp in fetcher._ready or tp in fetcher._parked_at or tp in fetcher.corrupt:
            continue
        source = fetcher._source_of.get(tp)
        if source is not None and tp in source.buffers:
            continue
        probe = copy.copy(tracker)
        probe._events = []  # next_action may queue events: keep them off the real tracker
        action = probe.next_action(now)
        if action is None:
            continue
        if isinstance(action, WaitAction) and tp in timers and timers[tp] <= action.until:
            continue
        if tp in timers and timers[tp] <= now:
            # Its wait ended after the poll's last send_requests: the next one pops the
            # timer and asks it (a slow machine makes that gap long enough to be seen).
            continue
        out.append(f"{tp}: {action!r} ({tracker!r})")
    # Parked partitions wait for their broker: one with a fetch in flight, or (held back at
    # the high watermark) one whose buffers the application is still draining.
    for node, box in fetcher._parked_busy.items():
        if box and fetcher._sources[node].can_send:
            out += [f"{tp}: parked on broker {node}, which has no fetch in flight" for tp in box]
    for node, box in fetcher._parked_held.items():
        source = fetcher._sources[node]
        if box and source.can_send and not source.buffers:
            out += [f"{tp}: held back on broker {node}, which has nothing buffered" for tp in box]
    return out


def _checked_poll(consumer: EpochConsumer, sink: list[Any], timeout_ms: int = 50) -> None:
    for recs in consumer.poll(timeout_ms=timeout_ms).values():
        sink += recs
    forgotten = _forgotten(consumer._engine.fetcher)
    assert not forgotten, "partitions left out of the ready set:\n" + "\n".join(forgotten)


def test_caught_up_polls_ask_only_partitions_with_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts = 300
    with EmbeddedCluster(brokers=1) as cluster:
        cluster.create_topic("t", partitions=parts, replication_factor=1)
        for p in range(0, parts, 30):
            cluster.append("t", p, [b"v-%d" % i for i in range(5)])
        # Nothing may answer or refresh during the 40 polls, however slowly they run on a
        # loaded machine: a long poll the broker holds, and no metadata refresh (each one
        # rightly puts every partition back in the ready set once).
        c = make_consumer(
            cluster,
            fetch_max_wait_ms=20_000,
            request_timeout_ms=40_000,
            metadata_max_age_ms=300_000,
        )
        try:
            c.assign([TopicPartition("t", p) for p in range(parts)])
            got: list[Any] = []
            poll_until(c, lambda: len(got) >= 50, sink=got)
            assert len(got) == 50
            asked = {"next_action": 0, "fetch_leader": 0}
            for name in asked:
                original = getattr(PartitionTracker, name)

                def counting(self: Any, now: float, _f: Any = original, _n: str = name) -> Any:
                    asked[_n] += 1
                    return _f(self, now)

                monkeypatch.setattr(PartitionTracker, name, counting)
            for _ in range(40):
                assert c.poll(timeout_ms=0) == {}
            # The walk this replaced asked every tracker on every poll (24,000 calls here).
            # Now the caught-up partitions sit in the fetch in flight and nothing asks them
            # until it is answered: at most one round, a look-ahead and an action each.
            total = asked["next_action"] + asked["fetch_leader"]
            assert total <= 2 * parts, asked
        finally:
            c.close()


def test_no_partition_is_left_out_through_pauses_seeks_and_elections() -> None:
    parts = 12
    with EmbeddedCluster(brokers=3) as cluster:
        cluster.create_topic("t", partitions=parts, replication_factor=3)
        tps = [TopicPartition("t", p) for p in range(parts)]
        for p in range(parts):
            cluster.append("t", p, [b"a-%d" % i for i in range(40)], batch_size=10)
        c = make_consumer(cluster, max_poll_records=25)
        try:
            c.assign(tps)
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while len(got) < 100:
                assert time.monotonic() < deadline, f"{len(got)} records"
                _checked_poll(c, got)
            c.pause(*tps[:4])
            for p in range(parts):
                cluster.append("t", p, [b"b-%d" % i for i in range(10)])
            for _ in range(5):
                _checked_poll(c, got)
            c.resume(*tps[:4])
            while c.position(tps[5]) < 3:  # the seek below re-reads, never skips
                assert time.monotonic() < deadline
                _checked_poll(c, got)
            c.seek(tps[5], 3)
            cluster.settle()  # followers caught up: clean elections lose nothing
            for p in (1, 6):
                leader = cluster.leader("t", p)
                other = next(b for b in cluster.replicas("t", p) if b != leader)
                cluster.elect_leader("t", p, other)
            # Every record, partition 5's from offset 3 twice: wait for the positions.
            deadline = time.monotonic() + 30
            while any(c.position(tp) < 50 for tp in tps):
                assert time.monotonic() < deadline, {str(tp): c.position(tp) for tp in tps}
                _checked_poll(c, got)
            seen = {(r.partition, r.offset) for r in got}
            assert seen == {(p, o) for p in range(parts) for o in range(50)}
            metrics = c.metrics(raw=True)
            assert metrics is not None and metrics["truncations_detected"] == 0
        finally:
            c.close()


def test_no_partition_is_left_out_through_an_unclean_election() -> None:
    # "t"-0 (RF 2) diverges and is elected uncleanly; "u" (RF 3) keeps a leader on the
    # third broker while the other two go down and come back around it.
    with EmbeddedCluster(brokers=3) as cluster:
        old, new = setup_topic(cluster, kept=10)
        cluster.create_topic("u", partitions=6, replication_factor=3)
        us = [TopicPartition("u", p) for p in range(6)]
        for tp in us:
            cluster.append("u", tp.partition, [b"u-%d" % i for i in range(20)], batch_size=5)
        cluster.settle()
        t0 = TopicPartition("t", 0)
        c = make_consumer(cluster, on_truncation="rewind")
        try:
            c.assign([t0, *us])
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while c.position(t0) < 10 or any(c.position(tp) < 20 for tp in us):
                assert time.monotonic() < deadline
                _checked_poll(c, got)
            cluster.stop_broker(new)
            cluster.append("t", 0, [b"maybe-lost-%d" % i for i in range(5)], batch_size=1)
            while c.position(t0) < 15:  # read what the election will take away
                assert time.monotonic() < deadline
                _checked_poll(c, got)
            unclean_elect(cluster, old, new, fresh=8)
            for tp in us:
                cluster.append("u", tp.partition, [b"v-%d" % i for i in range(10)])
            deadline = time.monotonic() + 30
            while c.position(t0) < 18 or any(c.position(tp) < 30 for tp in us):
                assert time.monotonic() < deadline, (c.position(t0), [c.position(tp) for tp in us])
                _checked_poll(c, got)
            metrics = c.metrics(raw=True)
            assert metrics is not None and metrics["truncations_detected"] == 1
            fresh = [r.value for r in got if r.topic == "t" and r.value.startswith(b"new-")]
            assert fresh == [b"new-%d" % i for i in range(8)]
        finally:
            c.close()
