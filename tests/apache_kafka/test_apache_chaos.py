"""One real-Kafka chaos schedule with EpochConsumer and the Java reference consumer side by
side (``epochguard.testing.chaos.apache``): the runner, its log reader and the Java adapter
work; the 30-schedule scoreboard is ``make chaos-apache`` (docs/reliability.md)."""

from __future__ import annotations

import pytest

from epochguard.testing.apache_kafka import ApacheKafkaCluster
from epochguard.testing.chaos.apache import run_apache_schedule, verdicts
from epochguard.testing.chaos.oracle import Delivered, Reported, Seeked
from epochguard.testing.chaos.schedule import (
    DeleteRecords,
    Elect,
    Produce,
    RestartConsumer,
    Schedule,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

SCHEDULE = Schedule(
    seed=90001,
    partitions=1,
    policy="raise",
    steps=(
        Produce(0, 4),
        Elect(0, False, 0),  # a clean move: nothing lost, nothing to report
        Produce(0, 3),
        Elect(0, True, 1),  # 1-2 records on the old leader only, then the unclean election
        Produce(0, 3),  # refills the diverged offsets under the new epoch
        RestartConsumer(0),  # from the commits, which may lie past the divergence
        # The old leader comes back by an unclean election, its lost records still in its
        # log where the consumers read the refill: a leader that never had the epoch they
        # read answers an older one (Java lost records to this in seeds 2 and 54).
        Elect(0, True, 0),
        Produce(0, 2),
        DeleteRecords(0, 0.25),
        Produce(0, 2),
    ),
)


def test_one_schedule_with_an_unclean_election_side_by_side(
    cluster: ApacheKafkaCluster,
) -> None:
    result = run_apache_schedule(SCHEDULE, cluster)
    log = "\n".join(result.step_log)
    assert "written to the old leader only" in result.step_log[3], log
    assert "written to the old leader only" in result.step_log[6], log
    vs = verdicts(result, ("epochguard", "java"))
    # The project's promise, on real brokers.
    assert vs["epochguard"].ok, f"{vs['epochguard'].describe()}\n{log}"

    # The final log as read back: contiguous from the log start, every record with the epoch
    # of its batch, and the unclean epoch's refill in it.
    (final,) = result.history.final.values()
    offsets = sorted(final.records)
    assert offsets == list(range(final.log_start, final.log_start + len(offsets))), final
    epochs = [final.records[o][0] for o in offsets]
    assert epochs == sorted(epochs) and epochs[-1] > epochs[0], epochs
    assert final.records[offsets[-1]][1] == b"end:%d:0" % SCHEDULE.seed
    assert final.log_start > 0  # DeleteRecords moved it
    # Every step left a snapshot (a leader then), plus the one before the first step and the
    # one after the end marker.
    assert len(result.history.snapshots) == len(SCHEDULE.steps) + 2
    assert all(s.get(0) is not None for s in result.history.snapshots)

    # The Java adapter works: records with their epochs, the end marker reached, and each
    # LogTruncationException mapped to a report followed by the application's seek to the
    # divergence it named. What Java lost is the scoreboard's business (it does lose records
    # in this schedule when it read the refill before the old leader came back).
    java = [e for e in result.history.events if e.app == "java"]
    delivered = [e for e in java if isinstance(e, Delivered)]
    assert delivered and all(e.epoch is not None for e in delivered)
    assert b"end:%d:0" % SCHEDULE.seed in {e.value for e in delivered}
    v = vs["java"]
    assert (v.stalls, v.spurious_reports) == (0, 0), v.describe()
    for report in (e for e in java if isinstance(e, Reported)):
        seek = java[java.index(report) + 1]
        assert isinstance(seek, Seeked) and seek.offset == report.divergence, (report, seek)
