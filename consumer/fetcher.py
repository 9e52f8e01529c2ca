"""The I/O driver: turns ``PartitionTracker`` actions into requests and answers back into
tracker inputs. It decides nothing about epochs itself.

Threading: every method runs on the application thread (inside ``EpochConsumer`` calls).
Request futures complete on kafka-python's IO thread; their callbacks only append to a
deque and set an event, and the answers are applied here, in order, by
:meth:`Fetcher.process_completions`.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import structlog
from kafka.errors import UnknownTopicOrPartitionError
from kafka.protocol.consumer import (
    FetchRequest,
    ListOffsetsRequest,
    OffsetForLeaderEpochRequest,
)
from kafka.protocol.metadata import MetadataRequest
from kafka.structs import TopicPartition

from epochguard.consumer.client import BrokerClient
from epochguard.consumer.records import ConsumerRecord, Deserializer, decode_records
from epochguard.offsets.events import (
    Event,
    FetchAction,
    MetadataRefreshNeeded,
    ResetAction,
    TruncationDetected,
    ValidateAction,
    WaitAction,
)
from epochguard.offsets.policy import OffsetPolicy, ResetStrategy
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.state import PartitionState, PartitionTracker

__all__ = ["Fetcher", "FetcherMetrics"]

log = structlog.get_logger("epochguard.consumer")

_FETCHING = PartitionState.FETCHING
_ZERO_UUID = uuid.UUID(int=0)
#: Fetch v12 is the first with LastFetchedEpoch/DivergingEpoch; v13 names topics by id, so a
#: topic deleted and re-created under the same name is answered UNKNOWN_TOPIC_ID instead of
#: from the new log. v13 is used when every topic of a request has a known id, else v12.
FETCH_MAX_VERSION = 13
FETCH_MAX_VERSION_BY_NAME = 12
#: Metadata v7+ carries leader epochs; v10+ topic ids; v12 is the last we need.
METADATA_MAX_VERSION = 12
OFFSET_FOR_LEADER_EPOCH_MIN_VERSION = 2
#: Fetch requests in flight per broker. Measured: a second one does not help once requests
#: holding only caught-up partitions are deferred (see ``send_requests``).
MAX_FETCHES_PER_BROKER = 1
_UNKNOWN_TOPIC_ERRORS = frozenset({3, 100})  # UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID
_UNKNOWN_TOPIC_OR_PARTITION = UnknownTopicOrPartitionError.errno


class _Buffered:
    """Decoded records of one partition not yet handed to the application."""

    __slots__ = ("action", "last_epoch", "next_offset", "pos", "records")

    def __init__(
        self,
        action: FetchAction,
        records: list[ConsumerRecord],
        next_offset: int,
        last_epoch: int | None,
    ) -> None:
        self.action = action
        self.records = records
        self.pos = 0
        self.next_offset = next_offset
        self.last_epoch = last_epoch


class _Prefetch:
    """A fetch sent before the tracker asked for it: the request the tracker will make once
    the application has drained the partition's buffer. It is only used as the answer to a
    tracker ``FetchAction`` asking for exactly the same thing (same leader, offset, current
    leader epoch and last fetched epoch); otherwise it is thrown away. The tracker still
    sees one answer per request it made, so it keeps every decision."""

    __slots__ = (
        "answer",
        "current_leader_epoch",
        "done",
        "last_fetched_epoch",
        "node",
        "offset",
        "topic_id",
        "version",
        "waiting",
    )

    def __init__(
        self,
        node: int,
        offset: int,
        current_leader_epoch: int | None,
        last_fetched_epoch: int | None,
        topic_id: str | None = None,
    ) -> None:
        self.node = node
        self.topic_id = topic_id
        self.offset = offset
        self.current_leader_epoch = current_leader_epoch
        self.last_fetched_epoch = last_fetched_epoch
        self.done = False
        self.answer: Any = None
        self.version = 0
        self.waiting: FetchAction | None = None

    def matches(self, action: FetchAction) -> bool:
        return (
            action.leader_id == self.node
            and action.offset == self.offset
            and action.current_leader_epoch == self.current_leader_epoch
            and action.last_fetched_epoch == self.last_fetched_epoch
            and action.topic_id == self.topic_id
        )


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

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class _Done(NamedTuple):
    handler: Callable[[Any, Any], None]
    context: Any
    future: Any


class Fetcher:
    """Partition trackers, the fetch buffer, metadata, and the requests that serve them."""

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
        self._buffers: dict[TopicPartition, _Buffered] = {}
        self._buffer_order: collections.deque[TopicPartition] = collections.deque()
        # In-flight fetch requests per broker (at most MAX_FETCHES_PER_BROKER).
        self._fetching_nodes: dict[int, int] = {}
        self._done: collections.deque[_Done] = collections.deque()
        self._wake = threading.Event()
        self.metrics = FetcherMetrics()
        # Metadata.
        self.metadata_topics: set[str] = set()
        self.topic_partitions: dict[str, set[int]] = {}
        self.topic_ids: dict[str, uuid.UUID | None] = {}
        self.all_topics: set[str] | None = None
        self._want_all_topics = False
        self._metadata_in_flight = False
        self._metadata_needed = True
        self._metadata_next = 0.0
        self._metadata_failures = 0
        self._metadata_ok_at = 0.0
        self.metadata_listeners: list[Callable[[], None]] = []
        self._leaders: dict[TopicPartition, tuple[int | None, int | None]] = {}
        #: partitions whose last fetch reached the high watermark
        self._caught_up: dict[TopicPartition, bool] = {}
        #: the high watermark of each partition's last fetch answer (``highwater()``)
        self.highwaters: dict[TopicPartition, int] = {}
        #: topics the last metadata answer called UNKNOWN_TOPIC_OR_PARTITION (fail fast)
        self.unknown_topics: set[str] = set()
        self._prefetch: dict[TopicPartition, _Prefetch] = {}
        # Topics a broker called unknown, and when. Fetch v12 names topics, so a fetch sent
        # after a delete + re-create would be answered from the new topic's log as if it
        # were the old one; fetches wait until metadata sent after that answer (with the
        # topic id that lets the tracker see the re-creation) has been applied.
        self._topic_hold: dict[str, float] = {}
        # Metadata answers in a row that still held a topic back (for the refresh backoff).
        self._hold_misses = 0
        self._prefetch_enabled = True
        self._read_committed = config["isolation_level"] == "read_committed"
        self._fetch_max_version = int(config.get("max_fetch_version", FETCH_MAX_VERSION))
        self._metadata_max_version = int(config.get("max_metadata_version", METADATA_MAX_VERSION))

    # ------------------------------------------------------------------ partitions

    def add_partition(self, tp: TopicPartition) -> PartitionTracker:
        tracker = self.trackers.get(tp)
        if tracker is None:
            tracker = PartitionTracker(tp, self._policy)
            self.trackers[tp] = tracker
            if tp.topic not in self.metadata_topics:
                self.metadata_topics.add(tp.topic)
                self.request_metadata()
            self._apply_known_metadata(tp)
        return tracker

    def remove_partition(self, tp: TopicPartition) -> None:
        self.trackers.pop(tp, None)
        self.highwaters.pop(tp, None)
        self.drop_buffer(tp)

    def drop_buffer(self, tp: TopicPartition) -> None:
        self._buffers.pop(tp, None)
        self._caught_up.pop(tp, None)
        self._drop_prefetch(tp)

    def _drop_prefetch(self, tp: TopicPartition) -> None:
        if self._prefetch.pop(tp, None) is not None:
            self.metrics.prefetches_discarded += 1

    def after_input(self, tp: TopicPartition) -> None:
        """Called after any command to a tracker: buffered records are only valid while the
        partition keeps fetching from the same position."""
        tracker = self.trackers.get(tp)
        if tracker is None or tracker.state is not _FETCHING or tracker.paused:
            self._buffers.pop(tp, None)
            self._drop_prefetch(tp)
        self._drain_events(tp)

    def has_buffered(self) -> bool:
        return bool(self._buffers)

    # ------------------------------------------------------------------ completions

    def _complete(self, handler: Callable[[Any, Any], None], context: Any, future: Any) -> None:
        def done(_value: Any) -> None:
            self._done.append(_Done(handler, context, future))
            self._wake.set()

        future.add_both(done)

    def wait(self, timeout_s: float) -> None:
        """Sleep until an answer arrives or ``timeout_s`` passes."""
        if self._done:
            return
        if timeout_s > 0:
            self._wake.wait(timeout_s)
        self._wake.clear()

    def wakeup(self) -> None:
        self._wake.set()

    def process_completions(self) -> None:
        done = self._done
        while done:
            item = done.popleft()
            item.handler(item.context, item.future)

    # ------------------------------------------------------------------ events

    def _drain_events(self, tp: TopicPartition) -> None:
        tracker = self.trackers.get(tp)
        if tracker is None:
            return
        events = tracker.drain_events()
        for event in events:
            if isinstance(event, MetadataRefreshNeeded):
                self.request_metadata()
            elif isinstance(event, TruncationDetected):
                self.metrics.truncations_detected += 1
                lost = event.report.lost_count
                if lost:
                    self.metrics.records_lost += lost
            name = getattr(event, "name", "")
            if name == "offset_validated":
                self.metrics.validations += 1
            elif name == "offset_reset":
                self.metrics.offset_resets += 1
            self._on_event(event)

    # ------------------------------------------------------------------ metadata

    def request_metadata(self) -> None:
        self._metadata_needed = True
        self._wake.set()

    def want_all_topics(self, value: bool) -> None:
        if value and not self._want_all_topics:
            self.request_metadata()
        self._want_all_topics = value

    def metadata_fresh_since(self, when: float) -> bool:
        return self._metadata_ok_at >= when

    def _maybe_send_metadata(self, now: float) -> None:
        if self._metadata_in_flight or now < self._metadata_next:
            return
        max_age = self._config["metadata_max_age_ms"] / 1000
        if not self._metadata_needed and now - self._metadata_ok_at < max_age:
            return
        topics = None if self._want_all_topics else sorted(self.metadata_topics)
        if topics is not None and not topics and self._metadata_ok_at > 0:
            self._metadata_needed = False
            return
        req_topics = (
            None
            if topics is None
            else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
        )
        request = MetadataRequest(
            topics=req_topics,
            allow_auto_topic_creation=bool(self._config["allow_auto_create_topics"]),
            include_topic_authorized_operations=False,
            max_version=self._metadata_max_version,
        )
        self._metadata_in_flight = True
        self._metadata_needed = False
        self.metrics.metadata_requests += 1
        fut = self._client.send(None, request)
        self._complete(self._on_metadata, (now, topics), fut)

    def _on_metadata(self, context: Any, future: Any) -> None:
        sent_at, topics = context
        self._metadata_in_flight = False
        now = time.monotonic()
        if future.exception is not None:
            self._metadata_failures += 1
            backoff = (
                min(
                    self._config["retry_backoff_ms"] * 2 ** min(self._metadata_failures, 8),
                    self._config["reconnect_backoff_max_ms"],
                )
                / 1000
            )
            self._metadata_next = now + backoff
            self._metadata_needed = True
            log.debug("metadata_request_failed", error=repr(future.exception), backoff_s=backoff)
            return
        response = future.value
        self._metadata_failures = 0
        self._metadata_next = now + self._config["retry_backoff_ms"] / 1000
        self._metadata_ok_at = sent_at
        self._client.update_brokers(response)
        leaders: dict[TopicPartition, tuple[int | None, int | None]] = {}
        if topics is None:
            self.all_topics = set()
        for topic in response.topics:
            name = topic.name
            self._note_topic_error(name, topic.error_code)
            if topic.error_code != 0:
                # Unknown topic: keep waiting; trackers stay blocked on metadata.
                if topic.error_code not in (3, 5):
                    log.warning("metadata_topic_error", topic=name, error_code=topic.error_code)
                continue
            if topics is None and self.all_topics is not None and not topic.is_internal:
                self.all_topics.add(name)
            held = self._topic_hold.get(name)
            if held is not None and sent_at >= held:
                del self._topic_hold[name]
            tid = getattr(topic, "topic_id", None)
            topic_id = None if tid is None or tid == _ZERO_UUID else tid
            self.topic_ids[name] = topic_id
            self.topic_partitions[name] = {p.partition_index for p in topic.partitions}
            for p in topic.partitions:
                epoch = getattr(p, "leader_epoch", -1)
                leader = p.leader_id if p.leader_id >= 0 else None
                leaders[TopicPartition(name, p.partition_index)] = (leader, epoch)
        self._leaders.update(leaders)
        if self._topic_hold:
            # Only metadata can release a held topic (it is back, with its new id): ask again
            # instead of waiting metadata_max_age_ms, backing off while it stays missing.
            self._hold_misses += 1
            backoff = (
                min(
                    self._config["retry_backoff_ms"] * 2 ** min(self._hold_misses, 8),
                    max(self._config["reconnect_backoff_max_ms"], self._config["retry_backoff_ms"]),
                )
                / 1000
            )
            self._metadata_next = now + backoff
            self._metadata_needed = True
        else:
            self._hold_misses = 0
        for tp, (leader, epoch) in leaders.items():
            tracker = self.trackers.get(tp)
            if tracker is None:
                continue
            applied = tracker.on_metadata(
                leader,
                epoch if epoch is not None and epoch >= 0 else None,
                self.topic_ids.get(tp.topic),
            )
            if not applied:
                self.metrics.stale_metadata_ignored += 1
                log.info(
                    "stale_metadata_ignored",
                    topic=tp.topic,
                    partition=tp.partition,
                    leader_epoch=epoch,
                    known_leader_epoch=tracker.leader_epoch,
                )
            self.after_input(tp)
        for listener in list(self.metadata_listeners):
            listener()

    def _note_topic_error(self, topic: str, error_code: int) -> None:
        if error_code == _UNKNOWN_TOPIC_OR_PARTITION:
            self.unknown_topics.add(topic)
        else:
            self.unknown_topics.discard(topic)

    def _apply_known_metadata(self, tp: TopicPartition) -> None:
        known = self._leaders.get(tp)
        if known is not None:
            leader, epoch = known
            self.trackers[tp].on_metadata(
                leader,
                epoch if epoch is not None and epoch >= 0 else None,
                self.topic_ids.get(tp.topic),
            )
            self.after_input(tp)

    # ------------------------------------------------------------------ sending

    def send_requests(self, now: float) -> float:
        """Send what the trackers ask for. Returns when something next needs doing."""
        self._maybe_send_metadata(now)
        wake_at: float = now + float(self._config["metadata_max_age_ms"]) / 1000
        if self._metadata_needed:
            wake_at = min(wake_at, max(self._metadata_next, now + 0.005))
        fetches: dict[int, list[FetchAction]] = {}
        validations: dict[int, list[ValidateAction]] = {}
        resets: dict[int, list[ResetAction]] = {}
        ready: list[tuple[TopicPartition, FetchAction, _Prefetch]] = []
        for tp, tracker in self.trackers.items():
            if tp in self._buffers:
                continue
            action = tracker.next_action(now)
            if action is None:
                self._drain_events(tp)
                continue
            if isinstance(action, WaitAction):
                wake_at = min(wake_at, action.until)
            elif isinstance(action, FetchAction):
                pf = self._prefetch.get(tp)
                if pf is not None:
                    if pf.matches(action):
                        if pf.done:
                            del self._prefetch[tp]
                            ready.append((tp, action, pf))
                        else:
                            pf.waiting = action  # answered when the prefetch completes
                        self._drain_events(tp)
                        continue
                    self._drop_prefetch(tp)
                if (
                    tp.topic in self._topic_hold
                    or self._fetching_nodes.get(action.leader_id, 0) >= MAX_FETCHES_PER_BROKER
                ):
                    tracker.cancel(action)
                else:
                    fetches.setdefault(action.leader_id, []).append(action)
            elif isinstance(action, ValidateAction):
                validations.setdefault(action.leader_id, []).append(action)
            elif isinstance(action, ResetAction):
                resets.setdefault(action.leader_id, []).append(action)
            self._drain_events(tp)
        if fetches:
            busy = {b.action.leader_id for b in self._buffers.values()}
            for node, actions in fetches.items():
                if node in busy and all(self._caught_up.get(a.tp, False) for a in actions):
                    # Only partitions at the end of their log: such a request long-polls for
                    # fetch_max_wait_ms. Send them along with the partitions the application
                    # is still draining from this broker instead.
                    for a in actions:
                        self.trackers[a.tp].cancel(a)
                    continue
                self._send_fetch(node, actions)
        for tp, action, pf in ready:
            self.metrics.prefetches_used += 1
            self._apply_partition(tp, action, pf.answer, pf.version, now)
        if self._prefetch_enabled and self._buffers:
            self._send_prefetches()
        for node, vactions in validations.items():
            self._send_validation(node, vactions)
        for node, ractions in resets.items():
            self._send_list_offsets(node, ractions)
        return wake_at

    def _fetch_request(
        self, entries: list[tuple[TopicPartition, int, int | None, int | None, str | None]]
    ) -> tuple[Any, dict[uuid.UUID, str]]:
        """A Fetch for ``(tp, offset, current_leader_epoch, last_fetched_epoch, topic_id)``
        entries, and the topic names by id (v13+ answers name topics by id only)."""
        cfg = self._config
        by_topic: dict[str, list[Any]] = {}
        ids: dict[str, uuid.UUID | None] = {}
        FP = FetchRequest.FetchTopic.FetchPartition
        for tp, offset, cle, lfe, topic_id in entries:
            ids[tp.topic] = _wire_topic_id(topic_id)
            by_topic.setdefault(tp.topic, []).append(
                FP(
                    partition=tp.partition,
                    current_leader_epoch=-1 if cle is None else cle,
                    fetch_offset=offset,
                    last_fetched_epoch=-1 if lfe is None else lfe,
                    log_start_offset=-1,
                    partition_max_bytes=cfg["max_partition_fetch_bytes"],
                )
            )
        max_version = self._fetch_max_version
        if any(tid is None for tid in ids.values()):
            # No id known (metadata without ids): only a by-name fetch can ask for it.
            max_version = min(max_version, FETCH_MAX_VERSION_BY_NAME)
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=cfg["fetch_max_wait_ms"],
            min_bytes=cfg["fetch_min_bytes"],
            max_bytes=cfg["fetch_max_bytes"],
            isolation_level=1 if self._read_committed else 0,
            session_id=0,
            session_epoch=-1,
            topics=[
                FetchRequest.FetchTopic(
                    topic=t, topic_id=_ZERO_UUID if ids[t] is None else ids[t], partitions=ps
                )
                for t, ps in by_topic.items()
            ],
            forgotten_topics_data=[],
            rack_id=cfg.get("client_rack") or "",
            min_version=4,
            max_version=max_version,
        )
        return request, {tid: t for t, tid in ids.items() if tid is not None}

    def _send_fetch(self, node: int, actions: list[FetchAction]) -> None:
        cfg = self._config
        request, names = self._fetch_request(
            [
                (a.tp, a.offset, a.current_leader_epoch, a.last_fetched_epoch, a.topic_id)
                for a in actions
            ]
        )
        self._fetching_nodes[node] = self._fetching_nodes.get(node, 0) + 1
        self.metrics.fetch_requests += 1
        fut = self._client.send(node, request, cfg["request_timeout_ms"] + cfg["fetch_max_wait_ms"])
        self._complete(self._on_fetch, (node, {a.tp: a for a in actions}, names), fut)

    def _send_prefetches(self) -> None:
        """For brokers with no fetch in flight: fetch what buffered partitions will ask for
        next, so the answer is (often) there when the application drains them."""
        by_node: dict[int, list[tuple[TopicPartition, _Prefetch]]] = {}
        for tp, buf in self._buffers.items():
            if tp in self._prefetch or self._caught_up.get(tp, False):
                continue
            tracker = self.trackers.get(tp)
            if tracker is None or tracker.state is not _FETCHING or tracker.paused:
                continue
            node = buf.action.leader_id
            if node != tracker.leader_id or self._fetching_nodes.get(node, 0) > 0:
                continue
            last = buf.records[-1].leader_epoch if buf.records else buf.last_epoch
            pf = _Prefetch(
                node,
                buf.next_offset,
                tracker.leader_epoch,
                None if last is None or last < 0 else last,
                tracker.topic_id,
            )
            by_node.setdefault(node, []).append((tp, pf))
        cfg = self._config
        for node, items in by_node.items():
            for tp, pf in items:
                self._prefetch[tp] = pf
            request, names = self._fetch_request(
                [
                    (tp, pf.offset, pf.current_leader_epoch, pf.last_fetched_epoch, pf.topic_id)
                    for tp, pf in items
                ]
            )
            self._fetching_nodes[node] = self._fetching_nodes.get(node, 0) + 1
            self.metrics.fetch_requests += 1
            fut = self._client.send(
                node, request, cfg["request_timeout_ms"] + cfg["fetch_max_wait_ms"]
            )
            self._complete(self._on_prefetch, (node, dict(items), names), fut)

    def _on_prefetch(self, context: Any, future: Any) -> None:
        node: int = context[0]
        sent: dict[TopicPartition, _Prefetch] = context[1]
        names: dict[uuid.UUID, str] = context[2]
        self._node_done(node)
        now = time.monotonic()
        ok = future.exception is None and not getattr(future.value, "error_code", 0)
        if ok:
            response = future.value
            for topic in response.responses:
                name = _topic_name(topic, response.API_VERSION, names)
                for p in topic.partitions:
                    tp = TopicPartition(name, p.partition_index)
                    found = sent.pop(tp, None)
                    if found is None or self._prefetch.get(tp) is not found:
                        continue  # discarded meanwhile
                    pf = found
                    if pf.waiting is not None:
                        del self._prefetch[tp]
                        self.metrics.prefetches_used += 1
                        self._apply_partition(tp, pf.waiting, p, response.API_VERSION, now)
                    else:
                        pf.answer, pf.version, pf.done = p, response.API_VERSION, True
        else:
            self.metrics.request_failures += 1
        # Failed, or left out of the answer: the tracker's request (if made) goes out again.
        for tp, pf in sent.items():
            if self._prefetch.get(tp) is not pf:
                continue
            del self._prefetch[tp]
            tracker = self.trackers.get(tp)
            if pf.waiting is not None and tracker is not None:
                tracker.cancel(pf.waiting)

    def _node_done(self, node: int) -> None:
        left = self._fetching_nodes.get(node, 1) - 1
        if left > 0:
            self._fetching_nodes[node] = left
        else:
            self._fetching_nodes.pop(node, None)

    def _on_fetch(self, context: Any, future: Any) -> None:
        node, actions, names = context
        self._node_done(node)
        now = time.monotonic()
        if future.exception is not None:
            self.metrics.request_failures += 1
            log.debug("fetch_failed", node=node, error=repr(future.exception))
            for tp, action in actions.items():
                tracker = self.trackers.get(tp)
                if tracker is not None:
                    tracker.on_request_failed(action, now)
                    self.after_input(tp)
            return
        response = future.value
        version = response.API_VERSION
        if getattr(response, "error_code", 0):
            for tp, action in actions.items():
                tracker = self.trackers.get(tp)
                if tracker is not None:
                    tracker.on_fetch_error(action, response.error_code, now)
                    self.after_input(tp)
            return
        for topic in response.responses:
            name = _topic_name(topic, version, names)
            for p in topic.partitions:
                tp = TopicPartition(name, p.partition_index)
                action = actions.pop(tp, None)
                if action is not None:
                    self._apply_partition(tp, action, p, version, now)
        # Partitions the broker left out: hand the fetch out again.
        for tp, action in actions.items():
            tracker = self.trackers.get(tp)
            if tracker is not None:
                tracker.cancel(action)

    def _apply_partition(
        self, tp: TopicPartition, action: FetchAction, p: Any, version: int, now: float
    ) -> None:
        """One partition of a Fetch answer, for the action it answers."""
        tracker = self.trackers.get(tp)
        if tracker is None:
            return
        self._caught_up[tp] = False
        if not p.error_code:
            self.highwaters[tp] = p.high_watermark
        if p.error_code:
            self.metrics.fetch_errors += 1
            if p.error_code in _UNKNOWN_TOPIC_ERRORS:
                self._topic_hold[tp.topic] = now
                self.request_metadata()
            tracker.on_fetch_error(action, p.error_code, now)
            self.after_input(tp)
            return
        div = p.diverging_epoch if version >= 12 else None
        if div is not None and (div.epoch >= 0 or div.end_offset >= 0):
            self.metrics.diverging_epoch_responses += 1
            tracker.on_diverging_epoch(action, div.epoch, div.end_offset, now)
            self.after_input(tp)
            return
        data = p.records
        if data:
            self.metrics.bytes_fetched += len(data)
            aborted = (
                [(a.producer_id, a.first_offset) for a in p.aborted_transactions]
                if self._read_committed and p.aborted_transactions
                else None
            )
            decoded = decode_records(
                data,
                tp.topic,
                tp.partition,
                action.offset,
                check_crcs=self._config["check_crcs"],
                key_deserializer=self._key_des,
                value_deserializer=self._value_des,
                aborted_producers=aborted,
                read_committed=self._read_committed,
            )
            if decoded.next_offset is not None and decoded.next_offset > action.offset:
                self._caught_up[tp] = decoded.next_offset >= p.high_watermark
                if tp not in self._buffers:
                    self._buffer_order.append(tp)
                self._buffers[tp] = _Buffered(
                    action, decoded.records, decoded.next_offset, decoded.last_epoch
                )
                return
        self._caught_up[tp] = action.offset >= p.high_watermark
        tracker.on_empty_fetch(action)
        self.after_input(tp)

    def _send_validation(self, node: int, actions: list[ValidateAction]) -> None:
        OT = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
        by_topic: dict[str, list[Any]] = {}
        for a in actions:
            by_topic.setdefault(a.tp.topic, []).append(
                OT.OffsetForLeaderPartition(
                    partition=a.tp.partition,
                    current_leader_epoch=-1
                    if a.current_leader_epoch is None
                    else a.current_leader_epoch,
                    leader_epoch=a.leader_epoch,
                )
            )
        request = OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=[OT(topic=t, partitions=ps) for t, ps in by_topic.items()],
            min_version=OFFSET_FOR_LEADER_EPOCH_MIN_VERSION,
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
            for topic in future.value.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.topic, p.partition)
                    action = actions.pop(tp, None)
                    tracker = self.trackers.get(tp)
                    if action is None or tracker is None:
                        continue
                    tracker.on_validation(action, p.error_code, p.leader_epoch, p.end_offset, now)
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
        LT = ListOffsetsRequest.ListOffsetsTopic
        by_topic: dict[str, list[Any]] = {}
        for a in actions:
            by_topic.setdefault(a.tp.topic, []).append(
                LT.ListOffsetsPartition(
                    partition_index=a.tp.partition,
                    current_leader_epoch=-1
                    if a.current_leader_epoch is None
                    else a.current_leader_epoch,
                    timestamp=-2 if a.strategy is ResetStrategy.EARLIEST else -1,
                )
            )
        request = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=1 if self._read_committed else 0,
            topics=[LT(name=t, partitions=ps) for t, ps in by_topic.items()],
            timeout_ms=self._config["request_timeout_ms"],
            min_version=4,
        )
        self.metrics.list_offsets_requests += 1
        fut = self._client.send(node, request)
        self._complete(self._on_list_offsets, {a.tp: a for a in actions}, fut)

    def _on_list_offsets(self, actions: dict[TopicPartition, ResetAction], future: Any) -> None:
        now = time.monotonic()
        if future.exception is None:
            for topic in future.value.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    action = actions.pop(tp, None)
                    tracker = self.trackers.get(tp)
                    if action is None or tracker is None:
                        continue
                    tracker.on_list_offsets(
                        action, max(p.offset, 0), p.leader_epoch, p.error_code, now
                    )
                    self.after_input(tp)
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
        order = self._buffer_order
        rounds = len(order)
        while remaining > 0 and rounds > 0 and order:
            rounds -= 1
            tp = order[0]
            buf = self._buffers.get(tp)
            if buf is None:
                order.popleft()
                continue
            if not eligible(tp):
                order.rotate(-1)
                continue
            tracker = self.trackers.get(tp)
            if tracker is None:
                self._buffers.pop(tp, None)
                order.popleft()
                continue
            records = buf.records
            start = buf.pos
            end = min(len(records), start + remaining)
            chunk = records[start:end]
            last_chunk = end >= len(records)
            if not self._advance(tracker, buf, chunk, last_chunk):
                self._buffers.pop(tp, None)
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
                del self._buffers[tp]
                order.popleft()
            else:
                order.rotate(-1)
            self._drain_events(tp)
        return out

    @staticmethod
    def _advance(
        tracker: PartitionTracker, buf: _Buffered, chunk: list[ConsumerRecord], last: bool
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
    ) -> dict[TopicPartition, tuple[int, int | None, int]]:
        """Blocking ListOffsets for arbitrary partitions (not their trackers):
        ``{tp: (offset, leader_epoch, timestamp)}``; offset -1 when there is none."""
        deadline = time.monotonic() + timeout_s
        result: dict[TopicPartition, tuple[int, int | None, int]] = {}
        pending = dict(timestamps)
        attempt = 0
        while pending:
            for tp in pending:
                if tp.topic not in self.metadata_topics:
                    self.metadata_topics.add(tp.topic)
                    self.request_metadata()
            self.ensure_metadata(pending, deadline)
            leaders = self._leaders
            by_node: dict[int, dict[TopicPartition, int]] = {}
            for tp, ts in pending.items():
                leader = leaders.get(tp, (None, None))[0]
                if leader is not None:
                    by_node.setdefault(leader, {})[tp] = ts
            futures = []
            LT = ListOffsetsRequest.ListOffsetsTopic
            for node, tss in by_node.items():
                by_topic: dict[str, list[Any]] = {}
                for tp, ts in tss.items():
                    by_topic.setdefault(tp.topic, []).append(
                        LT.ListOffsetsPartition(
                            partition_index=tp.partition,
                            current_leader_epoch=leaders.get(tp, (None, -1))[1] or -1,
                            timestamp=ts,
                        )
                    )
                request = ListOffsetsRequest(
                    replica_id=-1,
                    isolation_level=1 if self._read_committed else 0,
                    topics=[LT(name=t, partitions=ps) for t, ps in by_topic.items()],
                    timeout_ms=self._config["request_timeout_ms"],
                    min_version=4,
                )
                self.metrics.list_offsets_requests += 1
                futures.append(self._client.send(node, request))
            for fut in futures:
                try:
                    resp = self._client.wait(fut, max(0.05, deadline - time.monotonic()))
                except Exception as exc:
                    log.debug("list_offsets_failed", error=repr(exc))
                    continue
                for topic in resp.topics:
                    for p in topic.partitions:
                        tp = TopicPartition(topic.name, p.partition_index)
                        if tp in pending and p.error_code == 0:
                            epoch = p.leader_epoch if p.leader_epoch >= 0 else None
                            result[tp] = (p.offset, epoch, p.timestamp)
                            del pending[tp]
            if pending:
                if time.monotonic() >= deadline:
                    from kafka.errors import KafkaTimeoutError

                    raise KafkaTimeoutError(
                        f"ListOffsets got no answer within {timeout_s:.1f}s for {sorted(pending)}"
                    )
                self.request_metadata()
                attempt += 1
                time.sleep(min(0.05 * attempt, 0.5))
        return result

    def ensure_metadata(self, tps: Iterable[TopicPartition], deadline: float) -> None:
        """Block (bounded) until every partition's leader is known."""
        leaders = self._leaders
        tps = list(tps)
        while any(leaders.get(tp, (None, None))[0] is None for tp in tps):
            if time.monotonic() >= deadline:
                return
            self.request_metadata()
            self.send_requests(time.monotonic())
            self.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self.process_completions()
            leaders = self._leaders

    def position_of(self, tp: TopicPartition) -> EpochOffset | None:
        tracker = self.trackers.get(tp)
        return None if tracker is None else tracker.position


def _wire_topic_id(topic_id: str | None) -> uuid.UUID | None:
    """The tracker's text id as Fetch v13 sends it; ``None`` (fetch by name) if not a UUID."""
    if topic_id is None:
        return None
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        return None


def _topic_name(topic: Any, version: int, names: dict[uuid.UUID, str]) -> str:
    """A Fetch answer's topic: by name up to v12, by the id the request carried from v13."""
    if version < 13:
        return str(topic.topic)
    return names.get(topic.topic_id, "")
