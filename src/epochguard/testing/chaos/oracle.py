"""The oracle: judges what an application received against what the cluster did.

Input is a :class:`History`: every event the consumers produced (records delivered,
truncation reports, seeks, assignments, commits) in the order they happened, tagged with the
step of the schedule during which they happened, plus a snapshot of each partition leader's
log after every step and the final log after healing. Values are unique in a run, so a value
names one record wherever a replica holds it.

The rules (issue 11), per application (a consumer or a consumer group):

* **silent re-read**: an offset delivered again while the application still holds it, with
  no report covering it in between. A new owner of a partition (a restart, a rebalance) may
  re-read what was delivered but not committed (at-least-once), never below the commit; an
  application's own seek allows re-reading from there. A topic deleted and re-created is
  a new log: what was held of the old one is released by a report or a new assignment.
* **silent loss**: a record held at the end that the final log does not hold at that offset
  with that epoch (it was replaced and nobody said so), or a record of the final log the
  application never received. Below the highest log start retention reached, nothing
  counts: those records are gone for every reader.
* **spurious report**: a report whose divergence point holds a record the application
  received that was in the leader's log, unchanged, from its delivery until the report (no
  snapshot in between shows it gone or replaced; below a snapshot's log start nothing can be
  shown gone); without a divergence, a report after which none of the records received
  in the lost range was ever gone.
* **raise breach**: with policy ``raise``, a record of the partition delivered after a report
  and before the application seeks.
* **stall**: the application did not reach the end of a partition after healing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

__all__ = [
    "Assigned",
    "Committed",
    "Delivered",
    "Event",
    "History",
    "LogSnapshot",
    "Recreated",
    "Reported",
    "Seeked",
    "Stalled",
    "Verdict",
    "judge",
]


@attrs.frozen
class Delivered:
    member: int
    partition: int
    offset: int
    epoch: int | None  # None: the client does not say
    value: bytes
    step: int
    app: str = "app"


@attrs.frozen
class Reported:
    """A truncation signal; ``divergence`` None: the client did not say where."""

    member: int
    partition: int
    divergence: int | None
    consumed_to: int | None
    step: int
    app: str = "app"
    text: str = ""


@attrs.frozen
class Seeked:
    member: int
    partition: int
    offset: int | None  # None: to the beginning
    step: int
    app: str = "app"


@attrs.frozen
class Assigned:
    """``member`` starts a session on the partition (assignment, restart, rebalance)."""

    member: int
    partition: int
    step: int
    app: str = "app"


@attrs.frozen
class Committed:
    member: int
    partition: int
    offset: int
    step: int
    app: str = "app"


@attrs.frozen
class Recreated:
    """The runner deleted and re-created the topic (a new topic id) during ``step``: what
    the application holds of the old incarnation is gone once a report or a new assignment
    of the partition tells it so (Kafka drops a deleted topic's commits)."""

    step: int
    app: str = "*"


@attrs.frozen
class Stalled:
    partition: int
    detail: str
    app: str = "app"


Event = Delivered | Reported | Seeked | Assigned | Committed | Recreated | Stalled


@attrs.frozen
class LogSnapshot:
    """One partition's leader log: its log start and ``offset -> (epoch, value)``."""

    log_start: int
    records: Mapping[int, tuple[int, bytes | None]]


@attrs.frozen
class History:
    """What happened in one run. ``snapshots[s][p]`` is partition ``p``'s leader log after
    step ``s`` (None: no leader then); ``final[p]`` after healing."""

    events: tuple[Event, ...]
    snapshots: tuple[Mapping[int, LogSnapshot | None], ...]
    final: Mapping[int, LogSnapshot]
    policy: str = "rewind"


@attrs.frozen
class Verdict:
    """Counts of broken promises in one run (``ok`` when all are zero)."""

    silent_losses: int = 0
    silent_rereads: int = 0
    spurious_reports: int = 0
    stalls: int = 0
    raise_breaches: int = 0
    delivered: int = 0
    reports: int = 0
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (
            self.silent_losses
            or self.silent_rereads
            or self.spurious_reports
            or self.stalls
            or self.raise_breaches
        )

    def counts(self) -> dict[str, int]:
        """The counters, by name (totals over many runs add these up)."""
        return {
            "silent_losses": self.silent_losses,
            "silent_rereads": self.silent_rereads,
            "spurious_reports": self.spurious_reports,
            "stalls": self.stalls,
            "raise_breaches": self.raise_breaches,
            "delivered": self.delivered,
            "reports": self.reports,
        }

    def describe(self) -> str:
        head = (
            f"silent losses {self.silent_losses}, silent re-reads {self.silent_rereads}, "
            f"spurious reports {self.spurious_reports}, stalls {self.stalls}, raise breaches "
            f"{self.raise_breaches} ({self.delivered} records delivered, {self.reports} reports)"
        )
        return "\n".join([head, *(f"  - {p}" for p in self.problems[:20])])


@attrs.define
class _Held:
    value: bytes
    epoch: int | None
    step: int
    member: int
    #: delivered past the last commit before a new session, or past a seek: may come again
    reread_ok: bool = False
    #: of a topic incarnation since deleted
    old: bool = False


@attrs.define
class _Tally:
    losses: int = 0
    rereads: int = 0
    spurious: int = 0
    stalls: int = 0
    breaches: int = 0
    delivered: int = 0
    reports: int = 0
    problems: list[str] = attrs.Factory(list)

    def verdict(self) -> Verdict:
        return Verdict(
            self.losses,
            self.rereads,
            self.spurious,
            self.stalls,
            self.breaches,
            self.delivered,
            self.reports,
            tuple(self.problems),
        )


def _gone(
    snapshots: Sequence[Mapping[int, LogSnapshot | None]],
    partition: int,
    offset: int,
    value: bytes,
    first: int,
    last: int,
) -> bool:
    """Whether a snapshot in steps ``first..last`` shows ``value`` gone from ``offset``."""
    for s in range(max(0, first), min(len(snapshots) - 1, last) + 1):
        snap = snapshots[s].get(partition)
        if snap is None or offset < snap.log_start:
            continue
        held = snap.records.get(offset)
        if held is None or held[1] != value:
            return True
    return False


def judge(history: History, app: str | None = None) -> Verdict:
    """Judge one application's events (``app``; default: every event)."""
    t = _Tally()
    view: dict[int, dict[int, _Held]] = {}
    committed: dict[int, int] = {}
    awaiting_seek: set[tuple[int, int]] = set()
    #: the last record delivered at each offset, per partition: (value, step)
    ever: dict[int, dict[int, tuple[bytes, int]]] = {}
    snaps = history.snapshots
    for ev in history.events:
        if app is not None and ev.app not in (app, "*"):
            continue
        if isinstance(ev, Recreated):
            for held in view.values():
                for h in held.values():
                    h.old = True
            committed.clear()
            continue
        if isinstance(ev, Stalled):
            t.stalls += 1
            t.problems.append(f"stall on p{ev.partition}: {ev.detail}")
            continue
        held = view.setdefault(ev.partition, {})
        if isinstance(ev, Delivered):
            t.delivered += 1
            if (ev.member, ev.partition) in awaiting_seek:
                t.breaches += 1
                t.problems.append(
                    f"p{ev.partition} offset {ev.offset} ({ev.value!r}) delivered to member "
                    f"{ev.member} after a report under policy raise, before any seek"
                )
            old = held.get(ev.offset)
            if old is not None and not old.reread_ok:
                t.rereads += 1
                t.problems.append(
                    f"p{ev.partition} offset {ev.offset} delivered again without a report: "
                    f"{old.value!r} at step {old.step} (member {old.member}), then "
                    f"{ev.value!r} at step {ev.step} (member {ev.member})"
                )
            held[ev.offset] = _Held(ev.value, ev.epoch, ev.step, ev.member)
            ever.setdefault(ev.partition, {})[ev.offset] = (ev.value, ev.step)
        elif isinstance(ev, Reported):
            t.reports += 1
            start = ev.divergence if ev.divergence is not None else 0
            end = ev.consumed_to
            for o in [o for o, h in held.items() if h.old]:
                del held[o]  # told: the topic it held them from is gone
            in_range = sorted(o for o in held if o >= start and (end is None or o < end))
            # Judged on the last record delivered at each offset, held or already dropped by
            # an earlier report: a restart from a commit older than that report validates
            # again and may repeat it (real, if redundant).
            got = ever.get(ev.partition, {})
            candidates = sorted(o for o in got if o >= start and (end is None or o < end))
            if ev.divergence is not None:
                candidates = candidates[:1]  # the record at the divergence must be gone
            # else: no divergence given: some record it received must be gone
            if candidates and not any(
                _gone(snaps, ev.partition, o, got[o][0], got[o][1], ev.step + 1) for o in candidates
            ):
                o = candidates[0]
                t.spurious += 1
                t.problems.append(
                    f"spurious report on p{ev.partition} at step {ev.step} (divergence "
                    f"{ev.divergence}, consumed to {ev.consumed_to}): {got[o][0]!r} at {o} "
                    f"was in the leader's log from its delivery (step {got[o][1]}) on; "
                    f"{ev.text}"
                )
            for o in in_range if end is not None else [o for o in held if o >= start]:
                del held[o]
            if history.policy == "raise":
                awaiting_seek.add((ev.member, ev.partition))
        elif isinstance(ev, Seeked):
            awaiting_seek.discard((ev.member, ev.partition))
            for o, h in held.items():
                if ev.offset is None or o >= ev.offset:
                    h.reread_ok = True
        elif isinstance(ev, Committed):
            committed[ev.partition] = ev.offset
        elif isinstance(ev, Assigned):
            # A new session: what was delivered past the last commit may come again.
            awaiting_seek.discard((ev.member, ev.partition))
            for o in [o for o, h in held.items() if h.old]:
                del held[o]
            c = committed.get(ev.partition, 0)
            for o, h in held.items():
                if o >= c:
                    h.reread_ok = True
    # Retention of an earlier incarnation says nothing about the final topic's log.
    since = max((ev.step + 1 for ev in history.events if isinstance(ev, Recreated)), default=0)
    for p, final in history.final.items():
        floor = max(
            [final.log_start]
            + [
                snap[p].log_start  # type: ignore[union-attr]
                for snap in snaps[since:]
                if snap.get(p) is not None
            ]
        )
        held = view.get(p, {})
        for o in sorted(held):
            if o < floor:
                continue
            h = held[o]
            f = final.records.get(o)
            if f is None or f[1] != h.value or (h.epoch is not None and f[0] != h.epoch):
                t.losses += 1
                t.problems.append(
                    f"p{p} offset {o}: the application holds {h.value!r} (epoch {h.epoch}, "
                    f"step {h.step}) but the final log has "
                    f"{'nothing' if f is None else f'{f[1]!r} (epoch {f[0]})'}, unreported"
                )
        for o in sorted(final.records):
            if o >= floor and o not in held:
                t.losses += 1
                t.problems.append(
                    f"p{p} offset {o} ({final.records[o][1]!r}) of the final log was never "
                    "delivered"
                )
    return t.verdict()
