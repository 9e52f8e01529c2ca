"""A partition without a leader whose replicas are all down, decided on fed answers and
``now`` (no broker): metadata is not asked again on the trackers' backoff while no answer
can name a leader; the replicas' addresses are tried with connections (no request), and the
refresh goes the moment one accepts, then backs off from ``retry_backoff_ms`` again.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace as NS
from typing import Any

import pytest
from kafka.errors import KafkaConnectionError
from kafka.future import Future
from kafka.structs import TopicPartition

from epochguard.consumer import wire
from epochguard.consumer.config import build_config
from epochguard.consumer.fetcher import Fetcher
from epochguard.consumer.metadata import ACCEPTED_UNTRUSTED, DARK_REFRESH_S, Metadata
from epochguard.offsets.policy import OffsetPolicy
from epochguard.offsets.state import PartitionState

TP = TopicPartition("t", 0)


def _answer(
    leader: int | None,
    replicas: list[int],
    offline: list[int],
    brokers: list[int],
    epoch: int = 3,
) -> wire.MetadataAnswer:
    partition = NS(
        partition_index=0,
        leader_id=-1 if leader is None else leader,
        leader_epoch=epoch,
        replica_nodes=replicas,
        isr_nodes=[],
        offline_replicas=offline,
        error_code=0 if leader is not None else 5,
    )
    topic = NS(name="t", error_code=0, topic_id=None, is_internal=False, partitions=[partition])
    nodes = [NS(node_id=b, host="h", port=9000 + b, rack=None) for b in brokers]
    return wire.read_metadata(NS(topics=[topic], brokers=nodes))


def _md(**config: Any) -> Metadata:
    md = Metadata(build_config(config))
    md.topics.add("t")
    return md


def _ask(md: Metadata, now: float) -> bool:
    """Whether a request is due at ``now`` (and marks it sent)."""
    return md.due(now) is not None


def _back(md: Metadata, node: int, at: float) -> bool:
    """``node`` refused a connection, then accepted one at ``at``: it is back."""
    md.probes_due(at - 0.05)
    md.on_probe(node, at - 0.05, reachable=False, refused=True)
    md.probes_due(at)
    return md.on_probe(node, at, reachable=True)


def _dark(md: Metadata, now: float = 10.0) -> Metadata:
    """The leader stopped: answers name it, then no leader with every replica offline."""
    assert _ask(md, now - 2)
    md.on_answer(_answer(0, [0, 1], [], [0, 1, 2]), now - 2, ["t"], now - 2)
    md.request(leader_for=TP)
    assert _ask(md, now - 1)
    md.on_answer(_answer(None, [0, 1], [0, 1], [2]), now - 1, ["t"], now)
    return md


def test_waiting_for_a_leader_while_every_replica_is_down_asks_nothing() -> None:
    md = _dark(_md())
    for t in (10.1, 10.5, 11.0, 12.0, 13.9):
        md.request(leader_for=TP, any_answer=True)  # the tracker's backoff steps
        assert not _ask(md, t)


def test_a_dark_partition_is_still_asked_about_every_few_seconds() -> None:
    """A broker may come back where the probes do not look (a new address): an answer, at
    DARK_REFRESH_S after the last one, is the only way to learn it."""
    md = _dark(_md())  # the last answer was to a request sent at 9.0
    assert md.wake_at(10.0, 99.0) <= 9.0 + DARK_REFRESH_S
    assert not _ask(md, 9.0 + DARK_REFRESH_S - 0.1)
    assert _ask(md, 9.0 + DARK_REFRESH_S)
    md.on_answer(_answer(None, [0, 1], [0, 1], [2]), 14.0, ["t"], 14.01)
    assert not _ask(md, 18.9)
    assert _ask(md, 19.0)


def test_the_replicas_are_tried_every_reconnect_backoff_while_they_refuse() -> None:
    md = _dark(_md(reconnect_backoff_ms=50))
    assert md.probes_due(10.0) == [0, 1]
    assert md.probes_due(10.0) == []  # in flight
    md.on_probe(0, 10.001, reachable=False, refused=True)
    md.on_probe(1, 10.001, reachable=False, refused=True)
    assert md.probes_due(10.03) == []
    assert md.wake_at(10.03, 99.0) == 10.051
    assert md.probes_due(10.06) == [0, 1]


def test_a_replica_accepting_a_connection_sends_the_refresh_at_once() -> None:
    md = _dark(_md())
    md.probes_due(10.0)
    md.on_probe(0, 10.001, reachable=False, refused=True)
    assert _back(md, 1, 10.4)
    assert md.wake_at(10.4, 99.0) <= 10.41
    assert _ask(md, 10.4)


def test_after_a_short_outage_the_backoff_starts_over_at_the_return() -> None:
    # Dark for less than retry_backoff_max_ms: nothing was held back. The backoff starts
    # over at the return (100, 200, 400, 800 ms), then the trackers' own (1 s) asks.
    md = _dark(_md(retry_backoff_ms=100))
    gaps = _revival_gaps(md, 10.4, 5)
    assert gaps == pytest.approx([0.1, 0.2, 0.4, 0.8], abs=0.0015)
    assert not _ask(md, 13.0)
    md.request(leader_for=TP, any_answer=True)  # the tracker's next backoff step
    assert _ask(md, 13.0)


def _revival_gaps(md: Metadata, back_at: float, n: int) -> list[float]:
    assert _back(md, 1, back_at)
    sent = []
    t = back_at
    for _ in range(n):
        while not _ask(md, t):
            t = round(t + 0.001, 3)
        sent.append(t)
        md.on_answer(_answer(None, [0, 1], [0], [1, 2]), t, ["t"], t)
    return [round(b - a, 3) for a, b in itertools.pairwise(sent)]


def test_the_refreshes_not_sent_while_dark_are_sent_every_retry_backoff_when_it_is_back() -> None:
    # Dark for 5.5 s: the trackers' backoff (at most retry_backoff_max_ms, 1 s, apart)
    # would have asked five times; those five go 100 ms apart after the one at the return,
    # then the backoff starts over.
    md = _dark(_md(retry_backoff_ms=100))
    gaps = _revival_gaps(md, 15.5, 10)
    assert gaps == pytest.approx([0.1] * 6 + [0.2, 0.4, 0.8], abs=0.0015)
    assert not _ask(md, 19.0)  # spent: the trackers' backoff asks from here on
    md.request(leader_for=TP, any_answer=True)
    assert _ask(md, 19.0)


def test_the_refreshes_every_retry_backoff_last_less_than_retry_backoff_max() -> None:
    md = _dark(_md(retry_backoff_ms=100))
    gaps = _revival_gaps(md, 100.0, 14)
    assert gaps == pytest.approx([0.1] * 10 + [0.2, 0.4, 0.8], abs=0.0015)
    assert not _ask(md, 105.0)


def test_an_answer_naming_a_leader_ends_the_watch() -> None:
    md = _dark(_md())
    assert _back(md, 1, 10.4)
    assert _ask(md, 10.4)
    md.on_answer(_answer(1, [0, 1], [0], [1, 2], epoch=4), 10.4, ["t"], 10.41)
    assert md.leader_of(TP) == 1
    assert md.probes_due(11.0) == []
    assert not _ask(md, 11.0)  # nothing needed, and within metadata_max_age_ms


def test_a_replica_still_shutting_down_is_not_back_until_it_refused() -> None:
    # The others stop listing a broker in controlled shutdown while it still listens: a
    # connection it accepts then is no return. It is tried again, backing off, until it
    # refuses; the next connection it accepts is its return.
    md = _dark(_md(reconnect_backoff_ms=50))
    assert md.probes_due(10.0) == [0, 1]
    assert not md.on_probe(0, 10.0, reachable=True)
    md.on_probe(1, 10.0, reachable=False, refused=True)
    assert md.probes_due(10.06) == [1]  # node 0: after 100 ms, not 50
    md.on_probe(1, 10.06, reachable=False, refused=True)
    assert md.probes_due(10.1) == [0]
    assert not md.on_probe(0, 10.1, reachable=True)
    assert md.wake_at(10.1, 99.0) == pytest.approx(10.11)  # node 1's next try
    assert md.probes_due(10.25) == [1]
    assert md.probes_due(10.3) == [0]  # 200 ms after the second accept
    md.on_probe(0, 10.3, reachable=False, refused=True)  # it stopped
    assert not _ask(md, 10.3)
    assert _back(md, 0, 12.0)
    assert _ask(md, 12.0)


@pytest.mark.parametrize("returns", [False, True], ids=["proxy", "back-already"])
def test_a_replica_accepting_every_connection_is_left_to_the_trackers_backoff(
    returns: bool,
) -> None:
    # Behind a TCP proxy or load balancer every connection is accepted, whether the broker
    # is down or back; a broker restarted before the answer that called it offline accepts
    # them too. Neither ever refuses: after ACCEPTED_UNTRUSTED in a row the partition is
    # asked for at once, then on the trackers' backoff, not at the dark refresh.
    md = _dark(_md(reconnect_backoff_ms=50))
    t = 10.0
    for _ in range(ACCEPTED_UNTRUSTED):
        while not (due := md.probes_due(t)):
            t = round(t + 0.001, 3)
        assert due == [0, 1]
        for node in due:
            assert not md.on_probe(node, t, reachable=True)
    assert t < 10.5
    assert md.wake_at(t, 99.0) <= t + 0.11  # not DARK_REFRESH_S after the last answer
    assert _ask(md, round(t + 0.1, 3))
    assert md.probes_due(t + 0.2) == []
    if returns:
        md.on_answer(_answer(1, [0, 1], [0], [1, 2], epoch=4), t + 0.1, ["t"], t + 0.11)
        assert md.leader_of(TP) == 1
        return
    md.on_answer(_answer(None, [0, 1], [0, 1], [2]), t + 0.1, ["t"], t + 0.11)
    assert md.probes_due(t + 0.3) == []  # not dark again
    md.request(leader_for=TP, any_answer=True)  # the tracker's next backoff step
    assert _ask(md, round(t + 0.3, 3))


def test_a_replica_not_refusing_is_left_to_the_trackers_backoff() -> None:
    # A timeout says nothing about the broker (the host may be down or cut off): its
    # partitions are asked for on the trackers' backoff, as without the watch.
    md = _dark(_md())
    md.probes_due(10.0)
    md.on_probe(0, 10.5, reachable=False, refused=False)
    md.request(leader_for=TP, any_answer=True)
    assert _ask(md, 10.6)
    md.on_answer(_answer(None, [0, 1], [0, 1], [2]), 10.6, ["t"], 10.61)
    md.request(leader_for=TP, any_answer=True)
    assert _ask(md, 10.8)
    assert md.probes_due(11.0) == []


def test_a_replica_accepting_connections_while_still_offline_is_not_trusted_again() -> None:
    # A broker listens a little before the others list it: the answers right after the
    # return may still call it offline, and the watch goes on. One that stays offline
    # while it accepts connections is left to the trackers' backoff, without probes.
    md = _dark(_md())
    still_offline = _answer(None, [0, 1], [0, 1], [2])
    assert _back(md, 0, 10.4)
    sent = []
    t = 10.4
    for _ in range(5):
        while not _ask(md, t):
            t = round(t + 0.001, 3)
        sent.append(t)
        md.on_answer(still_offline, t, ["t"], t)
    assert [round(b - a, 3) for a, b in itertools.pairwise(sent)] == [0.1, 0.2, 0.4, 0.8]
    assert not _ask(md, 13.0)
    md.request(leader_for=TP, any_answer=True)
    assert _ask(md, 13.0)
    md.on_answer(still_offline, 13.0, ["t"], 13.0)
    assert md.probes_due(13.1) == []  # not dark again: the tracker's backoff asks
    md.request(leader_for=TP, any_answer=True)
    assert _ask(md, 13.2)


def test_an_answer_to_a_request_sent_before_the_replica_was_back_is_asked_again() -> None:
    md = _dark(_md())
    md.request()  # another partition's refresh: on its way when the replica is back
    assert _ask(md, 10.1)
    assert _back(md, 1, 10.2)
    assert not _ask(md, 10.2)  # one request at a time
    md.on_answer(_answer(None, [0, 1], [0, 1], [2]), 10.1, ["t"], 10.25)
    assert md.probes_due(10.3) == []
    assert _ask(md, 10.25)


def test_a_replica_at_an_address_never_seen_is_not_watched() -> None:
    md = _md()
    md.request(leader_for=TP)
    assert _ask(md, 1.0)
    md.on_answer(_answer(None, [0, 1], [0, 1], [2]), 1.0, ["t"], 1.01)
    assert md.probes_due(1.1) == []
    md.request(leader_for=TP, any_answer=True)
    assert _ask(md, 1.2)


def test_a_partition_given_up_stops_the_probes() -> None:
    md = _dark(_md())
    assert md.probes_due(10.0) == [0, 1]
    md.forget([TP])
    md.on_probe(0, 10.01, reachable=False, refused=True)
    assert md.probes_due(11.0) == []
    assert md.wake_at(11.0, 99.0) == 99.0


# ------------------------------------------- the leader's connection lost: probes first


def _lost(md: Metadata, now: float = 100.0, leader: int = 0) -> Metadata:
    """The last answer (at 10.0) named broker 0 the leader of replicas 0 and 1, both live;
    a request to broker 0 failed with its connection at ``now``."""
    assert _ask(md, 10.0)
    md.on_answer(_answer(0, [0, 1], [], [0, 1, 2]), 10.0, ["t"], 10.0)
    md.request(any_answer=True, lost_leader=(TP, leader, now))
    return md


def test_a_lost_leader_connection_asks_nothing_while_every_replica_refuses() -> None:
    md = _lost(_md(reconnect_backoff_ms=50))
    assert not _ask(md, 100.0)
    assert md.probes_due(100.0) == [0, 1]
    md.on_probe(0, 100.001, reachable=False, refused=True)
    md.on_probe(1, 100.001, reachable=False, refused=True)
    for t in (100.1, 101.0, 103.0, 104.9):
        md.request(any_answer=True, lost_leader=(TP, 0, t))  # the tracker's retries
        assert not _ask(md, t)
        for node in md.probes_due(t):
            md.on_probe(node, t, reachable=False, refused=True)
    assert _back(md, 1, 104.95)
    assert _ask(md, 104.95)


def test_the_dark_refresh_counts_from_the_lost_connection_not_the_last_answer() -> None:
    md = _lost(_md())
    assert md.wake_at(100.0, 999.0) <= 100.005  # the probes, at once
    assert not _ask(md, 104.9)
    assert _ask(md, 100.0 + DARK_REFRESH_S)


@pytest.mark.parametrize("node", [0, 1], ids=["the-leader", "the-follower"])
def test_a_replica_accepting_after_a_lost_leader_connection_sends_the_refresh_at_once(
    node: int,
) -> None:
    # The leader may still run (the connection was cut on the way), or another replica
    # may lead by now: only an answer says, and it is asked for at once.
    md = _lost(_md())
    assert md.probes_due(100.0) == [0, 1]
    md.on_probe(1 - node, 100.001, reachable=False, refused=True)
    assert not _ask(md, 100.001)
    assert not md.on_probe(node, 100.002, reachable=True)
    assert _ask(md, 100.002)
    assert md.probes_due(100.5) == []
    md.on_answer(_answer(node, [0, 1], [], [0, 1, 2], epoch=4), 100.002, ["t"], 100.01)
    assert md.leader_of(TP) == node
    assert md.probes_due(101.0) == []


def test_a_probe_failing_otherwise_after_a_lost_leader_connection_sends_the_refresh() -> None:
    md = _lost(_md())
    md.probes_due(100.0)
    md.on_probe(1, 100.001, reachable=False, refused=True)
    md.on_probe(0, 110.0, reachable=False, refused=False)  # a timeout
    assert _ask(md, 110.0)


def test_a_lost_connection_to_a_broker_the_answers_do_not_call_leader_asks_at_once() -> None:
    md = _lost(_md(), leader=1)
    assert _ask(md, 100.0)
    assert md.probes_due(100.0) == []


def test_an_answer_after_a_lost_leader_connection_decides_from_there() -> None:
    # Asked for another reason meanwhile: an answer naming no leader with every replica
    # offline keeps the partition dark as any such answer does (probes, no refreshes).
    md = _lost(_md())
    md.request()
    assert _ask(md, 100.0)
    md.on_answer(_answer(None, [0, 1], [0, 1], [2]), 100.0, ["t"], 100.01)
    assert md.probes_due(100.01) == [0, 1]
    md.on_probe(0, 100.02, reachable=True)  # still shutting down: not a return
    assert not _ask(md, 100.02)


# ------------------------------------------------------------------ through the fetcher


class _Client:
    """Answers nothing by itself: the test completes the futures."""

    rebootstraps = 0

    def __init__(self) -> None:
        self.metadata: list[Future] = []
        self.probes: list[tuple[int, Future]] = []
        self.sent: list[tuple[int, Future]] = []

    def send_metadata(self, request: Any) -> Future:
        fut = Future()
        self.metadata.append(fut)
        return fut

    def probe(self, node: int) -> Future:
        fut = Future()
        self.probes.append((node, fut))
        return fut

    def send(self, node: int, request: Any, timeout_ms: float | None = None) -> Future:
        fut = Future()
        self.sent.append((node, fut))
        return fut


def _wire_answer(leader: int | None, offline: list[int], brokers: list[int]) -> Any:
    partition = NS(
        partition_index=0,
        leader_id=-1 if leader is None else leader,
        leader_epoch={0: 4, None: 5, 1: 6}[leader],
        replica_nodes=[0, 1],
        isr_nodes=[],
        offline_replicas=offline,
        error_code=0,
    )
    topic = NS(name="t", error_code=0, topic_id=None, is_internal=False, partitions=[partition])
    return NS(
        topics=[topic],
        brokers=[NS(node_id=b, host="h", port=9000 + b, rack=None) for b in brokers],
        error_code=0,
    )


def _fetcher_led_by_0(mocker: Any) -> tuple[list[float], _Client, Fetcher, Any]:
    """A Fetcher on a test clock reading ``TP`` from offset 5, whose first answer named
    broker 0 the leader: the clock, the client, the fetcher and the tracker."""
    clock = [100.0]
    mocker.patch("epochguard.consumer.fetcher.time.monotonic", lambda: clock[0])
    client = _Client()
    f = Fetcher(client, build_config({}), OffsetPolicy("earliest"), None, None, lambda e: None)  # type: ignore[arg-type]
    tracker = f.add_partition(TP)
    tracker.seek(5)
    f.send_requests(clock[0])
    client.metadata.pop().success(_wire_answer(0, [], [0, 1, 2]))
    f.process_completions()
    return clock, client, f, tracker


def _broker_1_back(clock: list[float], client: _Client, f: Fetcher, asked: int) -> None:
    """Both replicas are tried; broker 1 accepts: one Metadata request goes, and its answer
    names broker 1 the leader."""
    clock[0] += 0.1
    f.send_requests(clock[0])
    assert {node for node, _ in client.probes} == {0, 1}
    client.probes[1][1].success(True)
    f.process_completions()
    f.send_requests(clock[0])
    assert f.metrics.metadata_requests == asked + 1
    client.metadata.pop().success(_wire_answer(1, [0], [1, 2]))
    f.process_completions()


def test_the_fetcher_probes_the_replicas_and_asks_metadata_when_one_is_back(mocker: Any) -> None:
    clock, client, f, tracker = _fetcher_led_by_0(mocker)
    assert tracker.leader_id == 0
    # the leader is gone: the next answer names no leader, both replicas offline
    f.request_metadata()
    for _ in range(40):  # four seconds of the trackers' backoff
        clock[0] += 0.1
        f.send_requests(clock[0])
        if client.metadata:
            client.metadata.pop().success(_wire_answer(None, [0, 1], [2]))
            f.process_completions()
        for _node, fut in client.probes:
            fut.failure(KafkaConnectionError("111 ECONNREFUSED"))
        client.probes.clear()
        f.process_completions()
    asked = f.metrics.metadata_requests
    assert asked <= 3  # the first answers; none while both replicas refuse
    _broker_1_back(clock, client, f, asked)
    assert f.metrics.replicas_back == 1
    assert tracker.leader_id == 1
    assert tracker.state is PartitionState.FETCHING


def test_the_fetcher_asks_no_metadata_while_the_lost_leaders_replicas_refuse(mocker: Any) -> None:
    """The leader stops while the partition's other replica is down: the long poll fails
    with its connection, both replicas refuse connections, and no Metadata request goes
    until one accepts; its answer names the new leader."""
    clock, client, f, tracker = _fetcher_led_by_0(mocker)
    asked = f.metrics.metadata_requests
    for _ in range(30):  # three seconds: the fetches to broker 0 fail, the probes refused
        clock[0] += 0.1
        f.send_requests(clock[0])
        for node, fut in client.sent:
            assert node == 0
            fut.failure(KafkaConnectionError("connection lost"))
        client.sent.clear()
        f.process_completions()
        f.send_requests(clock[0])
        for _node, fut in client.probes:
            fut.failure(KafkaConnectionError("111 ECONNREFUSED"))
        client.probes.clear()
        f.process_completions()
    assert f.metrics.metadata_requests == asked
    assert tracker.leader_id == 0
    _broker_1_back(clock, client, f, asked)
    assert tracker.leader_id == 1
