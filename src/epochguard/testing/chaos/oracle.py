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
  a new log: what was held of the old one is released by a report or a new assignment. A
  report that says the epoch it consumed to covers only records read in that epoch or an
  earlier one: not what another member read at those offsets since, in a later epoch, and
  the application committed.
* **silent loss**: a record held at the end that the final log does not hold at that offset
  with that epoch (it was replaced and nobody said so), or a record of the final log the
  application never received. Below the highest log start retention reached, nothing
  counts: those records are gone for every reader. What a session delivered past the last
  commit the application saw acknowledged is that session's alone once another consumer
  (another member, or the same one restarted) takes the partition over: nothing tells that
  consumer of it, so its being gone does not count until a commit past it shows the new
  session knew of it (the final log's records there must still be delivered).
* **spurious report**: a report whose divergence point holds a record the application
  received that was in the leader's log, unchanged, from its delivery until the report (no
  snapshot in between shows it gone or replaced; below a snapshot's log start nothing can be
  shown gone); without a divergence, a report after which none of the records received
  in the lost range was ever gone. The record the reporting member last received itself
  there counts too: a report either shows gone is real (a member given back a partition it
  read before reports what it had, even when another member reported it already).
* **raise breach**: with policy ``raise``, a record of the partition delivered after a report
  and before the application seeks.
* **stall**: the application did not reach the end of a partition after healing.

With transactional producers (``History.read_committed``: the consumers read committed
records only) a record's fate also depends on its transaction, read from the snapshots the
way a partition leader reads its log (per producer, the transactional batches after its
last marker belong to one transaction that the next COMMIT or ABORT marker decides; still
open when no marker follows). The final log's *committed view* (plain records and records
of committed transactions) takes the final log's place in the rules above, and:

* **aborted delivery**: a record delivered that no snapshot up to its delivery showed
  committed (its transaction aborted, or still open: read past the last stable offset).
* **committed loss**: a record held at the end that the final log still holds, unchanged,
  but no longer as committed (its marker was lost and its transaction then aborted or left
  open), with no hanging-transaction report of its producer at or below it, and, when its
  transaction was decided again (:data:`DECIDED_AGAIN`), no reopened-transaction report
  naming that record. A record left to the old session as above does not count either.
* **unreported hanging transaction**: a transaction that hung (open in the final log while
  the coordinator holds nothing open for its producer, or aborted by an operator after a
  report) that the application never reported.
* **spurious hanging report**: a report of a producer whose transaction the coordinator held
  open in every snapshot since the log showed it open (when the snapshots know the
  coordinator's state): not hanging, only long.

A record of the final log never delivered whose transaction was decided again (read as
aborted, committed since) is a silent loss unless a reopened-transaction report of this
application names it: the application was told that it no longer knows its fate.

Records behind a transaction still open at the end (at or past the final last stable
offset) count as neither lost nor delivered: the stall and the hanging rules judge them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

__all__ = [
    "DECIDED_AGAIN",
    "Assigned",
    "Committed",
    "Committing",
    "Decided",
    "Delivered",
    "Event",
    "HangingAborted",
    "HangingReported",
    "History",
    "LogSnapshot",
    "Recreated",
    "ReopenedReported",
    "Reported",
    "Seeked",
    "Stalled",
    "Started",
    "TxnView",
    "Verdict",
    "judge",
    "txn_view",
]


#: How the oracle words a record whose transaction was decided again: an unclean election
#: took its marker, and another marker decided the reopened transaction otherwise: its
#: producer's next one on the partition (the end of its next transaction there, or the
#: coordinator's abort of it), before it hung long enough to be reported, or an operator's
#: abort after a report (another application's, when this one did not report it).
DECIDED_AGAIN = "its marker was lost and it was decided again"


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
    """A truncation signal; ``divergence`` None: the client did not say where.
    ``consumed_epoch``: the leader epoch of the record before ``consumed_to`` (None: not
    said); the report is about records read in that epoch or earlier ones."""

    member: int
    partition: int
    divergence: int | None
    consumed_to: int | None
    step: int
    app: str = "app"
    text: str = ""
    consumed_epoch: int | None = None


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
class Started:
    """``member`` (re)started: a consumer of its own, knowing only what was committed."""

    member: int
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


@attrs.frozen
class HangingReported:
    """A hanging-transaction report: the transaction of ``producer_id`` (None: the client
    could not name it) holds the partition's last stable offset at ``first_offset``."""

    member: int
    partition: int
    first_offset: int
    producer_id: int | None
    step: int
    app: str = "app"
    text: str = ""


@attrs.frozen
class ReopenedReported:
    """A reopened-transaction report: the records of ``producer_id`` at offsets
    ``first_offset..last_offset`` (every one up to ``last_offset`` when not
    ``from_start``) were read under a decision of their transaction that no longer holds."""

    member: int
    partition: int
    producer_id: int
    first_offset: int
    last_offset: int
    step: int
    from_start: bool = True
    app: str = "app"
    text: str = ""

    def covers(self, partition: int, producer_id: int, offset: int) -> bool:
        return (
            partition == self.partition
            and producer_id == self.producer_id
            and offset <= self.last_offset
            and (offset >= self.first_offset or not self.from_start)
        )


@attrs.frozen
class Committing:
    """A producer's commit of these values is under way on the partition: the runner sees a
    real broker's COMMIT marker only once the commit call returns (its :class:`Decided`), and
    a consumer can read the marker before that. A delivery after this event counts as after
    the marker when a :class:`Decided` commit of the value follows."""

    partition: int
    values: frozenset[bytes]
    step: int
    app: str = "*"


@attrs.frozen
class Decided:
    """The transaction coordinator wrote a COMMIT (or ABORT) marker on the partition's leader,
    deciding the records with these values (the runner sees it happen, where the cluster
    lets it: the snapshots between steps can miss a marker an unclean election took away
    before the next one)."""

    partition: int
    commit: bool
    values: frozenset[bytes]
    step: int
    app: str = "*"


@attrs.frozen
class HangingAborted:
    """The application (as an operator would, with ``kafka-transactions.sh abort``) wrote the
    ABORT marker of a reported hanging transaction."""

    member: int
    partition: int
    first_offset: int
    producer_id: int
    step: int
    app: str = "app"


Event = (
    Delivered
    | Reported
    | Seeked
    | Assigned
    | Committed
    | Started
    | Recreated
    | Stalled
    | HangingReported
    | HangingAborted
    | ReopenedReported
    | Committing
    | Decided
)


@attrs.frozen
class LogSnapshot:
    """One partition's leader log: its log start and ``offset -> (epoch, value)`` of its data
    records; with transactions also which of them are transactional (``offset -> producer
    id``), the markers (``offset -> (producer id, commit)``) and the producer ids whose
    transaction the coordinator holds open on the partition (Ongoing, or decided with the
    marker not written yet; None: not known)."""

    log_start: int
    records: Mapping[int, tuple[int, bytes | None]]
    transactional: Mapping[int, int] = attrs.field(factory=dict)
    markers: Mapping[int, tuple[int, bool]] = attrs.field(factory=dict)
    coordinator_open: frozenset[int] | None = None


@attrs.frozen
class TxnView:
    """What a log says of its transactions: the state of each transactional record
    (``committed``, ``aborted`` or ``open``), the first offset of each producer's open
    transaction, and the last stable offset they leave (None: nothing open)."""

    states: Mapping[int, str]
    open_first: Mapping[int, int]

    @property
    def last_stable(self) -> int | None:
        return min(self.open_first.values(), default=None)

    def committed(self, offset: int) -> bool:
        """Whether a read_committed reader gets the record at ``offset`` (plain or
        committed)."""
        return self.states.get(offset, "committed") == "committed"


def txn_view(snap: LogSnapshot) -> TxnView:
    """Walk ``snap`` as a partition leader walks its log (Kafka's ProducerStateManager): per
    producer, the transactional records after its last marker belong to one transaction,
    decided by the next marker."""
    states: dict[int, str] = {}
    ongoing: dict[int, list[int]] = {}
    for o in sorted({*snap.transactional, *snap.markers}):
        marker = snap.markers.get(o)
        if marker is None:
            ongoing.setdefault(snap.transactional[o], []).append(o)
            continue
        pid, commit = marker
        for x in ongoing.pop(pid, ()):
            states[x] = "committed" if commit else "aborted"
    for offsets in ongoing.values():
        for x in offsets:
            states[x] = "open"
    return TxnView(states, {pid: offsets[0] for pid, offsets in ongoing.items()})


@attrs.frozen
class History:
    """What happened in one run. ``snapshots[s][p]`` is partition ``p``'s leader log after
    step ``s`` (None: no leader then); ``final[p]`` after healing."""

    events: tuple[Event, ...]
    snapshots: tuple[Mapping[int, LogSnapshot | None], ...]
    final: Mapping[int, LogSnapshot]
    policy: str = "rewind"
    #: the consumers read committed records only (a run with transactional producers)
    read_committed: bool = False
    #: values written in transactions whose commit the producer saw succeed
    committed_values: frozenset[bytes] = frozenset()


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
    #: the run had transactions: the counters below are judged too
    transactional: bool = False
    aborted_deliveries: int = 0
    committed_losses: int = 0
    unreported_hanging: int = 0
    spurious_hanging: int = 0
    #: for information: hanging reports made, transactions that hung (each needed a
    #: report), and records the producers saw committed that the final log does not hold
    #: as committed (taken by an unclean election, or aborted after their marker was lost)
    hanging_reports: int = 0
    hanging_transactions: int = 0
    committed_lost_by_cluster: int = 0
    #: of the silent and committed losses, records whose transaction was decided again
    #: after its marker was lost (see :data:`DECIDED_AGAIN`) with no reopened-transaction
    #: report naming them
    decided_again: int = 0
    #: for information: reopened-transaction reports made, and the records decided again
    #: that one of them named (not failures: the application was told)
    reopened_reports: int = 0
    decided_again_reported: int = 0

    @property
    def only_decided_again(self) -> bool:
        """Failed, and only with records whose transaction was decided again after its
        marker was lost."""
        return (
            not self.ok
            and self.silent_losses + self.committed_losses == self.decided_again
            and not (
                self.silent_rereads
                or self.spurious_reports
                or self.stalls
                or self.raise_breaches
                or self.aborted_deliveries
                or self.unreported_hanging
                or self.spurious_hanging
            )
        )

    @property
    def ok(self) -> bool:
        return not (
            self.silent_losses
            or self.silent_rereads
            or self.spurious_reports
            or self.stalls
            or self.raise_breaches
            or self.aborted_deliveries
            or self.committed_losses
            or self.unreported_hanging
            or self.spurious_hanging
        )

    def counts(self) -> dict[str, int]:
        """The counters, by name (totals over many runs add these up); those of
        transactions only for a run that had them."""
        out = {
            "silent_losses": self.silent_losses,
            "silent_rereads": self.silent_rereads,
            "spurious_reports": self.spurious_reports,
            "stalls": self.stalls,
            "raise_breaches": self.raise_breaches,
            "delivered": self.delivered,
            "reports": self.reports,
        }
        if self.transactional:
            out |= {
                "aborted_deliveries": self.aborted_deliveries,
                "committed_losses": self.committed_losses,
                "unreported_hanging": self.unreported_hanging,
                "spurious_hanging": self.spurious_hanging,
                "hanging_reports": self.hanging_reports,
                "hanging_transactions": self.hanging_transactions,
                "committed_lost_by_cluster": self.committed_lost_by_cluster,
                "decided_again": self.decided_again,
                "reopened_reports": self.reopened_reports,
                "decided_again_reported": self.decided_again_reported,
            }
        return out

    def describe(self) -> str:
        head = (
            f"silent losses {self.silent_losses}, silent re-reads {self.silent_rereads}, "
            f"spurious reports {self.spurious_reports}, stalls {self.stalls}, raise breaches "
            f"{self.raise_breaches} ({self.delivered} records delivered, {self.reports} reports)"
        )
        if self.transactional:
            head += (
                f"; aborted deliveries {self.aborted_deliveries}, committed losses "
                f"{self.committed_losses}, unreported hanging {self.unreported_hanging}, "
                f"spurious hanging {self.spurious_hanging} ({self.hanging_transactions} hung, "
                f"{self.hanging_reports} hanging reports, {self.committed_lost_by_cluster} "
                "committed records lost by the cluster)"
            )
        return "\n".join([head, *(f"  - {p}" for p in self.problems[:20])])


@attrs.define
class _Held:
    value: bytes
    epoch: int | None
    step: int
    member: int
    #: which start of ``member`` delivered it (:class:`Started` events before)
    life: int = 0
    #: delivered past the last commit before a new session, or past a seek: may come again
    reread_ok: bool = False
    #: past the last acknowledged commit when another consumer (another member, or this one
    #: restarted) took the partition over: its loss is not counted until a commit past it
    orphaned: bool = False
    #: of a topic incarnation since deleted
    old: bool = False
    #: the application's last commit since its delivery is past it
    committed: bool = False


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
    transactional: bool = False
    aborted_deliveries: int = 0
    committed_losses: int = 0
    unreported_hanging: int = 0
    spurious_hanging: int = 0
    hanging_reports: int = 0
    hanging_transactions: int = 0
    committed_lost_by_cluster: int = 0
    decided_again: int = 0
    reopened_reports: int = 0
    decided_again_reported: int = 0

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
            transactional=self.transactional,
            aborted_deliveries=self.aborted_deliveries,
            committed_losses=self.committed_losses,
            unreported_hanging=self.unreported_hanging,
            spurious_hanging=self.spurious_hanging,
            hanging_reports=self.hanging_reports,
            hanging_transactions=self.hanging_transactions,
            committed_lost_by_cluster=self.committed_lost_by_cluster,
            decided_again=self.decided_again,
            reopened_reports=self.reopened_reports,
            decided_again_reported=self.decided_again_reported,
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


class _Transactions:
    """The transaction rules of one judgement (see the module doc), over cached views of the
    snapshots."""

    def __init__(self, history: History, app: str | None) -> None:
        self.history = history
        self.app = app
        self._views: dict[int, TxnView] = {}
        self.reports: list[HangingReported] = []
        self.reopened: list[ReopenedReported] = []
        #: values seen committed (aborted) by a marker as it was written, per partition
        self.committed: dict[int, set[bytes]] = {}
        self.aborted: dict[int, set[bytes]] = {}
        #: values whose commit was under way (:class:`Committing`), per partition
        self.committing: dict[int, set[bytes]] = {}
        #: values any marker of the run committed, per partition
        self._ever_committed: dict[int, set[bytes]] = {}
        for ev in history.events:
            if isinstance(ev, Decided) and ev.commit:
                self._ever_committed.setdefault(ev.partition, set()).update(ev.values)

    def view(self, snap: LogSnapshot) -> TxnView:
        v = self._views.get(id(snap))
        if v is None:
            v = self._views[id(snap)] = txn_view(snap)
        return v

    def _window(self, partition: int, last: int) -> list[LogSnapshot]:
        """The partition's snapshots of steps ``0..last`` (the final log past the last
        step), those with a leader."""
        snaps = self.history.snapshots
        out = [snap for s in snaps[: last + 1] if (snap := s.get(partition)) is not None]
        final = self.history.final.get(partition)
        if last >= len(snaps) and final is not None:
            out.append(final)
        return out

    def aborted_delivery(self, ev: Delivered) -> str | None:
        """Why ``ev`` delivered a record read_committed readers never had, or None. Judged
        on the snapshots up to the one after the delivery, and on the markers seen written
        before it: a record shown committed in any of them (or never shown at its offset)
        is not held against the client."""
        if ev.value in self.committed.get(ev.partition, ()):
            return None
        if ev.value in self.committing.get(ev.partition, ()) and ev.value in (
            self._ever_committed.get(ev.partition, ())
        ):
            return None  # read the marker before the commit call returned
        seen_uncommitted = ""
        for snap in self._window(ev.partition, ev.step + 1):
            held = snap.records.get(ev.offset)
            if held is None or held[1] != ev.value:
                continue
            state = self.view(snap).states.get(ev.offset, "committed")
            if state == "committed":
                return None
            seen_uncommitted = state
        if not seen_uncommitted:
            return None
        return (
            f"p{ev.partition} offset {ev.offset} ({ev.value!r}) delivered at step {ev.step} "
            f"(member {ev.member}) but its transaction was {seen_uncommitted} in every "
            "snapshot up to then"
        )

    def decided_otherwise(self, partition: int, offset: int, value: bytes | None, now: str) -> str:
        """`` (aborted at step 4, ...)`` when a snapshot showed the record decided otherwise
        than ``now``: its marker was lost and the producer's next marker decided its range
        again (what the consumer cannot tell from a truncation report, which names only the
        offsets from the marker on). The text contains :data:`DECIDED_AGAIN`."""
        for state, seen in (("committed", self.committed), ("aborted", self.aborted)):
            if state != now and value in seen.get(partition, ()):
                return f" ({state} when its marker was written: {DECIDED_AGAIN})"
        for step, snaps in enumerate(self.history.snapshots):
            snap = snaps.get(partition)
            if snap is None:
                continue
            held = snap.records.get(offset)
            if held is None or held[1] != value:
                continue
            state = self.view(snap).states.get(offset, "committed")
            if state in ("committed", "aborted") and state != now:
                return f" ({state} at step {step}: {DECIDED_AGAIN})"
        return ""

    def covered(self, partition: int, producer_id: int, offset: int) -> bool:
        """Whether a hanging report names ``producer_id``'s transaction at or below
        ``offset`` (a report that could not name the producer covers every one)."""
        return any(
            r.partition == partition
            and r.first_offset <= offset
            and r.producer_id in (producer_id, None)
            for r in self.reports
        )

    def told_reopened(self, partition: int, producer_id: int, offset: int) -> bool:
        """Whether a reopened-transaction report names ``producer_id``'s record at
        ``offset``."""
        return any(r.covers(partition, producer_id, offset) for r in self.reopened)

    def spurious(self, ev: HangingReported) -> bool:
        """Whether ``ev`` named a transaction that was only long: from the report back to
        where the log began showing it open from ``first_offset``, the coordinator held the
        producer's transaction open in every snapshot, and no snapshot ever showed the
        record at ``first_offset`` decided (a transaction decided once and open again lost
        its marker: it hangs, whatever the producer does next)."""
        if ev.producer_id is None:
            return False
        window = self._window(ev.partition, ev.step)
        known = False
        value: bytes | None = None
        for snap in reversed(window):
            if self.view(snap).open_first.get(ev.producer_id) != ev.first_offset:
                break  # not open from there before this: the stall began after
            if snap.coordinator_open is None or ev.producer_id not in snap.coordinator_open:
                return False  # unknown, or hanging then: the report may be right
            known = True
            value = snap.records.get(ev.first_offset, (0, None))[1]
        if not known:
            return False
        for snap in window:
            held = snap.records.get(ev.first_offset)
            if (
                held is not None
                and held[1] == value
                and self.view(snap).states.get(ev.first_offset) in ("committed", "aborted")
            ):
                return False
        return True

    def hung(self) -> dict[tuple[int, int], int]:
        """The transactions that needed a report: open in the final log while the coordinator
        holds nothing open for the producer there, or aborted by any application after its
        report. ``(partition, producer id) -> first offset``."""
        out: dict[tuple[int, int], int] = {}
        for p, final in self.history.final.items():
            for pid, first in self.view(final).open_first.items():
                if final.coordinator_open is None or pid not in final.coordinator_open:
                    out[(p, pid)] = first
        for ev in self.history.events:
            if isinstance(ev, HangingAborted):
                out.setdefault((ev.partition, ev.producer_id), ev.first_offset)
        return out

    def committed_lost_by_cluster(self, floors: Mapping[int, int]) -> int:
        """Values the producers saw committed that the final log does not hold as committed
        (above the retention floor)."""
        where: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset), last seen
        for snaps in self.history.snapshots:
            for p, snap in snaps.items():
                if snap is None:
                    continue
                for o, (_epoch, value) in snap.records.items():
                    if value is not None:
                        where[value] = (p, o)
        lost = 0
        for value in self.history.committed_values:
            at = where.get(value)
            if at is None:
                continue
            p, o = at
            final = self.history.final.get(p)
            if final is None or o < floors.get(p, 0):
                continue
            held = final.records.get(o)
            if held is None or held[1] != value or not self.view(final).committed(o):
                lost += 1
        return lost


def _named(got: Mapping[int, tuple[bytes, int]], report: Reported) -> list[int]:
    """The offsets received that ``report`` says are gone: with a divergence, the record at
    it must be gone; without, some record received in the range must be."""
    start = report.divergence if report.divergence is not None else 0
    end = report.consumed_to
    named = sorted(o for o in got if o >= start and (end is None or o < end))
    return named[:1] if report.divergence is not None else named


def _any_gone(
    snaps: Sequence[Mapping[int, LogSnapshot | None]],
    report: Reported,
    got: Mapping[int, tuple[bytes, int]],
    offsets: list[int],
) -> bool:
    return any(
        _gone(snaps, report.partition, o, got[o][0], got[o][1], report.step + 1) for o in offsets
    )


def _read_since(held: _Held, report: Reported) -> bool:
    """Whether ``held`` was read, and committed, in a later epoch than anything ``report``
    names: another member read the new log at those offsets and the application committed
    past them (a member given back a partition reports what it read before the election,
    not what the group read and committed since). Not committed, it may come again."""
    return (
        held.committed
        and report.consumed_epoch is not None
        and held.epoch is not None
        and held.epoch > report.consumed_epoch
    )


def _is_record(held: _Held, record: tuple[int, bytes | None] | None) -> bool:
    """Whether ``held`` is the log's ``record`` at its offset (``(epoch, value)``; None: the
    log has nothing there)."""
    return (
        record is not None
        and record[1] == held.value
        and (held.epoch is None or record[0] == held.epoch)
    )


def judge(history: History, app: str | None = None) -> Verdict:
    """Judge one application's events (``app``; default: every event)."""
    t = _Tally(transactional=history.read_committed)
    txns = _Transactions(history, app) if history.read_committed else None
    view: dict[int, dict[int, _Held]] = {}
    committed: dict[int, int] = {}
    awaiting_seek: set[tuple[int, int]] = set()
    #: the last record delivered at each offset, per partition: (value, step)
    ever: dict[int, dict[int, tuple[bytes, int]]] = {}
    #: the same per member and partition: what each member itself received
    ever_own: dict[tuple[int, int], dict[int, tuple[bytes, int]]] = {}
    snaps = history.snapshots
    #: how many times each member started before (its current life)
    lives: dict[int, int] = {}
    for ev in history.events:
        if app is not None and ev.app not in (app, "*"):
            continue
        if isinstance(ev, Started):
            lives[ev.member] = lives.get(ev.member, -1) + 1
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
        if isinstance(ev, HangingReported):
            t.hanging_reports += 1
            if txns is not None:
                txns.reports.append(ev)
                if txns.spurious(ev):
                    t.spurious_hanging += 1
                    t.problems.append(
                        f"spurious hanging report on p{ev.partition} at step {ev.step}: "
                        f"producer {ev.producer_id} from offset {ev.first_offset}, whose "
                        "transaction the coordinator held open all along; "
                        f"{ev.text}"
                    )
            continue
        if isinstance(ev, HangingAborted):
            continue
        if isinstance(ev, ReopenedReported):
            t.reopened_reports += 1
            if txns is not None:
                txns.reopened.append(ev)
            continue
        if isinstance(ev, Committing):
            if txns is not None:
                txns.committing.setdefault(ev.partition, set()).update(ev.values)
            continue
        if isinstance(ev, Decided):
            if txns is not None:
                seen = txns.committed if ev.commit else txns.aborted
                seen.setdefault(ev.partition, set()).update(ev.values)
            continue
        if isinstance(ev, Delivered):
            t.delivered += 1
            if txns is not None:
                why = txns.aborted_delivery(ev)
                if why is not None:
                    t.aborted_deliveries += 1
                    t.problems.append(why)
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
            held[ev.offset] = _Held(ev.value, ev.epoch, ev.step, ev.member, lives.get(ev.member, 0))
            ever.setdefault(ev.partition, {})[ev.offset] = (ev.value, ev.step)
            ever_own.setdefault((ev.member, ev.partition), {})[ev.offset] = (ev.value, ev.step)
        elif isinstance(ev, Reported):
            t.reports += 1
            start = ev.divergence if ev.divergence is not None else 0
            end = ev.consumed_to
            for o in [o for o, h in held.items() if h.old]:
                del held[o]  # told: the topic it held them from is gone
            in_range = sorted(o for o in held if o >= start and (end is None or o < end))
            # Judged on the last record delivered at each offset, held or already dropped by
            # an earlier report: a restart from a commit older than that report validates
            # again and may repeat it (real, if redundant). Judged also on what the reporting
            # member received itself: given back a partition it read before, it reports the
            # records it had that are gone, even when another member has since reported them
            # and received their replacements (real, if redundant). Spurious when neither
            # shows a record gone.
            got = ever.get(ev.partition, {})
            own = ever_own.get((ev.member, ev.partition), {})
            candidates = _named(got, ev)
            real = _any_gone(snaps, ev, got, candidates) or _any_gone(
                snaps, ev, own, _named(own, ev)
            )
            if candidates and not real:
                first = candidates[0]
                t.spurious += 1
                t.problems.append(
                    f"spurious report on p{ev.partition} at step {ev.step} (divergence "
                    f"{ev.divergence}, consumed to {ev.consumed_to}): {got[first][0]!r} at "
                    f"{first} was in the leader's log from its delivery (step {got[first][1]}) on; "
                    f"{ev.text}"
                )
            for o in in_range if end is not None else [o for o in held if o >= start]:
                if _read_since(held[o], ev):
                    continue  # written after the truncation the report is about
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
            for o, h in held.items():
                h.committed = o < ev.offset
                if h.committed:
                    h.orphaned = False  # a session that knows of it committed past it
        elif isinstance(ev, Assigned):
            # A new session: what was delivered past the last commit may come again.
            awaiting_seek.discard((ev.member, ev.partition))
            for o in [o for o, h in held.items() if h.old]:
                del held[o]
            # What another consumer delivered past the last commit the application saw land
            # (another member, or this one before a restart) may come again, and this one
            # may start from a commit below it and never know of it: gone, it counts only
            # once a commit past it shows the session knew (the final log's records there
            # must still be delivered). A member given back a partition remembers what it
            # read itself.
            c = committed.get(ev.partition, 0)
            life = lives.get(ev.member, 0)
            for o, h in held.items():
                if o >= c:
                    h.reread_ok = True
                    if h.member != ev.member or h.life != life:
                        h.orphaned = True
    # Retention of an earlier incarnation says nothing about the final topic's log.
    since = max((ev.step + 1 for ev in history.events if isinstance(ev, Recreated)), default=0)
    floors: dict[int, int] = {}
    for p, final in history.final.items():
        floor = floors[p] = max(
            [final.log_start]
            + [
                snap[p].log_start  # type: ignore[union-attr]
                for snap in snaps[since:]
                if snap.get(p) is not None
            ]
        )
        fview = txns.view(final) if txns is not None else None
        stable = fview.last_stable if fview is not None else None
        held = view.get(p, {})
        for o in sorted(held):
            if o < floor:
                continue
            h = held[o]
            f = final.records.get(o)
            if not _is_record(h, f):
                if h.orphaned:
                    continue  # the final record there, if any, is judged as never delivered
                t.losses += 1
                t.problems.append(
                    f"p{p} offset {o}: the application holds {h.value!r} (epoch {h.epoch}, "
                    f"step {h.step}) but the final log has "
                    f"{'nothing' if f is None else f'{f[1]!r} (epoch {f[0]})'}, unreported"
                )
            elif (
                txns is not None
                and fview is not None
                and not h.orphaned
                and not fview.committed(o)
                and not txns.covered(p, final.transactional[o], o)
            ):
                again = txns.decided_otherwise(p, o, h.value, fview.states[o])
                if again and txns.told_reopened(p, final.transactional[o], o):
                    t.decided_again_reported += 1
                    continue
                t.committed_losses += 1
                t.decided_again += bool(again)
                t.problems.append(
                    f"p{p} offset {o}: the application holds {h.value!r} (step {h.step}) "
                    f"but its transaction is {fview.states[o]} in the final log{again}, and no "
                    f"hanging report names producer {final.transactional[o]} at or below it"
                )
        for o, rec in sorted(final.records.items()):
            # An orphaned record the final log replaced tells nothing of its replacement.
            if o < floor or (o in held and (not held[o].orphaned or _is_record(held[o], rec))):
                continue
            if fview is not None and (
                not fview.committed(o) or (stable is not None and o >= stable)
            ):
                continue  # aborted, or behind a transaction still open: not readable
            again = ""
            if txns is not None and o in final.transactional:
                again = txns.decided_otherwise(p, o, final.records[o][1], "committed")
                if again and txns.told_reopened(p, final.transactional[o], o):
                    t.decided_again_reported += 1
                    continue
                t.decided_again += bool(again)
            t.losses += 1
            t.problems.append(
                f"p{p} offset {o} ({final.records[o][1]!r}) of the final log was never "
                f"delivered{again}"
            )
    if txns is not None:
        hung = txns.hung()
        t.hanging_transactions = len(hung)
        for (p, pid), first in sorted(hung.items()):
            if not any(r.partition == p and r.producer_id in (pid, None) for r in txns.reports):
                t.unreported_hanging += 1
                t.problems.append(
                    f"p{p}: the transaction of producer {pid} from offset {first} hung and "
                    "was never reported"
                )
        t.committed_lost_by_cluster = txns.committed_lost_by_cluster(floors)
    return t.verdict()
