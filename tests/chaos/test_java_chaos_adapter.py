"""The Java chaos adapter maps TruncationProbe's events to the oracle's, and does what a Java
application does after each (seek to the divergence, start over, commit): checked against a
scripted probe, no JVM needed (tests/apache_kafka/test_apache_chaos.py runs the real one)."""

from __future__ import annotations

from typing import Any

import pytest

from epochguard.testing.apache_kafka.probe import ProbeError
from epochguard.testing.chaos.apache import JavaChaosClient
from epochguard.testing.chaos.oracle import Assigned, Committed, Delivered, Reported, Seeked
from epochguard.testing.chaos.runner import MemberContext

TOPIC = "t"
KEY = f"{TOPIC}-0"


class FakeProbe:
    def __init__(self, polls: list[list[dict[str, Any]]]) -> None:
        self.polls = polls
        self.calls: list[tuple[Any, ...]] = []
        self.commit_failures = 0
        self.position = 0

    def poll(self, max_records: int, timeout_ms: int) -> list[dict[str, Any]]:
        self.calls.append(("poll", max_records, timeout_ms))
        events = self.polls.pop(0) if self.polls else []
        for e in events:
            if e["event"] == "record":
                self.position = e["offset"] + 1
        return [*events, {"event": "polled", "count": 0, "outcome": "timeout"}]

    def seek(self, offset: int, leader_epoch: int | None = None) -> list[dict[str, Any]]:
        self.calls.append(("seek", offset, leader_epoch))
        self.position = offset
        return [{"event": "seeked"}]

    def seek_to_beginning(self) -> list[dict[str, Any]]:
        self.calls.append(("seek_to_beginning",))
        self.position = 0
        return [{"event": "seeked"}]

    def commit(self) -> tuple[int, int | None]:
        self.calls.append(("commit",))
        if self.commit_failures:
            self.commit_failures -= 1
            raise ProbeError("commit failed: NOT_COORDINATOR")
        return self.position, None

    def close(self) -> None:
        self.calls.append(("close",))


class FakeCluster:
    def __init__(self, probe: FakeProbe) -> None:
        self.probe = probe
        self.started: list[tuple[Any, ...]] = []

    def java_probe(
        self,
        topic: str,
        partition: int,
        reset: str,
        props: dict[str, str],
        *,
        bootstrap_servers: str | None = None,
    ) -> FakeProbe:
        self.started.append((topic, partition, reset, dict(props), bootstrap_servers))
        return self.probe


def record(offset: int, epoch: int | None, value: str | None) -> dict[str, Any]:
    return {"event": "record", "offset": offset, "leader_epoch": epoch, "value": value}


def client(polls: list[list[dict[str, Any]]]) -> tuple[JavaChaosClient, FakeProbe, list[Any]]:
    events: list[Any] = []
    ctx = MemberContext(
        bootstrap="127.0.0.1:1",
        topic=TOPIC,
        partitions=1,
        policy="raise",
        member=0,
        group_id="g",
        store_path=None,
        subscribe=False,
        emit=events.append,
        app="java",
    )
    probe = FakeProbe(polls)
    cluster = FakeCluster(probe)
    c = JavaChaosClient(ctx, cluster)  # type: ignore[arg-type]
    # No reset policy: a truncation must be an exception, and commits go to the group. The
    # probe bootstraps where every client of the run does (a fault proxy, when there is one).
    assert cluster.started == [(TOPIC, 0, "none", {"group.id": "g"}, "127.0.0.1:1")]
    return c, probe, events


def test_records_are_delivered_with_their_epochs_and_committed_after_the_poll() -> None:
    c, probe, events = client([[record(0, 0, "a"), record(1, 3, "b")], []])
    c.poll_once()
    assert events == [
        Assigned(-1, 0, -1),
        Delivered(-1, 0, 0, 0, b"a", -1),
        Delivered(-1, 0, 1, 3, b"b", -1),
        Committed(-1, 0, 2, -1),
    ]
    c.poll_once()  # nothing new: nothing to commit
    assert [x[0] for x in probe.calls] == ["poll", "commit", "poll"]


def test_a_truncation_is_reported_with_the_divergence_and_the_application_seeks_there() -> None:
    truncation = {
        "event": "truncation",
        "divergent_offsets": {KEY: {"offset": 5, "leader_epoch": 1}},
        "fetch_offsets": {KEY: 8},
        "message": "Truncated partitions detected",
    }
    c, probe, events = client([[record(7, 1, "x")], [truncation]])
    c.poll_once()
    c.poll_once()
    assert events[-2:] == [
        Reported(-1, 0, 5, 8, -1, text="Truncated partitions detected"),
        Seeked(-1, 0, 5, -1),
    ]
    assert ("seek", 5, 1) in probe.calls  # with the epoch: Java validates it again


def test_a_truncation_without_a_divergence_starts_over_from_the_beginning() -> None:
    unknown = {
        "event": "truncation",
        "divergent_offsets": {},
        "fetch_offsets": {KEY: 4},
        "message": "no divergence",
    }
    c, probe, events = client([[unknown]])
    c.poll_once()
    assert events[-2:] == [
        Reported(-1, 0, None, 4, -1, text="no divergence"),
        Seeked(-1, 0, None, -1),
    ]
    assert ("seek_to_beginning",) in probe.calls


@pytest.mark.parametrize("delivered_before", [False, True])
def test_out_of_range_counts_as_a_report_only_after_a_delivery(delivered_before: bool) -> None:
    oor = {"event": "out_of_range", "fetch_offsets": {KEY: 3}, "message": "out of range"}
    polls = [[record(0, 0, "a")]] if delivered_before else []
    c, probe, events = client([*polls, [oor]])
    for _ in range(len(polls) + 1):
        c.poll_once()
    reports = [e for e in events if isinstance(e, Reported)]
    assert reports == (
        [Reported(-1, 0, None, None, -1, text="out of range")] if delivered_before else []
    )
    assert events[-1] == Seeked(-1, 0, None, -1)
    assert probe.calls.count(("seek_to_beginning",)) == 1


def test_no_commit_yet_starts_at_the_beginning_without_a_report() -> None:
    no_offset = {"event": "error", "type": "NoOffsetForPartitionException", "message": "none"}
    c, probe, events = client([[no_offset]])
    c.poll_once()
    assert events == [Assigned(-1, 0, -1)]
    assert ("seek_to_beginning",) in probe.calls


def test_a_refused_commit_is_tried_again_after_the_next_poll() -> None:
    c, probe, events = client([[record(0, 0, "a")], []])
    probe.commit_failures = 1
    c.poll_once()
    assert not [e for e in events if isinstance(e, Committed)]
    c.poll_once()
    assert [e for e in events if isinstance(e, Committed)] == [Committed(-1, 0, 1, -1)]
    c.close()
    assert probe.calls[-1] == ("close",)
