"""Reopened transactions: a decision a read_committed consumer acted on, taken back.

An unclean leader election can truncate away a transaction's COMMIT or ABORT marker that
only the old leader had. The new leader then holds the transaction's records without a
marker: the transaction is open again, and the next marker its producer writes on the
partition (the end of its next transaction there, the coordinator's abort of it, an
operator's abort) decides all of it again, perhaps otherwise. Records the consumer
delivered as committed can end up aborted, records it skipped as aborted committed.

A read_committed consumer sees what it needs to tell the application: every
transactional batch it reads (producer id and epoch, offsets, delivered or skipped as
aborted), every control batch (producer id, COMMIT or ABORT), each Fetch answer's
aborted-transaction list, and the divergence point of each truncation it detects. Three
signals come of it, each a :class:`ReopenedTransaction` naming the partition, the producer
and the offsets of the records this consumer acted on:

* ``MARKER_TRUNCATED``, at truncation time: the divergence lies at or below the marker that
  decided a transaction it read (or past its records when it never read the marker), and
  above the transaction's first record: that transaction is open again on the new leader,
  its records below the divergence undecided.
* ``DECIDED_AGAIN``: the producer's next marker on the partition decided such a transaction
  otherwise than the consumer read it (COMMIT of records it skipped, ABORT of records it
  delivered).
* ``ABORTED_LISTED``: a Fetch answer lists an aborted transaction of a producer starting at
  or below records of that producer this consumer delivered as committed (Kafka lists every
  aborted transaction whose range overlaps the fetch, from its first offset to its marker,
  so a fetch past the records still names it): those deliveries were reverted. After a
  truncation found by a session that had read nothing yet (a restart or a new owner of
  the partition validating its committed position), an aborted transaction of the new log
  that began below the divergence point and ends above it is one whose old marker the
  truncation took: records of it an earlier session read, as committed or not, are
  aborted now (``delivered`` is ``None``: this session cannot tell).

Sans-IO, one :class:`TransactionLedger` per partition: the driver hands it each Fetch
answer's transactional batches (:meth:`~TransactionLedger.read`) and each truncation's
divergence point (:meth:`~TransactionLedger.truncated`); both answer the reports to make.
The ledger holds at most ``max_transactions`` decided transactions per partition (the most
recent ones, by marker offset) besides one open transaction per producer: a truncation
deeper than the oldest one it holds cannot name the transactions below, and says so
(:attr:`TransactionLedger.forgotten_below`). Moves of a transaction follow
:data:`TRANSITIONS`, checked at run time.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Sequence
from typing import Any, Final, NamedTuple

import attrs

from epochguard.offsets.errors import InvalidTransitionError

__all__ = [
    "DEFAULT_MAX_TRANSACTIONS",
    "TRANSITIONS",
    "BatchKind",
    "ReopenCause",
    "ReopenedTransaction",
    "TransactionLedger",
    "TxnBatch",
    "TxnState",
    "TxnTrigger",
    "UndecidedTransaction",
]

#: Decided transactions remembered per partition: enough for the tail an unclean election
#: takes on a partition with a few hundred transactions a minute. About 100 bytes each.
DEFAULT_MAX_TRANSACTIONS: Final = 1000

#: Transactions handed over with one committed position, at most: the group keeps a
#: commit's metadata within ``offset.metadata.max.bytes`` (4096 by default).
MAX_HANDED_OVER: Final = 16


class BatchKind(enum.Enum):
    """What a transactional batch of a Fetch answer was to the consumer."""

    DELIVERED = "delivered"  # data records handed to the application (read as committed)
    SKIPPED = "skipped"  # data records skipped: the answer listed their transaction aborted
    COMMIT = "commit"  # a COMMIT marker
    ABORT = "abort"  # an ABORT marker


class TxnBatch(NamedTuple):
    """One transactional batch as the decoder saw it: offsets ``first..last`` (the records
    at or after the fetch offset)."""

    producer_id: int
    producer_epoch: int
    first: int
    last: int
    kind: BatchKind


class TxnState(enum.Enum):
    OPEN = "open"  # records read, no marker read yet (the answer ended before it)
    COMMITTED = "committed"  # its COMMIT marker read
    ABORTED = "aborted"  # its ABORT marker read
    REOPENED = "reopened"  # its marker taken by a truncation: open again on the new leader
    REVERTED = "reverted"  # decided otherwise than read, and reported so: forgotten


class TxnTrigger(enum.Enum):
    COMMIT_READ = "commit_read"
    ABORT_READ = "abort_read"
    MARKER_TRUNCATED = "marker_truncated"  # the divergence lies at or below its marker
    DECIDED_OTHERWISE = "decided_otherwise"  # a marker or an aborted list contradicts it


_S, _T = TxnState, TxnTrigger
#: Every move a transaction can make.
TRANSITIONS: Final[dict[tuple[TxnState, TxnTrigger], TxnState]] = {
    (_S.OPEN, _T.COMMIT_READ): _S.COMMITTED,
    (_S.OPEN, _T.ABORT_READ): _S.ABORTED,
    (_S.OPEN, _T.MARKER_TRUNCATED): _S.REOPENED,
    (_S.OPEN, _T.DECIDED_OTHERWISE): _S.REVERTED,
    (_S.COMMITTED, _T.MARKER_TRUNCATED): _S.REOPENED,
    (_S.COMMITTED, _T.DECIDED_OTHERWISE): _S.REVERTED,
    (_S.ABORTED, _T.MARKER_TRUNCATED): _S.REOPENED,
    (_S.REOPENED, _T.COMMIT_READ): _S.COMMITTED,
    (_S.REOPENED, _T.ABORT_READ): _S.ABORTED,
    (_S.REOPENED, _T.DECIDED_OTHERWISE): _S.REVERTED,
}


class ReopenCause(enum.Enum):
    """Which signal revealed it (see the module doc)."""

    MARKER_TRUNCATED = "marker_truncated"
    DECIDED_AGAIN = "decided_again"
    ABORTED_LISTED = "aborted_listed"


@attrs.frozen
class UndecidedTransaction:
    """Records ``first_offset..last_offset`` of a transaction of ``producer_id`` that a
    reader of the partition read below a position without reading the marker that decides
    them, ``delivered`` as committed or skipped as aborted (its aborted list said so).

    A position committed to a group carries these (``EpochOffset.undecided_transactions``),
    so that the next reader, which starts at that position and reads the marker, can tell
    when it decides them otherwise than they were read: an unclean election that took the
    old marker at exactly the committed offset shows no truncation to anyone."""

    producer_id: int
    producer_epoch: int
    first_offset: int
    last_offset: int
    delivered: bool
    from_start: bool = True

    def to_json(self) -> list[int]:
        return [
            self.producer_id,
            self.producer_epoch,
            self.first_offset,
            self.last_offset,
            int(self.delivered),
            int(self.from_start),
        ]

    @classmethod
    def from_json(cls, data: Any) -> UndecidedTransaction:
        """Parse :meth:`to_json`'s list; ``ValueError`` for anything else."""
        if (
            not isinstance(data, list)
            or len(data) != 6
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in data)
            or data[2] > data[3]
            or data[4] not in (0, 1)
            or data[5] not in (0, 1)
        ):
            raise ValueError(f"not an undecided transaction: {data!r}")
        pid, epoch, first, last, delivered, from_start = data
        return cls(pid, epoch, first, last, bool(delivered), bool(from_start))


@attrs.frozen
class ReopenedTransaction:
    """A transaction on ``tp`` whose decision, as this consumer read it, no longer holds.

    The records of producer ``producer_id`` at offsets ``first_offset..last_offset`` were
    ``delivered`` to the application as committed (``delivered=False``: skipped as
    aborted; ``None``: read by an earlier session, as committed or not). ``now_committed``
    is the new decision (``None``: undecided, the transaction is open again on the
    partition leader: its producer's next marker there decides it).
    ``from_start`` is ``False`` when the consumer began reading inside the transaction:
    records of it before ``first_offset`` (read by an earlier session) share its fate."""

    tp: Any
    producer_id: int
    #: ``None`` when only an aborted-transaction list named it
    producer_epoch: int | None
    first_offset: int
    last_offset: int
    delivered: bool | None
    cause: ReopenCause
    now_committed: bool | None = None
    #: the marker the consumer read (taken by the truncation) or the one deciding again
    marker_offset: int | None = None
    #: the truncation's divergence point, for ``MARKER_TRUNCATED``
    divergence: int | None = None
    from_start: bool = True

    @property
    def was(self) -> str:
        if self.delivered is None:
            return "unknown"
        return "committed" if self.delivered else "aborted"

    @property
    def now(self) -> str:
        if self.now_committed is None:
            return "open"
        return "committed" if self.now_committed else "aborted"

    def covers(self, offset: int) -> bool:
        """Whether the record at ``offset`` (of this producer) is one this report names."""
        return offset <= self.last_offset and (offset >= self.first_offset or not self.from_start)

    def describe(self) -> str:
        where = f"{self.tp.topic}-{self.tp.partition}"
        records = f"offsets {self.first_offset}..{self.last_offset}"
        if not self.from_start:
            records += " (and records of it before, read earlier)"
        did = {
            True: "delivered as committed",
            False: "skipped as aborted",
            None: "read by an earlier session",
        }[self.delivered]
        who = f"producer {self.producer_id}" + (
            "" if self.producer_epoch is None else f" epoch {self.producer_epoch}"
        )
        if self.cause is ReopenCause.MARKER_TRUNCATED:
            return (
                f"{where}: the truncation at offset {self.divergence} took the marker of the "
                f"transaction of {who} that decided {records} ({did}): the transaction is open "
                "again, and its producer's next marker on the partition decides it anew. "
                "Abort it with kafka-transactions.sh abort to keep it aborted, or treat those "
                "records as undecided (see the transactions guide)"
            )
        return (
            f"{where}: the transaction of {who} was decided again, now {self.now}: records at "
            f"{records} were {did}"
            + (
                f" (marker at offset {self.marker_offset})"
                if self.marker_offset is not None
                else ""
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values for a log line."""
        return {
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "was": self.was,
            "now": self.now,
            "cause": self.cause.value,
            "marker_offset": self.marker_offset,
            "divergence": self.divergence,
            "from_start": self.from_start,
        }


@attrs.define
class _Txn:
    """One producer's transaction as this consumer read it."""

    producer_id: int
    producer_epoch: int
    first: int
    last: int
    delivered: bool
    from_start: bool
    state: TxnState = TxnState.OPEN
    marker: int | None = None
    #: REOPENED: the last record read under the decision its lost marker made (records of
    #: the producer read since are read under the new one)
    undecided_last: int | None = None

    def goto(self, trigger: TxnTrigger) -> None:
        target = TRANSITIONS.get((self.state, trigger))
        if target is None:
            raise InvalidTransitionError(
                f"transaction of producer {self.producer_id}: no move from {self.state.value} "
                f"on {trigger.value}"
            )
        self.state = target


class TransactionLedger:
    """One partition's memory of the transactions a read_committed consumer read (see the
    module doc)."""

    __slots__ = (
        "_decided",
        "_inherited_at",
        "_open",
        "_origin",
        "_seen_marker",
        "_told",
        "_unknown_below",
        "forgotten_below",
        "max_transactions",
        "next_offset",
        "tp",
    )

    def __init__(self, tp: Any, max_transactions: int = DEFAULT_MAX_TRANSACTIONS) -> None:
        if max_transactions < 1:
            raise ValueError(f"max_transactions must be positive, got {max_transactions}")
        self.tp = tp
        self.max_transactions = max_transactions
        #: where the next answer continues the reading (None: nothing read yet)
        self.next_offset: int | None = None
        #: markers below this offset were forgotten (the bound): a truncation below it
        #: cannot name every transaction it reopened
        self.forgotten_below = 0
        # Where continuous reading began: a producer whose marker was not read since may
        # have begun its transaction before it.
        self._origin = 0
        self._seen_marker: set[int] = set()
        # The transaction of each producer with no marker read (OPEN or REOPENED).
        self._open: dict[int, _Txn] = {}
        # Decided transactions (COMMITTED or ABORTED), in marker order; bounded.
        self._decided: collections.deque[_Txn] = collections.deque()
        # A truncation found before anything was read: transactions spanning its divergence
        # point were read by an earlier session, and those aborted since are reported once
        # each (producer id, first offset).
        self._unknown_below: int | None = None
        self._told: set[tuple[int, int]] = set()
        # Where the transactions another reader handed over end (:meth:`inherit`), until
        # the first answer.
        self._inherited_at: int | None = None

    def __len__(self) -> int:
        return len(self._open) + len(self._decided)

    def reset(self) -> None:
        """The consumer's position moved somewhere the ledger cannot follow (a seek, a
        reset, a new assignment): forget everything."""
        self._open.clear()
        self._decided.clear()
        self._seen_marker.clear()
        self.next_offset = None
        self.forgotten_below = 0
        self._unknown_below = None
        self._told.clear()
        self._inherited_at = None

    def undecided_below(
        self, offset: int, limit: int = MAX_HANDED_OVER
    ) -> tuple[UndecidedTransaction, ...]:
        """What a reader starting at ``offset`` cannot see: transactions with records
        below it whose marker this consumer has not read, or read at or past it, oldest
        first, at most ``limit``. Nothing for an offset past what this consumer has read:
        markers there it cannot vouch for."""
        if self.next_offset is None or offset > self.next_offset:
            return ()
        txns = [t for t in self._open.values() if t.state is TxnState.OPEN]
        for t in reversed(self._decided):  # in marker order: the newest first
            if t.marker is None or t.marker < offset:
                break
            txns.append(t)
        return tuple(
            UndecidedTransaction(
                t.producer_id,
                t.producer_epoch,
                t.first,
                min(t.last, offset - 1),
                t.delivered,
                t.from_start,
            )
            for t in sorted(txns, key=lambda t: t.first)
            if t.first < offset
        )[:limit]

    def inherit(self, offset: int, txns: Iterable[UndecidedTransaction]) -> None:
        """This consumer starts reading at ``offset``, a position another reader committed
        with the transactions it had read below it undecided (:meth:`undecided_below`): the
        marker this consumer reads for each judges it as if it had read its records."""
        if self.next_offset is not None:
            return  # this consumer has read the partition itself: its own record stands
        for t in txns:
            if t.first_offset < offset and t.producer_id not in self._open:
                self._open[t.producer_id] = _Txn(
                    t.producer_id,
                    t.producer_epoch,
                    t.first_offset,
                    min(t.last_offset, offset - 1),
                    t.delivered,
                    t.from_start,
                )
        self._inherited_at = offset

    def _start(self, fetch_offset: int) -> None:
        """The first answer, at ``fetch_offset``: handed-over transactions hold below it
        (records from it on are read again); past the handed-over position, the markers
        deciding them may lie in the skipped range."""
        self._origin = fetch_offset
        at, self._inherited_at = self._inherited_at, None
        if at is None:
            return
        if fetch_offset > at:
            self._open.clear()
        else:
            self._read_again_from(fetch_offset)

    def _read_again_from(self, offset: int) -> None:
        """Open transactions keep only their records below ``offset``: the rest will be
        read again."""
        for pid, txn in list(self._open.items()):
            if txn.first >= offset:
                del self._open[pid]
            else:
                txn.last = min(txn.last, offset - 1)
                if txn.undecided_last is not None:
                    txn.undecided_last = min(txn.undecided_last, offset - 1)

    def _jump(self, offset: int) -> None:
        """An answer that does not continue the last one: the records from ``offset`` on
        will be read again (backwards), or the ones in between never (forwards)."""
        if self.next_offset is not None and offset < self.next_offset:
            self._origin = min(self._origin, offset)
            self._read_again_from(offset)
            again = [t for t in self._decided if t.marker is not None and t.marker >= offset]
            self._decided = collections.deque(
                t for t in self._decided if t.marker is not None and t.marker < offset
            )
            # Decided at or past ``offset``: their markers will be read again.
            for txn in again:
                if txn.first < offset and txn.producer_id not in self._open:
                    self._open[txn.producer_id] = _Txn(
                        txn.producer_id,
                        txn.producer_epoch,
                        txn.first,
                        min(txn.last, offset - 1),
                        txn.delivered,
                        txn.from_start,
                    )
            return
        # Forwards: markers of the open transactions may lie in the gap.
        self._open.clear()
        self._seen_marker.clear()
        self._origin = offset

    def read(
        self,
        fetch_offset: int,
        batches: Sequence[TxnBatch],
        next_offset: int | None,
        aborted: Iterable[tuple[int, int]] | None = None,
    ) -> list[ReopenedTransaction]:
        """One Fetch answer of the partition, asked at ``fetch_offset``: its transactional
        batches in offset order, where it ends (``next_offset``: the offset after its last
        batch, None if it had none) and its aborted-transaction list (``(producer id, first
        offset)``). Answers the reverted decisions it reveals."""
        if self.next_offset is None:
            self._start(fetch_offset)
        elif fetch_offset != self.next_offset:
            self._jump(fetch_offset)
        out: list[ReopenedTransaction] = []
        for pid, first in aborted or ():
            if first < fetch_offset:
                out += self._aborted_listed(pid, first, fetch_offset)
                found = self._aborted_across(pid, first, fetch_offset)
                if found is not None:
                    out.append(found)
        for b in batches:
            if b.kind is BatchKind.COMMIT or b.kind is BatchKind.ABORT:
                found = self._marker(b)
                if found is not None:
                    out.append(found)
                continue
            txn = self._open.get(b.producer_id)
            delivered = b.kind is BatchKind.DELIVERED
            if txn is None:
                self._open[b.producer_id] = _Txn(
                    b.producer_id,
                    b.producer_epoch,
                    b.first,
                    b.last,
                    delivered,
                    from_start=b.producer_id in self._seen_marker or self._origin == 0,
                )
            elif txn.state is TxnState.OPEN:
                txn.last = b.last
                txn.delivered = txn.delivered or delivered
                txn.producer_epoch = max(txn.producer_epoch, b.producer_epoch)
            else:
                # REOPENED: records the producer added since belong to it on the new leader,
                # read under its new decision: a report of that decision names the earlier
                # ones only, a later truncation all of them.
                txn.last = b.last
        if next_offset is not None:
            self.next_offset = max(next_offset, fetch_offset)
        return out

    def _marker(self, b: TxnBatch) -> ReopenedTransaction | None:
        self._seen_marker.add(b.producer_id)
        txn = self._open.pop(b.producer_id, None)
        if txn is None:
            return None  # a transaction none of whose records this consumer read
        commit = b.kind is BatchKind.COMMIT
        if txn.delivered != commit:
            # Records delivered, then an ABORT (or skipped, then a COMMIT): the marker the
            # consumer went by is gone, and this one decided the transaction otherwise.
            txn.goto(TxnTrigger.DECIDED_OTHERWISE)
            return self._report(txn, ReopenCause.DECIDED_AGAIN, commit, marker=b.first)
        txn.goto(TxnTrigger.COMMIT_READ if commit else TxnTrigger.ABORT_READ)
        txn.marker = b.first
        txn.undecided_last = None
        self._decided.append(txn)
        while len(self._decided) > self.max_transactions:
            gone = self._decided.popleft()
            self.forgotten_below = (gone.marker or 0) + 1
        return None

    def _aborted_listed(self, pid: int, first: int, fetch_offset: int) -> list[ReopenedTransaction]:
        """The answer lists an aborted transaction of ``pid`` from ``first`` (below the fetch
        offset): records of ``pid`` delivered as committed at or after ``first`` were
        reverted."""
        out: list[ReopenedTransaction] = []
        txn = self._open.get(pid)
        if txn is not None and txn.delivered and txn.last >= first:
            del self._open[pid]
            txn.goto(TxnTrigger.DECIDED_OTHERWISE)
            out.append(self._report(txn, ReopenCause.ABORTED_LISTED, False))
        for txn in [t for t in self._decided if t.producer_id == pid]:
            if txn.delivered and txn.last >= first and txn.first < fetch_offset:
                self._decided.remove(txn)
                txn.goto(TxnTrigger.DECIDED_OTHERWISE)
                out.append(self._report(txn, ReopenCause.ABORTED_LISTED, False))
        return out

    def _aborted_across(
        self, pid: int, first: int, fetch_offset: int
    ) -> ReopenedTransaction | None:
        """After a truncation found before anything was read: an aborted transaction from
        below its divergence point to above it lost its old marker to it (see the module
        doc)."""
        below = self._unknown_below
        if below is None or not first < below <= fetch_offset or (pid, first) in self._told:
            return None
        if pid in self._open or any(t.producer_id == pid for t in self._decided):
            return None  # read by this session: the rules above judge it
        self._told.add((pid, first))
        return ReopenedTransaction(
            tp=self.tp,
            producer_id=pid,
            producer_epoch=None,
            first_offset=first,
            last_offset=below - 1,
            delivered=None,
            cause=ReopenCause.ABORTED_LISTED,
            now_committed=False,
            divergence=below,
        )

    def truncated(self, divergence: int) -> list[ReopenedTransaction]:
        """The partition's log diverges from what the consumer read at ``divergence``; it
        reads on from there. Answers the transactions that are open again: those whose
        marker lay at or past the divergence (or was never read) with records below it."""
        out: list[ReopenedTransaction] = []
        if self.next_offset is None:
            self._unknown_below = divergence
            self._start(divergence)
        reopened: dict[int, _Txn] = {}
        for txn in self._decided:
            taken = txn.marker is None or txn.marker >= divergence
            if taken and txn.first < divergence and txn.producer_id not in reopened:
                reopened[txn.producer_id] = txn
        for pid, txn in self._open.items():
            if txn.first < divergence and pid not in reopened:
                reopened[pid] = txn
        self._decided = collections.deque(
            t for t in self._decided if t.marker is not None and t.marker < divergence
        )
        self._open = {}
        for pid, txn in sorted(reopened.items(), key=lambda kv: kv[1].first):
            txn.last = min(txn.last, divergence - 1)
            self._open[pid] = txn
            if txn.state is TxnState.REOPENED:
                # Reported open again already; still undecided.
                txn.undecided_last = min(txn.undecided_last or 0, txn.last)
                continue
            txn.undecided_last = txn.last
            marker = txn.marker if txn.state is not TxnState.OPEN else None
            txn.goto(TxnTrigger.MARKER_TRUNCATED)
            txn.marker = None
            out.append(
                self._report(
                    txn, ReopenCause.MARKER_TRUNCATED, None, marker=marker, divergence=divergence
                )
            )
        self._seen_marker = {pid for pid in self._seen_marker if pid not in reopened}
        self.next_offset = divergence
        return out

    def _report(
        self,
        txn: _Txn,
        cause: ReopenCause,
        now_committed: bool | None,
        *,
        marker: int | None = None,
        divergence: int | None = None,
    ) -> ReopenedTransaction:
        return ReopenedTransaction(
            tp=self.tp,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            first_offset=txn.first,
            last_offset=txn.last if txn.undecided_last is None else txn.undecided_last,
            delivered=txn.delivered,
            cause=cause,
            now_committed=now_committed,
            marker_offset=marker,
            divergence=divergence,
            from_start=txn.from_start,
        )
