"""A reference model of one replicated Kafka partition, and a broker answering from it.

Records are ``(epoch, uid)``; a uid is unique per append, so two replicas hold "the same
record" at an offset exactly when the uids are equal. Replicas keep their whole log, including
the prefix below ``log_start`` (retention only hides it), so the model can always say what a
replica *had* at an offset.

Epoch caches follow Kafka's ``LeaderEpochFileCache``: a leader assigns ``(epoch, LEO)`` when
elected, followers add an entry when they append the first record of a newer epoch,
truncation removes entries starting at or past the truncation point, and retention keeps the
entry covering the new log start (moved up to it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epochguard.offsets import (
    ErrorCode,
    FetchAction,
    ResetAction,
    ResetStrategy,
    ValidateAction,
)

Rec = tuple[int, int]  # (epoch, uid)


@dataclass
class Replica:
    rid: int
    log: list[Rec] = field(default_factory=list)
    log_start: int = 0
    cache: list[tuple[int, int]] = field(default_factory=list)  # (epoch, start offset)

    @property
    def leo(self) -> int:
        return len(self.log)

    def assign(self, epoch: int, start: int) -> None:
        if not self.cache or epoch > self.cache[-1][0]:
            self.cache.append((epoch, start))

    def truncate_to(self, offset: int) -> None:
        del self.log[offset:]
        self.cache = [(e, s) for e, s in self.cache if s < offset]

    def truncate_from_start(self, start: int) -> None:
        below = [(e, s) for e, s in self.cache if s <= start]
        above = [(e, s) for e, s in self.cache if s > start]
        self.cache = ([(below[-1][0], start)] if below else []) + above

    def end_offset_for(self, epoch: int, modern: bool) -> tuple[int, int]:
        """OffsetForLeaderEpoch as the broker computes it (``modern``: Kafka >= 2.x floor
        handling; otherwise an epoch older than the cache answers UNDEFINED)."""
        if not self.cache or epoch < 0:
            return (-1, -1)
        if epoch == self.cache[-1][0]:
            return (epoch, self.leo)
        higher = next(((e, s) for e, s in self.cache if e > epoch), None)
        if higher is None:
            return (-1, -1)
        floor = [e for e, _ in self.cache if e <= epoch]
        if not floor:
            return (epoch, higher[1]) if modern else (-1, -1)
        return (floor[-1], higher[1])

    def epoch_for_offset(self, offset: int) -> int:
        found = -1
        for e, s in self.cache:
            if s > offset:
                break
            found = e
        return found


@dataclass
class Cluster:
    """Three replicas, a controller epoch, a topic id, and metadata history."""

    replicas: list[Replica] = field(default_factory=lambda: [Replica(i) for i in range(3)])
    leader: int | None = 0
    epoch: int = 0
    topic_id: str = "topic-0"
    uid: int = 0
    modern_epoch_cache: bool = True
    diverging_epoch: bool = True
    history: list[tuple[int | None, int, str]] = field(default_factory=list)
    unclean_elections: int = 0
    truncated_records: int = 0
    # An old leader that has not heard of its successor: (replica id, its epoch). It keeps
    # answering clients that still send its epoch, and may take writes.
    zombie: tuple[int, int] | None = None
    zombie_answers: int = 0
    # Highest offset retention ever deleted below. The model keeps deleted records, and a
    # follower that truncates below its log start gets them back readable, which Kafka
    # never does; offsets below this are therefore not compared.
    deleted_below: int = 0
    # The replica that answered the last request (the leader, or a zombie).
    answered_by: Replica | None = None

    def __post_init__(self) -> None:
        self.replicas[0].assign(0, 0)
        self.history.append(self.metadata())

    # ------------------------------------------------------------------ cluster changes

    def leader_replica(self) -> Replica | None:
        return None if self.leader is None else self.replicas[self.leader]

    def append(self, n: int) -> None:
        lead = self.leader_replica()
        if lead is None:
            return
        for _ in range(n):
            self.uid += 1
            lead.log.append((self.epoch, self.uid))

    def replicate(self, rid: int, n: int) -> None:
        lead = self.leader_replica()
        if lead is None or rid == self.leader:
            return
        f = self.replicas[rid]
        if self.zombie is not None and self.zombie[0] == rid:
            self.zombie = None  # it fetched from the new leader: it knows now
        common = 0
        for a, b in zip(f.log, lead.log, strict=False):
            if a != b:
                break
            common += 1
        self.truncated_records += f.leo - common
        f.truncate_to(common)
        # Kafka keeps log start <= log end: truncating below it restarts the log there.
        f.log_start = min(f.log_start, f.leo)
        for rec in lead.log[common : common + n]:
            if not f.cache or rec[0] > f.cache[-1][0]:
                f.cache.append((rec[0], f.leo))
            f.log.append(rec)

    def elect(self, rid: int, zombie: bool = False) -> None:
        lead = self.leader_replica()
        if lead is not None and self.replicas[rid].log != lead.log:
            self.unclean_elections += 1
        self.zombie = None
        if zombie and lead is not None and lead.rid != rid:
            self.zombie = (lead.rid, self.epoch)
        self.epoch += 1
        self.leader = rid
        new = self.replicas[rid]
        new.assign(self.epoch, new.leo)
        self.history.append(self.metadata())

    def zombie_append(self, n: int) -> None:
        """A producer with stale metadata writes to the zombie (acks=1)."""
        if self.zombie is None:
            return
        rid, epoch = self.zombie
        for _ in range(n):
            self.uid += 1
            self.replicas[rid].log.append((epoch, self.uid))

    def go_offline(self) -> None:
        self.zombie = None
        if self.leader is not None:
            self.leader = None
            self.epoch += 1  # Kafka bumps the epoch when the leader is removed
            self.history.append(self.metadata())

    def retention(self, upto: int) -> None:
        lead = self.leader_replica()
        if lead is not None:
            self.deleted_below = max(self.deleted_below, min(upto, lead.leo))
        for r in self.replicas:
            new_start = min(upto, r.leo)
            if new_start > r.log_start:
                r.log_start = new_start
                r.truncate_from_start(new_start)

    def recreate_topic(self) -> None:
        self.zombie = None
        self.deleted_below = 0
        self.topic_id = f"topic-{int(self.topic_id.split('-')[1]) + 1}"
        self.replicas = [Replica(i) for i in range(3)]
        self.epoch = 0
        self.leader = 0
        self.replicas[0].assign(0, 0)
        self.history.append(self.metadata())

    def metadata(self) -> tuple[int | None, int, str]:
        return (self.leader, self.epoch, self.topic_id)

    # --------------------------------------------------------------------- broker side

    def _serving(self, leader_id: int, current_leader_epoch: int | None) -> tuple[int, Replica]:
        """The replica answering a request sent to ``leader_id``, or an error code."""
        if self.zombie is not None and leader_id == self.zombie[0]:
            rid, epoch = self.zombie
            if current_leader_epoch is not None and current_leader_epoch > epoch:
                return ErrorCode.UNKNOWN_LEADER_EPOCH, self.replicas[rid]
            if current_leader_epoch is not None and current_leader_epoch < epoch:
                return ErrorCode.FENCED_LEADER_EPOCH, self.replicas[rid]
            self.zombie_answers += 1
            self.answered_by = self.replicas[rid]
            return ErrorCode.NONE, self.replicas[rid]
        err = self._check(leader_id, current_leader_epoch)
        lead = self.leader_replica()
        if not err:
            self.answered_by = lead
        return err, lead if lead is not None else self.replicas[0]

    def _check(self, leader_id: int, current_leader_epoch: int | None) -> int:
        if self.leader is None:
            return ErrorCode.LEADER_NOT_AVAILABLE
        if leader_id != self.leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch is not None:
            if current_leader_epoch < self.epoch:
                return ErrorCode.FENCED_LEADER_EPOCH
            if current_leader_epoch > self.epoch:
                return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.NONE

    def fetch(self, a: FetchAction, max_records: int) -> tuple[str, Any]:
        """("error", code) | ("diverging", (epoch, end)) | ("records", [(first, last, recs)])."""
        if a.topic_id is not None and a.topic_id != self.topic_id:
            return ("error", ErrorCode.UNKNOWN_TOPIC_ID)  # Fetch v13+
        err, lead = self._serving(a.leader_id, a.current_leader_epoch)
        if err:
            return ("error", err)
        last_fetched = a.last_fetched_epoch if self.diverging_epoch else None
        if last_fetched is not None:
            e, end = lead.end_offset_for(last_fetched, self.modern_epoch_cache)
            if e < 0 or end < 0 or a.offset < lead.log_start:
                return ("error", ErrorCode.OFFSET_OUT_OF_RANGE)
            if e < last_fetched or end < a.offset:
                return ("diverging", (e, end))
        if a.offset < lead.log_start or a.offset > lead.leo:
            return ("error", ErrorCode.OFFSET_OUT_OF_RANGE)
        batches: list[tuple[int, int, list[Rec]]] = []
        for off in range(a.offset, min(lead.leo, a.offset + max_records)):
            rec = lead.log[off]
            if batches and batches[-1][2][-1][0] == rec[0]:
                batches[-1][2].append(rec)
                batches[-1] = (batches[-1][0], off, batches[-1][2])
            else:
                batches.append((off, off, [rec]))
        return ("records", batches)

    def offset_for_leader_epoch(self, a: ValidateAction) -> tuple[int, int, int]:
        err, lead = self._serving(a.leader_id, a.current_leader_epoch)
        if err:
            return (err, -1, -1)
        e, end = lead.end_offset_for(a.leader_epoch, self.modern_epoch_cache)
        return (ErrorCode.NONE, e, end)

    def list_offsets(self, a: ResetAction) -> tuple[int, int, int]:
        err, lead = self._serving(a.leader_id, a.current_leader_epoch)
        if err:
            return (err, -1, -1)
        if a.strategy is ResetStrategy.EARLIEST:
            return (ErrorCode.NONE, lead.log_start, lead.epoch_for_offset(lead.log_start))
        return (ErrorCode.NONE, lead.leo, lead.cache[-1][0] if lead.cache else -1)

    def record(self, offset: int, replica: Replica | None = None) -> Rec | None:
        """What the current leader (or ``replica``) has, or had below its log start, at
        ``offset``."""
        lead = self.leader_replica() if replica is None else replica
        if lead is None or offset >= lead.leo:
            return None
        return lead.log[offset]
