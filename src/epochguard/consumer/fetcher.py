"""The engine's fetching half: turns ``PartitionTracker`` actions into requests and answers
back into tracker inputs. It decides nothing about epochs itself, and it never waits.

Layout: requests are built and answers parsed in :mod:`~epochguard.consumer.wire` (the only
place that converts wire values), the consumer's metadata lives in
:mod:`~epochguard.consumer.metadata`, and what was fetched from each broker but not yet
delivered (buffers, prefetches, the request in flight) in :mod:`~epochguard.consumer.source`.
This module drives them: :meth:`Fetcher.send_requests`, the answer handlers, delivery
(:meth:`Fetcher.fetched_records`) and :meth:`Fetcher.pump_until`, the one step that waits for
answers (by yielding :class:`~epochguard.consumer.effects.Pump` to the driver).

Threading: every method runs on the driver's thread (the application thread inside
``EpochConsumer`` calls, the event loop for ``AIOEpochConsumer``). Request futures complete
where the connections are served; their callbacks only append to a deque and set
:attr:`Fetcher.wake_signal`, and the answers are applied here, in order, by
:meth:`Fetcher.process_completions`.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import attrs
from kafka.errors import KafkaTimeoutError
from kafka.structs import TopicPartition

from epochguard._errors import ErrorCode, error_name
from epochguard._log import get_logger
from epochguard.consumer import wire
from epochguard.consumer.client import BrokerClient, is_refusal
from epochguard.consumer.columns import decode_columns
from epochguard.consumer.effects import Pump, Signal, Step
from epochguard.consumer.errors import CorruptRecordError, RecordDeserializationError
from epochguard.consumer.metadata import Metadata
from epochguard.consumer.records import (
    ConsumerRecord,
    DecodedFetch,
    Deserializer,
    batch_cuts,
    decode_records,
    fetch_end,
)
from epochguard.consumer.session import SESSION_ERRORS, SessionEvent, SessionPlan, SessionState
from epochguard.consumer.source import MAX_FETCHES_PER_BROKER, Buffered, Prefetch, Source
from epochguard.offsets.events import (
    Event,
    FetchAction,
    MetadataRefreshNeeded,
    OffsetReset,
    PositionValidated,
    RefreshReason,
    ResetAction,
    TruncationDetected,
    ValidateAction,
    WaitAction,
)
from epochguard.offsets.policy import OffsetPolicy, ResetStrategy, RetryBackoff
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.reopened import ReopenedTransaction, TransactionLedger
from epochguard.offsets.state import PartitionState, PartitionTracker

__all__ = [
    "FETCH_MAX_VERSION",
    "FETCH_MAX_VERSION_BY_NAME",
    "MAX_FETCHES_PER_BROKER",
    "METADATA_MAX_VERSION",
    "Fetcher",
    "FetcherMetrics",
]

log = get_logger("epochguard.consumer")

_FETCHING = PartitionState.FETCHING
FETCH_MAX_VERSION = wire.FETCH_MAX_VERSION
FETCH_MAX_VERSION_BY_NAME = wire.FETCH_MAX_VERSION_BY_NAME
METADATA_MAX_VERSION = wire.METADATA_MAX_VERSION
#: INCONSISTENT_TOPIC_ID: a fetch session still holds a re-created topic's old id (real
#: Kafka answers it to an incremental fetch; a full fetch gets UNKNOWN_TOPIC_ID).
_UNKNOWN_TOPIC_ERRORS = (
    wire.ERR.UnknownTopicOrPartitionError,
    wire.ERR.UnknownTopicIdError,
    wire.ERR.InconsistentTopicIdError,
)
#: Refusals by a broker that does not lead the partition (any more, or not yet): the
#: metadata that sent the request there is out of date, so the refresh goes at once.
_NOT_LEADING = frozenset(
    error_name(code) for code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)
)
#: A request to the leader failed with its connection (the trackers' reason).
_CONNECTION_LOST = error_name(ErrorCode.NETWORK_EXCEPTION)
#: Between rounds of a blocking ListOffsets lookup whose leaders did not all answer.
_LOOKUP_BACKOFF = RetryBackoff(0.05, 0.5)
#: Longest single wait inside :meth:`Fetcher.pump_until` (its predicate may depend on state
#: that no answer signals, such as the clock or another thread).
_PUMP_MAX_WAIT_S = 0.05
#: Records of one piece of a partition's answer, decoded at a time (see
#: :attr:`Fetcher.decode_piece_records`): a read's worth (aiokafka's ``getmany`` reads
#: take what is buffered; ``max_poll_records`` is 500 by default).
DECODE_PIECE_RECORDS = 500


class FetcherMetrics:
    """Plain counters, exposed through ``EpochConsumer.metrics()``."""

    def __init__(self) -> None:
        self.records_consumed = 0
        self.bytes_fetched = 0
        self.fetch_requests = 0
        self.fetch_errors = 0
        self.metadata_requests = 0
        self.offset_for_leader_epoch_requests = 0
        self.list_offsets_requests = 0
        self.diverging_epoch_responses = 0
        self.prefetches_used = 0
        self.prefetches_discarded = 0
        self.truncations_detected = 0
        self.records_lost = 0
        self.validations = 0
        self.offset_resets = 0
        self.stale_metadata_ignored = 0
        self.request_failures = 0
        #: KIP-392: Fetch answers that named another replica to read from.
        self.preferred_replica_changes = 0
        #: KIP-392: fetch answers served by a follower (the rest came from leaders).
        self.fetches_from_followers = 0
        #: KIP-392: record bytes of those answers (``bytes_fetched`` counts every answer).
        self.bytes_fetched_from_followers = 0
        #: KIP-227: fetches sent as incremental session requests, partitions carried by
        #: fetches (all of them in a full fetch, the changed ones in an incremental one),
        #: partitions forgotten, and sessions dropped back to a full fetch.
        self.incremental_fetch_requests = 0
        self.fetch_partitions_sent = 0
        self.fetch_partitions_forgotten = 0
        self.fetch_session_resets = 0
        #: KIP-951: leaders taken from a refused Fetch's hint, without a metadata round trip.
        self.leader_hints_applied = 0
        #: Replicas of a partition without a leader found back by a connection attempt
        #: (every replica was down): metadata was asked at once.
        self.replicas_back = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@attrs.frozen
class FetchSent:
    """What a Fetch answer is applied against: the broker, the tracker actions it serves,
    the topic names of its topic ids, and its fetch-session plan (``None``: sessionless)."""

    node: int
    actions: dict[TopicPartition, FetchAction]
    names: dict[uuid.UUID, str]
    plan: SessionPlan | None = None


@attrs.frozen
class PrefetchSent:
    """A prefetch: the broker, the prefetches it carries, the topic names of its ids."""

    node: int
    sent: dict[TopicPartition, Prefetch]
    names: dict[uuid.UUID, str]


@attrs.frozen
class MetadataSent:
    sent_at: float
    topics: Any


class _Done(NamedTuple):
    handler: Callable[[Any, Any], None]
    context: Any
    future: Any


def _next_fetch(p: wire.FetchedPartition) -> tuple[int, int | None] | None:
    """Where a fetch of what follows answer ``p`` starts (offset and the epoch of its last
    batch), read from its batch headers; ``None`` for an error, a divergence, no records,
    headers that cannot say, or an answer at the end of the log (held back instead)."""
    data = p.records
    if p.error is not None or p.diverging is not None or not data:
        return None
    end = fetch_end(data)
    if end is None or end[0] >= p.high_watermark:
        return None
    return end


def _all_done(futures: list[Any]) -> bool:
    return all(f.is_done for f in futures)


def _refreshed(metadata: Metadata, since: float, not_before: float) -> bool:
    return time.monotonic() >= not_before and metadata.fresh_since(since)


def _ignore(_context: Any, _future: Any) -> None:
    """Completion handler for futures whose answers are read by the code that waits."""


class Fetcher:
    """Partition trackers, the fetch sources, metadata, and the requests that serve them."""

    def __init__(
        self,
        client: BrokerClient,
        config: dict[str, Any],
        policy: OffsetPolicy,
        key_deserializer: Deserializer | None,
        value_deserializer: Deserializer | None,
        on_event: Callable[[Event], None],
    ) -> None:
        self._client = client
        self._config = config
        self._policy = policy
        self._key_des = key_deserializer
        self._value_des = value_deserializer
        self._on_event = on_event
        self.trackers: dict[TopicPartition, PartitionTracker] = {}
        self.metadata = Metadata(config)
        self._sources: dict[int, Source] = {}
        # Which source holds a partition's buffer or prefetch (at most one at a time).
        self._source_of: dict[TopicPartition, Source] = {}
        # Delivery order across partitions (round robin), of partitions with a buffer.
        self._buffer_order: collections.deque[TopicPartition] = collections.deque()
        self._done: collections.deque[_Done] = collections.deque()
        #: Most record bytes one :meth:`process_completions` decodes (``None``: no bound).
        #: The asyncio driver sets one: an answer for many partitions (up to
        #: ``fetch_max_bytes``) is then decoded a few partitions per read, each read giving
        #: the event loop a turn, instead of in one go that stalls the loop.
        self.decode_budget_bytes: int | None = None
        #: With a decode budget, a partition's answer is decoded in pieces of whole batches
        #: of at most this many records (and half the budget's bytes), each when the reads
        #: reach it: the decoding a read does is bounded whatever the batches' size (one
        #: MiB of one-record batches took about 100 ms decoded whole).
        self.decode_piece_records = DECODE_PIECE_RECORDS
        #: Whether a prefetch answered before its tracker asked has what follows it
        #: prefetched at once (:meth:`_chain_prefetches`). The asyncio driver turns it on
        #: (measured faster at 1 KB x 1 partition, no slower at 8); for the threaded
        #: driver, which decodes whole answers at once, it was slower at 8 partitions.
        self.chain_prefetches = False
        # Partitions of answers that arrived (their trackers still await them) and wait for
        # a later process_completions() to decode and apply them, oldest first.
        self._undecoded: collections.deque[
            tuple[FetchAction, wire.FetchedPartition, float, Prefetch | None]
        ] = collections.deque()
        # The partitions send_requests() visits: each poll's work is proportional to the
        # partitions with something to do, not to all assigned ones (at 1,000 partitions
        # the walk over every tracker was most of each poll). A partition leaves the set
        # when its visit finds it idle and comes back on whatever can end that:
        # - any tracker input or command (after_input, add_partition, clear_corrupt, the
        #   cancels below): in flight, paused, stopped, no position, corrupt;
        # - the end of its buffer (fetched_records): buffered;
        # - the time its WaitAction names (_timers): retry backoff, metadata wait;
        # - its broker's request completing (_parked_busy) or its broker's buffers running
        #   dry or a fetch going to it (_parked_held): see send_requests.
        self._ready: dict[TopicPartition, None] = {}
        self._timers: list[tuple[float, int, TopicPartition]] = []
        self._timer_seq = itertools.count()
        # Per broker: partitions whose fetch waits for that broker's request in flight, and
        # caught-up partitions held back while the application drains that broker's
        # buffers; _parked_at says which of those dicts holds a partition.
        self._parked_busy: dict[int, dict[TopicPartition, None]] = {}
        self._parked_held: dict[int, dict[TopicPartition, None]] = {}
        self._parked_at: dict[TopicPartition, dict[TopicPartition, None]] = {}
        #: Set when an answer arrives or a request should go out now; drivers wait on it.
        self.wake_signal = self._wake = Signal()
        self.metrics = FetcherMetrics()
        # Partitions whose refused fetch named their new leader (KIP-951) in the answer
        # being applied: no metadata refresh for that refusal.
        self._hinted: set[TopicPartition] = set()
        # Brokers whose last Fetch answer was v12+: they compare a fetch's LastFetchedEpoch
        # with their own epochs and answer DivergingEpoch (KIP-595), so a partition whose
        # leader moves to one of them needs no OffsetForLeaderEpoch round trip (the next
        # fetch is the validation). A broker not heard from yet is validated the old way.
        self._diverging_nodes: set[int] = set()
        self.metadata_listeners: list[Callable[[], None]] = []
        # The connection layer's rebootstrap count when metadata was last asked for after one.
        self._rebootstraps_seen = client.rebootstraps
        #: record bytes fetched per broker (KIP-392 diagnostics: what crossed racks)
        self.bytes_by_node: collections.Counter[int] = collections.Counter()
        #: the high watermark of each partition's last fetch answer (``highwater()``)
        self.highwaters: dict[TopicPartition, int] = {}
        #: the last stable offset and the wall-clock time (ms) of that answer
        #: (``AIOEpochConsumer.last_stable_offset`` / ``last_poll_timestamp``)
        self.last_stable_offsets: dict[TopicPartition, int] = {}
        self.last_fetch_ms: dict[TopicPartition, int] = {}
        # Partitions whose fetched bytes did not decode: left out of fetching until the
        # application seeks them (a re-fetch would fail the same way and starve poll), and
        # the errors the next polls raise, one each.
        self.corrupt: set[TopicPartition] = set()
        self.corrupt_errors: dict[
            TopicPartition, CorruptRecordError | RecordDeserializationError
        ] = {}
        self._prefetch_enabled = True
        self._read_committed = config["isolation_level"] == "read_committed"
        # read_committed: what each partition's reader saw of transactions, and who hears of
        # a decision it acted on that no longer holds (offsets/reopened.py).
        self.ledgers: dict[TopicPartition, TransactionLedger] = {}
        self.on_reopened: Callable[[ReopenedTransaction], None] | None = None
        self._fetch_params = wire.FetchParams(
            max_wait_ms=int(config["fetch_max_wait_ms"]),
            min_bytes=int(config["fetch_min_bytes"]),
            max_bytes=int(config["fetch_max_bytes"]),
            partition_max_bytes=int(config["max_partition_fetch_bytes"]),
            read_committed=self._read_committed,
            rack_id=config.get("client_rack") or "",
            max_version=int(config.get("max_fetch_version", wire.FETCH_MAX_VERSION)),
        )
        self._fetch_timeout_ms = config["request_timeout_ms"] + config["fetch_max_wait_ms"]
        # KIP-392: how long a leader's choice of read replica holds (Java: the metadata age).
        self._replica_ttl_s = float(config["metadata_max_age_ms"]) / 1000
        self._sessions_enabled = bool(config.get("enable_incremental_fetch_sessions", True))
        # record_format="columns": buffers hold RecordColumns, which slice and measure as
        # the record lists do (consumer/columns.py).
        self._decode: Callable[..., Any] = decode_records
        if config.get("record_format") == "columns":
            self._decode = functools.partial(
                decode_columns, headers=bool(config.get("column_headers", False))
            )

    # ------------------------------------------------------------------ metadata views

    @property
    def metadata_topics(self) -> set[str]:
        return self.metadata.topics

    @property
    def topic_partitions(self) -> dict[str, set[int]]:
        return self.metadata.topic_partitions

    @property
    def topic_ids(self) -> dict[str, str | None]:
        return self.metadata.topic_ids

    @property
    def all_topics(self) -> set[str] | None:
        return self.metadata.all_topics

    @property
    def unknown_topics(self) -> set[str]:
        return self.metadata.unknown_topics

    @property
    def unauthorized_topics(self) -> set[str]:
        return self.metadata.unauthorized_topics

    def take_authorization_error(self) -> Exception | None:
        return self.metadata.take_authorization_error()

    # ------------------------------------------------------------------ partitions

    def add_partition(self, tp: TopicPartition) -> PartitionTracker:
        tracker = self.trackers.get(tp)
        if tracker is None:
            tracker = PartitionTracker(tp, self._policy)
            self.trackers[tp] = tracker
            if self._read_committed:
                self.ledgers[tp] = TransactionLedger(tp)
            for source in self._sources.values():
                if source.session.holds(tp):
                    source.session.event(SessionEvent.PARTITION_RETURNED)
            # Callers may command a new tracker (restore) without after_input.
            self._ready[tp] = None
            if tp.topic not in self.metadata.topics:
                self.metadata.topics.add(tp.topic)
                self.request_metadata()
            self._apply_known_metadata(tp)
        return tracker

    def remove_partition(self, tp: TopicPartition) -> None:
        self.clear_corrupt(tp)
        self.metadata.forget((tp,))
        self.trackers.pop(tp, None)
        self.ledgers.pop(tp, None)
        self.highwaters.pop(tp, None)
        self.last_stable_offsets.pop(tp, None)
        self.last_fetch_ms.pop(tp, None)
        self.drop_buffer(tp)
        self._ready.pop(tp, None)
        box = self._parked_at.pop(tp, None)
        if box is not None:
            box.pop(tp, None)

    def clear_corrupt(self, tp: TopicPartition) -> None:
        """The application moved ``tp`` (seek): fetch it again."""
        self.corrupt.discard(tp)
        self.corrupt_errors.pop(tp, None)
        self.mark_ready(tp)

    def drop_buffer(self, tp: TopicPartition) -> None:
        source = self._source_of.pop(tp, None)
        if source is not None and source.drop(tp):
            self.metrics.prefetches_discarded += 1

    def _source(self, node: int) -> Source:
        source = self._sources.get(node)
        if source is None:
            source = self._sources[node] = Source(node, self._sessions_enabled)
        return source

    def _buffer(self, tp: TopicPartition) -> Buffered | None:
        source = self._source_of.get(tp)
        return None if source is None else source.buffers.get(tp)

    def _drop_prefetch(self, tp: TopicPartition) -> None:
        source = self._source_of.get(tp)
        if source is not None and source.prefetches.pop(tp, None) is not None:
            self.metrics.prefetches_discarded += 1

    def mark_ready(self, tp: TopicPartition) -> None:
        """``tp``'s tracker may have something to send: the next ``send_requests`` asks it."""
        if tp in self.trackers:
            self._ready[tp] = None
            box = self._parked_at.pop(tp, None)
            if box is not None:
                box.pop(tp, None)

    def _park(
        self, where: dict[int, dict[TopicPartition, None]], node: int, tp: TopicPartition
    ) -> None:
        box = where.get(node)
        if box is None:
            box = where[node] = {}
        box[tp] = None
        self._parked_at[tp] = box

    def _release(self, box: dict[TopicPartition, None] | None) -> None:
        if box:
            parked_at = self._parked_at
            for tp in box:
                parked_at.pop(tp, None)
            self._ready.update(box)
            box.clear()

    def after_input(self, tp: TopicPartition) -> None:
        """Called after any command to a tracker: buffered records are only valid while the
        partition keeps fetching from the same position."""
        self.mark_ready(tp)
        tracker = self.trackers.get(tp)
        if tracker is None or tracker.state is not _FETCHING or tracker.paused:
            source = self._source_of.get(tp)
            if source is not None:
                source.buffers.pop(tp, None)
                self._drop_prefetch(tp)
        self._drain_events(tp)

    def has_buffered(self) -> bool:
        return any(s.buffers for s in self._sources.values())

    # ------------------------------------------------------------------ completions

    def _complete(self, handler: Callable[[Any, Any], None], context: Any, future: Any) -> None:
        def done(_value: Any) -> None:
            self._done.append(_Done(handler, context, future))
            self._wake.set()

        future.add_both(done)

    def wait(self, timeout_s: float, decode: bool = True) -> None:
        """Sleep until an answer arrives or ``timeout_s`` passes (see :meth:`has_completions`
        for ``decode``)."""
        if self.has_completions(decode):
            return
        if timeout_s > 0:
            self._wake.wait_blocking(timeout_s)
        self._wake.clear()

    def wakeup(self) -> None:
        self._wake.set()

    def has_completions(self, decode: bool = True) -> bool:
        """Answers arrived that :meth:`process_completions` has not applied yet (with
        ``decode=False``, not counting those whose records wait undecoded)."""
        return bool(self._done) or (decode and bool(self._undecoded))

    def process_completions(
        self,
        wanted: int = 0,
        deliverable: Callable[[TopicPartition], bool] | None = None,
        decode: bool = True,
    ) -> None:
        """Apply the answers that arrived, in order; with :attr:`decode_budget_bytes`, the
        fetched records of about that many bytes (at least one partition's), the rest at the
        next calls. With ``wanted`` (a read's ``max_records``), decoding stops as soon as
        that many records of ``deliverable`` partitions are buffered: a reader decodes what
        it hands out, not a whole answer ahead of it (decoded records held in the buffers
        are what the garbage collector walks; the undecoded bytes are one object each).
        ``decode=False`` applies the other answers and leaves those with records undecoded
        (their partitions await them as if they were still on their way)."""
        done = self._done
        while done:
            item = done.popleft()
            item.handler(item.context, item.future)
        if decode and self._undecoded:
            self._apply_undecoded(wanted, deliverable)

    def _buffered_at_least(
        self, wanted: int, deliverable: Callable[[TopicPartition], bool] | None
    ) -> bool:
        """At least ``wanted`` records of ``deliverable`` partitions are buffered."""
        source_of = self._source_of
        for tp in self._buffer_order:
            source = source_of.get(tp)
            buf = None if source is None else source.buffers.get(tp)
            if buf is None or (deliverable is not None and not deliverable(tp)):
                continue
            # With pieces left, what their batch headers count: the reads decode them
            # before other partitions' answers are started.
            wanted -= len(buf.records) - buf.pos + buf.rest_records
            if wanted <= 0:
                return True
        return False

    def _apply_undecoded(
        self, wanted: int, deliverable: Callable[[TopicPartition], bool] | None
    ) -> None:
        budget = self.decode_budget_bytes
        queue = self._undecoded
        spent = 0
        while queue:
            size = len(queue[0][1].records)
            if budget is not None and spent and spent + size > budget:
                return
            if wanted and self._buffered_at_least(wanted, deliverable):
                return
            action, p, now, ahead = queue.popleft()
            spent += size
            self._source(action.node_id).undecoded -= 1
            self._apply_partition(action, p, now, ahead)

    def pump_until(self, predicate: Callable[[], bool], deadline: float) -> Step[bool]:
        """Apply answers, send what the trackers and metadata need, and wait for more, until
        ``predicate()`` holds or ``deadline`` (``time.monotonic()``) passes. Returns the
        predicate's last value. Every wait of the consumer goes through here, so trackers
        keep moving (validations, resets, metadata) whatever the caller waits for. Fetched
        records left undecoded (the asyncio driver's budget) stay so: no predicate waits for
        them, and decoding them all here held the event loop for every buffered answer
        (``end_offsets()`` during a backlog over 100 partitions)."""
        while True:
            self.process_completions(decode=False)
            if predicate():
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            yield Pump(self, min(deadline, now + _PUMP_MAX_WAIT_S), decode=False)

    # ------------------------------------------------------------------ events

    def _drain_events(self, tp: TopicPartition) -> None:
        tracker = self.trackers.get(tp)
        if tracker is None:
            return
        events = tracker.drain_events()
        for event in events:
            if isinstance(event, MetadataRefreshNeeded):
                if tp not in self._hinted:
                    refused = event.reason in _NOT_LEADING
                    now = time.monotonic()
                    leader = tracker.leader_id
                    self.metadata.request(
                        now if refused else None,
                        any_answer=not refused,
                        leader_for=tp if event.reason == RefreshReason.LEADER_UNKNOWN else None,
                        lost_leader=(tp, leader, now)
                        if leader is not None and event.reason == _CONNECTION_LOST
                        else None,
                    )
                    self._wake.set()
            elif isinstance(event, TruncationDetected):
                self.metrics.truncations_detected += 1
                lost = event.report.lost_count
                if lost:
                    self.metrics.records_lost += lost
            elif isinstance(event, PositionValidated):
                self.metrics.validations += 1
            elif isinstance(event, OffsetReset):
                self.metrics.offset_resets += 1
            self._on_event(event)

    # ------------------------------------------------------------------ metadata

    def request_metadata(self) -> None:
        self.metadata.request()
        self._wake.set()

    def want_all_topics(self, value: bool) -> None:
        if value and not self.metadata.want_all:
            self.request_metadata()
        self.metadata.want_all = value

    def metadata_fresh_since(self, when: float) -> bool:
        return self.metadata.fresh_since(when)

    def _maybe_send_metadata(self, now: float) -> None:
        rebootstraps = self._client.rebootstraps
        if rebootstraps != self._rebootstraps_seen:
            # The brokers may all have moved: learn where they are now, whatever the
            # metadata schedule says.
            self._rebootstraps_seen = rebootstraps
            self.metadata.request()
        due = self.metadata.due(now)
        if due is None:
            return
        request, topics = due
        self.metrics.metadata_requests += 1
        fut = self._client.send_metadata(request)
        self._complete(self._on_metadata, MetadataSent(now, topics), fut)

    def _send_probes(self, now: float) -> None:
        for node in self.metadata.probes_due(now):
            self._complete(self._on_probe, node, self._client.probe(node))

    def _on_probe(self, node: int, future: Any) -> None:
        now = time.monotonic()
        error = future.exception
        back = self.metadata.on_probe(
            node, now, reachable=error is None, refused=error is not None and is_refusal(error)
        )
        if back:
            self.metrics.replicas_back += 1
            log.info("leaderless_replica_back", node=node)
            self._wake.set()

    def _on_metadata(self, context: MetadataSent, future: Any) -> None:
        sent_at, topics = context.sent_at, context.topics
        now = time.monotonic()
        if future.exception is not None:
            self.metadata.on_failure(future.exception, now)
            return
        answer = wire.read_metadata(future.value)
        if answer.error is not None:
            # REBOOTSTRAP_REQUIRED above all: the answer names nothing; the connection layer
            # goes back to the bootstrap servers for the next request (strategy permitting).
            self.metadata.on_failure(answer.error(), now)
            return
        leaders = self.metadata.on_answer(answer, sent_at, topics, now)
        topic_ids = self.metadata.topic_ids
        for tp, (leader, epoch) in leaders.items():
            tracker = self.trackers.get(tp)
            if tracker is None:
                continue
            replicas = self.metadata.replicas_of(tp)
            before = (tracker.leader_id, tracker.leader_epoch)
            if not tracker.on_metadata(
                leader,
                epoch,
                topic_ids.get(tp.topic),
                replicas,
                fetch_detects_divergence=self._judges_by_fetch(leader),
            ):
                self.metrics.stale_metadata_ignored += 1
                log.info(
                    "stale_metadata_ignored",
                    topic=tp.topic,
                    partition=tp.partition,
                    leader_epoch=epoch,
                    known_leader_epoch=tracker.leader_epoch,
                )
            elif before[0] is not None and before != (tracker.leader_id, tracker.leader_epoch):
                self._leader_changed(tp)
            self.after_input(tp)
        for listener in list(self.metadata_listeners):
            listener()

    def _leader_changed(self, tp: TopicPartition) -> None:
        """A new leader or leader epoch for ``tp``: the session it is in goes back to a full
        fetch, so every partition of that broker is answered once more, under the epochs
        the trackers now send."""
        # The session holding it may be a follower's (KIP-392), not the old leader's.
        for source in self._sources.values():
            if source.session.holds(tp):
                before = source.session.state
                source.session.event(SessionEvent.LEADER_CHANGED)
                self._session_event(source, before)

    def _judges_by_fetch(self, leader: int | None) -> bool:
        """Whether ``leader``'s fetch answers judge a position (DivergingEpoch) in place of an
        OffsetForLeaderEpoch request. With no leader the choice waits for the metadata that
        names one (nothing is fetched or validated until then), so a leaderless answer
        between two leaders does not commit the partition to a round trip the next leader
        would have made unnecessary."""
        return leader is None or leader in self._diverging_nodes

    def _note_fetch_version(self, node: int, answer: wire.FetchAnswer) -> None:
        if answer.version >= wire.FETCH_DIVERGING_MIN_VERSION:
            self._diverging_nodes.add(node)
        else:
            self._diverging_nodes.discard(node)

    def _session_event(self, source: Source, before: SessionState) -> None:
        if before is SessionState.OPEN and source.session.state is not SessionState.OPEN:
            self.metrics.fetch_session_resets += 1

    def _apply_known_metadata(self, tp: TopicPartition) -> None:
        known = self.metadata.leaders.get(tp)
        if known is not None:
            leader, epoch = known
            self.trackers[tp].on_metadata(
                leader,
                epoch,
                self.metadata.topic_ids.get(tp.topic),
                self.metadata.replicas_of(tp),
                fetch_detects_divergence=self._judges_by_fetch(leader),
            )
            self.after_input(tp)

    # ------------------------------------------------------------------ sending

    def send_requests(self, now: float) -> float:
        """Send what the trackers ask for. Returns when something next needs doing.

        Only the partitions in the ready set are asked (see ``__init__``): the others are
        known to be idle until an input, a timer or their broker wakes them."""
        self._maybe_send_metadata(now)
        self._send_probes(now)
        metadata = self.metadata
        wake_at = metadata.wake_at(now, now + float(self._config["metadata_max_age_ms"]) / 1000)
        ready_set = self._ready
        timers = self._timers
        while timers and timers[0][0] <= now:
            tp = heapq.heappop(timers)[2]
            if tp in self.trackers:
                self.mark_ready(tp)
        sources = self._sources
        for node, s in sources.items():
            if s.can_send:
                self._release(self._parked_busy.get(node))
                if not s.holds_records:
                    self._release(self._parked_held.get(node))
        if timers:
            wake_at = min(wake_at, timers[0][0])
        if not ready_set:
            if self._prefetch_enabled:
                self._send_prefetches()
            return wake_at
        self._ready = {}
        fetches: dict[int, list[FetchAction]] = {}
        validations: dict[int, list[ValidateAction]] = {}
        resets: dict[int, list[ResetAction]] = {}
        ready: list[tuple[FetchAction, wire.FetchedPartition]] = []
        promoted: dict[TopicPartition, Prefetch] = {}
        source_of = self._source_of
        trackers = self.trackers
        corrupt = self.corrupt
        # Fetches that would only be made to be cancelled are not made: those to a broker
        # with a request in flight (parked until it completes), and, while a broker still
        # has buffered records, those of its partitions at the end of their log, which go
        # out only along with a partition that is not (held back, see the deferral below).
        busy = {node for node, s in sources.items() if not s.can_send}
        draining = {node for node, s in sources.items() if s.holds_records and node not in busy}
        held_back: dict[int, list[TopicPartition]] = {}
        for tp in ready_set:
            tracker = trackers.get(tp)
            if tracker is None:
                continue
            source = source_of.get(tp)
            if source is not None and tp in source.buffers:
                continue  # ready again when its buffer is drained or dropped
            if tp in corrupt:
                continue  # ready again on seek (clear_corrupt)
            if (
                (busy or draining)
                and (source is None or tp not in source.prefetches)
                and tracker.fetch_leader(now) is not None
            ):
                # fetch_node, not the leader: a KIP-392 follower serves the fetch.
                to = tracker.fetch_node
                assert to is not None
                if to in busy:
                    self._park(self._parked_busy, to, tp)
                    continue
                if (
                    to in draining
                    and sources[to].caught_up.get(tp, False)
                    and not metadata.held(tp.topic)
                ):
                    held_back.setdefault(to, []).append(tp)
                    continue
            action = tracker.next_action(now)
            if action is None:
                # In flight, paused, stopped or without a position: an input wakes it.
                self._drain_events(tp)
                continue
            if isinstance(action, WaitAction):
                until = action.until
                heapq.heappush(timers, (until, next(self._timer_seq), tp))
                wake_at = min(wake_at, until)
            elif isinstance(action, FetchAction):
                pf = None if source is None else source.prefetches.get(tp)
                if source is not None and pf is not None:
                    if pf.matches(action):
                        if pf.answer is not None:
                            if pf.after is None:
                                del source.prefetches[tp]
                            else:
                                # What follows is on its way already: it is this
                                # answer's early prefetch (see _prefetch_ahead).
                                source.prefetches[tp] = promoted[tp] = pf.after
                            ready.append((action, pf.answer))
                        else:
                            pf.waiting = action  # answered when the prefetch completes
                        self._drain_events(tp)
                        continue
                    self._drop_prefetch(tp)
                node = action.node_id
                if metadata.held(tp.topic):
                    # Until metadata settles the topic: asked again at the next poll.
                    tracker.cancel(action)
                    self._ready[tp] = None
                elif not self._source(node).can_send:
                    tracker.cancel(action)
                    self._park(self._parked_busy, node, tp)
                else:
                    fetches.setdefault(node, []).append(action)
            elif isinstance(action, ValidateAction):
                validations.setdefault(action.leader_id, []).append(action)
            elif isinstance(action, ResetAction):
                resets.setdefault(action.leader_id, []).append(action)
            self._drain_events(tp)
        for node, tps in held_back.items():
            going = fetches.get(node)
            if not going:
                for tp in tps:
                    self._park(self._parked_held, node, tp)
                continue
            self._add_held_back(going, tps, now)
        for node, actions in fetches.items():
            source = self._sources[node]
            if source.holds_records and source.all_caught_up(actions):
                # Only partitions at the end of their log: such a request long-polls for
                # fetch_max_wait_ms. Send them along with the partitions the application
                # is still draining from this broker instead.
                for a in actions:
                    trackers[a.tp].cancel(a)
                    self._park(self._parked_held, node, a.tp)
                continue
            held = self._parked_held.get(node)
            if held:
                # Caught-up partitions held back earlier go out with this fetch.
                tps = list(held)
                held.clear()
                for tp in tps:
                    self._parked_at.pop(tp, None)
                self._add_held_back(actions, tps, now)
            self._send_fetch(source, actions)
        if ready:
            self.metrics.prefetches_used += len(ready)
            if promoted and self._prefetch_enabled and self.chain_prefetches:
                # A promoted prefetch whose answer is here already: what follows it goes
                # out before these answers are decoded.
                by_source: dict[int, list[tuple[Prefetch, wire.FetchedPartition]]] = {}
                for pf in promoted.values():
                    if pf.answer is not None:
                        by_source.setdefault(pf.node, []).append((pf, pf.answer))
                for node, stored in by_source.items():
                    self._chain_prefetches(self._sources[node], stored)
            self._apply_answers(ready, now, promoted)
        if self._prefetch_enabled:
            self._send_prefetches()
        for node, vactions in validations.items():
            self._send_validation(node, vactions)
        for node, ractions in resets.items():
            self._send_list_offsets(node, ractions)
        return wake_at

    def _add_held_back(
        self, going: list[FetchAction], tps: list[TopicPartition], now: float
    ) -> None:
        """Add the fetches of held-back partitions to a fetch about to be sent to their
        broker; any other action they ask for instead goes back to the ready set."""
        for tp in tps:
            tracker = self.trackers.get(tp)
            if tracker is None:
                continue
            action = tracker.next_action(now)
            if isinstance(action, FetchAction) and action.node_id == going[0].node_id:
                going.append(action)
            elif action is not None:
                if not isinstance(action, WaitAction):
                    tracker.cancel(action)
                self._ready[tp] = None
            self._drain_events(tp)

    def _send_fetch(self, source: Source, actions: list[FetchAction]) -> None:
        params = self._fetch_params
        by_id = wire.uses_topic_ids(actions, params)
        plan = source.session.plan(actions, by_id)
        request, names = wire.fetch_request(
            plan.entries,
            params,
            session_id=plan.session_id,
            session_epoch=plan.epoch,
            forgotten=plan.forgotten,
            by_id=by_id,
        )
        if plan.names:
            names = {**plan.names, **names}
        source.request_sent()
        metrics = self.metrics
        metrics.fetch_requests += 1
        metrics.fetch_partitions_sent += len(plan.entries)
        if plan.incremental:
            metrics.incremental_fetch_requests += 1
            metrics.fetch_partitions_forgotten += len(plan.forgotten)
        fut = self._client.send(source.node, request, self._fetch_timeout_ms)
        self._complete(
            self._on_fetch, FetchSent(source.node, {a.tp: a for a in actions}, names, plan), fut
        )

    def _send_prefetches(self) -> None:
        """For brokers with no fetch in flight: fetch what buffered partitions will ask for
        next, so the answer is (often) there when the application drains them."""
        for source in self._sources.values():
            if not source.buffers:
                continue
            items = source.prefetch_entries(self.trackers, _FETCHING)
            if items:
                self._send_prefetch_request(source, items)

    def _send_prefetch_request(
        self,
        source: Source,
        items: list[tuple[TopicPartition, Prefetch]],
        chained: bool = False,
    ) -> None:
        if not chained:  # chained ones hang off the partition's prefetch in place
            for tp, pf in items:
                source.prefetches[tp] = pf
                self._source_of[tp] = source
        request, names = wire.fetch_request([pf.entry for _tp, pf in items], self._fetch_params)
        source.request_sent()
        self.metrics.fetch_requests += 1
        fut = self._client.send(source.node, request, self._fetch_timeout_ms)
        self._complete(self._on_prefetch, PrefetchSent(source.node, dict(items), names), fut)

    def _prefetch_ahead(
        self, pairs: list[tuple[FetchAction, wire.FetchedPartition]]
    ) -> dict[TopicPartition, Prefetch]:
        """Send the prefetches for what follows these answers before decoding them: where
        each ends is in its batch headers, so the broker serves the next answer while these
        are decoded and handed out (with one fetch in flight per broker, the round trip
        otherwise waits for the decoding). One request per broker for all of its
        partitions; the conditions of :meth:`Source.prefetch_entries`; the same rule for
        using them: only as the answer to a tracker fetch that asks for exactly this."""
        by_node: dict[int, list[tuple[TopicPartition, Prefetch]]] = {}
        for action, p in pairs:
            end = _next_fetch(p)
            if end is None:
                continue
            tp = action.tp
            tracker = self.trackers.get(tp)
            if tracker is None or action.topic_probe or not tracker.awaits(action):
                continue
            source = self._source(action.node_id)
            if self._source_of.get(tp, source) is not source:
                continue  # moved brokers: applying the answer first drops what the old one holds
            if not source.may_prefetch_ahead(tp, tracker, _FETCHING):
                continue
            by_node.setdefault(action.node_id, []).append(
                (tp, source.prefetch(tp, tracker, end[0], end[1]))
            )
        ahead: dict[TopicPartition, Prefetch] = {}
        for node, items in by_node.items():
            self._send_prefetch_request(self._sources[node], items)
            ahead.update(items)
        return ahead

    @staticmethod
    def _ahead_holds(ahead: Prefetch, decoded: Any, offset: int) -> bool:
        """Whether the decoded answer ends where its early prefetch assumed."""
        records = decoded.records
        last = records[-1].leader_epoch if len(records) else decoded.last_epoch
        return Fetcher._ends_as_assumed(ahead, decoded.next_offset, last, offset)

    @staticmethod
    def _ends_as_assumed(
        ahead: Prefetch, next_offset: int | None, last_epoch: int | None, offset: int
    ) -> bool:
        """Whether an answer to a fetch at ``offset`` that ends at ``next_offset``, its last
        record (else its last batch) of ``last_epoch``, is where its early prefetch goes on
        from."""
        if next_offset is None or next_offset <= offset or next_offset != ahead.entry.offset:
            return False
        last = None if last_epoch is None or last_epoch < 0 else last_epoch
        return last == ahead.entry.last_fetched_epoch

    def _on_prefetch(self, context: PrefetchSent, future: Any) -> None:
        node, sent, names = context.node, context.sent, context.names
        source = self._source(node)
        source.request_done()
        now = time.monotonic()
        answer = None if future.exception is not None else self._read_fetch(node, future, names)
        if answer is not None:
            self._note_fetch_version(node, answer)
        waited: list[tuple[FetchAction, wire.FetchedPartition]] = []
        stored: list[tuple[Prefetch, wire.FetchedPartition]] = []
        if answer is not None and answer.error is None:
            prefetches = source.prefetches
            for p in answer.partitions:
                tp = p.tp
                found = sent.pop(tp, None)
                head = prefetches.get(tp)
                if found is None or head is None:
                    continue  # discarded meanwhile
                if head is not found:
                    if head.after is found:
                        found.answer = p  # chained: used once its predecessor is
                    continue
                if found.waiting is not None:
                    del prefetches[tp]
                    self.metrics.prefetches_used += 1
                    waited.append((found.waiting, p))
                else:
                    found.answer = p
                    stored.append((found, p))
        else:
            self.metrics.request_failures += 1
        # Failed, or left out of the answer: the tracker's request (if made) goes out again.
        for tp, pf in sent.items():
            head = source.prefetches.get(tp)
            if head is not None and head.after is pf:
                head.after = None
                continue
            if head is not pf:
                continue
            del source.prefetches[tp]
            tracker = self.trackers.get(tp)
            if pf.waiting is not None and tracker is not None:
                tracker.cancel(pf.waiting)
                self.mark_ready(tp)
        if waited:
            self._apply_answers(waited, now)
        elif stored and self._prefetch_enabled and self.chain_prefetches:
            self._chain_prefetches(source, stored)

    def _chain_prefetches(
        self, source: Source, stored: list[tuple[Prefetch, wire.FetchedPartition]]
    ) -> None:
        """Prefetch what follows prefetch answers that arrived before their trackers asked
        for them (the application is still taking the records before them): the broker
        serves the next answer meanwhile instead of waiting until the tracker asks, which
        with one request in flight per broker left a round trip per answer unoverlapped.
        One prefetch chained per partition at most (the answers held stay bounded); the
        conditions and the rule for using it are :meth:`_prefetch_ahead`'s."""
        items: list[tuple[TopicPartition, Prefetch]] = []
        for head, p in stored:
            end = _next_fetch(p)
            if end is None:
                continue
            tracker = self.trackers.get(p.tp)
            if tracker is None or not source.may_chain(tracker, _FETCHING):
                continue
            head.after = source.prefetch(p.tp, tracker, end[0], end[1])
            items.append((p.tp, head.after))
        if items:
            self._send_prefetch_request(source, items, chained=True)

    @staticmethod
    def _read_fetch(node: int, future: Any, names: dict[uuid.UUID, str]) -> wire.FetchAnswer | None:
        """The answer, or ``None`` for a frame that does not parse (the lean path parses
        here, on the application thread): a failed request, which the trackers retry."""
        try:
            return wire.read_fetch(future.value, names)
        except wire.MalformedFetchResponse as exc:
            log.warning("fetch_response_malformed", node=node, error=str(exc))
            return None

    def _on_fetch(self, context: FetchSent, future: Any) -> None:
        node, actions, names, plan = context.node, context.actions, context.names, context.plan
        source = self._source(node)
        source.request_done()
        now = time.monotonic()
        answer = None if future.exception is not None else self._read_fetch(node, future, names)
        if answer is not None:
            self._note_fetch_version(node, answer)
        if plan is not None:
            session = source.session
            before = session.state
            if answer is None:
                session.on_failure(plan)
            else:
                code = 0 if answer.error is None else answer.error.errno
                session.on_answer(plan, code, answer.session_id, [p.tp for p in answer.partitions])
            self._session_event(source, before)
        if answer is not None and answer.error is not None and answer.error.errno in SESSION_ERRORS:
            # About the session, not the partitions: the session now sends a full fetch,
            # at once and without the partitions' error backoff.
            log.info("fetch_session_error", node=node, error=answer.error.__name__)
            for tp, action in actions.items():
                tracker = self.trackers.get(tp)
                if tracker is not None:
                    tracker.cancel(action)
                    self.mark_ready(tp)
            return
        if answer is None:
            self.metrics.request_failures += 1
            log.debug("fetch_failed", node=node, error=repr(future.exception))
            for tp, action in actions.items():
                tracker = self.trackers.get(tp)
                if tracker is not None:
                    tracker.on_request_failed(action, now)
                    self.after_input(tp)
            return
        if answer.error is not None:
            for tp, action in actions.items():
                tracker = self.trackers.get(tp)
                if tracker is not None:
                    # A refusal (FENCED) then waits for the next leader's judgement.
                    tracker.on_fetch_error(
                        action,
                        answer.error.errno,
                        now,
                        fetch_detects_divergence=self._judges_by_fetch(tracker.leader_id),
                    )
                    self.after_input(tp)
            return
        pairs = []
        for p in answer.partitions:
            answered = actions.pop(p.tp, None)
            if answered is not None:
                pairs.append((answered, p))
        self._apply_answers(pairs, now)
        if plan is not None and plan.incremental:
            # An incremental answer leaves out the partitions with nothing new (no records,
            # same high watermark and log start, no error): an empty fetch each, whose
            # position and epochs stay as they are.
            for tp, action in actions.items():
                tracker = self.trackers.get(tp)
                if tracker is not None:
                    tracker.on_empty_fetch(action)
                    self.after_input(tp)
            return
        # Partitions a full answer left out: hand the fetch out again.
        for tp, action in actions.items():
            tracker = self.trackers.get(tp)
            if tracker is not None:
                tracker.cancel(action)
                self.mark_ready(tp)

    def _apply_answers(
        self,
        pairs: list[tuple[FetchAction, wire.FetchedPartition]],
        now: float,
        sent_ahead: dict[TopicPartition, Prefetch] | None = None,
    ) -> None:
        """Partitions of Fetch answers, each for the action it answers: first the fetches
        of what follows them go out (one request per broker, before anything is decoded),
        then each is applied. ``sent_ahead``: those that went out already (chained on a
        prefetch's answer, see :meth:`_chain_prefetches`)."""
        ahead = self._prefetch_ahead(pairs) if self._prefetch_enabled else {}
        if sent_ahead:
            ahead.update(sent_ahead)
        if self.decode_budget_bytes is None:
            for action, p in pairs:
                self._apply_partition(action, p, now, ahead.get(action.tp))
            return
        # Decoded by process_completions(), within its budget: the trackers await these
        # answers until then, as if they were still on their way. Partitions without
        # records (caught up, left empty by fetch_max_bytes, errors) cost nothing to apply
        # and are applied now: behind the others they would not be fetched again until the
        # whole answer (up to fetch_max_bytes) was decoded. So are topic probes, whose
        # records are never decoded: a lookup (position()) waits for what they settle, and
        # lookups leave undecoded answers to the reads.
        queue = self._undecoded
        for action, p in pairs:
            if p.records and not action.topic_probe:
                self._source(action.node_id).undecoded += 1
                queue.append((action, p, now, ahead.get(action.tp)))
            else:
                self._apply_partition(action, p, now, ahead.get(action.tp))

    def _note_offsets(self, tp: TopicPartition, p: wire.FetchedPartition) -> None:
        self.highwaters[tp] = p.high_watermark
        self.last_stable_offsets[tp] = p.last_stable_offset
        self.last_fetch_ms[tp] = int(time.time() * 1000)

    def _apply_partition(
        self,
        action: FetchAction,
        p: wire.FetchedPartition,
        now: float,
        ahead: Prefetch | None = None,
    ) -> None:
        """One partition of a Fetch answer, for the action it answers; ``ahead`` is the
        prefetch sent for what follows it before it was decoded (see
        :meth:`_prefetch_ahead`)."""
        tp = action.tp
        tracker = self.trackers.get(tp)
        if tracker is None:
            return
        if not tracker.awaits(action):
            # Stale: a former leader's late answer, or one for a partition paused, moved or
            # seeked meanwhile (pause() and the rest handed the fetch back). Touch nothing:
            # the broker that now serves the partition may hold the current fetch's
            # records in a buffer, and a paused partition's records would sit in a buffer
            # nobody drains while its broker holds back its caught-up partitions.
            # Except what it says of the partition: the broker's fetch session has sent
            # these, and leaves the partition out of its answers until they change
            # (KIP-227). From the broker that serves it now, they are the latest.
            if p.error is None and action.node_id == tracker.fetch_node and not action.topic_probe:
                self._note_offsets(tp, p)
            self.mark_ready(tp)
            return
        if action.topic_probe:
            self._apply_probe(tracker, action, p, now)
            return
        if action.read_replica is not None:
            self.metrics.fetches_from_followers += 1
        source = self._source(action.node_id)
        previous = self._source_of.get(tp)
        if previous is not None and previous is not source:
            previous.drop(tp)
        self._source_of[tp] = source
        source.caught_up[tp] = False
        if p.error is None:
            self._note_offsets(tp, p)
        else:
            self.metrics.fetch_errors += 1
            if issubclass(p.error, _UNKNOWN_TOPIC_ERRORS):
                self.metadata.hold(tp.topic, now)
                self.request_metadata()
            elif p.error is wire.ERR.TopicAuthorizationFailedError:
                # An ACL removed after metadata allowed the topic: poll() raises it as Java's
                # fetcher does, and the tracker retries with its backoff.
                self.metadata.refuse(tp.topic)
            # The leader may have answered its first v12+ fetch since metadata named it.
            tracker.on_fetch_error(
                action,
                p.error.errno,
                now,
                fetch_detects_divergence=self._judges_by_fetch(tracker.leader_id),
            )
            hinted = p.current_leader is not None and self._apply_leader_hint(
                tp, tracker, p.current_leader
            )
            if hinted:
                # The refusal's metadata refresh is answered by the hint already.
                self._hinted.add(tp)
            self.after_input(tp)
            self._hinted.discard(tp)
            return
        div = p.diverging
        if div is not None:
            self.metrics.diverging_epoch_responses += 1
            tracker.on_diverging_epoch(action, div.epoch, div.end_offset, now)
            self.after_input(tp)
            return
        data = p.records
        if data:
            self.metrics.bytes_fetched += len(data)
            self.bytes_by_node[action.node_id] += len(data)
            if action.read_replica is not None:
                self.metrics.bytes_fetched_from_followers += len(data)
            cuts = self._piece_cuts(data)
            if cuts is not None:
                first = self._decode_first_piece(action, data, cuts)
                if first is not None:
                    self._buffer_in_pieces(action, p, data, cuts, first, ahead, source)
                    return
            try:
                decoded = self._decode_from(
                    tp,
                    data,
                    action.offset,
                    **(
                        {"aborted_producers": p.aborted, "read_committed": True, "transactions": []}
                        if self._read_committed
                        else {}
                    ),
                )
            except CorruptRecordError as exc:
                if ahead is not None:
                    self._drop_prefetch(tp)
                self._on_corrupt(action, exc)
                return
            except RecordDeserializationError as exc:
                if ahead is not None:
                    self._drop_prefetch(tp)
                self._on_undeserializable(action, exc, source)
                return
            if ahead is not None and not self._ahead_holds(ahead, decoded, action.offset):
                self._drop_prefetch(tp)
            if decoded.next_offset is not None and decoded.next_offset <= action.offset:
                # Whole batches, every one ending below the offset asked for: no broker
                # answers that (the batch holding the offset comes first). Asking again
                # would get the same answer, as fast as the broker can send it.
                if ahead is not None:
                    self._drop_prefetch(tp)
                self._on_corrupt(
                    action,
                    CorruptRecordError(
                        f"the answer holds only batches ending below the fetch offset (they "
                        f"end at {decoded.next_offset - 1})"
                    ),
                )
                return
            if decoded.next_offset is not None and decoded.next_offset > action.offset:
                ledger = self.ledgers.get(tp)
                if ledger is not None:
                    self._read_transactions(ledger, action.offset, decoded, p.aborted)
                source.caught_up[tp] = decoded.next_offset >= p.high_watermark
                if tp not in source.buffers:
                    self._buffer_order.append(tp)
                source.add_buffer(
                    tp, Buffered(action, decoded.records, decoded.next_offset, decoded.last_epoch)
                )
                return
        source.caught_up[tp] = action.offset >= p.high_watermark
        preferred = p.preferred_read_replica
        if preferred is not None and preferred != action.node_id:
            # KIP-392: the leader names a closer replica (an answer without records). The
            # tracker decides; it validates with the leader before fetching from there.
            self.metrics.preferred_replica_changes += 1
            log.info(
                "preferred_read_replica",
                topic=tp.topic,
                partition=tp.partition,
                replica=preferred,
                rack=self.metadata.racks.get(preferred),
                served_by=action.node_id,
            )
            tracker.on_preferred_replica(action, preferred, now, now + self._replica_ttl_s)
        else:
            tracker.on_empty_fetch(action)
        self.after_input(tp)

    def _decode_from(self, tp: TopicPartition, data: Any, offset: int, **more: Any) -> Any:
        """``tp``'s fetched ``data`` decoded from ``offset`` with the consumer's settings."""
        return self._decode(
            data,
            tp.topic,
            tp.partition,
            offset,
            check_crcs=self._config["check_crcs"],
            key_deserializer=self._key_des,
            value_deserializer=self._value_des,
            **more,
        )

    def _piece_cuts(self, data: Any) -> list[tuple[int, int]] | None:
        """Where to cut ``data`` into pieces decoded one at a time (see
        :attr:`decode_piece_records`), or ``None``: decoded whole. Only with a decode budget
        (the asyncio driver), records as tuples, and not read_committed (whose transaction
        ledger reads an answer's transactional batches at once)."""
        budget = self.decode_budget_bytes
        if budget is None or self._read_committed or self._decode is not decode_records:
            return None
        cuts = batch_cuts(data, self.decode_piece_records, max(1, budget // 2))
        return cuts if cuts is not None and len(cuts) > 1 else None

    def _decode_first_piece(
        self, action: FetchAction, data: Any, cuts: list[tuple[int, int]]
    ) -> DecodedFetch | None:
        """The first piece of a partition's answer decoded, or ``None`` when it does not
        decode or ends at or below the fetch offset: the whole answer is then decoded as one,
        whose errors are reported as any answer's."""
        tp = action.tp
        try:
            decoded = self._decode_from(tp, data[: cuts[0][0]], action.offset)
        except (CorruptRecordError, RecordDeserializationError):
            return None
        if decoded.next_offset is None or decoded.next_offset <= action.offset:
            return None
        return decoded  # type: ignore[no-any-return]

    def _buffer_in_pieces(
        self,
        action: FetchAction,
        p: wire.FetchedPartition,
        data: Any,
        cuts: list[tuple[int, int]],
        first: DecodedFetch,
        ahead: Prefetch | None,
        source: Source,
    ) -> None:
        tp = action.tp
        end = fetch_end(data)
        assert end is not None  # cut, so whole v2 batches
        next_offset, last_epoch = end
        source.caught_up[tp] = next_offset >= p.high_watermark
        buf = Buffered(action, first.records, next_offset, last_epoch)
        view = memoryview(data)
        buf.rest = collections.deque((view[a:b], n) for (a, _), (b, n) in itertools.pairwise(cuts))
        buf.rest_records = sum(n for _, n in cuts[1:])
        assert first.next_offset is not None  # above action.offset (_decode_first_piece)
        buf.rest_offset = first.next_offset
        buf.rest_epoch = first.last_epoch
        buf.last_record_epoch = first.records[-1].leader_epoch if first.records else None
        buf.ahead = ahead
        if tp not in source.buffers:
            self._buffer_order.append(tp)
        source.add_buffer(tp, buf)

    def _decode_next_piece(self, tp: TopicPartition, buf: Buffered) -> None:
        """Decode the next piece of ``buf``'s answer into it. A piece that does not decode
        ends the buffer where the pieces before it ended: the fetch from there gets the same
        bytes back as its answer's first batches, and their error is reported as any
        answer's is (with nothing of them delivered)."""
        rest = buf.rest
        assert rest is not None
        try:
            # Taken off once decoded: an exception other than these keeps it.
            decoded = self._decode_from(tp, rest[0][0], buf.rest_offset)
        except (CorruptRecordError, RecordDeserializationError) as exc:
            log.debug(
                "fetched_piece_not_decoded",
                topic=tp.topic,
                partition=tp.partition,
                offset=buf.rest_offset,
                error=str(exc),
            )
            decoded = None
        if decoded is None or decoded.next_offset is None or decoded.next_offset <= buf.rest_offset:
            buf.rest = buf.ahead = None
            buf.rest_records = 0
            buf.next_offset = buf.rest_offset
            buf.last_epoch = self._pieces_last_epoch(buf)
            self._drop_prefetch(tp)
            source = self._source_of.get(tp)
            if source is not None:
                source.caught_up[tp] = False  # the answer ends early: more follows
            return
        buf.rest_records -= rest.popleft()[1]
        if buf.pos >= len(buf.records):
            buf.records = decoded.records
            buf.pos = 0
        else:
            buf.records.extend(decoded.records)
        if decoded.records:
            buf.last_record_epoch = decoded.records[-1].leader_epoch
        buf.rest_offset = decoded.next_offset
        if decoded.last_epoch is not None:
            buf.rest_epoch = decoded.last_epoch
        if rest:
            return
        buf.rest = None
        buf.last_epoch = self._pieces_last_epoch(buf)
        # The whole answer is decoded: does it end where its early prefetch assumed?
        ahead, buf.ahead = buf.ahead, None
        if ahead is not None and not self._ends_as_assumed(
            ahead, buf.next_offset, buf.last_epoch, buf.action.offset
        ):
            self._drop_prefetch(tp)
        source = self._source_of.get(tp)
        if source is not None:
            source.unprefetched[tp] = None

    @staticmethod
    def _pieces_last_epoch(buf: Buffered) -> int | None:
        """The epoch a buffer decoded in pieces ends with: its last record's, as an answer
        decoded whole hands the tracker with its last records (else its last batch's), so
        that the position's epoch does not depend on where the pieces were cut."""
        if buf.last_record_epoch is not None:
            return buf.last_record_epoch
        return buf.rest_epoch

    def _read_transactions(
        self,
        ledger: TransactionLedger,
        fetch_offset: int,
        decoded: DecodedFetch,
        aborted: list[tuple[int, int]] | None,
    ) -> None:
        found = ledger.read(fetch_offset, decoded.transactions, decoded.next_offset, aborted)
        if found and self.on_reopened is not None:
            for reopened in found:
                self.on_reopened(reopened)

    def _apply_probe(
        self,
        tracker: PartitionTracker,
        action: FetchAction,
        p: wire.FetchedPartition,
        now: float,
    ) -> None:
        """The answer to a fetch under a topic id metadata names instead of the position's:
        it says only whether that leader serves the id. Its records are of the other
        incarnation: never decoded, and its offsets are not this position's."""
        tp = action.tp
        if p.error is None:
            tracker.on_empty_fetch(action)
        else:
            self.metrics.fetch_errors += 1
            if issubclass(p.error, _UNKNOWN_TOPIC_ERRORS):
                self.metadata.hold(tp.topic, now)
                self.request_metadata()
            tracker.on_fetch_error(action, p.error.errno, now)
        self.after_input(tp)

    def _apply_leader_hint(
        self, tp: TopicPartition, tracker: PartitionTracker, hint: wire.LeaderHint
    ) -> bool:
        """KIP-951: a refused Fetch named the partition's leader now. Taken as a metadata
        answer for this partition alone when it is newer than what metadata said and the
        broker's address is known, so the tracker validates with the new leader without a
        metadata round trip; otherwise the metadata refresh the refusal asked for decides."""
        known = self.metadata.epoch_of(tp)
        if known is not None and hint.leader_epoch <= known:
            return False
        if not self._client.broker_known(hint.leader_id):
            return False
        self.metadata.leaders[tp] = (hint.leader_id, hint.leader_epoch)
        before = (tracker.leader_id, tracker.leader_epoch)
        accepted = tracker.on_metadata(
            hint.leader_id,
            hint.leader_epoch,
            self.metadata.topic_ids.get(tp.topic),
            self.metadata.replicas_of(tp),
            fetch_detects_divergence=self._judges_by_fetch(hint.leader_id),
        )
        if not accepted:
            return False
        self.metrics.leader_hints_applied += 1
        log.info(
            "leader_hint_applied",
            topic=tp.topic,
            partition=tp.partition,
            leader=hint.leader_id,
            leader_epoch=hint.leader_epoch,
        )
        if before[0] is not None and before != (tracker.leader_id, tracker.leader_epoch):
            self._leader_changed(tp)
        return True

    def _on_corrupt(self, action: FetchAction, exc: CorruptRecordError) -> None:
        """Stop ``action``'s partition at its position (nothing skipped, the others keep
        going) and keep the error for poll, naming the partition and offset."""
        tp = action.tp
        self.metrics.fetch_errors += 1
        log.warning(
            "corrupt_records",
            topic=tp.topic,
            partition=tp.partition,
            offset=action.offset,
            error=str(exc),
        )
        # The decoder's own text, without kafka's "[Error 2] CorruptRecordError: " prefix,
        # which the error raised here carries once already.
        reason = exc.args[0] if exc.args else exc
        error = CorruptRecordError(
            f"{tp.topic}-{tp.partition}: cannot decode the records fetched at offset "
            f"{action.offset} ({reason}); the partition stays at offset {action.offset} until "
            "seek()",
            tp=tp,
            offset=action.offset,
        )
        error.__cause__ = exc
        self._stop_until_seek(action, error)

    def _stop_until_seek(
        self, action: FetchAction, error: CorruptRecordError | RecordDeserializationError
    ) -> None:
        """``action``'s partition fetches nothing more until the application seeks it; poll
        raises ``error`` once."""
        tp = action.tp
        tracker = self.trackers.get(tp)
        if tracker is not None:
            tracker.cancel(action)
        self.corrupt.add(tp)
        self.corrupt_errors[tp] = error
        self.after_input(tp)

    def _on_undeserializable(
        self, action: FetchAction, exc: RecordDeserializationError, source: Source
    ) -> None:
        """Deliver the records before the one the deserializer failed on, as Java does; the
        next fetch starts at that record, fails at once, and stops the partition there."""
        tp = action.tp
        if exc.records:
            epoch = exc.records[-1].leader_epoch
            source.caught_up[tp] = False
            if tp not in source.buffers:
                self._buffer_order.append(tp)
            source.add_buffer(
                tp, Buffered(action, exc.records, exc.offset, epoch if epoch >= 0 else None)
            )
            return
        self.metrics.fetch_errors += 1
        log.warning(
            "deserialization_failed",
            topic=tp.topic,
            partition=tp.partition,
            offset=exc.offset,
            error=repr(exc.__cause__),
        )
        error = RecordDeserializationError(
            f"{exc.args[0]}; the partition stays at offset {action.offset} until seek()",
            tp=tp,
            offset=exc.offset,
        )
        error.__cause__ = exc.__cause__
        self._stop_until_seek(action, error)

    def _send_validation(self, node: int, actions: list[ValidateAction]) -> None:
        request = wire.offset_for_leader_epoch_request(
            wire.EpochQuery(a.tp, a.current_leader_epoch, a.leader_epoch) for a in actions
        )
        self.metrics.offset_for_leader_epoch_requests += 1
        log.debug(
            "offset_for_leader_epoch_sent",
            node=node,
            partitions=[(str(a.tp), a.leader_epoch) for a in actions],
        )
        fut = self._client.send(node, request)
        self._complete(self._on_validation, {a.tp: a for a in actions}, fut)

    def _on_validation(self, actions: dict[TopicPartition, ValidateAction], future: Any) -> None:
        now = time.monotonic()
        if future.exception is None:
            for tp, error, end in wire.read_offset_for_leader_epoch(future.value):
                action = actions.pop(tp, None)
                tracker = self.trackers.get(tp)
                if action is None or tracker is None:
                    continue
                code = 0 if error is None else error.errno
                tracker.on_validation(action, code, end.epoch, end.end_offset, now)
                self.after_input(tp)
        else:
            self.metrics.request_failures += 1
            log.debug("offset_for_leader_epoch_failed", error=repr(future.exception))
        for tp, action in actions.items():
            tracker = self.trackers.get(tp)
            if tracker is not None:
                tracker.on_request_failed(action, now)
                self.after_input(tp)

    def _send_list_offsets(self, node: int, actions: list[ResetAction]) -> None:
        request = wire.list_offsets_request(
            [
                (
                    a.tp,
                    wire.EARLIEST_TIMESTAMP
                    if a.strategy is ResetStrategy.EARLIEST
                    else wire.LATEST_TIMESTAMP,
                    a.current_leader_epoch,
                )
                for a in actions
            ],
            self._read_committed,
            self._config["request_timeout_ms"],
        )
        self.metrics.list_offsets_requests += 1
        fut = self._client.send(node, request)
        self._complete(self._on_list_offsets, {a.tp: a for a in actions}, fut)

    def _on_list_offsets(self, actions: dict[TopicPartition, ResetAction], future: Any) -> None:
        now = time.monotonic()
        if future.exception is None:
            for lo in wire.read_list_offsets(future.value):
                action = actions.pop(lo.tp, None)
                tracker = self.trackers.get(lo.tp)
                if action is None or tracker is None:
                    continue
                # Earliest/latest always exist; "none" (-1) would only come with an error.
                offset = 0 if lo.offset is None else lo.offset
                tracker.on_list_offsets(action, offset, lo.leader_epoch, lo.error_code, now)
                self.after_input(lo.tp)
        else:
            self.metrics.request_failures += 1
        for tp, action in actions.items():
            tracker = self.trackers.get(tp)
            if tracker is not None:
                tracker.on_request_failed(action, now)
                self.after_input(tp)

    # ------------------------------------------------------------------ delivery

    def fetched_records(
        self, max_records: int, eligible: Callable[[TopicPartition], bool]
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Hand out up to ``max_records`` buffered records, advancing the trackers."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        remaining = max_records
        pieced: set[TopicPartition] = set()
        order = self._buffer_order
        source_of = self._source_of
        rounds = len(order)
        while remaining > 0 and rounds > 0 and order:
            rounds -= 1
            tp = order[0]
            source = source_of.get(tp)
            buf = None if source is None else source.buffers.get(tp)
            if buf is None:
                order.popleft()
                continue
            assert source is not None
            if not eligible(tp):
                order.rotate(-1)
                continue
            tracker = self.trackers.get(tp)
            if tracker is None:
                source.buffers.pop(tp, None)
                order.popleft()
                continue
            if buf.rest is not None and tp not in pieced and len(buf.records) - buf.pos < remaining:
                # One piece per partition and call: what a read decodes stays about what it
                # hands out.
                pieced.add(tp)
                self._decode_next_piece(tp, buf)
            records = buf.records
            start = buf.pos
            end = min(len(records), start + remaining)
            last_chunk = end >= len(records) and buf.rest is None
            if not last_chunk and type(records) is list:
                # The records handed out leave the buffer: the application frees them when
                # it is done with them, while they are in the cache, not all at once (cold)
                # with the buffer's last chunk.
                chunk = records[start:end]
                del records[:end]
                end = 0
            else:
                chunk = records[start:end]
            if not self._advance(tracker, buf, chunk, last_chunk):
                source.buffers.pop(tp, None)
                self._drop_prefetch(tp)
                order.popleft()
                self.after_input(tp)
                continue
            buf.pos = end
            if chunk:
                out[tp] = chunk
                remaining -= len(chunk)
                self.metrics.records_consumed += len(chunk)
            if last_chunk:
                del source.buffers[tp]
                order.popleft()
                self._ready[tp] = None  # its next fetch
            else:
                order.rotate(-1)
            self._drain_events(tp)
        return out

    @staticmethod
    def _advance(
        tracker: PartitionTracker, buf: Buffered, chunk: list[ConsumerRecord], last: bool
    ) -> bool:
        action = buf.action
        if not chunk:
            if not last:
                return True
            # Only control/aborted/skipped batches: move past them.
            start = tracker.position.offset if tracker.position is not None else action.offset
            return tracker.on_records(
                action, start, buf.next_offset - 1, buf.last_epoch, buf.next_offset
            )
        first = chunk[0]
        last_rec = chunk[-1]
        if first.leader_epoch == last_rec.leader_epoch:
            runs: Iterable[tuple[int, int, int]] = (
                (first.offset, last_rec.offset, first.leader_epoch),
            )
        else:
            runs_l: list[tuple[int, int, int]] = []
            run_start = first
            prev = first
            for rec in chunk:
                if rec.leader_epoch != run_start.leader_epoch:
                    runs_l.append((run_start.offset, prev.offset, run_start.leader_epoch))
                    run_start = rec
                prev = rec
            runs_l.append((run_start.offset, prev.offset, run_start.leader_epoch))
            runs = runs_l
        runs = list(runs)
        for i, (lo, hi, epoch) in enumerate(runs):
            final = last and i == len(runs) - 1
            nxt = buf.next_offset if final else None
            if not tracker.on_records(action, lo, hi, epoch if epoch >= 0 else None, nxt):
                return False
        return True

    # ------------------------------------------------------------------ direct lookups

    def list_offsets(
        self, timestamps: dict[TopicPartition, int], timeout_s: float
    ) -> Step[dict[TopicPartition, tuple[int, int | None, int]]]:
        """ListOffsets for arbitrary partitions (not their trackers):
        ``{tp: (offset, leader_epoch, timestamp)}``; offset -1 when there is none."""
        deadline = time.monotonic() + timeout_s
        result: dict[TopicPartition, tuple[int, int | None, int]] = {}
        pending = dict(timestamps)
        metadata = self.metadata
        for tp in pending:
            if tp.topic not in metadata.topics:
                metadata.topics.add(tp.topic)
                self.request_metadata()
        attempt = 0
        last_error: BaseException | None = None
        while pending:
            yield from self.ensure_metadata(pending, deadline)
            by_node: dict[int, list[tuple[TopicPartition, int, int | None]]] = {}
            for tp, ts in pending.items():
                leader = metadata.leader_of(tp)
                if leader is not None:
                    # The leader epoch from metadata fences the answer (epoch 0 included).
                    by_node.setdefault(leader, []).append((tp, ts, metadata.epoch_of(tp)))
            futures = []
            for node, queries in by_node.items():
                request = wire.list_offsets_request(
                    queries, self._read_committed, self._config["request_timeout_ms"]
                )
                self.metrics.list_offsets_requests += 1
                fut = self._client.send(node, request)
                self._complete(_ignore, None, fut)
                futures.append(fut)
            yield from self.pump_until(functools.partial(_all_done, futures), deadline)
            for fut in futures:
                if not fut.is_done or fut.exception is not None:
                    log.debug("list_offsets_failed", error=repr(fut.exception))
                    last_error = fut.exception or last_error
                    continue
                for lo in wire.read_list_offsets(fut.value):
                    if lo.tp in pending and lo.error is None:
                        offset = -1 if lo.offset is None else lo.offset
                        result[lo.tp] = (offset, lo.leader_epoch, lo.timestamp)
                        del pending[lo.tp]
            if pending:
                if time.monotonic() >= deadline:
                    raise KafkaTimeoutError(
                        f"ListOffsets got no answer within {timeout_s:.1f}s for {sorted(pending)}"
                        + (f"; last error: {last_error}" if last_error is not None else "")
                    )
                asked = time.monotonic()
                self.request_metadata()
                retry_at = asked + _LOOKUP_BACKOFF.delay(attempt)
                attempt += 1
                # A refused lookup (FENCED, NOT_LEADER, ...) means our leaders or epochs were
                # stale: ask again with metadata sent after it, and not before the backoff.
                yield from self.pump_until(
                    functools.partial(_refreshed, metadata, asked, retry_at), deadline
                )
        return result

    def ensure_metadata(self, tps: Iterable[TopicPartition], deadline: float) -> Step[bool]:
        """Wait (bounded) until every partition's leader is known."""
        tps = list(tps)
        leader_of = self.metadata.leader_of

        def known() -> bool:
            if all(leader_of(tp) is not None for tp in tps):
                return True
            self.request_metadata()
            return False

        return (yield from self.pump_until(known, deadline))

    def position_of(self, tp: TopicPartition) -> EpochOffset | None:
        tracker = self.trackers.get(tp)
        return None if tracker is None else tracker.position
