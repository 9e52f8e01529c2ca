"""The transaction coordinator of the EmbeddedCluster, sans-IO (Kafka's ``TransactionCoordinator``).

One :class:`TransactionCoordinator` per cluster keeps every transactional id's producer id,
epoch, state and the partitions and groups of its open transaction. It follows Kafka's
transaction protocol without the ``__transaction_state`` log (its state survives broker
restarts, as Kafka's does through that log):

- ``InitProducerId`` hands out a producer id and bumps the epoch on every call, fencing
  older instances; an open transaction is aborted first (the caller is told
  CONCURRENT_TRANSACTIONS and retries, as from Kafka, and ends two epochs later).
- ``EndTxn`` moves to PrepareCommit / PrepareAbort and writes a COMMIT / ABORT marker to
  every partition of the transaction through :class:`Participants`; a partition without a
  leader (or below min ISR) keeps its marker pending and :meth:`tick` retries it. Once every
  marker is written the group offsets of the transaction are committed or dropped and the
  state is CompleteCommit / CompleteAbort.
- :meth:`tick` also aborts a transaction open longer than its timeout, bumping the epoch so
  the producer is fenced (Kafka's ``abortTimedOutTransactions``).

Every call takes ``now_ms`` (wall-clock milliseconds: DescribeTransactions reports start
times); nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Protocol

import attrs

from epochguard._errors import ErrorCode
from epochguard._log import get_logger

log = get_logger("epochguard.testing.embedded")

#: Kafka's ``transaction.max.timeout.ms`` default.
MAX_TRANSACTION_TIMEOUT_MS = 900_000
#: An epoch at this value is exhausted: the next bump takes a new producer id (Kafka's rule).
MAX_PRODUCER_EPOCH = 32_766
#: The coordinator epoch written in markers: this coordinator never moves between leaders
#: of a ``__transaction_state`` partition, so it stays that of a fresh Kafka cluster.
COORDINATOR_EPOCH = 0

TopicPartition = tuple[str, int]


class TxnState(enum.Enum):
    """Kafka's names, as ListTransactions and DescribeTransactions report them."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


_PREPARING = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


class Participants(Protocol):
    """What the coordinator needs from the rest of the cluster."""

    def new_producer_id(self) -> int: ...

    def partition_exists(self, topic: str, partition: int) -> bool: ...

    def write_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> bool:
        """Append the marker on the partition's leader; False to retry later."""
        ...

    def end_group_transaction(self, group_id: str, producer_id: int, commit: bool) -> None: ...


@attrs.define(eq=False)
class Transaction:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = attrs.field(factory=set)
    groups: set[str] = attrs.field(factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    #: Partitions whose marker is not written yet (PrepareCommit / PrepareAbort).
    pending_markers: set[TopicPartition] = attrs.field(factory=set)


@attrs.frozen
class InitResult:
    error: int
    producer_id: int = -1
    producer_epoch: int = -1


class TransactionCoordinator:
    def __init__(
        self,
        participants: Participants,
        max_timeout_ms: int = MAX_TRANSACTION_TIMEOUT_MS,
    ) -> None:
        self.participants = participants
        self.max_timeout_ms = max_timeout_ms
        self.transactions: dict[str, Transaction] = {}
        self._by_producer_id: dict[int, Transaction] = {}

    # -- InitProducerId --------------------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        now_ms: int,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> InitResult:
        if not transactional_id:
            return InitResult(ErrorCode.INVALID_REQUEST)
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        txn = self.transactions.get(transactional_id)
        if txn is None:
            pid = self.participants.new_producer_id()
            txn = Transaction(transactional_id, pid, 0, timeout_ms, last_update_ms=now_ms)
            self.transactions[transactional_id] = txn
            self._by_producer_id[pid] = txn
            log.info(
                "transactional_id_initialised",
                transactional_id=transactional_id,
                producer_id=pid,
                producer_epoch=0,
            )
            return InitResult(ErrorCode.NONE, pid, 0)
        if producer_id >= 0 and (
            producer_id != txn.producer_id or producer_epoch != txn.producer_epoch
        ):
            # KIP-360: a producer re-initialising with an id and epoch that are not the
            # current ones was fenced by a newer instance.
            return InitResult(ErrorCode.PRODUCER_FENCED)
        if txn.state in _PREPARING:
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if txn.state is TxnState.ONGOING:
            self._fence_and_abort(txn, now_ms, reason="producer_reinitialised")
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        self._bump_epoch(txn)
        txn.timeout_ms = timeout_ms
        txn.state = TxnState.EMPTY
        txn.start_ms = -1
        txn.last_update_ms = now_ms
        log.info(
            "transactional_id_initialised",
            transactional_id=transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
        )
        return InitResult(ErrorCode.NONE, txn.producer_id, txn.producer_epoch)

    def _bump_epoch(self, txn: Transaction) -> None:
        if txn.producer_epoch >= MAX_PRODUCER_EPOCH:
            del self._by_producer_id[txn.producer_id]
            txn.producer_id = self.participants.new_producer_id()
            txn.producer_epoch = 0
            self._by_producer_id[txn.producer_id] = txn
        else:
            txn.producer_epoch += 1

    # -- checks shared by the transaction APIs ---------------------------------------------

    def _current(self, transactional_id: str, producer_id: int, producer_epoch: int) -> int:
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if txn.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        return ErrorCode.NONE

    def _begin(self, txn: Transaction, now_ms: int) -> None:
        if txn.state is not TxnState.ONGOING:
            txn.state = TxnState.ONGOING
            txn.start_ms = now_ms
            txn.partitions.clear()
            txn.groups.clear()
        txn.last_update_ms = now_ms

    # -- AddPartitionsToTxn / AddOffsetsToTxn ----------------------------------------------

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
    ) -> dict[TopicPartition, int]:
        wanted = list(partitions)
        error = self._current(transactional_id, producer_id, producer_epoch)
        txn = self.transactions.get(transactional_id)
        if not error and txn is not None and txn.state in _PREPARING:
            error = ErrorCode.CONCURRENT_TRANSACTIONS
        if error:
            return dict.fromkeys(wanted, error)
        assert txn is not None
        unknown = {tp for tp in wanted if not self.participants.partition_exists(*tp)}
        if unknown:
            return {
                tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                for tp in wanted
            }
        self._begin(txn, now_ms)
        txn.partitions.update(wanted)
        return dict.fromkeys(wanted, ErrorCode.NONE)

    def add_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        now_ms: int,
    ) -> int:
        error = self._current(transactional_id, producer_id, producer_epoch)
        txn = self.transactions.get(transactional_id)
        if not error and txn is not None and txn.state in _PREPARING:
            error = ErrorCode.CONCURRENT_TRANSACTIONS
        if error:
            return error
        assert txn is not None
        self._begin(txn, now_ms)
        txn.groups.add(group_id)
        return ErrorCode.NONE

    def offset_commit_error(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> int:
        """Whether a TxnOffsetCommit belongs to the open transaction (KIP-890 verification)."""
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if txn.producer_epoch != producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if txn.state is not TxnState.ONGOING or group_id not in txn.groups:
            return ErrorCode.INVALID_TXN_STATE
        return ErrorCode.NONE

    def produce_error(self, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int:
        """Whether a transactional batch may be appended to ``tp`` (KIP-890 verification)."""
        txn = self._by_producer_id.get(producer_id)
        if txn is None:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if producer_epoch != txn.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if txn.state is not TxnState.ONGOING or tp not in txn.partitions:
            return ErrorCode.INVALID_TXN_STATE
        return ErrorCode.NONE

    # -- EndTxn ----------------------------------------------------------------------------

    def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> int:
        error = self._current(transactional_id, producer_id, producer_epoch)
        if error:
            return error
        txn = self.transactions[transactional_id]
        state = txn.state
        if state is TxnState.ONGOING:
            self._prepare_end(txn, commit, now_ms)
            return ErrorCode.NONE
        done, preparing = (
            (TxnState.COMPLETE_COMMIT, TxnState.PREPARE_COMMIT)
            if commit
            else (TxnState.COMPLETE_ABORT, TxnState.PREPARE_ABORT)
        )
        if state is done:
            return ErrorCode.NONE  # a retried EndTxn
        if state is preparing:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return ErrorCode.INVALID_TXN_STATE

    def _prepare_end(self, txn: Transaction, commit: bool, now_ms: int) -> None:
        txn.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        txn.pending_markers = set(txn.partitions)
        txn.last_update_ms = now_ms
        self._write_markers(txn, now_ms)

    def _fence_and_abort(self, txn: Transaction, now_ms: int, reason: str) -> None:
        """Abort ``txn`` under a bumped epoch, so its producer can no longer write."""
        self._bump_epoch(txn)
        log.info(
            "transaction_aborted_by_coordinator",
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            reason=reason,
        )
        self._prepare_end(txn, False, now_ms)

    def _write_markers(self, txn: Transaction, now_ms: int) -> None:
        commit = txn.state is TxnState.PREPARE_COMMIT
        for topic, partition in sorted(txn.pending_markers):
            written = self.participants.write_marker(
                topic, partition, txn.producer_id, txn.producer_epoch, commit
            )
            if written:
                txn.pending_markers.discard((topic, partition))
        if txn.pending_markers:
            return
        for group_id in sorted(txn.groups):
            self.participants.end_group_transaction(group_id, txn.producer_id, commit)
        txn.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        txn.partitions.clear()
        txn.groups.clear()
        txn.last_update_ms = now_ms
        log.info(
            "transaction_completed",
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            result="commit" if commit else "abort",
        )

    # -- time ------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Retry pending markers and abort transactions open longer than their timeout."""
        for txn in list(self.transactions.values()):
            if txn.state in _PREPARING:
                self._write_markers(txn, now_ms)
            elif txn.state is TxnState.ONGOING and now_ms - txn.start_ms > txn.timeout_ms:
                self._fence_and_abort(txn, now_ms, reason="timed_out")

    # -- admin -----------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> Transaction | None:
        return self.transactions.get(transactional_id)

    def by_producer_id(self, producer_id: int) -> Transaction | None:
        return self._by_producer_id.get(producer_id)
