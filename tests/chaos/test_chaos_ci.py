"""The CI set: 300 fixed chaos schedules against EpochConsumer, judged by the oracle.

250 schedules drawn whole from seeds 0..249 (partitions, a consumer group or a single
consumer committing to its group or a SqliteOffsetStore, policy, every kind of fault) and 50
without unclean elections or topic re-creation (seeds 5000..5049), which must bring no report
at all. Six runs at a time, each on its own EmbeddedCluster; a run that failed only by
finishing late on a loaded machine runs again on its own (tests/chaos/late.py). A failure is
shrunk and printed as code that replays it. Larger runs: ``make chaos SEEDS=N FIRST=K``
(docs/guides/testing.md); figures in docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import pytest

from epochguard.testing.chaos import RunResult, Schedule, generate, run_schedule
from epochguard.testing.chaos.clients import aio_epoch_consumer, epoch_consumer
from epochguard.testing.chaos.oracle import Reported
from epochguard.testing.chaos.runner import MemberContext, run_many
from epochguard.testing.chaos.schedule import (
    Elect,
    Idle,
    MetadataDelay,
    PauseReplication,
    Produce,
    RecreateTopic,
    RestartConsumer,
    StartBroker,
    StopBroker,
)
from epochguard.testing.chaos.shrink import shrink

from .late import run_settled, settled

pytestmark = [pytest.mark.independent, pytest.mark.slow, pytest.mark.timeout(400)]

WORKERS = 6
CHUNK = 50


def _all_ok(results: Iterable[RunResult]) -> None:
    """Fail with every failed run's whole description (an assertion's would be cut short)."""
    bad = [r for r in results if not r.ok]
    if bad:
        pytest.fail("\n\n".join(r.describe() for r in bad), pytrace=False)


def _fail_with_replay(results: Iterable[RunResult], clients: Any = None) -> None:
    bad = sorted((r for r in results if not r.ok), key=lambda r: r.schedule.seed)
    if not bad:
        return
    first = bad[0]
    small, runs = shrink(
        first.schedule, lambda s: not run_schedule(s, clients).verdict.ok, max_runs=40
    )
    pytest.fail(
        f"{len(bad)} schedule(s) failed (seeds {[r.schedule.seed for r in bad]}); the first:\n"
        f"{first.describe()}\nshrunk in {runs} runs to {len(small.steps)} steps, replay:\n"
        f"{small.to_code()}",
        pytrace=False,
    )


# Schedules of the set that fail for a reason still open (docs/reliability.md, "What the
# chaos runs found"); each runs below, and may fail only in the known way.
#: Schedules that failed in the 5,000-schedule run: a consumer restarted from a group commit
#: whose epoch the new leader never had. The leader answers an older epoch ending above the
#: records the application read in the committed epoch, so Java's rule reports a divergence
#: that is only an upper bound and records below it, replaced too, went unreported. The
#: commit now carries whether its epoch is exact (consumer/group.py, provenance metadata),
#: and the restored consumer reports the divergence as unknown.
RESTORED_EXACT_COMMITS = (92, 685, 867, 1199, 2039, 2277, 2354, 3570, 4483, 4647)


#: Seed 72 failed the CI set in sessions 4 and 5 (about one run in fifty): a group member
#: handed a partition back took the answer to its former tracker's OffsetForLeaderEpoch as
#: its own and reported a truncation that never happened. Tracker tokens are unique in the
#: process since; it runs here with the rest again, and on its own below, many times over.
HANDED_BACK_PARTITION = 72


@pytest.mark.parametrize("first", range(0, 250, CHUNK))
def test_chaos_schedules(first: int) -> None:
    left_out = RESTORED_EXACT_COMMITS
    seeds = [s for s in range(first, first + CHUNK) if s not in left_out]
    results = settled(run_many(map(generate, seeds), workers=WORKERS))
    assert len(results) == len(seeds)
    _fail_with_replay(results)
    assert all(r.verdict.delivered > 0 for r in results)
    # The set must stage real truncations, not only pass: most chunks see several.
    assert sum(r.verdict.reports for r in results) > 0


def test_a_partition_handed_back_takes_no_answer_meant_for_its_former_tracker() -> None:
    results = settled(run_many([generate(HANDED_BACK_PARTITION)] * 12, workers=WORKERS))
    _fail_with_replay(results)


#: Seed 4392 (an offset store; the topic re-created twice, broker 2's metadata 0.5 s late):
#: the consumer restarted after the second re-creation from a stored position of the new
#: incarnation, and metadata from the lagging broker named the deleted topic's id. Taken for
#: a newer incarnation, it made the consumer report a re-creation of records that were there,
#: in about one run in two, until a topic id was judged by which one a leader serves.
RESTART_BEHIND_LAGGING_METADATA = 4392


def test_a_restart_hearing_a_deleted_topic_s_id_from_a_broker_behind_reports_nothing() -> None:
    schedule = generate(RESTART_BEHIND_LAGGING_METADATA)
    assert schedule.offsets == "store"
    assert any(isinstance(step, MetadataDelay) and step.seconds > 0 for step in schedule.steps)
    results = settled(run_many([schedule] * 6, workers=WORKERS))
    _fail_with_replay(results)


#: Consumer groups through topic re-creation (``generate(group_recreate=True)``): the first
#: 30 seeds from 20000 on whose schedule is a group that sees the topic re-created. Groups
#: were kept apart from re-creation because seed 72 gave a spurious report there; that was
#: the handed-back partition above. 200 such schedules passed before this set was added.
GROUP_RECREATE_FIRST_SEED = 20_000


def _group_recreate_schedules(count: int) -> list[Schedule]:
    out: list[Schedule] = []
    seed = GROUP_RECREATE_FIRST_SEED
    while len(out) < count:
        s = generate(seed, group_recreate=True)
        if s.members > 1 and any(isinstance(step, RecreateTopic) for step in s.steps):
            out.append(s)
        seed += 1
    return out


def test_consumer_groups_through_topic_re_creation() -> None:
    results = settled(run_many(_group_recreate_schedules(30), workers=WORKERS))
    _fail_with_replay(results)
    assert sum(r.verdict.reports for r in results) > 0


#: Network faults mixed with elections, retention and re-creation
#: (``generate(network=True)``, every consumer connecting through the fault proxy): the
#: first 24 seeds from 30000 on whose schedule has a network fault. Together they draw
#: every kind of network fault several times.
NETWORK_FIRST_SEED = 30_000


def _network_schedules(count: int) -> list[Schedule]:
    out: list[Schedule] = []
    seed = NETWORK_FIRST_SEED
    while len(out) < count:
        s = generate(seed, network=True)
        if s.network:
            out.append(s)
        seed += 1
    return out


def test_chaos_schedules_with_network_faults() -> None:
    results = settled(run_many(_network_schedules(24), workers=WORKERS))
    _fail_with_replay(results)
    assert all(r.verdict.delivered > 0 for r in results)
    assert sum(r.verdict.reports for r in results) > 0


def _unplaced_restores(results: Iterable[RunResult]) -> int:
    """Reports of a restored consumer that could not say where its log diverged."""
    return sum(
        1
        for r in results
        for ev in r.history.events
        if isinstance(ev, Reported) and ev.divergence is None and ev.text == "restore"
    )


def test_restarts_from_exact_commits_report_what_they_cannot_place() -> None:
    results = settled(run_many(map(generate, RESTORED_EXACT_COMMITS), workers=WORKERS))
    _fail_with_replay(results)
    # The shape the set is for (a restart from a commit whose epoch the new leader never
    # had) depends on timing: about half the runs stage it. At least some must, reported
    # as unknown; a set that staged none runs once more.
    if _unplaced_restores(results) == 0:
        again = settled(run_many(map(generate, RESTORED_EXACT_COMMITS), workers=WORKERS))
        _fail_with_replay(again)
        results += again
    assert _unplaced_restores(results) > 0, "no restart from an exact commit was staged"


def test_chaos_schedules_without_unclean_elections_report_nothing() -> None:
    schedules = [generate(seed, unclean=False) for seed in range(5000, 5000 + CHUNK)]
    first = list(run_many(schedules, workers=WORKERS))
    results = settled(first)
    _fail_with_replay(results)
    # A report counts against the consumer even in a run that finished late and ran again.
    reported = sorted({r.schedule.seed for r in first + results if r.verdict.reports})
    assert not reported, f"reports without an unclean election: seeds {reported}"


# Shrunk from seed 1 of the first CI set: the coordinator (broker 2) restarts with late
# metadata, and the restarted consumer must resume at its commit (the EmbeddedCluster
# answered "no commit" then, and the consumer re-read from the log start).
RESTART_BEHIND_A_LATE_COORDINATOR = Schedule(
    1,
    (
        Produce(0, 5, 1),
        MetadataDelay(1, 0.5),
        StopBroker(4),
        StartBroker(0),
        RestartConsumer(1),
    ),
    partitions=1,
)


def test_a_restart_behind_a_coordinator_with_late_metadata_resumes_at_the_commit() -> None:
    result = run_settled(RESTART_BEHIND_A_LATE_COORDINATOR)
    assert result.verdict.ok, result.describe()
    # 5 records and the end marker, some twice when the commit was refused before the restart
    assert result.verdict.delivered >= 6


# Shrunk from network-chaos seed 100339 (it needs no network fault): the group coordinator
# moves to broker 2, which restarted with late metadata and answers the restarting
# consumer's commit with UNKNOWN_TOPIC_OR_PARTITION. A commit that gives up there leaves no
# trace of the records read, and the unclean election that follows drops them unreported;
# commit() asks again until its timeout, as Java's commitSync does. The schedule failed about
# one run in two before, so it runs several times.
COMMIT_TO_A_COORDINATOR_WITH_LATE_METADATA = Schedule(
    seed=100339,
    steps=(
        StopBroker(1),
        MetadataDelay(1, 0.2),
        StartBroker(5),
        Produce(1, 2, 1),
        RestartConsumer(0),
        Elect(1, True, 5),
    ),
    partitions=2,
    policy="rewind",
    members=1,
    offsets="group",
)


def test_a_commit_refused_by_a_coordinator_with_late_metadata_is_asked_again() -> None:
    schedules = [COMMIT_TO_A_COORDINATOR_WITH_LATE_METADATA] * 5
    results = settled(run_many(schedules, workers=3))
    _all_ok(results)


# A known truncation: both followers lag, the leader alone takes 3 records that the consumer
# reads, a stale follower is elected uncleanly and takes 2 new ones.
KNOWN = Schedule(
    1,
    (
        Produce(0, 5, 5),
        Idle(0.3),
        PauseReplication(0, 0),
        PauseReplication(0, 1),
        Produce(0, 3, 1),
        Idle(0.5),
        Elect(0, True, 0),
        Produce(0, 2, 1),
    ),
    partitions=1,
)


def test_a_known_truncation_is_reported_and_a_deaf_client_is_caught() -> None:
    result = run_settled(KNOWN)
    assert result.verdict.ok, result.describe()
    assert result.verdict.reports >= 1

    def deaf(ctx: MemberContext) -> object:
        """EpochConsumer whose application never hears of truncations."""

        def emit(ev: object) -> None:
            if not isinstance(ev, Reported):
                ctx.emit(ev)

        return epoch_consumer(attrs.evolve(ctx, emit=emit))

    caught = run_schedule(KNOWN, deaf)  # type: ignore[arg-type]
    assert caught.verdict.silent_rereads + caught.verdict.silent_losses >= 1, caught.describe()


def test_chaos_schedules_with_the_asyncio_consumer() -> None:
    """The same oracle over AIOEpochConsumer (the engine's asyncio driver): 50 schedules of
    the CI set (seeds 250..299, not in the threaded consumer's set above)."""
    seeds = range(250, 300)
    clients = {"aio": aio_epoch_consumer}
    results = settled(run_many(map(generate, seeds), clients, workers=WORKERS), clients)
    assert len(results) == len(seeds)
    _fail_with_replay(results, clients)
    assert all(r.verdict.delivered > 0 for r in results)


def test_a_commit_before_a_blackholed_coordinator_lands() -> None:
    """Network-chaos seed 102203: the consumer reads and commits four records (p1 6..9), the
    coordinator's broker is blackholed (its connections reset) 30 ms after they were
    written, the consumer restarts and an unclean election drops the four records. A commit
    that waited behind the long-poll Fetch on the coordinator's connection was cut by the
    reset in about two runs in three, and the restart resumed before the four records with
    nothing to report. Coordinator requests go on a connection of their own, so the commit
    lands first and the restarted consumer reports the four gone; a run whose commit the
    machine's load still left behind the reset is judged by the oracle (what was delivered
    past the last acknowledged commit is the old session's alone). The report must come in
    at least three runs of five: with the commit on the fetch connection it came in two of
    nine, with it on its own in about 98 of 100 (under the load of eight runs at once)."""
    clients = {"aio": aio_epoch_consumer}
    schedules = [generate(102203, network=True)] * 5
    results = settled(run_many(schedules, clients, workers=3), clients)
    _all_ok(results)
    reported = [
        r
        for r in results
        if any(
            isinstance(e, Reported) and e.partition == 1 and e.consumed_to == 10
            for e in r.history.events
        )
    ]
    assert len(reported) >= 3, (
        f"the commit of p1 6..9 landed before the coordinator's reset in {len(reported)} runs of 5"
    )
