"""``python -m epochguard demo``: the epoch core walking through an unclean election.

Self-contained: a two-broker partition simulated in memory answers the tracker's actions, so
the demo shows exactly the decisions of :class:`PartitionTracker` and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka.structs import TopicPartition

from epochguard._errors import ErrorCode
from epochguard.offsets.events import (
    FetchAction,
    OffsetReset,
    PositionValidated,
    ResetAction,
    TruncationDetected,
    ValidateAction,
    ValidationStarted,
    WaitAction,
)
from epochguard.offsets.policy import OffsetPolicy
from epochguard.offsets.state import PartitionTracker


@dataclass
class _Broker:
    """One replica: records as (epoch, value), and its leader epoch cache."""

    broker_id: int
    log: list[tuple[int, str]] = field(default_factory=list)
    epochs: list[tuple[int, int]] = field(default_factory=list)  # (epoch, start offset)

    def append(self, epoch: int, value: str) -> None:
        if not self.epochs or self.epochs[-1][0] < epoch:
            self.epochs.append((epoch, len(self.log)))
        self.log.append((epoch, value))

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        if self.epochs and epoch == self.epochs[-1][0]:
            return epoch, len(self.log)
        floor = [(e, s) for e, s in self.epochs if e <= epoch]
        later = [s for e, s in self.epochs if e > epoch]
        if not floor or not later:
            return -1, -1
        return floor[-1][0], later[0]


@dataclass
class _Partition:
    brokers: dict[int, _Broker]
    leader: int
    epoch: int

    def answer_fetch(self, a: FetchAction) -> tuple[int, list[tuple[int, int, str]]]:
        if a.leader_id != self.leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, []
        if a.current_leader_epoch is not None and a.current_leader_epoch < self.epoch:
            return ErrorCode.FENCED_LEADER_EPOCH, []
        log = self.brokers[self.leader].log
        return ErrorCode.NONE, [(o, log[o][0], log[o][1]) for o in range(a.offset, len(log))]


def run_demo(out: Callable[[str], None] = print) -> int:
    tp = TopicPartition("payments", 0)
    b1, b2 = _Broker(1), _Broker(2)
    part = _Partition({1: b1, 2: b2}, leader=1, epoch=1)
    tracker = PartitionTracker(tp, OffsetPolicy(auto_offset_reset="earliest", on_truncation="auto"))
    consumed: dict[int, tuple[int, str]] = {}
    step = 0

    def say(text: str) -> None:
        nonlocal step
        step += 1
        out(f"[{step:02d}] {text}")

    def pump(limit: int = 20) -> None:
        for _ in range(limit):
            action = tracker.next_action(now=0.0)
            if action is None or isinstance(action, WaitAction):
                return
            if isinstance(action, ResetAction):
                log = part.brokers[part.leader].log
                tracker.on_list_offsets(action, 0 if action.strategy == "earliest" else len(log))
            elif isinstance(action, ValidateAction):
                end_epoch, end_offset = part.brokers[part.leader].end_offset_for(
                    action.leader_epoch
                )
                say(
                    f"consumer -> broker {action.leader_id}: OffsetForLeaderEpoch("
                    f"current_leader_epoch={action.current_leader_epoch}, "
                    f"leader_epoch={action.leader_epoch})  [position {action.position}]"
                )
                say(
                    f"broker {part.leader} -> consumer: epoch {end_epoch} ends at offset "
                    f"{end_offset}"
                )
                tracker.on_validation(action, 0, end_epoch, end_offset, now=0.0)
            elif isinstance(action, FetchAction):
                err, records = part.answer_fetch(action)
                if err:
                    tracker.on_fetch_error(action, err, now=0.0)
                elif not records:
                    tracker.on_empty_fetch(action)
                    return
                else:
                    for offset, epoch, value in records:
                        if not tracker.on_records(action, offset, offset, epoch):
                            break
                        consumed[offset] = (epoch, value)
                    first, last = records[0], records[-1]
                    say(
                        f"consumer read offsets {first[0]}..{last[0]} "
                        f"(epoch {records[-1][1]}): " + ", ".join(v for _, _, v in records)
                    )
            for ev in tracker.drain_events():
                show(ev)

    def show(ev: object) -> None:
        if isinstance(ev, TruncationDetected):
            r = ev.report
            div_epoch = "?" if r.divergence is None else r.divergence.leader_epoch
            say(
                f"TRUNCATION DETECTED on {r.topic}-{r.partition} (detected by "
                f"{r.detected_by.value}): consumed up to offset {r.lost_to}, "
                f"divergence offset {r.lost_from} (epoch {div_epoch})"
            )
            lost = ", ".join(
                consumed[o][1] for o in range(r.lost_from or 0, r.lost_to) if o in consumed
            )
            say(f"records the application read that no longer exist: {lost} ({r.lost_count})")
            say(f"decision: {ev.decision} -> new position {ev.new_position}")
            out("")
            out("truncation report (JSON):")
            out(json.dumps(r.to_dict(), indent=2, sort_keys=True))
            out("")
        elif isinstance(ev, PositionValidated):
            say(f"position {ev.position} validated against leader epoch {ev.leader_epoch}")
        elif isinstance(ev, ValidationStarted):
            say(f"position {ev.position} must be validated ({ev.cause.value})")
        elif isinstance(ev, OffsetReset):
            say(f"no committed offset: auto_offset_reset={ev.strategy.value} -> {ev.position}")

    out("epochguard demo: an unclean leader election under a running consumer")
    out("=" * 72)
    for i in range(10):
        b1.append(1, f"pay-{i}")
    for rec in b1.log[:7]:
        b2.append(*rec)
    say("broker 1 leads payments-0 in epoch 1 and holds pay-0..pay-9 (offsets 0..9);")
    say("broker 2 is a lagging follower: it only has offsets 0..6")
    tracker.on_metadata(leader_id=1, leader_epoch=1, topic_id="payments-id")
    tracker.restore(None, source="demo")
    pump()
    say(f"consumer position: {tracker.position}")

    say("broker 1 crashes; broker 2 is elected although it is behind (unclean), epoch 2")
    part.leader, part.epoch = 2, 2
    b2.epochs.append((2, len(b2.log)))
    for i in range(3):
        b2.append(2, f"new-{i}")
    say("producers write new-0..new-2; on broker 2 they land at offsets 7..9")
    say("a consumer without epochs would continue at offset 10 and never notice that")
    say("pay-7..pay-9 are gone and new-0..new-2 were skipped")
    tracker.on_metadata(leader_id=2, leader_epoch=2, topic_id="payments-id")
    for ev in tracker.drain_events():
        show(ev)
    pump()
    say(f"consumer position: {tracker.position}")
    missing = [o for o in range(len(b2.log)) if consumed.get(o) != b2.log[o]]
    say(
        "every record in the new log was delivered: "
        + ("yes" if not missing else f"no, missing {missing}")
    )
    return 0 if not missing else 1
