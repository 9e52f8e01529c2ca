"""Raft-term leader epochs: the controller's rules of ``EmbeddedCluster(epochs="raft")``.

Redpanda uses each partition's Raft term as its Kafka leader epoch (its leader-epoch RFC,
docs/rfcs/20220209_leader_epoch_support_rfc.md in redpanda-data/redpanda). Against Kafka's
rules (``state.py``) that changes:

* **Terms.** Every election attempt takes a new term, the failed ones too: a partition whose
  leader lost its majority goes leaderless under a new term, each start or stop of one of
  its brokers while no majority runs is another failed attempt, and one election in three
  after such a failure splits the vote once (a fixed hash of topic, partition and term, so
  a run replays). Epochs skip numbers, a term can hold no record, and the same broker can
  lead again under a new term. A new partition's first leader takes term 1.
* **Elections.** A running replica wins with the votes of a majority of the replicas: each
  running replica votes for a log at least as up to date as its own (last term, then log
  end). There is no ISR rule and no unclean election; the candidate with the most up-to-date
  log wins (ties: replica order).
* **Visibility.** The high watermark is the offset a majority of the replicas following the
  leader hold, in memory: an acks=1 record is visible once a majority has it.
* **Durability.** acks=0/1 writes are not flushed. An acks=all write, the start of a term (its
  configuration batch is written with a flush by the leader and by each follower that
  appends it) and :meth:`EmbeddedCluster.flush` make what precedes them durable.
  ``stop_broker`` is a power cut: the broker's replicas keep their durable prefix only. So a
  majority that loses acks=1 records it made visible truncates the partition: the one way a
  Raft-term broker loses acknowledged records.
* **Topics.** The controller is a Raft group of every broker too: topics are created and
  deleted only while a majority of the brokers runs (``ClusterState.controller_available``).
* **Answers.** OffsetForLeaderEpoch echoes the requested term with the offset where it ends,
  or where the next term starts when it holds no record (``PartitionLog.term_end_offset``);
  ListOffsets names the current term for every query; Fetch stops at v11 (no
  ``DivergingEpoch``: a truncation is found through OffsetForLeaderEpoch only) and
  OffsetForLeaderEpoch at v3, the versions Redpanda serves.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from epochguard._log import get_logger
from epochguard.testing.embedded.state import EmbeddedClusterError

if TYPE_CHECKING:
    from epochguard.testing.embedded.partition_log import PartitionLog
    from epochguard.testing.embedded.state import ClusterState, PartitionState

__all__ = ["EPOCH_RULES", "KAFKA", "RAFT", "RAFT_MAX_VERSIONS", "RaftElections"]

log = get_logger("epochguard.testing.embedded")

KAFKA: Final = "kafka"
RAFT: Final = "raft"
#: The values of ``EmbeddedCluster(epochs=...)``.
EPOCH_RULES: Final = (KAFKA, RAFT)

FETCH, OFFSET_FOR_LEADER_EPOCH = 1, 23
#: The highest versions a Raft-term broker serves, by API key (Redpanda's Fetch and
#: OffsetForLeaderEpoch handlers).
RAFT_MAX_VERSIONS: Final[Mapping[int, int]] = {FETCH: 11, OFFSET_FOR_LEADER_EPOCH: 3}


def _log_key(replica: PartitionLog) -> tuple[int, int]:
    """How up to date a Raft log is: its last term, then its end."""
    return replica.latest_epoch, replica.log_end_offset


class RaftElections:
    """Elections and terms of a Raft-term cluster; ``ClusterState.raft`` holds one.

    Called on the loop thread by ``ClusterState`` where Kafka's controller would decide."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster

    # -- votes -----------------------------------------------------------------------------

    @staticmethod
    def majority(p: PartitionState) -> int:
        return len(p.replicas) // 2 + 1

    def voters(self, p: PartitionState) -> list[int]:
        """The running replicas (a replica that is behind still votes)."""
        return [r for r in p.replicas if self.cluster.brokers[r].alive]

    def wins(self, p: PartitionState, candidate: int) -> bool:
        """Whether ``candidate`` gets the votes of a majority of the replicas."""
        if candidate not in p.replicas or not self.cluster.brokers[candidate].alive:
            return False
        key = _log_key(p.logs[candidate])
        votes = sum(1 for v in self.voters(p) if _log_key(p.logs[v]) <= key)
        return votes >= self.majority(p)

    @staticmethod
    def split_votes(p: PartitionState) -> int:
        """Failed rounds before an election after a leader failure finds its winner."""
        return 1 if zlib.crc32(f"{p.topic}/{p.index}/{p.leader_epoch}".encode()) % 3 == 0 else 0

    # -- elections -------------------------------------------------------------------------

    def campaign(self, p: PartitionState, failed_attempts: int | None = None) -> bool:
        """The running replicas of a leaderless partition hold an election; returns whether
        one won. Without a majority running the attempt fails, under a new term all the
        same (nothing happens when no replica runs)."""
        voters = self.voters(p)
        if not voters:
            return False
        winners = [r for r in voters if self.wins(p, r)]
        if not winners:
            self._new_term(p, None, 1)
            return False
        best = max(_log_key(p.logs[r]) for r in winners)
        winner = next(r for r in winners if _log_key(p.logs[r]) == best)
        extra = self.split_votes(p) if failed_attempts is None else failed_attempts
        self._new_term(p, winner, extra + 1)
        return True

    def elect(self, p: PartitionState, broker_id: int, unclean: bool, failed_attempts: int) -> None:
        """``EmbeddedCluster.elect_leader``: ``broker_id`` campaigns (the current leader too:
        it is re-elected under a new term) after ``failed_attempts`` failed rounds."""
        if unclean:
            raise EmbeddedClusterError(
                "a Raft-term cluster has no unclean elections: records are lost when a "
                "majority loses acks=1 writes (stop_broker is a power cut)"
            )
        if failed_attempts < 0:
            raise EmbeddedClusterError(f"failed_attempts must be >= 0, got {failed_attempts}")
        if not self.wins(p, broker_id):
            voters = self.voters(p)
            last, end = _log_key(p.logs[broker_id])
            raise EmbeddedClusterError(
                f"broker {broker_id} cannot win an election of {p.topic}-{p.index}: "
                f"{len(voters)} of {len(p.replicas)} replicas running, and a majority votes "
                f"only for a log as up to date as its own (its log: term {last}, end {end})"
            )
        self._new_term(p, broker_id, failed_attempts + 1)

    def _new_term(self, p: PartitionState, leader: int | None, steps: int) -> None:
        p.leader_epoch += steps
        p.leader = leader
        if leader is not None:
            replica = p.logs[leader]
            # The new term's configuration batch, written with a flush.
            replica.assign_epoch(p.leader_epoch)
            replica.flush()
            # Followers rejoin once they have caught up with this log (state.py).
            p.isr[:] = [leader]
            log.info(
                "leader_elected",
                topic=p.topic,
                partition=p.index,
                leader=leader,
                leader_epoch=p.leader_epoch,
                failed_attempts=steps - 1,
            )
        else:
            log.info(
                "election_failed",
                topic=p.topic,
                partition=p.index,
                leader_epoch=p.leader_epoch,
                running=len(self.voters(p)),
                replicas=len(p.replicas),
            )

    # -- brokers ---------------------------------------------------------------------------

    def broker_stopped(self, p: PartitionState, broker_id: int) -> None:
        """``broker_id`` lost power: its replica keeps its durable prefix; a leader that is
        gone, or that no longer reaches a majority, is replaced by an election."""
        replica = p.logs[broker_id]
        before = replica.log_end_offset
        replica.lose_unflushed()
        self.cluster.replica_shortened(
            p, broker_id, before, "replica_lost_unflushed", logging.WARNING
        )
        if broker_id in p.isr and len(p.isr) > 1:
            p.isr.remove(broker_id)
        if p.leader == broker_id:
            p.leader = None
            self.campaign(p)
        elif p.leader is None or len(self.voters(p)) < self.majority(p):
            # A leader without a majority steps down and campaigns in vain; without a leader
            # the survivors time out and campaign again.
            p.leader = None
            self.campaign(p)

    def broker_started(self, p: PartitionState) -> None:
        """A replica of ``p`` is back: a leaderless partition holds an election."""
        if p.leader is None:
            self.campaign(p)

    # -- high watermark --------------------------------------------------------------------

    def majority_end(self, p: PartitionState, following: list[int]) -> int | None:
        """The offset a majority of the replicas hold (the leader and ``following``, the
        followers that replicate from it now); ``None`` without a majority."""
        assert p.leader is not None
        ends = sorted(
            (p.logs[r].log_end_offset for r in (p.leader, *following)),
            reverse=True,
        )
        need = self.majority(p)
        return ends[need - 1] if len(ends) >= need else None
