"""Real-Kafka chaos schedules with EpochConsumer and the Java reference consumer side by
side (``epochguard.testing.chaos.apache``): the runner, its log reader and the Java adapter
work, with and without transactions; the 30-schedule scoreboards are ``make chaos-apache``
and ``python -m epochguard.testing.chaos.apache --transactions`` (docs/reliability.md)."""

from __future__ import annotations

import pytest

from epochguard.testing.apache_kafka import ApacheKafkaCluster
from epochguard.testing.chaos.apache import run_apache_schedule, verdicts
from epochguard.testing.chaos.oracle import Delivered, HangingAborted, Reported, Seeked
from epochguard.testing.chaos.schedule import (
    DeleteRecords,
    Elect,
    Produce,
    RestartConsumer,
    Schedule,
    TxnEnd,
    TxnProduce,
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


#: A transactional schedule (``generate_apache(transactions=True)`` picks from these steps):
#: a committed transaction, then an unclean election by the marker recipe (pick 0: a new
#: transaction reaches both replicas, its COMMIT marker only the old leader). Nothing is left
#: open for the coordinator to time out, so the brokers' default timeouts do.
TXN_SCHEDULE = Schedule(
    seed=90002,
    partitions=1,
    policy="rewind",
    transactions=1,
    steps=(
        TxnProduce(0, 3),
        TxnEnd(0, True),
        Produce(0, 2),
        Elect(0, True, 0),
        Produce(0, 2),
    ),
)


def test_a_lost_commit_marker_side_by_side(cluster: ApacheKafkaCluster) -> None:
    result = run_apache_schedule(TXN_SCHEDULE, cluster)
    log = "\n".join(result.step_log)
    assert "a marker on the old leader only" in result.step_log[3], log
    assert "committed 1 records" in result.step_log[3], log
    vs = verdicts(result, ("epochguard", "java"))
    ours, java = vs["epochguard"], vs["java"]
    # EpochConsumer reports the hanging transaction; its application aborts it, as the
    # transactions guide says, and both consumers read on to the end.
    assert ours.ok, f"{ours.describe()}\n{log}"
    assert ours.hanging_transactions == 1 and ours.hanging_reports == 1
    assert any(isinstance(e, HangingAborted) for e in result.history.events)
    # The Java consumer has no such report: it waited, silently, until the abort.
    assert java.unreported_hanging == 1 and java.stalls == 0, java.describe()
    # The log reader reads markers: in the final log, the first transaction's COMMIT right
    # after its three records, and the ABORT the application wrote for the hanging one.
    (final,) = result.history.final.values()
    pid = final.transactional[0]
    assert final.markers[3] == (pid, True), final
    assert sorted(final.markers.values())[0] == (pid, False), final
