"""The consumer engine: everything ``EpochConsumer`` and ``AIOEpochConsumer`` decide.

Every position carries the leader epoch of the record before it. Positions are validated
with the partition leader (Fetch v12 ``DivergingEpoch`` or OffsetForLeaderEpoch) whenever
the leader or its epoch changes, a fetch is fenced, or a position is restored (committed
offsets, an offset store, ``seek`` with an epoch). Per-partition decisions are made by
:class:`epochguard.offsets.state.PartitionTracker`; assignment, group membership, commits and
delivery are decided here.

The engine never waits: an operation that needs answers or time is a
:data:`~epochguard.consumer.effects.Step` (a generator of effects) that a driver runs, on
the application's thread (``EpochConsumer``) or on its event loop (``AIOEpochConsumer``).
The drivers move bytes and time and hold the public API; they decide nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs
import kafka.errors as kerrors
from kafka.structs import (
    ConsumerGroupMetadata,
    MemberState,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from kafka.util import ensure_valid_topic_name

from epochguard._log import get_logger
from epochguard.consumer.client import BrokerClient
from epochguard.consumer.effects import Await, Call, Pump, Step, TaskHandle, Turn
from epochguard.consumer.errors import (
    ConsumerClosedError,
    ConsumerConfigError,
    HangingTransactionError,
    LogTruncationError,
    ReopenedTransactionError,
    UnassignedPartitionError,
    as_consumer_error,
)
from epochguard.consumer.fetcher import Fetcher
from epochguard.consumer.group import ClassicMember
from epochguard.consumer.group_consumer import ConsumerGroupMember
from epochguard.consumer.hanging import HangingTransactionMonitor
from epochguard.consumer.left_positions import LeftPositions
from epochguard.consumer.membership import CommitView, Membership
from epochguard.consumer.records import ConsumerRecord, as_deserializer
from epochguard.consumer.telemetry import TelemetryReporter
from epochguard.offsets.errors import EpochGuardError
from epochguard.offsets.events import Event, NoValidOffset, TruncationDetected
from epochguard.offsets.hanging import HangingTransaction
from epochguard.offsets.policy import OffsetPolicy
from epochguard.offsets.position import EpochOffset, normalise_topic_id
from epochguard.offsets.reopened import ReopenedTransaction
from epochguard.offsets.report import DetectedBy, TruncationReport
from epochguard.offsets.state import PartitionState, PartitionTracker

__all__ = ["ConsumerEngine", "ValidationResult", "make_policy"]

log = get_logger("epochguard.consumer")

_STOPPED = (PartitionState.TRUNCATED, PartitionState.NO_VALID_OFFSET)
#: Longest single wait of a loop whose condition no answer signals (the clock, a restore).
_PUMP_SLICE_S = 0.05


@attrs.frozen
class ValidationResult:
    """The answer of :meth:`EpochConsumer.validate_offsets` for one partition.

    ``valid``: the position exists in the leader's log as it was read. Otherwise
    ``report`` says what was truncated (``report.divergence`` is where to resume), or
    ``error`` names why no judgement was possible (e.g. the position is below the log start).
    """

    tp: TopicPartition
    position: EpochOffset
    valid: bool
    report: TruncationReport | None = None
    error: str | None = None
    #: The position to resume from: ``position`` if valid, else the divergence point.
    safe_position: EpochOffset | None = None


def make_policy(cfg: Mapping[str, Any]) -> OffsetPolicy:
    """The offset policy a consumer's configuration asks for."""
    from epochguard.offsets.errors import InvalidPolicyError
    from epochguard.offsets.policy import RetryBackoff

    try:
        return OffsetPolicy(
            auto_offset_reset=cfg["auto_offset_reset"],
            on_truncation=cfg["on_truncation"],
            retry_backoff=RetryBackoff(
                initial=cfg["retry_backoff_ms"] / 1000,
                maximum=max(cfg["retry_backoff_ms"], 1000) / 1000,
            ),
        )
    except InvalidPolicyError as exc:
        raise ConsumerConfigError("on_truncation", str(exc)) from exc


#: The most partitions whose last position a consumer keeps after giving them up (see
#: LeftPositions); a member that hands more in and out forgets the oldest first.
LEFT_POSITIONS_MAX = 50_000
#: How long at least such a position is kept (seconds).
LEFT_POSITIONS_TTL_S = 600.0


class ConsumerEngine:
    """One consumer's state and decisions, shared by both drivers (see the module doc)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        policy: OffsetPolicy,
        client: BrokerClient,
        spawn: Callable[[Step[None], str], TaskHandle],
    ) -> None:
        self._policy = policy
        self.config = cfg
        self.closed = False
        #: The driver's class name, for messages.
        self.kind = "EpochConsumer"
        self._client = client
        self.fetcher = Fetcher(
            self._client,
            cfg,
            self._policy,
            as_deserializer(cfg["key_deserializer"]),
            as_deserializer(cfg["value_deserializer"]),
            self._on_event,
        )
        self.fetcher.metadata_listeners.append(self._on_metadata_answer)
        # After a rebootstrap the fetcher asks for metadata at once (the brokers may all
        # have moved): wake the driver for it.
        client.rebootstrap_listeners.append(self.fetcher.wakeup)
        self.store = cfg["offset_store"]
        membership = ConsumerGroupMember if cfg["group_protocol"] == "consumer" else ClassicMember
        self.group: Membership | None = (
            membership(self._client, cfg, spawn) if cfg["group_id"] is not None else None
        )
        if self.group is not None:
            self.group.commit_view = self._commit_view
        self.assigned: list[TopicPartition] = []
        self._manual = False
        # subscribe() without a group_id: recompute the assignment after metadata answers.
        self._subscribed_metadata_seen = False
        self.subscription_topics: set[str] | None = None
        self.pattern: re.Pattern[str] | None = None
        # When the pattern was subscribed: only metadata asked for after it names every
        # topic of the cluster (an earlier topics() call leaves an older list behind).
        self._pattern_since = 0.0
        # topics() calls under way (each asks for every topic of the cluster meanwhile).
        self._topics_asked = 0
        self._listener: Any = None
        self._paused: set[TopicPartition] = set()
        # The partitions the poll under way may deliver (None: all of them).
        self._only: frozenset[TopicPartition] | None = None
        self._pending_truncations: dict[TopicPartition, TruncationReport] = {}
        self._pending_errors: dict[TopicPartition, EpochGuardError] = {}
        self._restored: set[TopicPartition] = set()
        # Where this consumer stood, with the topic id, in partitions it gave up (a topic
        # deleted from under a group revokes them). A partition that comes back under another
        # topic id with no committed offset (Kafka deletes a deleted topic's commits) starts
        # from here, so the re-creation is reported instead of a silent start over. Kept
        # for LEFT_POSITIONS_TTL_S or twice metadata_max_age_ms (a re-creation shows in
        # metadata within one), whichever is longer, for at most LEFT_POSITIONS_MAX.
        self._left_positions = LeftPositions(
            max(LEFT_POSITIONS_TTL_S, 2 * cfg["metadata_max_age_ms"] / 1000), LEFT_POSITIONS_MAX
        )
        # When such a partition came back under the same id: decided on metadata asked after.
        self._left_checked: dict[TopicPartition, float] = {}
        self._next_auto_commit = time.monotonic() + cfg["auto_commit_interval_ms"] / 1000
        # Iteration (the threaded driver's iterator): the batch being handed out one record
        # at a time, and (while the iterator's own poll runs) each partition's position
        # before its records were taken.
        self.iter_cursor: IterCursor | None = None
        self.iter_capture: dict[TopicPartition, EpochOffset | None] | None = None
        # Positions moved back by settle_iterator, still being validated: still committed.
        self._rewound: dict[TopicPartition, EpochOffset] = {}
        self._report_callback: Callable[[TruncationReport], Any] | None = cfg[
            "on_truncation_report"
        ]
        self._truncation_reports: list[TruncationReport] = []
        # Stopped partitions (truncation under "raise", no valid offset) the application has
        # not sought yet, and when each is next due a ``partition_awaiting_seek`` warning.
        self._awaiting_seek: dict[TopicPartition, float] = {}
        # Tests replace this to drive the awaiting-seek warnings without sleeping.
        self._clock: Callable[[], float] = time.monotonic
        # Subscribed topics (or the pattern) already warned about matching nothing.
        self._warned_unmatched: set[str] = set()
        #: The threaded driver's commit_async: runs before each commit (earlier async
        #: commits complete first) and in every poll round (their callbacks).
        self.before_commit: Callable[[float], None] | None = None
        self.on_poll_round: Callable[[], None] | None = None
        #: Called when the iteration in progress must end (see settle_iterator).
        self.iterator_reset: Callable[[], None] | None = None
        #: The driver reads the sockets only inside effects (the threaded driver without
        #: an IO thread): a poll whose time is up with nothing in hand takes one more turn.
        self.reads_only_in_effects = False
        # read_committed: last stable offsets that stopped (hanging transactions).
        self._hanging: HangingTransactionMonitor | None = None
        if cfg["isolation_level"] == "read_committed":
            self._hanging = HangingTransactionMonitor(
                self._client,
                self.fetcher,
                cfg["transaction_max_timeout_ms"],
                cfg["request_timeout_ms"],
                self._on_hanging_transaction,
            )
        self._hanging_reports: list[HangingTransaction] = []
        self._pending_hanging: dict[TopicPartition, HangingTransaction] = {}
        # read_committed: transactions read as decided that a truncation reopened, or that
        # were decided again otherwise (offsets/reopened.py).
        self._reopened_reports: list[ReopenedTransaction] = []
        self._pending_reopened: list[ReopenedTransaction] = []
        self.fetcher.on_reopened = self._on_reopened
        # KIP-714: pushes the counters to the brokers when a subscription asks for them.
        self.telemetry: TelemetryReporter | None = None
        if cfg["enable_metrics_push"]:
            resource = {"client_id": str(cfg["client_id"]), "client_software_name": "epochguard"}
            if cfg["group_id"] is not None:
                resource["group_id"] = str(cfg["group_id"])
            self.telemetry = TelemetryReporter(
                self._client,
                self._counters,
                resource,
                cfg["request_timeout_ms"],
                self.fetcher.wake_signal,
            )

    # ------------------------------------------------------------------ helpers

    def _ensure_open(self) -> None:
        if self.closed:
            raise ConsumerClosedError(f"the {self.kind} is closed")

    def request_timeout_s(self) -> float:
        return float(self.config["request_timeout_ms"]) / 1000

    def _on_event(self, event: Event) -> None:
        if isinstance(event, TruncationDetected):
            report = event.report
            self._truncation_reports.append(report)
            log.warning("truncation_detected", **event.to_dict())
            self._truncation_reopens(report)
            if event.decision == "raise":
                self._pending_truncations[report.tp] = report
                self._await_seek(report.tp)
            if self._report_callback is not None:
                self._report_callback(report)
            return
        if isinstance(event, NoValidOffset):
            tracker = self.fetcher.trackers.get(event.tp)
            if tracker is not None and tracker.error is not None:
                self._pending_errors[event.tp] = tracker.error
            self._await_seek(event.tp)
            log.warning(event.name, **event.to_dict())
            return
        name = getattr(event, "name", "tracker_event")
        to_dict = getattr(event, "to_dict", None)
        log.debug(name, **(to_dict() if to_dict is not None else {}))

    def _on_hanging_transaction(self, found: HangingTransaction) -> None:
        decision = self.config["on_hanging_transaction"]
        self._hanging_reports.append(found)
        log.error(
            "hanging_transaction_detected",
            **found.to_dict(),
            decision=decision,
            hint="abort it with kafka-transactions.sh abort (KIP-664)",
        )
        if decision == "raise" and found.tp in self.fetcher.trackers:
            self._pending_hanging[found.tp] = found

    def hanging_transactions(self) -> list[HangingTransaction]:
        """Every hanging transaction reported so far (oldest first)."""
        return list(self._hanging_reports)

    def _on_reopened(self, found: ReopenedTransaction) -> None:
        decision = self.config["on_hanging_transaction"]
        self._reopened_reports.append(found)
        log.error("transaction_reopened", **found.to_dict(), decision=decision)
        if decision == "raise" and found.tp in self.fetcher.trackers:
            self._pending_reopened.append(found)

    def reopened_transactions(self) -> list[ReopenedTransaction]:
        """Every reopened (or decided again) transaction reported so far (oldest first)."""
        return list(self._reopened_reports)

    def _truncation_reopens(self, report: TruncationReport) -> None:
        """What the partition's transaction ledger says the truncation reopened."""
        ledger = self.fetcher.ledgers.get(report.tp)
        if ledger is None:
            return
        if report.divergence is None or report.detected_by is DetectedBy.TOPIC_RECREATED:
            ledger.reset()  # another log, or no telling where it differs: nothing to name
            return
        divergence = report.divergence.offset
        if divergence < ledger.forgotten_below:
            log.warning(
                "reopened_transactions_unknown",
                topic=report.topic,
                partition=report.partition,
                divergence=divergence,
                remembered_from=ledger.forgotten_below,
            )
        for found in ledger.truncated(divergence):
            self._on_reopened(found)

    def _tracker(self, tp: TopicPartition) -> PartitionTracker:
        if not isinstance(tp, TopicPartition):
            raise TypeError(f"partition must be a kafka TopicPartition, got {tp!r}")
        tracker = self.fetcher.trackers.get(tp)
        if tracker is None:
            raise UnassignedPartitionError(f"partition {tp} is not assigned to this consumer")
        return tracker

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manually assign partitions (no group management)."""
        self._ensure_open()
        if self.subscription_topics is not None:
            raise kerrors.IllegalStateError("assign() after subscribe(): call unsubscribe()")
        parts = list(dict.fromkeys(partitions))
        if not parts:
            # kafka-python: an empty assignment is unsubscribe() (nothing to commit or leave
            # without a subscription).
            self.settle_iterator()
            self._forget_subscription()
            return
        for tp in parts:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign() needs kafka TopicPartitions, got {tp!r}")
        self.settle_iterator()
        self._manual = True
        self.set_assignment(parts)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def set_assignment(self, parts: list[TopicPartition]) -> None:
        now = time.monotonic()
        for tp in self._left_positions.expire(now):
            self._left_checked.pop(tp, None)
        for tp in list(self.fetcher.trackers):
            if tp not in parts:
                tracker = self.fetcher.trackers[tp]
                left = tracker.position
                if left is not None and left.offset > 0 and left.topic_id is not None:
                    report = tracker.last_report
                    reported = None if report is None else report.consumed_to
                    self._left_positions.remember(tp, left, now, reported)
                self.fetcher.remove_partition(tp)
                self._left_checked.pop(tp, None)
                self._paused.discard(tp)
                self._pending_truncations.pop(tp, None)
                self._pending_errors.pop(tp, None)
                self._pending_hanging.pop(tp, None)
                self._pending_reopened = [r for r in self._pending_reopened if r.tp != tp]
                self._awaiting_seek.pop(tp, None)
                self._restored.discard(tp)
        for tp in parts:
            self.fetcher.add_partition(tp)
        self.assigned = parts

    def restore_positions(self, deadline: float) -> Step[None]:
        """Give every new partition its starting position: committed offset (with epoch,
        validated before the first fetch), the offset store's, or the reset policy."""
        # _restored only holds assigned partitions (set_assignment drops the others), so
        # equal sizes mean nothing to do: the common case, checked without a walk over
        # every partition on every poll.
        if len(self._restored) >= len(self.assigned):
            return
        todo = [tp for tp in self.assigned if tp not in self._restored]
        if not todo:
            return
        stored: Mapping[TopicPartition, EpochOffset | None]
        source = "committed"
        if self.store is not None:
            stored = self.store.load()
            source = "offset_store"
        elif self.group is not None:
            try:
                stored = yield from self.group.fetch_committed(todo, deadline)
            except (
                kerrors.GroupAuthorizationFailedError,
                kerrors.TopicAuthorizationFailedError,
            ):
                # A refusal is the application's to handle: asking again each poll() would
                # hide it behind partitions that never get a position.
                raise
            except kerrors.KafkaError as exc:
                # No coordinator answer in time: stay without a position, try next poll().
                log.debug(
                    "committed_offsets_unavailable", group=self.group.group_id, error=repr(exc)
                )
                return
        else:
            stored = {}
        topic_ids = self.fetcher.metadata.topic_ids
        now = time.monotonic()
        recommit: dict[TopicPartition, tuple[EpochOffset, str]] = {}
        for tp in todo:
            tracker = self.fetcher.trackers[tp]
            position, from_ = stored.get(tp), source
            if self.group is not None and position is not None and from_ == "committed":
                acknowledged = self.group.own_commits.overtaken(tp, position, now)
                if acknowledged is not None:
                    # One of this member's commits, cut off unanswered, reached the
                    # coordinator after a later one it acknowledged: resume from that one,
                    # and put it back in the group for whoever reads the partition next.
                    log.warning(
                        "commit_overtaken",
                        topic=tp.topic,
                        partition=tp.partition,
                        found=position.to_json(),
                        acknowledged=acknowledged[0].to_json(),
                    )
                    position = acknowledged[0]
                    recommit[tp] = acknowledged
            left = self._left_positions.get(tp, now)
            if position is None and left is not None:
                current = normalise_topic_id(topic_ids.get(tp.topic))
                if current is not None and current != left.topic_id:
                    # Nothing committed, and the topic is another incarnation than the one
                    # this consumer read: its commits went with the deleted topic. Start
                    # from where we stood in the old log; the tracker reports the re-creation.
                    position, from_ = left, "left_position"
                else:
                    since = self._left_checked.setdefault(tp, now)
                    if not self.fetcher.metadata.fresh_since(since):
                        # Metadata from before the deletion still names the old id: decide
                        # on an answer asked for now (the next poll, or the one after).
                        self.fetcher.request_metadata()
                        continue
            read_to = reported = None
            if position is not None and left is not None and from_ != "left_position":
                # Only within one topic incarnation, known on every side: a position from
                # the log of a topic since re-created must not be validated against the new one.
                current = normalise_topic_id(topic_ids.get(tp.topic))
                committed_id = normalise_topic_id(position.topic_id)
                if current is not None and current == left.topic_id == committed_id:
                    # This consumer read the partition before a rebalance took it away; a
                    # commit that failed on the way leaves the committed position below
                    # what it delivered, and a truncation there must still be reported.
                    read_to = left
                    reported = self._left_positions.reported(tp, now)
            self._left_positions.forget(tp)
            self._left_checked.pop(tp, None)
            if tracker.state is PartitionState.INITIALIZING:
                tracker.restore(position, source=from_, read_to=read_to, reported=reported)
                ledger = self.fetcher.ledgers.get(tp)
                if ledger is not None and position is not None:
                    ledger.inherit(position.offset, position.undecided_transactions)
                self.fetcher.after_input(tp)
            self._restored.add(tp)
        if recommit and self.group is not None:
            try:
                yield from self.group.commit(recommit, deadline)
            except kerrors.KafkaError as exc:
                log.warning("commit_overtaken_repair_failed", error=repr(exc))

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        listener: Any = None,
    ) -> None:
        """Subscribe to topics (or a regex ``pattern``): with a ``group_id`` through group
        management; without one, as kafka-python, every partition of those topics is
        assigned to this consumer (following metadata, no commits to a group)."""
        self._ensure_open()
        if self._manual:
            raise kerrors.IllegalStateError("subscribe() after assign(): call unsubscribe()")
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        # The error classes are kafka-python's for the same mistakes.
        if not topic_list and not pattern:
            raise ValueError("subscribe() needs topics or a pattern")
        if topic_list and pattern:
            raise kerrors.IllegalStateError("subscribe() takes topics or a pattern, not both")
        for topic in topic_list:
            ensure_valid_topic_name(topic)
        self._listener = listener
        self._warned_unmatched.clear()
        self.settle_iterator()
        self._subscribed_metadata_seen = bool(self.fetcher.topic_partitions)
        if pattern is not None:
            self.pattern = re.compile(pattern)
            self._pattern_since = time.monotonic()
            self.subscription_topics = set()
            self.fetcher.want_all_topics(True)
            # Matched only against metadata asked for from now on: ask now, whether or not
            # all topics were asked for already (a second pattern, a request in flight).
            self.fetcher.request_metadata()
        else:
            self.pattern = None
            self._want_all_topics()
            self.subscription_topics = set(topic_list)
            self.fetcher.metadata_topics.update(topic_list)
            self.fetcher.request_metadata()
        if self.group is not None:
            self.group.rejoin_needed = True

    def subscription(self) -> set[str] | None:
        return None if self.subscription_topics is None else set(self.subscription_topics)

    def unsubscribe(self) -> Step[None]:
        """Drop the subscription and the assignment. As in kafka-python 3.0, positions are
        committed first (if auto commit) and the rebalance listener is not called."""
        yield from self.unsubscribe_now()

    def unsubscribe_now(self) -> Step[None]:
        """:meth:`unsubscribe`'s local part, done before this returns (aiokafka's
        ``unsubscribe()`` is not a coroutine), and the step that finishes it: the commit
        of the positions held until now and leaving the group."""
        self._ensure_open()
        self.settle_iterator()
        positions: dict[TopicPartition, EpochOffset] = {}
        leave = self.group is not None and self.subscription_topics is not None
        if leave and self.config["enable_auto_commit"] and self.assigned:
            positions = self.current_positions()
        self._forget_subscription()
        return self._leave_after_unsubscribe(positions, leave)

    def _leave_after_unsubscribe(
        self, positions: dict[TopicPartition, EpochOffset], leave: bool
    ) -> Step[None]:
        if positions:
            try:
                yield from self.commit(positions)
            except kerrors.KafkaError as exc:
                log.warning("commit_on_unsubscribe_failed", error=repr(exc))
        if leave and self.group is not None:
            yield from self.group.leave("unsubscribed")

    def _forget_subscription(self) -> None:
        self.subscription_topics = None
        self.pattern = None
        self._manual = False
        self._want_all_topics()
        self.set_assignment([])
        self._left_positions.clear()  # the application let go of those partitions itself
        self._left_checked.clear()

    @property
    def pattern_matched(self) -> bool:
        """Whether the subscription names its topics: a list does; a pattern once a metadata
        answer asked for after ``subscribe()`` has named every topic of the cluster."""
        return self.pattern is None or self.fetcher.metadata_fresh_since(self._pattern_since)

    def _update_pattern(self) -> None:
        if self.pattern is None or not self.pattern_matched or self.fetcher.all_topics is None:
            return
        matched = {t for t in self.fetcher.all_topics if self.pattern.match(t)}
        if matched != self.subscription_topics:
            self.subscription_topics = matched
            self.fetcher.metadata_topics.update(matched)
            if self.group is not None:
                self.group.rejoin_needed = True

    def _on_metadata_answer(self) -> None:
        self._subscribed_metadata_seen = True

    def _assign_all_subscribed(self) -> None:
        """``subscribe()`` without a ``group_id``: as kafka-python, every partition of the
        subscribed topics (or of the topics the pattern matches) is assigned here, following
        metadata; there is no group and no rebalance listener call."""
        if not self._subscribed_metadata_seen:
            return
        self._subscribed_metadata_seen = False
        self._update_pattern()
        subscription = self.subscription_topics
        if subscription is None:
            return
        known = self.fetcher.topic_partitions
        parts = [
            TopicPartition(topic, p)
            for topic in sorted(subscription)
            for p in sorted(known.get(topic, ()))
        ]
        if set(parts) != set(self.assigned):
            self.set_assignment(parts)

    def call_listener(self, method: str, partitions: set[TopicPartition]) -> Step[None]:
        """Run the rebalance listener's ``method`` (an async one under asyncio)."""
        listener = self._listener
        if listener is None:
            return
        fn = getattr(listener, method, None)
        if method == "on_partitions_lost" and not callable(fn):
            # kafka-python's listener has no on_partitions_lost; Java's default calls revoked.
            fn = listener.on_partitions_revoked
        if fn is not None:
            yield Call(fn, (partitions,))

    def _commit_view(self, topic: str, partitions: Sequence[int]) -> CommitView:
        """The brokers this consumer's metadata names leaders of ``topic`` (of
        ``partitions`` first, then of the topic's other partitions, each broker once), and
        the ids the partitions' trackers know to be deleted incarnations."""
        leaders = self.fetcher.metadata.leaders
        asked = [TopicPartition(topic, p) for p in partitions]
        others = sorted(tp for tp in list(leaders) if tp.topic == topic and tp not in asked)
        nodes: list[int] = []
        for tp in asked + others:
            node = leaders.get(tp, (None, None))[0]
            if node is not None and node not in nodes:
                nodes.append(node)
        older: set[str] = set()
        for tp in asked:
            tracker = self.fetcher.trackers.get(tp)
            if tracker is not None:
                older.update(tracker.old_topic_ids)
        return CommitView(tuple(nodes), frozenset(older))

    def metadata_for(self, topics: set[str], deadline: float) -> Step[dict[str, set[int]]]:
        self.fetcher.metadata_topics.update(topics)
        self.fetcher.request_metadata()
        start = time.monotonic()

        def answered() -> bool:
            if not self.fetcher.metadata_fresh_since(start):
                return False
            known = all(t in self.fetcher.topic_partitions for t in topics)
            return known or time.monotonic() - start > 1.0

        yield from self.fetcher.pump_until(answered, deadline)
        return {
            t: self.fetcher.topic_partitions[t]
            for t in topics
            if t in self.fetcher.topic_partitions
        }

    def _ensure_group(self, deadline: float) -> Step[None]:
        group = self.group
        if self.subscription_topics is None:
            return
        if group is None:
            self._assign_all_subscribed()
            return
        group.polled()
        self._update_pattern()
        yield from group.reconcile(self, deadline)

    # ------------------------------------------------------------------ polling

    def poll(
        self,
        timeout_ms: int,
        max_records: int | None,
        columns: bool = False,
        only: Collection[TopicPartition] | None = None,
    ) -> Step[dict[TopicPartition, Any]]:
        """Records (``columns``: one ``RecordColumns`` per partition) within ``timeout_ms``;
        with ``only``, of those partitions alone (aiokafka's ``getmany(*partitions)``).

        Raises :class:`LogTruncationError` (policy ``"raise"``) once per detected truncation;
        those partitions stay stopped until :meth:`seek`, the others keep flowing."""
        self._ensure_open()
        fmt = self.config["record_format"]
        if columns and fmt != "columns":
            raise ConsumerConfigError(
                "record_format",
                "is 'records': poll_columns() needs a consumer created with "
                "record_format='columns'",
            )
        if not columns and fmt != "records":
            raise ConsumerConfigError(
                "record_format",
                "is 'columns': this consumer's records are read with poll_columns(), "
                "not poll() or iteration",
            )
        self._only = None if only is None else frozenset(only)
        try:
            return (yield from self._poll(timeout_ms, max_records))
        finally:
            self._only = None

    def _poll(self, timeout_ms: int, max_records: int | None) -> Step[dict[TopicPartition, Any]]:
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must not be negative, got {timeout_ms}")
        if max_records is None:
            max_records = self.config["max_poll_records"]
        if isinstance(max_records, bool) or not isinstance(max_records, int):
            raise TypeError(f"max_records must be an int, got {max_records!r}")
        if max_records < 1:
            raise ValueError("max_records must be positive")
        self.settle_iterator()
        # Nothing assigned or subscribed: wait out the timeout and return {}, as kafka-python.
        fetcher = self.fetcher
        deadline = time.monotonic() + timeout_ms / 1000
        last_turn = False
        while True:
            if self.group is not None and self.group.rebalancing:
                # A join step's answer is only read off its socket when a thread turns the
                # connections (no IO thread): a poll that hands out buffered records never
                # waits, and with a backlog the join would not go on until the buffers ran
                # dry. One turn that does not wait takes the answers in, right before the
                # group applies them (the turn spends the wake-up they bring).
                yield Pump(fetcher, time.monotonic())
            yield from self._ensure_group(deadline)
            self._warn_unmatched_subscription()
            # Bounded by the poll timeout (at least one round trip): with the coordinator
            # down, poll() still returns on time and the next one tries again.
            yield from self.restore_positions(max(deadline, time.monotonic() + 1.0))
            yield from self._maybe_auto_commit()
            if self.on_poll_round is not None:
                self.on_poll_round()
            fetcher.process_completions(max_records, self._deliverable)
            if self._hanging is not None:
                self._hanging.tick(time.monotonic())
            if self.telemetry is not None:
                self.telemetry.tick(time.monotonic())
            self._warn_awaiting_seek()
            self._raise_pending()
            # Applying answers can take milliseconds (a metadata answer or a first fetch
            # answer over 1,000 partitions), and so can handing out records and planning the
            # fetches they free: not both in one step of the asyncio loop. Nothing has been
            # handed out yet, so a read cancelled here loses nothing.
            yield Turn()
            records = fetcher.fetched_records(max_records, self._eligible)
            now = time.monotonic()
            if not records and now >= deadline and self.reads_only_in_effects and not last_turn:
                # Nothing in hand when the time is up: one turn that does not wait takes in
                # the answers that arrived (otherwise poll(timeout_ms=0) in a loop would
                # never get a record).
                last_turn = True
                yield Pump(fetcher, now)
                continue
            if records or now >= deadline:
                # What the delivery freed goes out before the application gets the records.
                fetcher.send_requests(now)
                return records
            yield Pump(fetcher, deadline)

    def _deliverable(self, tp: TopicPartition) -> bool:
        return tp not in self._paused and (self._only is None or tp in self._only)

    def _eligible(self, tp: TopicPartition) -> bool:
        if not self._deliverable(tp):
            return False
        capture = self.iter_capture
        if capture is not None and tp not in capture:
            # The fetcher asks right before it hands out (and moves past) tp's records: this
            # is where the iterator rewinds tp to if the application stops before them.
            tracker = self.fetcher.trackers.get(tp)
            capture[tp] = None if tracker is None else tracker.position
        return True

    def _raise_pending(self) -> None:
        refused = self._client.take_fatal_error()
        if refused is not None:
            raise refused
        denied = self.fetcher.take_authorization_error()
        if denied is not None:
            raise denied
        if self._pending_truncations:
            truncations, self._pending_truncations = self._pending_truncations, {}
            raise LogTruncationError(truncations)
        if self._pending_hanging:
            hanging, self._pending_hanging = self._pending_hanging, {}
            raise HangingTransactionError(hanging)
        if self._pending_reopened:
            reopened, self._pending_reopened = self._pending_reopened, []
            raise ReopenedTransactionError(reopened)
        if self._pending_errors:
            tp, error = next(iter(self._pending_errors.items()))
            del self._pending_errors[tp]
            raise as_consumer_error(error)
        corrupt = self.fetcher.corrupt_errors
        if corrupt:
            tp = next(iter(corrupt))
            raise corrupt.pop(tp)

    def _await_seek(self, tp: TopicPartition) -> None:
        """A partition just stopped until a seek: its first ``partition_awaiting_seek`` is due
        one interval from now (the error itself is logged as it happens)."""
        interval = self.config["awaiting_seek_log_interval_ms"] / 1000
        self._awaiting_seek[tp] = self._clock() + interval

    def _warn_awaiting_seek(self) -> None:
        """Log ``partition_awaiting_seek`` for each stopped partition every
        ``awaiting_seek_log_interval_ms``: an application that catches the error and carries
        on without seeking would otherwise stall that partition without a trace."""
        if not self._awaiting_seek:
            return
        now = self._clock()
        interval = self.config["awaiting_seek_log_interval_ms"] / 1000
        for tp, due in list(self._awaiting_seek.items()):
            tracker = self.fetcher.trackers.get(tp)
            if tracker is None or tracker.state not in _STOPPED:
                del self._awaiting_seek[tp]
                continue
            if now < due:
                continue
            self._awaiting_seek[tp] = now + interval
            report = tracker.last_report if tracker.state is PartitionState.TRUNCATED else None
            divergence = None if report is None else report.divergence
            log.warning(
                "partition_awaiting_seek",
                topic=tp.topic,
                partition=tp.partition,
                state=tracker.state.name.lower(),
                divergence=None if divergence is None else str(divergence),
                divergence_offset=None if divergence is None else divergence.offset,
                error=None if tracker.error is None else str(tracker.error),
                hint="call seek() on this partition to resume it",
            )

    def _warn_unmatched_subscription(self) -> None:
        """Warn once per subscribed topic the cluster does not have, or once per pattern that
        matches no topic (kafka-python stays silent and simply gets no records)."""
        fetcher = self.fetcher
        if self.subscription_topics is None:
            return
        if self.pattern is not None:
            key = "pattern:" + self.pattern.pattern
            if (
                fetcher.all_topics is not None
                and self.pattern_matched
                and not self.subscription_topics
                and key not in self._warned_unmatched
            ):
                self._warned_unmatched.add(key)
                log.warning(
                    "subscription_matches_nothing",
                    pattern=self.pattern.pattern,
                    topics_in_cluster=len(fetcher.all_topics),
                )
            return
        for topic in sorted(self.subscription_topics & fetcher.unknown_topics):
            if topic not in self._warned_unmatched:
                self._warned_unmatched.add(topic)
                log.warning("subscribed_topic_missing", topic=topic)

    def settle_iterator(self) -> None:
        """End the iteration in progress. ``poll()`` moved the positions past the whole
        batch the iterator hands out one by one; records not handed out yet must be read
        again, as with kafka-python's iterator (it moves a position only as each record is
        handed out). So each partition with such records is moved back: after the last
        record handed out (its epoch exact), or where its records of the batch began."""
        if self.iter_capture is not None:
            return  # called from within the iterator's own poll(): nothing is left over
        cursor, self.iter_cursor = self.iter_cursor, None
        if self.iterator_reset is not None:
            self.iterator_reset()
        if cursor is None:
            return
        for k, (tp, records) in enumerate(cursor.items):
            if k < cursor.k or (k == cursor.k and cursor.i + 1 >= len(records)):
                continue
            if k == cursor.k:
                last = records[cursor.i]
                epoch = last.leader_epoch if last.leader_epoch >= 0 else None
                position: EpochOffset | None = EpochOffset(
                    last.offset + 1, epoch, epoch_exact=epoch is not None
                )
            else:
                position = cursor.before.get(tp)
            tracker = self.fetcher.trackers.get(tp)
            if tracker is None or tracker.state is not PartitionState.FETCHING:
                continue  # revoked, stopped or being validated: it gets a new position anyway
            if position is None:
                # Not expected: the fetcher asks _eligible before handing records out.
                log.warning("iterator_rewind_unknown", topic=tp.topic, partition=tp.partition)
                continue
            tracker.seek(position, source="iterator_rewind")
            self._rewound[tp] = position
            self.fetcher.drop_buffer(tp)
            self.fetcher.after_input(tp)
            log.debug(
                "iterator_rewound",
                topic=tp.topic,
                partition=tp.partition,
                position=str(position),
                records=len(records) - (cursor.i + 1 if k == cursor.k else 0),
            )

    # ------------------------------------------------------------------ positions

    def seek(
        self, partition: TopicPartition, offset: int | EpochOffset | OffsetAndMetadata
    ) -> None:
        """Move the position. With an epoch (``EpochOffset`` or ``OffsetAndMetadata`` with a
        ``leader_epoch``) the position is validated before fetching from it."""
        self._ensure_open()
        tracker = self._tracker(partition)
        position: EpochOffset | int
        if isinstance(offset, OffsetAndMetadata):
            epoch = offset.leader_epoch
            position = EpochOffset(
                offset.offset, epoch if epoch is not None and epoch >= 0 else None
            )
        elif isinstance(offset, EpochOffset) or (
            isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0
        ):
            position = offset
        else:
            raise ValueError(f"seek needs an offset >= 0 or an EpochOffset, got {offset!r}")
        self.settle_iterator()
        tracker.seek(position)
        self._restored.add(partition)
        self._pending_truncations.pop(partition, None)
        self._pending_errors.pop(partition, None)
        self.fetcher.clear_corrupt(partition)
        self.fetcher.drop_buffer(partition)
        self.fetcher.after_input(partition)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_reset(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_reset(partitions, "latest")

    def _seek_reset(self, partitions: tuple[TopicPartition, ...], strategy: str) -> None:
        self._ensure_open()
        if not partitions and not self.assigned:
            raise UnassignedPartitionError("no partitions are currently assigned")
        trackers = [(tp, self._tracker(tp)) for tp in partitions or tuple(self.assigned)]
        self.settle_iterator()
        for tp, tracker in trackers:
            tracker.request_reset(strategy, reason=f"seek_to_{strategy}")
            self._restored.add(tp)
            self._pending_truncations.pop(tp, None)
            self._pending_errors.pop(tp, None)
            self.fetcher.clear_corrupt(tp)
            self.fetcher.drop_buffer(tp)
            self.fetcher.after_input(tp)

    def _wait_position(self, tp: TopicPartition, timeout_ms: int | None) -> Step[EpochOffset]:
        tracker = self._tracker(tp)
        self.settle_iterator()
        timeout = self.request_timeout_s() if timeout_ms is None else timeout_ms / 1000
        start = time.monotonic()
        deadline = start + timeout
        if tp.partition not in self.fetcher.topic_partitions.get(tp.topic, ()):
            # Not known to exist: ask now rather than at the next periodic refresh.
            self.fetcher.request_metadata()

        while True:
            # Restoring (committed offsets) is part of getting a position: keep at it.
            yield from self.restore_positions(deadline)
            self.fetcher.process_completions(decode=False)
            if tracker.state is PartitionState.FETCHING and tracker.position is not None:
                return tracker.position
            if tracker.state in _STOPPED and tracker.error is not None:
                raise as_consumer_error(tracker.error)
            self._raise_if_missing([tp], since=start)
            now = time.monotonic()
            if now >= deadline:
                raise kerrors.KafkaTimeoutError(f"no valid position for {tp} within {timeout}s")
            yield Pump(self.fetcher, min(deadline, now + _PUMP_SLICE_S), decode=False)

    def position_with_epoch(
        self, partition: TopicPartition, timeout_ms: int | None = None
    ) -> Step[EpochOffset]:
        """The position (the offset of the next record to be returned, with the leader epoch
        of the record before it), once validated.

        Raises ``UnknownTopicOrPartitionError`` as soon as metadata says the partition does
        not exist, and ``KafkaTimeoutError`` if no position is known within ``timeout_ms``
        (default ``request_timeout_ms``)."""
        self._ensure_open()
        return (yield from self._wait_position(partition, timeout_ms))

    def highwater(self, partition: TopicPartition) -> int | None:
        """The high watermark from the last fetch answer for ``partition`` (``None`` before
        the first one), as kafka-python: compare with :meth:`position` for the lag."""
        self._ensure_open()
        self._tracker(partition)
        return self.fetcher.highwaters.get(partition)

    def committed(
        self, partition: TopicPartition, timeout_ms: int | None
    ) -> Step[tuple[EpochOffset, str] | None]:
        """The last committed position of ``partition`` with its metadata, or ``None``."""
        self._ensure_open()
        if not isinstance(partition, TopicPartition):
            raise TypeError(f"partition must be a kafka TopicPartition, got {partition!r}")
        deadline = time.monotonic() + (
            self.request_timeout_s() if timeout_ms is None else timeout_ms / 1000
        )
        if self.store is not None:
            stored: EpochOffset | None = self.store.load().get(partition)
            return None if stored is None else (stored, "")
        if self.group is None:
            raise kerrors.IllegalStateError("committed() needs a group_id or an offset_store")
        got = yield from self.group.fetch_committed_metadata([partition], deadline)
        return got.get(partition)

    def current_positions(self) -> dict[TopicPartition, EpochOffset]:
        self.settle_iterator()
        out = {}
        for tp, rewound in list(self._rewound.items()):
            tracker = self.fetcher.trackers.get(tp)
            if tracker is None or tracker.state in _STOPPED or tracker.position != rewound:
                del self._rewound[tp]
            elif tracker.state is not PartitionState.FETCHING:
                out[tp] = rewound  # consumed up to here; its validation is still under way
            else:
                del self._rewound[tp]
        for tp in self.assigned:
            tracker = self.fetcher.trackers.get(tp)
            if tracker is not None and tracker.state is PartitionState.FETCHING:
                pos = tracker.position
                if pos is not None:
                    out[tp] = pos
        return out

    def normalise_offsets(
        self, offsets: Mapping[TopicPartition, Any] | None
    ) -> dict[TopicPartition, tuple[EpochOffset, str]]:
        if offsets is None:
            return {
                tp: (self._with_undecided(tp, pos), "")
                for tp, pos in self.current_positions().items()
            }
        out: dict[TopicPartition, tuple[EpochOffset, str]] = {}
        for tp, value in offsets.items():
            if isinstance(value, EpochOffset):
                out[tp] = (self._with_undecided(tp, value), "")
            elif isinstance(value, OffsetAndMetadata):
                epoch = value.leader_epoch if value.leader_epoch is not None else -1
                position = EpochOffset(value.offset, epoch if epoch >= 0 else None)
                # The application's own metadata leaves no room for the hand-over.
                out[tp] = (
                    (position, value.metadata)
                    if value.metadata
                    else (self._with_undecided(tp, position), "")
                )
            elif isinstance(value, int) and not isinstance(value, bool):
                out[tp] = (self._with_undecided(tp, EpochOffset(value)), "")
            else:
                raise TypeError(f"cannot commit {value!r} for {tp}")
        return out

    def _with_undecided(self, tp: TopicPartition, position: EpochOffset) -> EpochOffset:
        """``position`` with the transactions this consumer read below it undecided (under
        read_committed), for the partition's next reader: see ``TransactionLedger.inherit``."""
        ledger = self.fetcher.ledgers.get(tp)
        if ledger is None or position.undecided_transactions:
            return position
        undecided = ledger.undecided_below(position.offset)
        return attrs.evolve(position, undecided_transactions=undecided) if undecided else position

    def commit(
        self, offsets: Mapping[TopicPartition, Any] | None = None, timeout_ms: int | None = None
    ) -> Step[None]:
        """Commit positions (default: the current ones) with their leader epochs.

        Commits made earlier with :meth:`commit_async` complete first (their callbacks run
        before this returns), so a synchronous commit is never overtaken by an older one.
        ``timeout_ms`` (default ``request_timeout_ms``) bounds the whole call."""
        self._ensure_open()
        timeout = self.request_timeout_s() if timeout_ms is None else timeout_ms / 1000
        deadline = time.monotonic() + timeout
        norm = self.normalise_offsets(offsets)
        if self.before_commit is not None:
            self.before_commit(deadline)
        if not norm:
            return
        if self.store is not None:
            self.store.save({tp: pos for tp, (pos, _m) in norm.items()})
            return
        if self.group is None:
            raise kerrors.IllegalStateError("commit() needs a group_id or an offset_store")
        yield from self.group.commit(norm, deadline)
        cb = self.config["default_offset_commit_callback"]
        if cb is not None:
            yield Call(cb, (as_offsets_and_metadata(norm), None))

    def _maybe_auto_commit(self) -> Step[None]:
        if not self.config["enable_auto_commit"] or (self.group is None and self.store is None):
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        if self.group is not None and self.group.rebalancing:
            # A join is under way: the generation is about to change, so the commit would
            # be refused. The next interval after the join commits instead.
            return
        self._next_auto_commit = now + self.config["auto_commit_interval_ms"] / 1000
        try:
            yield from self.commit()
        except kerrors.KafkaError as exc:
            log.warning("auto_commit_failed", error=repr(exc))

    # ------------------------------------------------------------------ pause/resume

    def pause(self, *partitions: TopicPartition) -> None:
        trackers = [self._tracker(tp) for tp in partitions]
        # The iterator must not hand out more of a paused partition's records (kafka-python
        # checks each record); what it has not handed out is read again after resume().
        self.settle_iterator()
        for tp, tracker in zip(partitions, trackers, strict=True):
            tracker.pause()
            self._paused.add(tp)
            self.fetcher.after_input(tp)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._tracker(tp).resume()
            self._paused.discard(tp)
            self.fetcher.after_input(tp)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    # ------------------------------------------------------------------ offsets lookup

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> Step[dict[TopicPartition, int]]:
        res = yield from self._list(partitions, -2, timeout_ms)
        return {tp: v[0] for tp, v in res.items()}

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> Step[dict[TopicPartition, int]]:
        res = yield from self._list(partitions, -1, timeout_ms)
        return {tp: v[0] for tp, v in res.items()}

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout_ms: int | None = None
    ) -> Step[dict[TopicPartition, OffsetAndTimestamp | None]]:
        """Earliest offset with timestamp >= the given one, with its leader epoch (kafka's
        ``OffsetAndTimestamp(offset, timestamp, leader_epoch)``); ``None`` if none."""
        self._ensure_open()
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0, got {ts}")
        timeout = self.request_timeout_s() if timeout_ms is None else timeout_ms / 1000
        yield from self._check_partitions_exist(list(timestamps), time.monotonic() + timeout)
        res = yield from self.fetcher.list_offsets(dict(timestamps), timeout)
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp in timestamps:
            offset, epoch, ts = res[tp]
            out[tp] = (
                None
                if offset < 0
                else OffsetAndTimestamp(offset, ts, -1 if epoch is None else epoch)
            )
        return out

    def _list(
        self, partitions: Iterable[TopicPartition], ts: int, timeout_ms: int | None
    ) -> Step[dict[TopicPartition, tuple[int, int | None, int]]]:
        self._ensure_open()
        tps = list(partitions)
        timeout = self.request_timeout_s() if timeout_ms is None else timeout_ms / 1000
        yield from self._check_partitions_exist(tps, time.monotonic() + timeout)
        return (yield from self.fetcher.list_offsets({tp: ts for tp in tps}, timeout))

    def _check_partitions_exist(self, tps: list[TopicPartition], deadline: float) -> Step[None]:
        """Raise ``UnknownTopicOrPartitionError`` for partitions metadata says do not exist,
        instead of retrying ListOffsets until the timeout (one metadata round trip, and only
        for topics or partitions not seen yet)."""
        for tp in tps:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"partitions must be kafka TopicPartitions, got {tp!r}")
        fetcher = self.fetcher
        unseen = {
            tp.topic for tp in tps if tp.partition not in fetcher.topic_partitions.get(tp.topic, ())
        }
        if not unseen:
            return
        start = time.monotonic()
        fetcher.metadata_topics.update(unseen)
        fetcher.request_metadata()
        yield from fetcher.pump_until(lambda: fetcher.metadata_fresh_since(start), deadline)
        self._raise_if_missing(tps, since=start)

    def _raise_if_missing(self, tps: Iterable[TopicPartition], since: float) -> None:
        """Fail fast (as kafka-python's ``position()``) once metadata requested after
        ``since`` says a topic is unknown or has no such partition."""
        fetcher = self.fetcher
        if not fetcher.metadata_fresh_since(since):
            return
        for tp in tps:
            partitions = fetcher.topic_partitions.get(tp.topic)
            if tp.topic in fetcher.unknown_topics:
                raise kerrors.UnknownTopicOrPartitionError(f"topic {tp.topic!r} does not exist")
            if tp.topic in fetcher.unauthorized_topics:
                raise kerrors.TopicAuthorizationFailedError(
                    f"not authorized to access topic {tp.topic!r}"
                )
            if partitions is not None and tp.partition not in partitions:
                raise kerrors.UnknownTopicOrPartitionError(
                    f"topic {tp.topic!r} has no partition {tp.partition} "
                    f"(partitions: {sorted(partitions)})"
                )

    # ------------------------------------------------------------------ validation

    def validate_offsets(
        self, offsets: Mapping[TopicPartition, EpochOffset], timeout_ms: int | None = None
    ) -> Step[dict[TopicPartition, ValidationResult]]:
        """Check positions kept outside Kafka against the leaders' logs, without assigning
        anything: one :class:`ValidationResult` per partition."""
        self._ensure_open()
        timeout = self.request_timeout_s() if timeout_ms is None else timeout_ms / 1000
        deadline = time.monotonic() + timeout
        policy = OffsetPolicy(
            auto_offset_reset="none",
            on_truncation="raise",
            retry_backoff=self._policy.retry_backoff,
        )
        probe = Fetcher(self._client, self.config, policy, None, None, lambda _e: None)
        results: dict[TopicPartition, ValidationResult] = {}
        for tp, pos in offsets.items():
            if not isinstance(pos, EpochOffset):
                raise TypeError(f"validate_offsets needs EpochOffset values, got {pos!r}")
            probe.add_partition(tp).restore(pos, source="validate_offsets")

        def settled() -> bool:
            for tp, tracker in list(probe.trackers.items()):
                pos = offsets[tp]
                if tracker.state is PartitionState.FETCHING:
                    valid_pos = tracker.position
                    results[tp] = ValidationResult(tp, pos, True, safe_position=valid_pos)
                    probe.remove_partition(tp)
                elif tracker.state is PartitionState.TRUNCATED:
                    report = tracker.last_report
                    results[tp] = ValidationResult(
                        tp,
                        pos,
                        False,
                        report=report,
                        safe_position=None if report is None else report.divergence,
                    )
                    probe.remove_partition(tp)
                elif tracker.state is PartitionState.NO_VALID_OFFSET:
                    results[tp] = ValidationResult(tp, pos, False, error=str(tracker.error))
                    probe.remove_partition(tp)
            return not probe.trackers

        if not (yield from probe.pump_until(settled, deadline)):
            raise kerrors.KafkaTimeoutError(
                f"validate_offsets: no answer for {sorted(probe.trackers)} in {timeout}s"
            )
        return results

    # ------------------------------------------------------------------ metadata

    def partitions_for_topic(self, topic: str) -> Step[set[int]]:
        """The topic's partition ids; ``set()`` if the topic does not exist (kafka-python)."""
        self._ensure_open()
        parts = yield from self.metadata_for({topic}, time.monotonic() + self.request_timeout_s())
        return set(parts.get(topic, ()))

    def topics(self) -> Step[set[str]]:
        self._ensure_open()
        fetcher = self.fetcher
        self._topics_asked += 1
        fetcher.want_all_topics(True)
        try:
            start = time.monotonic()
            deadline = start + self.request_timeout_s()
            fetcher.request_metadata()
            yield from fetcher.pump_until(lambda: fetcher.metadata_fresh_since(start), deadline)
        finally:
            self._topics_asked -= 1
            self._want_all_topics()
        return set(fetcher.all_topics or ())

    def _want_all_topics(self) -> None:
        """Ask metadata for every topic of the cluster while a pattern subscription or a
        ``topics()`` call needs them. Decided from both, not restored from before a
        ``topics()`` call: under asyncio a ``subscribe(pattern=...)`` made while one waits
        would otherwise be left matched against a list that is never asked for again."""
        self.fetcher.want_all_topics(self.pattern is not None or self._topics_asked > 0)

    def metrics(self, raw: bool = False) -> dict[str, Any] | None:
        """Counters, shaped as kafka-python's: ``{group: {name: value}}``; ``None`` when
        ``metrics_enabled=False``.

        Groups: ``consumer-fetch-manager-metrics`` and ``consumer-coordinator-metrics`` with
        kafka-style names for what both clients count, ``epochguard-metrics`` with every
        epochguard counter (truncations, records lost, validations, partitions awaiting a
        seek, ...). ``raw=True`` returns the epochguard counters as one flat
        ``{name: value}`` dict (kafka-python returns its internal metric objects there)."""
        if not self.config["metrics_enabled"]:
            return None
        m = self._counters()
        if raw:
            return m
        groups: dict[str, dict[str, Any]] = {
            "consumer-fetch-manager-metrics": {
                "records-consumed-total": m["records_consumed"],
                "bytes-consumed-total": m["bytes_fetched"],
                "fetch-total": m["fetch_requests"],
            },
            "consumer-coordinator-metrics": {"assigned-partitions": len(self.assigned)},
            "epochguard-metrics": {k.replace("_", "-"): v for k, v in m.items()},
        }
        if self.group is not None:
            groups["consumer-coordinator-metrics"]["heartbeat-total"] = m["heartbeats_sent"]
            groups["consumer-coordinator-metrics"]["join-total"] = m["rebalances"]
        return groups

    def _counters(self) -> dict[str, Any]:
        """Every epochguard counter, flat (``metrics(raw=True)``; also what is pushed)."""
        m: dict[str, Any] = self.fetcher.metrics.as_dict()
        if self.group is not None:
            m["heartbeats_sent"] = self.group.heartbeats_sent
            m["rebalances"] = self.group.rebalances
        m["assigned_partitions"] = len(self.assigned)
        m["rebootstraps"] = self._client.rebootstraps
        hanging = self._hanging
        m["describe_producers_requests"] = 0 if hanging is None else hanging.requests_sent
        m["hanging_transactions_detected"] = 0 if hanging is None else hanging.detected
        m["reopened_transactions_detected"] = len(self._reopened_reports)
        m["partitions_awaiting_seek"] = sum(
            1 for t in self.fetcher.trackers.values() if t.state in _STOPPED
        )
        telemetry = self.telemetry
        m["telemetry_pushes"] = 0 if telemetry is None else telemetry.pushes_sent
        return m

    def group_metadata(self) -> ConsumerGroupMetadata:
        """A snapshot of the group membership (kafka's ``ConsumerGroupMetadata``), e.g. for
        ``KafkaProducer.send_offsets_to_transaction``; ``group_id=None`` without a group."""
        group = self.group
        if group is None:
            return ConsumerGroupMetadata(group_id=None)
        if group.generation < 0:
            state = MemberState.UNJOINED
        elif group.rejoin_needed:
            state = MemberState.REBALANCING
        else:
            state = MemberState.STABLE
        return ConsumerGroupMetadata(
            group_id=group.group_id,
            generation_id=group.generation,
            member_id=group.member_id,
            group_instance_id=self.config["group_instance_id"],
            state=state,
        )

    def truncation_reports(self) -> list[TruncationReport]:
        """Every truncation report seen so far (oldest first)."""
        return list(self._truncation_reports)

    # ------------------------------------------------------------------ closing

    def close(self, autocommit: bool, deadline: float, tell_listener: bool = True) -> Step[None]:
        """Commit (if auto commit), tell the listener (kafka-python and Java do, aiokafka
        does not), leave the group; the driver closes the connections after. Bounded by
        ``deadline`` even when every broker is down."""
        self.closed = True
        timeout = max(0.0, deadline - time.monotonic())
        if self.group is not None:
            self.group.abandon_join()
        try:
            if (
                autocommit
                and self.config["enable_auto_commit"]
                and (self.group is not None or self.store is not None)
            ):
                positions = self.current_positions()
                if positions and self.store is not None:
                    self.store.save(positions)
                elif positions and self.group is not None and self.group.coordinator_id is not None:
                    yield from self.group.commit(
                        {tp: (p, "") for tp, p in positions.items()},
                        time.monotonic() + max(0.1, timeout / 2),
                    )
        except Exception as exc:
            log.warning("close_commit_failed", error=repr(exc))
        if self.group is not None:
            try:
                if self.assigned and tell_listener:
                    yield from self.call_listener("on_partitions_revoked", set(self.assigned))
            except Exception as exc:
                log.warning("close_listener_failed", error=repr(exc))
            yield from self.group.leave()
        yield from self._terminating_push(deadline)

    def _terminating_push(self, deadline: float) -> Step[None]:
        """KIP-714: a consumer holding a metrics subscription pushes once more, marked
        terminating, so the last counts reach the broker. Best effort, within ``deadline``."""
        if self.telemetry is None:
            return
        request = self.telemetry.close_request()
        timeout = deadline - time.monotonic()
        if request is None or timeout <= 0:
            return
        future = self._client.send(None, request, timeout * 1000)
        try:
            yield Await(future, timeout)
        except Exception as exc:
            log.debug("telemetry_terminating_push_failed", error=repr(exc))

    def close_deserializers(self) -> None:
        for key in ("key_deserializer", "value_deserializer"):
            # kafka-python closes Deserializer objects that have a close(); so do we.
            closer = getattr(self.config[key], "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception as exc:
                    log.warning("deserializer_close_failed", key=key, error=repr(exc))


class IterCursor:
    """Where the iterator is in the batch it hands out: partition ``k``, record ``i``."""

    __slots__ = ("before", "i", "items", "k")

    def __init__(
        self,
        items: list[tuple[TopicPartition, list[ConsumerRecord]]],
        before: dict[TopicPartition, EpochOffset | None],
    ) -> None:
        self.items = items
        self.before = before
        self.k = 0
        self.i = -1


def as_offsets_and_metadata(
    norm: Mapping[TopicPartition, tuple[EpochOffset, str]],
) -> dict[TopicPartition, OffsetAndMetadata]:
    return {tp: OffsetAndMetadata(p.offset, m, p.wire_epoch) for tp, (p, m) in norm.items()}
