"""Transactional producers for chaos runs, and what the oracle reads of transactions in a log.

A run with ``Schedule.transactions`` producers applies :class:`~.schedule.TxnProduce` and
:class:`~.schedule.TxnEnd` through a :class:`TxnDriver`:

* :class:`EmbeddedTransactions` drives the EmbeddedCluster's transaction coordinator from
  the runner's thread, on the cluster's loop, as a transactional client would over the wire
  (InitProducerId, AddPartitionsToTxn, a transactional Produce with the broker's checks,
  EndTxn): steps apply at once, the same way on every replay, and faults aimed at
  consumers' requests do not hit the producers. The coordinator aborts transactions left
  open longer than their timeout, fencing their producer; the next write initialises it
  again, as an application does after ``ProducerFencedError``.
* :class:`KafkaPythonTransactions` uses kafka-python's ``KafkaProducer`` with a
  ``transactional_id`` (real Kafka; any cluster). Every blocking call is bounded: a
  producer that does not answer in time is abandoned and a new one is made.

Both remember which values went into transactions whose commit the producer saw succeed
(``committed_values``, for the oracle's figures), tell the runner which records each
decision covers (``on_decided``: every marker the EmbeddedCluster's coordinator writes, as it
writes it; on real Kafka, each commit or abort the producer saw succeed), and, before the
run's end, wait until the coordinator holds no transaction open (:meth:`TxnDriver.settle`):
after that, a transaction still open in a log is hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import attrs

from epochguard._errors import ErrorCode
from epochguard._log import get_logger

__all__ = [
    "CONSUMER_TXN_MAX_TIMEOUT_MS",
    "TXN_TIMEOUT_MS",
    "EmbeddedTransactions",
    "KafkaPythonTransactions",
    "TxnDriver",
    "coordinator_open",
    "read_batches",
    "settle_markers",
]

log = get_logger("epochguard.testing.chaos")

#: The EmbeddedCluster's ``transaction.max.timeout.ms`` in a transactional run, and every
#: producer's transaction timeout: a transaction left open is aborted within the run.
TXN_TIMEOUT_MS = 1000
#: What the consumers are told the brokers' ``transaction.max.timeout.ms`` is: above
#: :data:`TXN_TIMEOUT_MS` by the coordinator's abort latency (its timer, a marker that waits
#: for a leader), so that a transaction that is only long is never reported as hanging. Four
#: times over: on a loaded machine (load average 20 on 2 cores) the coordinator's timer and
#: the consumers' polls run late, and at twice the timeout live transactions were reported.
CONSUMER_TXN_MAX_TIMEOUT_MS = 4000

_FENCED = (
    ErrorCode.PRODUCER_FENCED,
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING,
)

T = TypeVar("T")


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


class TxnDriver(Protocol):
    """What the runner asks of a run's transactional producers."""

    committed_values: set[bytes]

    def produce(self, producer: int, partition: int, values: list[bytes]) -> str:
        """Write ``values`` in ``producer``'s open transaction (begun if none is); a line
        for the step log."""
        ...

    def end(self, producer: int, commit: bool) -> str:
        """Commit or abort ``producer``'s open transaction; a line for the step log."""
        ...

    def settle(self, timeout: float) -> str:
        """Wait until the coordinator holds no transaction of the run open (those left
        open time out); a line for the step log."""
        ...

    def close(self) -> None: ...


# -- what the oracle reads of a log ---------------------------------------------------------


@attrs.frozen
class LogContents:
    """One partition log's records as the oracle's :class:`~.oracle.LogSnapshot` holds
    them."""

    records: dict[int, tuple[int, bytes | None]]
    transactional: dict[int, int]
    markers: dict[int, tuple[int, bool]]


def read_batches(batches: Iterable[Any], below: int | None = None) -> LogContents:
    """Data records (``offset -> (batch epoch, value)``), which of them are transactional
    (``offset -> producer id``) and the transaction markers (``offset -> (producer id,
    commit)``) of kafka-python ``DefaultRecordBatch`` objects, offsets below ``below``."""
    records: dict[int, tuple[int, bytes | None]] = {}
    transactional: dict[int, int] = {}
    markers: dict[int, tuple[int, bool]] = {}
    for batch in batches:
        control = batch.is_control_batch
        txn = batch.is_transactional
        for rec in batch:
            if below is not None and rec.offset >= below:
                break
            if control:
                markers[rec.offset] = (batch.producer_id, bool(rec.commit))
                continue
            records[rec.offset] = (batch.leader_epoch, rec.value)
            if txn:
                transactional[rec.offset] = batch.producer_id
    return LogContents(records, transactional, markers)


def coordinator_open(state: Any, topic: str) -> dict[int, frozenset[int]]:
    """Per partition of ``topic``, the producer ids whose transaction the EmbeddedCluster's
    coordinator holds open there (Ongoing, or decided with the marker not written yet).
    Call on the cluster's loop."""
    from epochguard.testing.embedded.transactions import TransactionCoordinator, TxnState

    coord = state.transactions
    out: dict[int, set[int]] = {}
    if isinstance(coord, TransactionCoordinator):
        for txn in coord.transactions.values():
            if txn.state is TxnState.ONGOING:
                parts = txn.partitions
            elif txn.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                parts = txn.pending_markers
            else:
                continue
            for t, p in parts:
                if t == topic:
                    out.setdefault(p, set()).add(txn.producer_id)
    return {p: frozenset(pids) for p, pids in out.items()}


def settle_markers(state: Any) -> None:
    """Let the EmbeddedCluster's coordinator write the markers it can write now (what its
    timer does every 0.1 s). Call on the cluster's loop."""
    from epochguard.testing.embedded.handlers._txn_common import wall_ms
    from epochguard.testing.embedded.transactions import TransactionCoordinator

    coord = state.transactions
    if isinstance(coord, TransactionCoordinator):
        coord.tick(wall_ms())


# -- the EmbeddedCluster's coordinator, driven in process -----------------------------------


@attrs.define
class _Producer:
    transactional_id: str
    producer_id: int = -1
    epoch: int = -1
    #: values written in the open transaction (empty: none open)
    values: list[bytes] = attrs.Factory(list)
    #: the next sequence number per partition (idempotence, per producer epoch)
    sequences: dict[int, int] = attrs.Factory(dict)

    def reset(self) -> None:
        """Fenced: the next write initialises a new instance."""
        self.producer_id = self.epoch = -1
        self.values = []
        self.sequences = {}


#: ``(partition, commit, values)``: a marker was written on the partition's leader, deciding
#: the records of these values.
OnDecided = Callable[[int, bool, frozenset[bytes]], None]


def _by_partition(written: list[tuple[int, bytes]]) -> list[tuple[int, frozenset[bytes]]]:
    """``(partition, value)`` pairs grouped: each partition with its values, in order."""
    out: dict[int, set[bytes]] = {}
    for partition, value in written:
        out.setdefault(partition, set()).add(value)
    return [(p, frozenset(out[p])) for p in sorted(out)]


@attrs.frozen
class _WatchedParticipants:
    """The coordinator's :class:`~epochguard.testing.embedded.transactions.Participants`,
    telling ``on_decided`` which records each marker it writes on ``topic`` decides."""

    inner: Any
    state: Any
    topic: str
    on_decided: OnDecided

    def new_producer_id(self) -> int:
        pid: int = self.inner.new_producer_id()
        return pid

    def partition_exists(self, topic: str, partition: int) -> bool:
        return bool(self.inner.partition_exists(topic, partition))

    def end_group_transaction(self, group_id: str, producer_id: int, commit: bool) -> None:
        self.inner.end_group_transaction(group_id, producer_id, commit)

    def write_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> bool:
        log_ = self._leader_log(topic, partition)
        end = log_.log_end_offset if log_ is not None else -1
        decided = self._open_values(log_, producer_id) if log_ is not None else frozenset()
        written = bool(
            self.inner.write_marker(topic, partition, producer_id, producer_epoch, commit)
        )
        if written and log_ is not None and log_.log_end_offset > end:
            self.on_decided(partition, commit, decided)
        return written

    def _leader_log(self, topic: str, partition: int) -> Any:
        if topic != self.topic:
            return None
        t = self.state.topics.get(topic)
        p = t.partitions.get(partition) if t is not None else None
        if p is None or p.leader is None:
            return None
        return p.logs[p.leader]

    @staticmethod
    def _open_values(log_: Any, producer_id: int) -> frozenset[bytes]:
        from kafka.record.default_records import DefaultRecordBatch

        entry = log_.producer(producer_id)
        if entry is None or entry.txn_first_offset < 0:
            return frozenset()
        values: set[bytes] = set()
        for raw in log_.batches_from(entry.txn_first_offset):
            batch = DefaultRecordBatch(raw)
            if batch.producer_id == producer_id and not batch.is_control_batch:
                values.update(rec.value for rec in batch if rec.value is not None)
        return frozenset(values)


class EmbeddedTransactions:
    """:class:`TxnDriver` on an EmbeddedCluster's own transaction coordinator (see the
    module doc). ``on_decided`` hears of every marker the coordinator writes on ``topic``,
    as it is written."""

    def __init__(
        self,
        cluster: Any,
        topic: str,
        producers: int,
        timeout_ms: int = TXN_TIMEOUT_MS,
        on_decided: OnDecided | None = None,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.timeout_ms = timeout_ms
        self.on_decided = on_decided
        self.producers = [_Producer(f"chaos-tx-{i}") for i in range(producers)]
        self.committed_values: set[bytes] = set()

    def _coordinator(self) -> Any:
        from epochguard.testing.embedded.handlers._txn_common import transaction_coordinator

        coord = transaction_coordinator(self.cluster.state)
        if self.on_decided is not None and not isinstance(coord.participants, _WatchedParticipants):
            coord.participants = _WatchedParticipants(
                coord.participants, self.cluster.state, self.topic, self.on_decided
            )
        return coord

    def _init(self, coord: Any, prod: _Producer, now: int) -> int:
        result = coord.init_producer_id(prod.transactional_id, self.timeout_ms, now)
        if result.error == ErrorCode.CONCURRENT_TRANSACTIONS:
            # An open transaction of a former instance was aborted just now; its markers
            # are written unless a partition has no leader (then: busy, try later).
            result = coord.init_producer_id(prod.transactional_id, self.timeout_ms, now)
        if result.error:
            return int(result.error)
        prod.reset()
        prod.producer_id, prod.epoch = result.producer_id, result.producer_epoch
        return ErrorCode.NONE

    def produce(self, producer: int, partition: int, values: list[bytes]) -> str:
        from epochguard.testing.embedded.handlers._txn_common import wall_ms

        prod = self.producers[producer]
        tp = (self.topic, partition)

        def do() -> str:
            state = self.cluster.state
            p = state.partition(self.topic, partition)
            if p.leader is None:
                return "no leader"
            coord = self._coordinator()
            now = wall_ms()
            if prod.producer_id < 0 and (error := self._init(coord, prod, now)):
                return f"InitProducerId: {_error_name(error)}"
            error = coord.add_partitions(
                prod.transactional_id, prod.producer_id, prod.epoch, [tp], now
            )[tp]
            if error in _FENCED:
                # The coordinator aborted the open transaction (its timeout): a new instance.
                prod.reset()
                if error := self._init(coord, prod, now):
                    return f"fenced; InitProducerId: {_error_name(error)}"
                error = coord.add_partitions(
                    prod.transactional_id, prod.producer_id, prod.epoch, [tp], now
                )[tp]
            if error:
                return f"AddPartitionsToTxn: {_error_name(error)}"
            leader_log = p.logs[p.leader]
            entry = leader_log.producer(prod.producer_id)
            if entry is not None and prod.epoch < entry.epoch:
                return "Produce: INVALID_PRODUCER_EPOCH"
            error = coord.produce_error(prod.producer_id, prod.epoch, tp)
            if error:
                return f"Produce: {_error_name(error)}"
            if len(p.isr) < state.topics[self.topic].min_insync_replicas:
                return "Produce: NOT_ENOUGH_REPLICAS"  # acks=all, as transactions require
            seq = prod.sequences.get(partition, 0)
            batch = _transactional_batch(values, prod.producer_id, prod.epoch, seq)
            base, last = state.append(p, p.leader, batch, p.leader_epoch)
            prod.sequences[partition] = seq + len(values)
            prod.values += values
            return (
                f"{values[0]!r}..{values[-1]!r} at {base}..{last}, producer "
                f"{prod.producer_id} epoch {prod.epoch}"
            )

        result: str = self.cluster.call(do)
        return result

    def end(self, producer: int, commit: bool) -> str:
        from epochguard.testing.embedded.handlers._txn_common import wall_ms

        prod = self.producers[producer]
        if not prod.values:
            return "none open"

        def do() -> str:
            error = self._coordinator().end_transaction(
                prod.transactional_id, prod.producer_id, prod.epoch, commit, wall_ms()
            )
            if error in _FENCED:
                written = len(prod.values)
                prod.reset()
                return f"fenced: the coordinator had aborted it ({written} records)"
            if error:
                return f"EndTxn: {_error_name(error)}"
            if commit:
                self.committed_values.update(prod.values)
            written = len(prod.values)
            prod.values = []
            return f"{'committed' if commit else 'aborted'} {written} records"

        result: str = self.cluster.call(do)
        return result

    def settle(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            open_ = self.cluster.call(lambda: coordinator_open(self.cluster.state, self.topic))
            if not open_:
                return "no transaction open"
            if time.monotonic() > deadline:
                return f"still open after {timeout} s: {open_}"
            time.sleep(0.05)

    def close(self) -> None:
        pass


def _transactional_batch(values: list[bytes], producer_id: int, epoch: int, seq: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, now, None, value, [])
    return bytes(builder.build())


# -- kafka-python's transactional producer --------------------------------------------------


class _Abandoned(Exception):
    """A producer call that did not return in time."""


def _bounded(fn: Callable[[], T], timeout: float) -> T:
    """``fn()`` on a thread of its own, given ``timeout`` seconds (kafka-python's commit and
    abort wait without a bound)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True, name="chaos-txn-call")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise _Abandoned(f"no answer in {timeout} s")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


class KafkaPythonTransactions:
    """:class:`TxnDriver` on kafka-python ``KafkaProducer`` instances with a
    ``transactional_id`` each (acks=all, idempotent). A producer whose call fails (fenced
    by a timeout abort, an error, no answer in ``call_timeout`` seconds) is closed and a new
    one is made for its next write: the open transaction's outcome is then up to the
    coordinator (it aborts it when the new instance initialises, or on its timeout).

    ``on_decided`` hears of each commit the producer saw succeed, per partition: the
    brokers' markers are not watched, so a commit counts from the moment the coordinator
    took it (its markers follow)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        transactional_ids: list[str],
        timeout_ms: int,
        *,
        call_timeout: float = 20.0,
        list_open: Callable[[list[str]], list[str]] | None = None,
        on_decided: OnDecided | None = None,
        on_committing: Callable[[int, frozenset[bytes]], None] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.ids = transactional_ids
        self.timeout_ms = timeout_ms
        self.call_timeout = call_timeout
        self.list_open = list_open
        self.on_decided = on_decided
        self.on_committing = on_committing
        self.committed_values: set[bytes] = set()
        self._producers: list[Any | None] = [None] * len(transactional_ids)
        # (partition, value) written in each producer's open transaction
        self._open: list[list[tuple[int, bytes]]] = [[] for _ in transactional_ids]

    def _producer(self, i: int) -> Any:
        p = self._producers[i]
        if p is None:
            from kafka import KafkaProducer

            p = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                transactional_id=self.ids[i],
                transaction_timeout_ms=self.timeout_ms,
                acks="all",
                request_timeout_ms=5000,
                max_block_ms=int(self.call_timeout * 1000),
                delivery_timeout_ms=int(self.call_timeout * 1000),
                retry_backoff_ms=100,
                linger_ms=0,
            )
            self._producers[i] = p
            _bounded(p.init_transactions, self.call_timeout)
        return p

    def _drop(self, i: int, why: BaseException) -> str:
        p, self._producers[i] = self._producers[i], None
        written = len(self._open[i])
        self._open[i] = []
        if p is not None:
            try:
                p.close(timeout=0)
            except Exception as exc:  # closing a broken producer: nothing more to do
                log.info("chaos_txn_producer_close_failed", error=repr(exc))
        return f"producer dropped ({why!r}; {written} records of its open transaction)"

    def produce(self, producer: int, partition: int, values: list[bytes]) -> str:
        try:
            p = self._producer(producer)
            if not self._open[producer]:
                p.begin_transaction()
            futures = [p.send(self.topic, v, partition=partition) for v in values]
            self._open[producer] += [(partition, v) for v in values]
            _bounded(lambda: p.flush(timeout=self.call_timeout), self.call_timeout + 1)
            offsets = [f.get(timeout=0).offset for f in futures]
        except Exception as exc:
            return self._drop(producer, exc)
        return f"{values[0]!r}..{values[-1]!r} at {offsets[0]}..{offsets[-1]}"

    def end(self, producer: int, commit: bool) -> str:
        if not self._open[producer]:
            return "none open"
        p = self._producers[producer]
        if p is None:
            return "none open"
        if commit and self.on_committing is not None:
            # The marker can be read before commit_transaction returns.
            for partition, values in _by_partition(self._open[producer]):
                self.on_committing(partition, values)
        try:
            _bounded(p.commit_transaction if commit else p.abort_transaction, self.call_timeout)
        except Exception as exc:
            return self._drop(producer, exc)
        written, self._open[producer] = self._open[producer], []
        if commit:
            self.committed_values.update(v for _p, v in written)
        if self.on_decided is not None:
            for partition, values in _by_partition(written):
                self.on_decided(partition, commit, values)
        return f"{'committed' if commit else 'aborted'} {len(written)} records"

    def settle(self, timeout: float) -> str:
        if self.list_open is None:
            return "not checked"
        deadline = time.monotonic() + timeout
        while True:
            try:
                open_ = self.list_open(self.ids)
            except Exception as exc:  # a coordinator moving: ask again
                log.info("chaos_txn_list_failed", error=repr(exc))
                open_ = ["?"]
            if not open_:
                return "no transaction open"
            if time.monotonic() > deadline:
                return f"still open after {timeout} s: {open_}"
            time.sleep(0.5)

    def close(self) -> None:
        for i, p in enumerate(self._producers):
            if p is not None:
                self._producers[i] = None
                try:
                    p.close(timeout=2)
                except Exception as exc:
                    log.info("chaos_txn_producer_close_failed", error=repr(exc))


def iter_open(transactions: Iterable[Any], ids: Iterable[str]) -> Iterator[str]:
    """The ids among ``ids`` whose ListTransactions entry is not finished."""
    wanted = set(ids)
    for t in transactions:
        tid = getattr(t, "transactional_id", None)
        state = str(getattr(getattr(t, "state", None), "value", getattr(t, "state", "")))
        if tid in wanted and state in ("Ongoing", "PrepareCommit", "PrepareAbort"):
            yield tid
