"""Classic consumer-group protocol: coordinator lookup, join/sync with kafka-python's
assignors, a background heartbeat thread, and offset commit/fetch carrying leader epochs.

Heartbeats: like kafka-python and the Java client, a daemon thread heartbeats while the
application is between polls. It also enforces ``max_poll_interval_ms``: if ``poll`` is not
called for that long, the thread leaves the group so the partitions move to a live member,
and the next ``poll`` rejoins. Joining and syncing happen inside ``poll`` on the
application thread, which is where listeners and commits-on-revoke run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import kafka.errors as kerrors
import structlog
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.structs import TopicPartition

from epochguard.consumer.client import BrokerClient
from epochguard.offsets.position import EpochOffset

__all__ = ["CommitFailedError", "GroupCoordinator"]

log = structlog.get_logger("epochguard.consumer")

_COORDINATOR_ERRORS = {14, 15, 16}  # LOAD_IN_PROGRESS, NOT_AVAILABLE, NOT_COORDINATOR
_REJOIN_ERRORS = {22, 25, 27}  # ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS
_MEMBER_ID_REQUIRED = 79
_FENCED_INSTANCE_ID = 82


class CommitFailedError(kerrors.CommitFailedError):  # type: ignore[misc]
    """An offset commit was rejected (the group rebalanced, or the member was fenced)."""


class _ClusterView:
    """What kafka-python's assignors read from ``cluster``."""

    def __init__(self, partitions: Mapping[str, set[int]]) -> None:
        self._partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        parts = self._partitions.get(topic)
        return set(parts) if parts is not None else None

    def topics(self, exclude_internal_topics: bool = True) -> set[str]:
        return set(self._partitions)


class GroupCoordinator:
    """One member of one classic group (plus offset APIs for ``assign()`` users)."""

    def __init__(self, client: BrokerClient, config: dict[str, Any]) -> None:
        self._client = client
        self._config = config
        self.group_id: str = config["group_id"]
        self._instance_id: str | None = config.get("group_instance_id")
        self.coordinator_id: int | None = None
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self._assignors = {a.name: a for a in config["partition_assignment_strategy"]}
        self._lock = threading.Lock()
        self.rejoin_needed = True
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self._last_poll = time.monotonic()
        self._closed = False
        self.heartbeats_sent = 0
        self.rebalances = 0

    # ------------------------------------------------------------------ coordinator

    def _timeout_s(self) -> float:
        return float(self._config["request_timeout_ms"]) / 1000

    def ensure_coordinator(self, deadline: float) -> int:
        attempt = 0
        while self.coordinator_id is None:
            if self._client.closed:
                raise kerrors.KafkaConnectionError("consumer closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise kerrors.KafkaTimeoutError(
                    f"group {self.group_id!r}: no coordinator found in time"
                )
            request = FindCoordinatorRequest(key=self.group_id, key_type=0, max_version=3)
            try:
                resp = self._client.request(None, request, min(self._timeout_s(), remaining))
            except kerrors.KafkaError as exc:
                log.debug("find_coordinator_failed", group=self.group_id, error=repr(exc))
                resp = None
            if resp is not None and resp.error_code == 0:
                self.coordinator_id = resp.node_id
                log.info("coordinator_found", group=self.group_id, node=resp.node_id)
                break
            attempt += 1
            time.sleep(min(0.05 * 2**attempt, 1.0, max(0.0, deadline - time.monotonic())))
        return self.coordinator_id

    def coordinator_dead(self) -> None:
        self.coordinator_id = None

    def _call(
        self,
        request: Any,
        deadline: float,
        timeout_s: float | None = None,
        lookup_deadline: float | None = None,
    ) -> Any:
        """Send to the coordinator; on transport errors find the coordinator again and retry
        until ``deadline`` (looking the coordinator up until ``lookup_deadline``)."""
        t = self._timeout_s() if timeout_s is None else timeout_s
        attempt = 0
        while True:
            node = self.ensure_coordinator(
                deadline if lookup_deadline is None else min(deadline, lookup_deadline)
            )
            remaining = max(0.05, deadline - time.monotonic())
            try:
                return self._client.request(node, request, min(t, remaining))
            except (
                kerrors.KafkaConnectionError,
                kerrors.NodeNotReadyError,
                kerrors.KafkaTimeoutError,
                kerrors.RequestTimedOutError,
                kerrors.UnknownBrokerIdError,
            ) as exc:
                self.coordinator_dead()
                if time.monotonic() >= deadline or self._client.closed:
                    raise
                attempt += 1
                log.debug("coordinator_request_failed", group=self.group_id, error=repr(exc))
                time.sleep(min(0.05 * attempt, 0.5, max(0.0, deadline - time.monotonic())))

    # ------------------------------------------------------------------ offsets

    def fetch_committed(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> dict[TopicPartition, EpochOffset | None]:
        """OffsetFetch (v5+ returns the committed leader epoch)."""
        return {
            tp: None if got is None else got[0]
            for tp, got in self.fetch_committed_metadata(partitions, deadline).items()
        }

    def fetch_committed_metadata(
        self, partitions: Sequence[TopicPartition], deadline: float
    ) -> dict[TopicPartition, tuple[EpochOffset, str] | None]:
        """Like :meth:`fetch_committed`, with the metadata string stored by the commit."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        T = OffsetFetchRequest.OffsetFetchRequestTopic
        request = OffsetFetchRequest(
            group_id=self.group_id,
            topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
            require_stable=True,
            max_version=7,
        )
        while True:
            try:
                resp = self._call(request, deadline)
            except kerrors.KafkaError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
                continue
            top = getattr(resp, "error_code", 0)
            if top in _COORDINATOR_ERRORS:
                self.coordinator_dead()
                if time.monotonic() >= deadline:
                    raise kerrors.for_code(top)()
                time.sleep(0.05)
                continue
            if top:
                raise kerrors.for_code(top)()
            out: dict[TopicPartition, tuple[EpochOffset, str] | None] = {}
            retry = False
            for topic in resp.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    if p.error_code in (14, 16, 89):  # loading, not coordinator, unstable
                        retry = True
                        continue
                    if p.error_code:
                        raise kerrors.for_code(p.error_code)()
                    if p.committed_offset < 0:
                        out[tp] = None
                    else:
                        epoch = getattr(p, "committed_leader_epoch", -1)
                        out[tp] = (
                            EpochOffset(p.committed_offset, epoch if epoch >= 0 else None),
                            p.metadata or "",
                        )
            if not retry:
                return out
            if time.monotonic() >= deadline:
                raise kerrors.KafkaTimeoutError("OffsetFetch: offsets unstable")
            time.sleep(0.05)

    def commit(
        self, offsets: Mapping[TopicPartition, tuple[EpochOffset, str]], deadline: float
    ) -> None:
        """OffsetCommit v6+ with ``committed_leader_epoch``."""
        if not offsets:
            return
        by_topic: dict[str, list[Any]] = {}
        T = OffsetCommitRequest.OffsetCommitRequestTopic
        for tp, (pos, metadata) in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                T.OffsetCommitRequestPartition(
                    partition_index=tp.partition,
                    committed_offset=pos.offset,
                    committed_leader_epoch=pos.wire_epoch,
                    committed_metadata=metadata,
                )
            )
        with self._lock:
            generation, member = self.generation, self.member_id
        subscribed = self.protocol is not None
        request = OffsetCommitRequest(
            group_id=self.group_id,
            generation_id_or_member_epoch=generation if subscribed else -1,
            member_id=member if subscribed else "",
            group_instance_id=self._instance_id if subscribed else None,
            retention_time_ms=-1,
            topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()],
            min_version=6,
            max_version=8,
        )
        while True:
            resp = self._call(request, deadline)
            errors = {p.error_code for t in resp.topics for p in t.partitions} - {0}
            if not errors:
                log.debug(
                    "offsets_committed",
                    group=self.group_id,
                    offsets={str(tp): str(p) for tp, (p, _m) in offsets.items()},
                )
                return
            if errors & _COORDINATOR_ERRORS:
                self.coordinator_dead()
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
            if errors & _REJOIN_ERRORS or _FENCED_INSTANCE_ID in errors:
                self.rejoin_needed = True
                raise CommitFailedError(
                    f"group {self.group_id!r}: commit rejected ({sorted(errors)}); the group "
                    "rebalanced, partitions may have moved to another member"
                )
            raise kerrors.for_code(min(errors))()

    # ------------------------------------------------------------------ membership

    def join(
        self,
        topics: set[str],
        metadata_for: Callable[[set[str], float], Mapping[str, set[int]]],
        deadline: float,
        lookup_deadline: float | None = None,
    ) -> list[TopicPartition]:
        """JoinGroup + SyncGroup until a generation is formed; returns our assignment.

        Raises ``KafkaTimeoutError`` if no coordinator answers by ``lookup_deadline`` (so
        ``poll`` keeps its timeout while the cluster is down)."""
        self.stop_heartbeats()
        protocols = [
            (name, assignor.metadata(topics).encode()) for name, assignor in self._assignors.items()
        ]
        rebalance_timeout = int(self._config["max_poll_interval_ms"])
        while True:
            if time.monotonic() >= deadline:
                raise kerrors.KafkaTimeoutError(f"group {self.group_id!r}: join timed out")
            request = JoinGroupRequest(
                group_id=self.group_id,
                session_timeout_ms=self._config["session_timeout_ms"],
                rebalance_timeout_ms=rebalance_timeout,
                member_id=self.member_id,
                group_instance_id=self._instance_id,
                protocol_type="consumer",
                protocols=protocols,
                reason=None,
                max_version=7,
            )
            try:
                resp = self._call(
                    request, deadline, rebalance_timeout / 1000 + 5, lookup_deadline=lookup_deadline
                )
            except kerrors.KafkaError as exc:
                log.debug("join_group_failed", group=self.group_id, error=repr(exc))
                if lookup_deadline is not None and time.monotonic() >= lookup_deadline:
                    raise
                time.sleep(0.1)
                continue
            err = resp.error_code
            if err == _MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id
                continue
            if err in _COORDINATOR_ERRORS:
                self.coordinator_dead()
                time.sleep(0.05)
                continue
            if err == 25:  # UNKNOWN_MEMBER_ID
                self.member_id = ""
                continue
            if err == 27:
                continue
            if err:
                raise kerrors.for_code(err)()
            with self._lock:
                self.member_id = resp.member_id
                self.generation = resp.generation_id
                self.protocol = resp.protocol_name
            if resp.leader == resp.member_id:
                assignments = self._assign(resp, metadata_for, deadline)
            else:
                assignments = []
            sync = SyncGroupRequest(
                group_id=self.group_id,
                generation_id=resp.generation_id,
                member_id=resp.member_id,
                group_instance_id=self._instance_id,
                protocol_type="consumer",
                protocol_name=resp.protocol_name,
                assignments=assignments,
                max_version=5,
            )
            try:
                sresp = self._call(sync, deadline, rebalance_timeout / 1000 + 5)
            except kerrors.KafkaError as exc:
                log.debug("sync_group_failed", group=self.group_id, error=repr(exc))
                continue
            if sresp.error_code in _COORDINATOR_ERRORS:
                self.coordinator_dead()
                continue
            if sresp.error_code == 25:
                self.member_id = ""
                continue
            if sresp.error_code in _REJOIN_ERRORS:
                continue
            if sresp.error_code:
                raise kerrors.for_code(sresp.error_code)()
            assignment = ConsumerProtocolAssignment.decode(sresp.assignment)
            assignor = self._assignors.get(resp.protocol_name)
            if assignor is not None and hasattr(assignor, "on_assignment"):
                try:
                    assignor.on_assignment(assignment, resp.generation_id)
                except Exception as exc:  # sticky assignor bookkeeping only
                    log.debug("assignor_on_assignment_failed", error=repr(exc))
            self.rejoin_needed = False
            self.rebalances += 1
            parts = sorted(assignment.partitions())
            log.info(
                "group_joined",
                group=self.group_id,
                generation=resp.generation_id,
                member_id=resp.member_id,
                leader=resp.leader == resp.member_id,
                protocol=resp.protocol_name,
                partitions=[str(tp) for tp in parts],
            )
            self.start_heartbeats()
            return parts

    def _assign(
        self,
        resp: Any,
        metadata_for: Callable[[set[str], float], Mapping[str, set[int]]],
        deadline: float,
    ) -> list[Any]:
        assignor = self._assignors[resp.protocol_name]
        all_topics: set[str] = set()
        for member in resp.members:
            member.metadata = ConsumerProtocolSubscription.decode(member.metadata)
            all_topics.update(member.metadata.topics)
        partitions = metadata_for(all_topics, deadline)
        result = assignor.assign(_ClusterView(partitions), resp.members)
        A = SyncGroupRequest.SyncGroupRequestAssignment
        return [A(member_id=m, assignment=a.encode()) for m, a in result.items()]

    def leave(self, reason: str = "the consumer is being closed") -> None:
        self.stop_heartbeats()
        with self._lock:
            member = self.member_id
            self.member_id = ""
            self.generation = -1
            self.protocol = None
        self.rejoin_needed = True
        if not member or self.coordinator_id is None or self._instance_id is not None:
            return
        request = LeaveGroupRequest(
            group_id=self.group_id,
            member_id=member,
            members=[
                LeaveGroupRequest.MemberIdentity(
                    member_id=member, group_instance_id=None, reason=reason
                )
            ],
            max_version=4,
        )
        try:
            self._client.request(self.coordinator_id, request, min(self._timeout_s(), 2.0))
            log.info("group_left", group=self.group_id, member_id=member, reason=reason)
        except kerrors.KafkaError as exc:
            log.debug("leave_group_failed", group=self.group_id, error=repr(exc))

    # ------------------------------------------------------------------ heartbeats

    def polled(self) -> None:
        self._last_poll = time.monotonic()

    def start_heartbeats(self) -> None:
        self._hb_stop = threading.Event()
        t = threading.Thread(
            target=self._heartbeat_loop,
            args=(self._hb_stop,),
            name=f"epochguard-heartbeat-{self.group_id}",
            daemon=True,
        )
        self._hb_thread = t
        t.start()

    def stop_heartbeats(self) -> None:
        self._hb_stop.set()
        t = self._hb_thread
        self._hb_thread = None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        interval = self._config["heartbeat_interval_ms"] / 1000
        max_poll = self._config["max_poll_interval_ms"] / 1000
        while not stop.wait(interval):
            if time.monotonic() - self._last_poll > max_poll:
                log.warning(
                    "max_poll_interval_exceeded",
                    group=self.group_id,
                    max_poll_interval_ms=self._config["max_poll_interval_ms"],
                )
                self.leave("max_poll_interval_ms exceeded")
                return
            with self._lock:
                generation, member = self.generation, self.member_id
            node = self.coordinator_id
            if node is None or not member:
                continue
            request = HeartbeatRequest(
                group_id=self.group_id,
                generation_id=generation,
                member_id=member,
                group_instance_id=self._instance_id,
                max_version=4,
            )
            try:
                resp = self._client.request(node, request, min(self._timeout_s(), interval * 3))
            except kerrors.KafkaError as exc:
                log.debug("heartbeat_failed", group=self.group_id, error=repr(exc))
                self.coordinator_dead()
                self.rejoin_needed = True
                return
            self.heartbeats_sent += 1
            if resp.error_code == 0:
                continue
            if resp.error_code in _COORDINATOR_ERRORS:
                self.coordinator_dead()
            log.info("rebalance_needed", group=self.group_id, error_code=resp.error_code)
            self.rejoin_needed = True
            return
