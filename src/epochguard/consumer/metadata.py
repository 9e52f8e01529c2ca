"""The consumer's own metadata: which topics to ask about, when, and what the last answers
said (partitions, leaders with their epochs, topic ids).

It is not kafka-python's ``ClusterMetadata``, which lets an older leader epoch replace a newer
one; epoch decisions stay in the trackers, which get every partition's leader from here.
Sending and applying answers is the driver's (:class:`~epochguard.consumer.fetcher.Fetcher`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.consumer import wire
from epochguard.offsets.policy import RetryBackoff

__all__ = ["Metadata"]

log = get_logger("epochguard.consumer")

_QUIET_TOPIC_ERRORS = (wire.ERR.UnknownTopicOrPartitionError, wire.ERR.LeaderNotAvailableError)
#: While a partition waits for a replica to accept a connection, metadata is still asked this
#: long after the last answer: a broker can come back where the probes do not look (a pod
#: restarted on a new address, a replica reassigned away), and only an answer says so.
DARK_REFRESH_S = 5.0
#: Connections a replica of a dark partition accepts in a row, never refusing one, before it
#: is left to the trackers' backoff (see :meth:`Metadata.on_probe`).
ACCEPTED_UNTRUSTED = 3


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
        #: Each partition's replicas, offline ones included, from the last answer naming them.
        self._every_replica: dict[TopicPartition, frozenset[int]] = {}
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
        # Waiting for a leader whose replicas are all down. Only a live replica can be
        # elected, so no answer can name a leader for such a partition before one of its
        # replicas is back; refreshing on the trackers' backoff meanwhile only asks the
        # brokers for the same answer. A broker that is down refuses connections, which
        # costs the cluster no request: the driver tries to connect to the replicas
        # (probes_due/on_probe) and the refresh goes the moment one accepts. See
        # docs/guides/consumer.md, "Partitions without a leader".
        #: Partitions whose tracker waits for a leader (request(leader_for=)).
        self._waiting: set[TopicPartition] = set()
        #: Of those, the ones whose last answer named no leader and only offline replicas,
        #: all at addresses an answer gave: their replicas.
        self._dark: dict[TopicPartition, frozenset[int]] = {}
        #: Dark partitions no answer called dark: their leader's connection was lost and
        #: the probes decide (see :meth:`request`, ``lost_leader``). One of their replicas
        #: accepting a connection it never refused sends the refresh at once.
        self._presumed: set[TopicPartition] = set()
        #: When a partition was last presumed dark (the dark refresh counts from there).
        self._presumed_at = float("-inf")
        #: Dark partitions one of whose replicas accepted a connection: when it did, and
        #: their replicas. An
        #: election follows a broker's return (the controller's, or an administrator's):
        #: they are asked for at once, then every retry_backoff_ms as many times as the
        #: trackers' backoff (one refresh per retry_backoff_max_ms at most) would have asked
        #: while they were dark (the refreshes not sent while no answer could change are
        #: sent when one can), then on a backoff started over at the return, until an
        #: answer names a leader or that backoff reaches retry_backoff_max_ms, where the
        #: trackers' own backoff is.
        self._revived: dict[TopicPartition, tuple[float, frozenset[int]]] = {}
        retry_max_s = max(retry_s, 1.0)
        self._revival_at = float("inf")
        self._revival_left = 0
        self._revival_max = max(0, int(retry_max_s / retry_s) - 1)
        self._revival_backoff = RetryBackoff(retry_s, retry_max_s)
        self._revival_attempts = 0
        self._retry_max_s = retry_max_s
        #: When the partitions now dark went dark (the first of them).
        self._dark_since: float | None = None
        #: Every broker an answer named: the driver knows where to reach it.
        self._known_brokers: set[int] = set()
        #: Per replica of a dark partition: when to try connecting next.
        self._probe_at: dict[int, float] = {}
        self._probing: set[int] = set()
        #: Replicas whose last connection attempt was refused: the next one accepted is a
        #: return. One accepted without a refusal before it is a broker still shutting
        #: down (the others no longer list it, it still listens) or one the cluster fenced
        #: while it runs: tried again later, backing off (_probe_backoff), until it refuses.
        #: One that never refuses (ACCEPTED_UNTRUSTED in a row) may be back already (it
        #: restarted before the answer that called it offline) or behind something that
        #: accepts connections for it (a TCP proxy, a load balancer): unwatchable.
        self._refused_by: set[int] = set()
        self._accepted_in_a_row: dict[int, int] = {}
        #: Replicas that cannot tell that they are back: a connection attempt failed
        #: other than by a refusal (the host may be down or unreachable), or one was
        #: accepted while answers still called it offline. Their partitions are refreshed
        #: on the trackers' backoff, until an answer lists the broker again.
        self._unwatchable: set[int] = set()
        self._probe_interval_s = float(config["reconnect_backoff_ms"]) / 1000
        self._probe_backoff = RetryBackoff(
            self._probe_interval_s, max(self._probe_interval_s, reconnect_max_s)
        )

    def request(
        self,
        refused_at: float | None = None,
        *,
        any_answer: bool = False,
        leader_for: TopicPartition | None = None,
        lost_leader: tuple[TopicPartition, int, float] | None = None,
    ) -> None:
        """Ask for a refresh. ``leader_for``: the refresh is for that partition's tracker,
        which knows no leader; none is sent while the last answer said every replica of it
        is down (it goes when one of them accepts a connection, see :meth:`on_probe`).
        ``refused_at``: a broker refused a request at that time
        because it does not lead the partition (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH):
        an answer to a request sent before that is what sent the request there, so the
        refresh goes without the spacing after that answer (failure backoffs still hold).
        Each refusal is a request the tracker itself backs off, which bounds the refreshes.
        ``any_answer``: the answer to a request already on its way will do (a tracker still
        waiting for a leader asks again, after its backoff, if that answer names none);
        otherwise the refresh is a request sent from now on (callers wait for
        :meth:`fresh_since`).
        ``lost_leader``: ``(partition, leader, now)``, a request to the partition's leader
        failed with its connection at ``now``. Only a running replica can lead the partition,
        so before asking, its replicas are tried with connections (no request): the first
        one accepting, or an attempt failing other than by a refusal, sends the refresh at
        once; while every one refuses the partition is dark, as after an answer naming no
        leader, and the refresh goes when one is back."""
        if lost_leader is not None:
            tp = lost_leader[0]
            if tp in self._dark or tp in self._revived or self._presume_dark(*lost_leader):
                return
        if leader_for is not None:
            self._waiting.add(leader_for)
            if leader_for in self._dark or leader_for in self._revived:
                return
        if any_answer and refused_at is None and self.in_flight:
            return
        self.needed = True
        if refused_at is not None and refused_at > self._refused_at:
            self._refused_at = refused_at

    def _presume_dark(self, tp: TopicPartition, leader: int, now: float) -> bool:
        replicas = self._every_replica.get(tp)
        if (
            replicas is None
            or self.leaders.get(tp, (None, None))[0] != leader
            or not replicas <= self._known_brokers
            or replicas & self._unwatchable
        ):
            return False
        self._waiting.add(tp)
        self._dark[tp] = replicas
        self._presumed.add(tp)
        self._presumed_at = now
        if self._dark_since is None:
            self._dark_since = now
        log.debug("leader_connection_lost", topic=tp.topic, partition=tp.partition, leader=leader)
        return True

    def _dark_asked_at(self) -> float:
        """When the dark partitions were last asked about (or presumed dark)."""
        return max(self.ok_at, self._presumed_at)

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
            wake_at = min(wake_at, max(at, now + 0.005))
        if self._revived and not self.in_flight:
            wake_at = min(wake_at, max(self._revival_at, now + 0.005))
        if self._dark:
            wake_at = min(wake_at, max(self._dark_asked_at() + DARK_REFRESH_S, now + 0.005))
            for node in self._watched():
                if node not in self._probing:
                    wake_at = min(wake_at, max(self._probe_at.get(node, now), now + 0.005))
        return wake_at

    def due(self, now: float) -> tuple[Any, list[str] | None] | None:
        """The request to send now, with the topics it asks for (``None``: all), or ``None``
        if nothing is due. Marks it in flight."""
        if self.in_flight:
            return None
        if self._dark and now - self._dark_asked_at() >= DARK_REFRESH_S:
            self.needed = True
        revival = bool(self._revived) and now >= self._revival_at
        if not revival:
            if now < self.next_at and not self._refusal_pending():
                return None
            if not self.needed and now - self.ok_at < self._max_age_s:
                return None
        self._revival_at = float("inf")
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
        if self._revived:
            self._revival_at = self.next_at
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
                if p.replicas:
                    self._every_replica[p.tp] = frozenset(p.replicas)
        self.leaders.update(leaders)
        if answer.racks:
            self.racks = dict(answer.racks)
        self._known_brokers.update(answer.racks)
        self._watch_leaderless(answer, sent_at, now)
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

    # ---------------------------------------------------- partitions whose replicas are down

    def _watch_leaderless(self, answer: wire.MetadataAnswer, sent_at: float, now: float) -> None:
        """Which waiting partitions the answer leaves without a leader and without a live
        replica (dark), and when to ask again for those whose replica came back."""
        live = set(answer.racks)
        self._unwatchable -= live
        for node in live:
            self._forget_probe(node)
        waiting = self._waiting
        if not waiting:
            return
        early = False
        for topic in answer.topics:
            for p in topic.partitions:
                tp = p.tp
                if tp not in waiting:
                    continue
                if p.leader_id is not None or topic.error is not None:
                    self._stop_watching(tp)
                    continue
                replicas = frozenset(p.replicas)
                offline = bool(replicas) and not (replicas & set(p.live_replicas) & live)
                revived = self._revived.get(tp)
                if revived is not None:
                    back_at = revived[0]
                    # A broker listens a little before the others list it: an answer still
                    # calling every replica offline does not end the watch early.
                    early = early or sent_at < back_at  # asked before it was back
                    continue
                self._presumed.discard(tp)  # an answer says from here on
                if offline and replicas <= self._known_brokers and not replicas & self._unwatchable:
                    self._dark[tp] = replicas
                else:
                    self._dark.pop(tp, None)
        if self._revived:
            if early:
                self._revival_at = now
            elif self._revival_left > 0:
                self._revival_left -= 1
                self._revival_at = now + self._retry_s
            else:
                delay = self._revival_backoff.delay(self._revival_attempts)
                self._revival_attempts += 1
                if delay < self._retry_max_s:
                    self._revival_at = now + delay
                else:
                    # The trackers' backoff asks from here on, as for any partition. A
                    # replica still offline although it accepts connections cannot tell
                    # when it is back: not watched again until an answer lists it.
                    for _back_at, replicas in self._revived.values():
                        if not replicas & live:
                            self._unwatchable.update(replicas)
                    self._revived.clear()
                    self._revival_at = float("inf")
        if self._dark and self._dark_since is None:
            self._dark_since = now
        self._drop_idle_probes()

    def _stop_watching(self, tp: TopicPartition) -> None:
        self._waiting.discard(tp)
        self._presumed.discard(tp)
        self._dark.pop(tp, None)
        self._revived.pop(tp, None)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """The partitions are no longer assigned: stop watching their replicas."""
        for tp in tps:
            self._stop_watching(tp)
        self._drop_idle_probes()

    def _watched(self) -> set[int]:
        nodes: set[int] = set()
        for replicas in self._dark.values():
            nodes |= replicas
        return nodes

    def _forget_probe(self, node: int) -> None:
        self._probe_at.pop(node, None)
        self._refused_by.discard(node)
        self._accepted_in_a_row.pop(node, None)

    def _drop_idle_probes(self) -> None:
        if not self._dark:
            self._dark_since = None
        watched = self._watched()
        for node in [n for n in self._probe_at if n not in watched]:
            self._forget_probe(node)

    def probes_due(self, now: float) -> list[int]:
        """Replicas of dark partitions to try connecting to now (no request: a connection
        made and closed, see :meth:`on_probe`). Marks them in flight."""
        if not self._dark:
            return []
        due = [
            node
            for node in sorted(self._watched())
            if node not in self._probing and now >= self._probe_at.get(node, now)
        ]
        self._probing.update(due)
        return due

    def on_probe(self, node: int, now: float, *, reachable: bool, refused: bool = False) -> bool:
        """The outcome of a connection attempt to ``node``: accepted (``reachable``: the
        broker is back if the attempt before was refused; otherwise it is still shutting
        down, or fenced while it runs, and is tried again backing off from
        ``reconnect_backoff_ms``, until ``ACCEPTED_UNTRUSTED`` accepted in a row leave its
        partitions to the trackers' backoff, with a refresh now), refused (nothing listens
        there: the broker is down; tried again every ``reconnect_backoff_ms``), or failed
        otherwise (a timeout, an unreachable host: it cannot tell when the broker is back,
        and its partitions are refreshed on the trackers' backoff until an answer lists it
        again). Returns whether a refresh is now due because the broker is back."""
        self._probing.discard(node)
        if reachable and node not in self._refused_by and self._doubt(node):
            return False
        if reachable and node not in self._refused_by:
            accepted = self._accepted_in_a_row.get(node, 0) + 1
            if accepted < ACCEPTED_UNTRUSTED:
                self._accepted_in_a_row[node] = accepted
                self._probe_at[node] = now + self._probe_backoff.delay(accepted)
                return False
            # A shutdown closes the listener soon after the others stop listing the broker;
            # one still accepting may be back already, or never refuse (a proxy in front of
            # it): nothing here tells its return. Asked for at once, then on the trackers'
            # backoff, as a replica whose attempts time out.
            log.info("leaderless_replica_unwatchable", node=node, accepted_in_a_row=accepted)
            self._unwatch(node)
            self.needed = True
            return False
        if reachable:
            self._forget_probe(node)
            back = [tp for tp, replicas in self._dark.items() if node in replicas]
            for tp in back:
                self._revived[tp] = (now, self._dark.pop(tp))
                self._presumed.discard(tp)
            if back:
                dark_for = now - (now if self._dark_since is None else self._dark_since)
                self._revival_left = min(int(dark_for / self._retry_max_s), self._revival_max)
                self._revival_attempts = 0
                self._revival_at = now
            self._drop_idle_probes()
            return bool(back)
        if refused:
            self._refused_by.add(node)
            self._accepted_in_a_row.pop(node, None)
            self._probe_at[node] = now + self._probe_interval_s
            return False
        self._unwatch(node)
        return False

    def _doubt(self, node: int) -> bool:
        """``node`` accepted a connection it never refused: the partitions presumed dark
        that it replicates may have a leader (it may be one, still running); they are asked
        about at once. Returns whether ``node`` is watched for no other partition."""
        doubted = [tp for tp in self._presumed if node in self._dark.get(tp, ())]
        if not doubted:
            return False
        for tp in doubted:
            del self._dark[tp]
            self._presumed.discard(tp)
        self.needed = True
        self._drop_idle_probes()
        return node not in self._watched()

    def _unwatch(self, node: int) -> None:
        self._unwatchable.add(node)
        for tp in [tp for tp, replicas in self._dark.items() if node in replicas]:
            del self._dark[tp]
            if tp in self._presumed:
                self._presumed.discard(tp)
                self.needed = True
        self._drop_idle_probes()

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
