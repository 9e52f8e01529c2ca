"""The consumer's own metadata: which topics to ask about, when, and what the last answers
said (partitions, leaders with their epochs, topic ids).

It is not kafka-python's ``ClusterMetadata``, which lets an older leader epoch replace a newer
one; epoch decisions stay in the trackers, which get every partition's leader from here.
Sending and applying answers is the driver's (:class:`~epochguard.consumer.fetcher.Fetcher`).
"""

from __future__ import annotations

from typing import Any

from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.consumer import wire
from epochguard.offsets.policy import RetryBackoff

__all__ = ["Metadata"]

log = get_logger("epochguard.consumer")

_QUIET_TOPIC_ERRORS = (wire.ERR.UnknownTopicOrPartitionError, wire.ERR.LeaderNotAvailableError)


class Metadata:
    """Topics of interest, the last answer per partition, and the refresh schedule."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._allow_auto_create = bool(config["allow_auto_create_topics"])
        self._max_age_s = float(config["metadata_max_age_ms"]) / 1000
        self._max_version = int(config.get("max_metadata_version", wire.METADATA_MAX_VERSION))
        retry_s = float(config["retry_backoff_ms"]) / 1000
        self._retry_s = retry_s
        reconnect_max_s = float(config["reconnect_backoff_max_ms"]) / 1000
        #: After a failed request: exponential up to reconnect_backoff_max_ms.
        self._failure_backoff = RetryBackoff(retry_s, max(retry_s, reconnect_max_s))
        #: While a topic is held back (see :meth:`hold`): ask again soon, backing off.
        self._hold_backoff = self._failure_backoff
        self.topics: set[str] = set()
        self.topic_partitions: dict[str, set[int]] = {}
        self.topic_ids: dict[str, str | None] = {}
        #: Every topic of the cluster, from the last all-topics answer (``None``: not asked).
        self.all_topics: set[str] | None = None
        self.want_all = False
        self.leaders: dict[TopicPartition, tuple[int | None, int | None]] = {}
        #: Each partition's live replicas (KIP-392: a read replica must be one of them).
        self.replicas: dict[TopicPartition, frozenset[int]] = {}
        #: Each broker's rack (``broker.rack``; ``None``: not set), from the last answer.
        self.racks: dict[int, str | None] = {}
        #: Topics the last answer about them called UNKNOWN_TOPIC_OR_PARTITION (fail fast).
        self.unknown_topics: set[str] = set()
        #: Topics the last answer about them refused (TOPIC_AUTHORIZATION_FAILED).
        self.unauthorized_topics: set[str] = set()
        # Refused topics of answers not raised to the application yet: as Java's
        # Metadata.maybeThrowAnyException, each answer that refuses is raised once.
        self._refused: set[str] = set()
        # Answers in a row that refused a topic of interest (for the refresh backoff).
        self._refusals = 0
        self.in_flight = False
        self.needed = True
        self.next_at = 0.0
        self.ok_at = 0.0
        self._failures = 0
        # When a broker last refused a request because it does not lead (see request()), and
        # whether next_at is only the spacing after an answer (no failure or hold backoff).
        self._refused_at = float("-inf")
        self._spacing_only = False
        # Topics a broker called unknown, and when. Fetch v12 names topics, so a fetch sent
        # after a delete + re-create would be answered from the new topic's log as if it
        # were the old one; fetches wait until metadata sent after that answer (with the
        # topic id that lets the tracker see the re-creation) has been applied.
        self._hold: dict[str, float] = {}
        # Answers in a row that still held a topic back (for the refresh backoff).
        self._hold_misses = 0

    def request(self, refused_at: float | None = None, *, any_answer: bool = False) -> None:
        """Ask for a refresh. ``refused_at``: a broker refused a request at that time
        because it does not lead the partition (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH):
        an answer to a request sent before that is what sent the request there, so the
        refresh goes without the spacing after that answer (failure backoffs still hold).
        Each refusal is a request the tracker itself backs off, which bounds the refreshes.
        ``any_answer``: the answer to a request already on its way will do (a tracker still
        waiting for a leader asks again, after its backoff, if that answer names none);
        otherwise the refresh is a request sent from now on (callers wait for
        :meth:`fresh_since`)."""
        if any_answer and refused_at is None and self.in_flight:
            return
        self.needed = True
        if refused_at is not None and refused_at > self._refused_at:
            self._refused_at = refused_at

    def _refusal_pending(self) -> bool:
        return self._spacing_only and self._refused_at >= self.ok_at

    def fresh_since(self, when: float) -> bool:
        return self.ok_at >= when

    def hold(self, topic: str, now: float) -> None:
        """A broker called ``topic`` unknown: no fetches for it until newer metadata."""
        self._hold[topic] = now
        self.needed = True

    def held(self, topic: str) -> bool:
        return topic in self._hold

    def wake_at(self, now: float, wake_at: float) -> float:
        if self.needed:
            at = now if self._refusal_pending() else self.next_at
            return min(wake_at, max(at, now + 0.005))
        return wake_at

    def due(self, now: float) -> tuple[Any, list[str] | None] | None:
        """The request to send now, with the topics it asks for (``None``: all), or ``None``
        if nothing is due. Marks it in flight."""
        if self.in_flight or (now < self.next_at and not self._refusal_pending()):
            return None
        if not self.needed and now - self.ok_at < self._max_age_s:
            return None
        topics = None if self.want_all else sorted(self.topics)
        if topics is not None and not topics and self.ok_at > 0:
            self.needed = False
            return None
        self.in_flight = True
        self.needed = False
        return wire.metadata_request(topics, self._allow_auto_create, self._max_version), topics

    def on_failure(self, error: BaseException, now: float) -> None:
        self.in_flight = False
        self._spacing_only = False
        self._failures += 1
        backoff = self._failure_backoff.delay(self._failures)
        self.next_at = now + backoff
        self.needed = True
        log.debug("metadata_request_failed", error=repr(error), backoff_s=backoff)

    def on_answer(
        self, answer: wire.MetadataAnswer, sent_at: float, topics: list[str] | None, now: float
    ) -> dict[TopicPartition, tuple[int | None, int | None]]:
        """Apply an answer; returns the ``(leader, epoch)`` it gave per partition."""
        self.in_flight = False
        self._failures = 0
        self.next_at = now + self._retry_s
        self._spacing_only = True
        self.ok_at = sent_at
        leaders: dict[TopicPartition, tuple[int | None, int | None]] = {}
        if topics is None:
            self.all_topics = set()
        for topic in answer.topics:
            name = topic.name
            if topic.error is wire.ERR.UnknownTopicOrPartitionError:
                self.unknown_topics.add(name)
            else:
                self.unknown_topics.discard(name)
            if topic.error is wire.ERR.TopicAuthorizationFailedError:
                self.unauthorized_topics.add(name)
                self._refused.add(name)
            else:
                self.unauthorized_topics.discard(name)
            if topic.error is not None:
                # Unknown topic: keep waiting; trackers stay blocked on metadata.
                if not issubclass(topic.error, _QUIET_TOPIC_ERRORS):
                    log.warning("metadata_topic_error", topic=name, error_code=topic.error.errno)
                continue
            if topics is None and self.all_topics is not None and not topic.is_internal:
                self.all_topics.add(name)
            held = self._hold.get(name)
            if held is not None and sent_at >= held:
                del self._hold[name]
            self.topic_ids[name] = topic.topic_id
            self.topic_partitions[name] = {p.tp.partition for p in topic.partitions}
            for p in topic.partitions:
                leaders[p.tp] = (p.leader_id, p.leader_epoch)
                if p.live_replicas:
                    self.replicas[p.tp] = frozenset(p.live_replicas)
        self.leaders.update(leaders)
        if answer.racks:
            self.racks = dict(answer.racks)
        if self._hold:
            # Only metadata can release a held topic (it is back, with its new id): ask again
            # instead of waiting metadata_max_age_ms, backing off while it stays missing.
            self._hold_misses += 1
            self.next_at = now + self._hold_backoff.delay(self._hold_misses)
            self._spacing_only = False
            self.needed = True
        else:
            self._hold_misses = 0
        if self.unauthorized_topics & self.topics:
            # An ACL is not granted in milliseconds: ask again, but backing off, so that an
            # application polling through the errors does not flood the brokers.
            self._refusals += 1
            self.next_at = max(self.next_at, now + self._failure_backoff.delay(self._refusals))
            self._spacing_only = False
        else:
            self._refusals = 0
        return leaders

    def refuse(self, topic: str) -> None:
        """A broker refused ``topic`` outside metadata (Fetch): raise it like an answer's."""
        self.unauthorized_topics.add(topic)
        self._refused.add(topic)

    def take_authorization_error(self) -> Exception | None:
        """A ``TopicAuthorizationFailedError`` naming the topics refused by answers applied
        since the last call, or ``None``."""
        if not self._refused:
            return None
        refused, self._refused = sorted(self._refused), set()
        error: Exception = wire.ERR.TopicAuthorizationFailedError(
            f"not authorized to access topics {refused} (the cluster's ACLs refuse this "
            "client's principal DESCRIBE on them)"
        )
        return error

    def leader_of(self, tp: TopicPartition) -> int | None:
        return self.leaders.get(tp, (None, None))[0]

    def replicas_of(self, tp: TopicPartition) -> frozenset[int] | None:
        """The live replicas of ``tp`` (``None``: not known)."""
        return self.replicas.get(tp)

    def epoch_of(self, tp: TopicPartition) -> int | None:
        return self.leaders.get(tp, (None, None))[1]
