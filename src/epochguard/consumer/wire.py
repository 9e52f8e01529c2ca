"""The wire layer: every request the consumer sends is built here and every answer it reads
is parsed here, as pure functions over kafka-python's protocol classes (no sockets).

This is the only module that converts wire values into the core's types:

- epochs and offsets: ``-1`` (``UNDEFINED_EPOCH`` / ``UNDEFINED_EPOCH_OFFSET``) <-> ``None``;
  any other negative value going out is a bug and raises :class:`WireValueError`;
- topic ids: the zero UUID (Kafka's ``Uuid.ZERO_UUID``, "no id") <-> ``None``, ids are text
  (``str(uuid)``) in the core;
- node ids: ``-1`` (no leader) -> ``None``;
- error codes -> ``kafka.errors`` classes (``None`` for no error); a code this version of
  kafka-python does not know becomes a class of its own that keeps the code in ``errno``.

Parsed answers are small frozen attrs values; the driver (``fetcher.py``, ``metadata.py``,
``group.py``) feeds them to the trackers. Error codes the consumer branches on are named
through :data:`ERR` (``kafka.errors``) so that codes are defined in one place: kafka-python.
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol

import attrs
import kafka.errors as ERR
from kafka.protocol.admin import DescribeProducersRequest
from kafka.protocol.consumer import FetchRequest as _KafkaFetchRequest
from kafka.protocol.consumer import (
    FetchResponse,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.structs import TopicPartition

from epochguard._errors import ErrorCode
from epochguard.consumer.group_messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
)
from epochguard.consumer.telemetry import PushAnswer, SubscriptionAnswer, TelemetrySubscription
from epochguard.consumer.telemetry_messages import (
    GetTelemetrySubscriptionsRequest,
    PushTelemetryRequest,
)
from epochguard.offsets.hanging import ProducerState

__all__ = [
    "CONSUMER_HEARTBEAT_MIN_VERSION",
    "ERR",
    "FETCH_API_KEY",
    "FETCH_DIVERGING_MIN_VERSION",
    "FETCH_MAX_VERSION",
    "FETCH_MAX_VERSION_BY_NAME",
    "MEMBER_OFFSETS_MIN_VERSION",
    "METADATA_MAX_VERSION",
    "OFFSETS_BY_ID_VERSION",
    "ZERO_UUID",
    "CommittedOffset",
    "DescribedConsumerGroup",
    "DescribedMember",
    "EpochEnd",
    "EpochQuery",
    "FetchAnswer",
    "FetchEntry",
    "FetchFrame",
    "FetchParams",
    "FetchRequest",
    "FetchRequestPartition",
    "FetchRequestTopic",
    "FetchTarget",
    "FetchedPartition",
    "ForgottenFetchTopic",
    "HeartbeatAnswer",
    "LeaderHint",
    "ListedOffset",
    "MalformedFetchResponse",
    "MemberHeartbeat",
    "MetadataAnswer",
    "NodeEndpoint",
    "PartitionLeader",
    "TopicMetadata",
    "WireValueError",
    "broker_addresses",
    "commit_errors",
    "commit_refused_topic_ids",
    "commit_topics",
    "consumer_group_describe_request",
    "consumer_group_heartbeat_request",
    "describe_producers_request",
    "epoch_from_wire",
    "epoch_to_wire",
    "error_from_wire",
    "fetch_request",
    "find_coordinator_request",
    "get_telemetry_subscriptions_request",
    "heartbeat_request",
    "join_group_request",
    "leave_group_request",
    "list_offsets_request",
    "member_offset_commit_request",
    "member_offset_fetch_request",
    "metadata_error",
    "metadata_request",
    "metadata_requires_rebootstrap",
    "node_from_wire",
    "offset_commit_request",
    "offset_fetch_request",
    "offset_for_leader_epoch_request",
    "offset_from_wire",
    "push_telemetry_request",
    "read_consumer_group_describe",
    "read_consumer_group_heartbeat",
    "read_describe_producers",
    "read_fetch",
    "read_get_telemetry_subscriptions",
    "read_list_offsets",
    "read_member_offset_fetch",
    "read_metadata",
    "read_offset_fetch",
    "read_offset_for_leader_epoch",
    "read_push_telemetry",
    "skip_tagged_fields",
    "sync_group_request",
    "topic_id_from_wire",
    "topic_id_to_wire",
    "uses_topic_ids",
]

#: Kafka's "no topic id".
ZERO_UUID: Final = uuid.UUID(int=0)
#: Fetch v12 is the first with LastFetchedEpoch/DivergingEpoch; v13 names topics by id, so a
#: topic deleted and re-created under the same name is answered UNKNOWN_TOPIC_ID instead of
#: from the new log. v13 is used when every topic of a request has a known id, else v12.
#: v16: KIP-951 leader hints (``CurrentLeader`` per partition, ``NodeEndpoints``); v17 only
#: adds a field replicas send.
FETCH_MAX_VERSION: Final = 17
#: The first Fetch version whose answers carry DivergingEpoch for a LastFetchedEpoch sent.
FETCH_DIVERGING_MIN_VERSION: Final = 12
FETCH_MAX_VERSION_BY_NAME: Final = 12
#: Metadata v7+ carries leader epochs; v10+ topic ids; v13 a top-level error code (KIP-1102:
#: REBOOTSTRAP_REQUIRED).
METADATA_MAX_VERSION: Final = 13
OFFSET_FOR_LEADER_EPOCH_MIN_VERSION: Final = 2
#: ListOffsets v4 is the first with current_leader_epoch (fencing) and leader_epoch answers.
LIST_OFFSETS_MIN_VERSION: Final = 4
#: ListOffsets timestamps that ask for the log start / log end instead of a time.
EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1

_UNDEFINED: Final = -1


class WireValueError(ValueError):
    """A value the core handed to the wire layer has no wire form (a bug in the caller)."""


# ------------------------------------------------------------------------------ conversions


def epoch_to_wire(epoch: int | None, what: str = "leader epoch") -> int:
    """``None`` -> ``-1`` (unknown). Epoch 0 is a real epoch and goes out as 0."""
    if epoch is None:
        return _UNDEFINED
    if epoch < 0:
        raise WireValueError(f"{what} must be >= 0 or None (unknown), got {epoch}")
    return epoch


def epoch_from_wire(value: int | None) -> int | None:
    """Any negative epoch (``-1`` is Kafka's UNDEFINED_EPOCH) -> ``None``."""
    return None if value is None or value < 0 else value


def offset_from_wire(value: int | None) -> int | None:
    """Any negative offset (``-1`` is UNDEFINED_EPOCH_OFFSET / "none") -> ``None``."""
    return None if value is None or value < 0 else value


def node_from_wire(value: int | None) -> int | None:
    """A leader/coordinator node id; ``-1`` (none) -> ``None``."""
    return None if value is None or value < 0 else value


def topic_id_from_wire(value: uuid.UUID | None) -> str | None:
    """A topic id as the core keeps it: text; the zero UUID ("no id") -> ``None``."""
    if value is None or value == ZERO_UUID:
        return None
    return str(value)


def topic_id_to_wire(topic_id: str | None) -> uuid.UUID | None:
    """The core's text id as a UUID; ``None`` for "no id" and for text that is not a UUID
    (ids restored from stores written by other tools), so the request names the topic."""
    if topic_id is None:
        return None
    return _parse_topic_id(topic_id)


@functools.lru_cache(maxsize=4096)
def _parse_topic_id(topic_id: str) -> uuid.UUID | None:
    # Every Fetch names its topics' ids (a fetch session each partition's): parsed once.
    try:
        value = uuid.UUID(topic_id)
    except ValueError:
        return None
    return None if value == ZERO_UUID else value


def error_from_wire(code: int) -> type[ERR.KafkaError] | None:
    """An error code as its ``kafka.errors`` class; 0 -> ``None``."""
    if code == 0:
        return None
    cls: type[ERR.KafkaError] = ERR.for_code(code)
    return cls


def _partitions(
    response: Any, topic_field: str = "name", partition_field: str = "partition_index"
) -> Iterator[tuple[TopicPartition, Any]]:
    """Every partition entry of a topic-then-partitions answer, with its TopicPartition
    (the older APIs name the fields ``topic`` and ``partition``)."""
    for topic in response.topics:
        name = getattr(topic, topic_field)
        for p in topic.partitions:
            yield TopicPartition(name, getattr(p, partition_field)), p


def _errno(error: type[ERR.KafkaError] | None) -> int:
    return 0 if error is None else int(error.errno)


# ------------------------------------------------------------------------------- metadata


@attrs.frozen
class PartitionLeader:
    tp: TopicPartition
    leader_id: int | None
    leader_epoch: int | None
    #: The replicas that are not offline (KIP-392: where a read replica may be).
    live_replicas: tuple[int, ...] = ()
    #: Every replica, offline ones included.
    replicas: tuple[int, ...] = ()


@attrs.frozen
class TopicMetadata:
    name: str
    error: type[ERR.KafkaError] | None
    topic_id: str | None
    is_internal: bool
    partitions: tuple[PartitionLeader, ...]


@attrs.frozen
class MetadataAnswer:
    topics: tuple[TopicMetadata, ...]
    #: Each broker's ``broker.rack`` (``None``: not set).
    racks: Mapping[int, str | None] = attrs.field(factory=dict)
    #: The answer's top-level error (Metadata v13+; ``None``: none). An answer with one
    #: names no brokers and no topics.
    error: type[ERR.KafkaError] | None = None

    @property
    def rebootstrap_required(self) -> bool:
        return _errno(self.error) == ErrorCode.REBOOTSTRAP_REQUIRED


def metadata_request(
    topics: Sequence[str] | None, allow_auto_create: bool, max_version: int = METADATA_MAX_VERSION
) -> Any:
    """``topics`` ``None``: every topic of the cluster."""
    req_topics = (
        None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    )
    return MetadataRequest(
        topics=req_topics,
        allow_auto_topic_creation=allow_auto_create,
        include_topic_authorized_operations=False,
        max_version=max_version,
    )


def read_metadata(response: Any) -> MetadataAnswer:
    out = []
    for topic in response.topics:
        name = str(topic.name)
        parts = tuple(_partition_leader(name, p) for p in topic.partitions)
        out.append(
            TopicMetadata(
                name,
                error_from_wire(topic.error_code),
                topic_id_from_wire(getattr(topic, "topic_id", None)),
                bool(getattr(topic, "is_internal", False)),
                parts,
            )
        )
    racks = {int(b.node_id): (b.rack or None) for b in getattr(response, "brokers", None) or ()}
    return MetadataAnswer(tuple(out), racks, metadata_error(response))


def metadata_error(response: Any) -> type[ERR.KafkaError] | None:
    """A Metadata answer's top-level error (v13+; older answers have none)."""
    return error_from_wire(int(getattr(response, "error_code", 0) or 0))


def metadata_requires_rebootstrap(response: Any) -> bool:
    """The answer's top-level error is REBOOTSTRAP_REQUIRED (KIP-1102)."""
    return _errno(metadata_error(response)) == ErrorCode.REBOOTSTRAP_REQUIRED


def broker_addresses(response: Any) -> dict[int, tuple[str, int]]:
    """The ``(host, port)`` of every broker a Metadata answer names."""
    return {
        int(b.node_id): (str(b.host), int(b.port)) for b in getattr(response, "brokers", None) or ()
    }


def _partition_leader(topic: str, p: Any) -> PartitionLeader:
    # Once per partition of every Metadata answer (a thousand at a time): the replicas are
    # read once, and the live ones are all of them unless some are offline.
    replicas = tuple(map(int, getattr(p, "replica_nodes", None) or ()))
    offline = getattr(p, "offline_replicas", None)
    return PartitionLeader(
        TopicPartition(topic, p.partition_index),
        node_from_wire(p.leader_id),
        # Metadata below v7 has no leader epochs.
        epoch_from_wire(getattr(p, "leader_epoch", None)),
        tuple(r for r in replicas if r not in offline) if offline else replicas,
        replicas,
    )


# ---------------------------------------------------------------------------------- fetch


class FetchTarget(Protocol):
    """What :func:`fetch_request` reads per partition (a tracker's ``FetchAction`` is one)."""

    @property
    def tp(self) -> TopicPartition: ...
    @property
    def offset(self) -> int: ...
    @property
    def current_leader_epoch(self) -> int | None: ...
    @property
    def last_fetched_epoch(self) -> int | None: ...
    @property
    def topic_id(self) -> str | None: ...


@attrs.frozen
class FetchEntry:
    """One partition of a Fetch: where to read and the epochs that fence/validate it."""

    tp: TopicPartition
    offset: int
    current_leader_epoch: int | None
    last_fetched_epoch: int | None
    topic_id: str | None


@attrs.frozen
class FetchParams:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partition_max_bytes: int
    read_committed: bool
    rack_id: str = ""
    max_version: int = FETCH_MAX_VERSION


@attrs.frozen
class EpochEnd:
    """An ``(epoch, end offset)`` answer (OffsetForLeaderEpoch, DivergingEpoch); ``None``
    fields are Kafka's UNDEFINED (-1): the leader knows no such epoch."""

    epoch: int | None
    end_offset: int | None


@attrs.frozen
class LeaderHint:
    """KIP-951: a broker's word on who leads a partition now, under which epoch."""

    leader_id: int
    leader_epoch: int


@attrs.frozen
class NodeEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None


def _leader_hint(leader_id: int, leader_epoch: int) -> LeaderHint | None:
    if leader_id < 0 or leader_epoch < 0:
        return None
    return LeaderHint(leader_id, leader_epoch)


@attrs.frozen
class FetchedPartition:
    tp: TopicPartition
    error: type[ERR.KafkaError] | None
    high_watermark: int
    diverging: EpochEnd | None
    records: Any
    #: ``(producer_id, first_offset)`` of aborted transactions, ``None`` if there are none.
    aborted: list[tuple[int, int]] | None
    #: KIP-392 (v11+): the replica the leader wants this consumer to fetch from next
    #: (``None``: no preference, Kafka's -1).
    preferred_read_replica: int | None = None
    #: The last stable offset (read_committed reads stop there); -1 when unknown.
    last_stable_offset: int = -1
    #: KIP-951 (v12+ tagged, sent from v16): the leader the broker knows, as
    #: ``LeaderHint``, with NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH; else ``None``.
    current_leader: LeaderHint | None = None

    @property
    def error_code(self) -> int:
        return _errno(self.error)


@attrs.frozen
class FetchAnswer:
    #: A whole-request error (fetch sessions): applies to every partition asked for.
    error: type[ERR.KafkaError] | None
    partitions: tuple[FetchedPartition, ...]
    version: int
    #: KIP-227 session id of the answer (v7+); 0: no session.
    session_id: int = 0
    #: KIP-951 (v16+): where the brokers named by ``current_leader`` hints listen.
    node_endpoints: tuple[NodeEndpoint, ...] = ()


def uses_topic_ids(entries: Iterable[FetchTarget], params: FetchParams) -> bool:
    """Whether a Fetch of ``entries`` names topics by id (v13+): only when every topic's id
    is known, so a topic re-created under the same name is refused, never read."""
    return params.max_version >= 13 and all(e.topic_id is not None for e in entries)


class FetchRequestPartition(NamedTuple):
    """One partition of a :class:`FetchRequest`, as it goes on the wire."""

    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int


class FetchRequestTopic(NamedTuple):
    topic: str
    #: The zero UUID when the request names topics (v12 and before).
    topic_id: uuid.UUID
    partitions: list[FetchRequestPartition]


class ForgottenFetchTopic(NamedTuple):
    topic: str
    topic_id: uuid.UUID
    partitions: list[int]


class _FetchRequestHeader:
    """The request header kafka-python's connections keep per request in flight: which
    answer to expect (its own parser asks it for the response class)."""

    __slots__ = ("client_id", "correlation_id", "request_api_key", "request_api_version")

    def __init__(self, version: int, correlation_id: int, client_id: str | None) -> None:
        self.request_api_key = FETCH_API_KEY
        self.request_api_version = version
        self.correlation_id = correlation_id
        self.client_id = client_id

    def get_response_class(self) -> Any:
        return FetchResponse[self.request_api_version]

    def __repr__(self) -> str:
        return (
            f"RequestHeader(api_key={FETCH_API_KEY}, api_version={self.request_api_version}, "
            f"correlation_id={self.correlation_id}, client_id={self.client_id!r})"
        )


class FetchRequest:
    """A Fetch request, encoded here rather than by kafka-python's schema classes (which
    build an object per partition and walk the schema per field: about a tenth of
    ``getmany`` at 1 KB records). It offers what kafka-python's connections use of a request
    (``API_KEY``, ``API_VERSION`` and the version bounds its negotiation reads,
    ``with_header``, ``encode``, ``header``, ``expect_response``), so it is sent as any
    other; the version is the one the connection negotiates, known only when it is sent.

    ``topics`` and ``forgotten_topics_data`` read as kafka-python's request would; the bytes
    equal kafka-python's encoding for every version it has (tests/consumer/test_wire.py)."""

    API_KEY: Final = 1
    name: Final = "FetchRequest"
    #: The class's bounds, as kafka-python's protocol classes give them (its version
    #: negotiation reads both these and the request's own ``_min_version``/``_max_version``).
    min_version: Final = 0
    max_version: Final = FETCH_MAX_VERSION

    __slots__ = (
        "API_VERSION",
        "_bodies",
        "_forgotten",
        "_header",
        "_max_version",
        "_min_version",
        "_topics",
        "isolation_level",
        "max_bytes",
        "max_wait_ms",
        "min_bytes",
        "rack_id",
        "session_epoch",
        "session_id",
    )

    def __init__(
        self,
        topics: list[tuple[str, uuid.UUID, list[tuple[int, int, int, int]]]],
        forgotten: list[tuple[str, uuid.UUID, list[int]]],
        params: FetchParams,
        session_id: int,
        session_epoch: int,
        max_version: int,
    ) -> None:
        #: ``(name, id, [(partition, current leader epoch, offset, last fetched epoch)])``,
        #: wire values (``-1`` for unknown epochs, the zero UUID for no id).
        self._topics = topics
        self._forgotten = forgotten
        self.max_wait_ms = params.max_wait_ms
        self.min_bytes = params.min_bytes
        self.max_bytes = params.max_bytes
        self.isolation_level = 1 if params.read_committed else 0
        self.rack_id = params.rack_id
        self.session_id = session_id
        self.session_epoch = session_epoch
        self._min_version = FETCH_MIN_VERSION
        self._max_version = max_version
        self.API_VERSION: int | None = None
        self._header: _FetchRequestHeader | None = None
        # The body per version: the partition max bytes is the params', kept with them.
        self._bodies: dict[int, bytes] = {-1: params.partition_max_bytes.to_bytes(4, "big")}

    # ---------------------------------------------------------- kafka-python's interface

    @property
    def header(self) -> _FetchRequestHeader | None:
        return self._header

    def with_header(self, correlation_id: int = 0, client_id: str | None = "kafka-python") -> None:
        if self.API_VERSION is None:
            raise ValueError("Version required to encode the request header")
        self._header = _FetchRequestHeader(self.API_VERSION, correlation_id, client_id)

    @staticmethod
    def expect_response() -> bool:
        return True

    def encode(
        self, version: int | None = None, header: bool = False, framed: bool = False
    ) -> bytes:
        """The request at ``version`` (default: ``API_VERSION``), with its header and the
        frame's length when asked, as kafka-python's ``encode`` gives it."""
        if version is not None:
            self.API_VERSION = version
            if self._header is not None:
                self._header.request_api_version = version
        version = self.API_VERSION
        if version is None:
            raise ValueError("Version required to encode data")
        if not FETCH_MIN_VERSION <= version <= FETCH_MAX_VERSION:
            raise ValueError(
                f"Fetch v{version}: only v{FETCH_MIN_VERSION}-v{FETCH_MAX_VERSION} are encoded"
            )
        body = self._bodies.get(version)
        if body is None:
            body = self._bodies[version] = self._encode_body(version)
        if not header:
            return _I32_BYTES(len(body)) + body if framed else body
        head = self._header
        if head is None:
            raise ValueError("No header found")
        client = head.client_id
        if client is None:
            tail = b"\xff\xff"
        else:
            raw = client.encode("utf-8")
            tail = len(raw).to_bytes(2, "big") + raw
        prefix = _HEADER(FETCH_API_KEY, version, head.correlation_id) + tail
        if version >= _FETCH_FLEXIBLE:
            prefix += b"\x00"  # request header v2: no tagged fields
        if framed:
            return _I32_BYTES(len(prefix) + len(body)) + prefix + body
        return prefix + body

    @classmethod
    def decode(cls, data: Any, version: int | None = None, **kwargs: Any) -> Any:
        """kafka-python's decoding of such bytes (its ``FetchRequest``): for tests."""
        return _KafkaFetchRequest.decode(data, version=version, **kwargs)

    # ----------------------------------------------------------------------- encoding

    def _encode_body(self, version: int) -> bytes:
        flexible = version >= _FETCH_FLEXIBLE
        by_id = version >= 13
        out = bytearray()
        if version <= 14:  # ReplicaId; from v15 in ReplicaState, a tag a consumer leaves out
            out += b"\xff\xff\xff\xff"
        out += _FETCH_TOP(self.max_wait_ms, self.min_bytes, self.max_bytes, self.isolation_level)
        if version >= 7:
            out += _SESSION(self.session_id, self.session_epoch)
        out += _array_length(len(self._topics), flexible)
        pmax = int.from_bytes(self._bodies[-1], "big", signed=True)
        pack = _FETCH_PARTITION[min(version, 12)]
        # v4: no log start offset; v5+: -1 (a consumer's); before v9: no leader epoch;
        # before v12: no last fetched epoch.
        for name, topic_id, partitions in self._topics:
            out += topic_id.bytes if by_id else _string(name, flexible)
            out += _array_length(len(partitions), flexible)
            if version >= 12:
                for p, cle, offset, lfe in partitions:
                    out += pack(p, cle, offset, lfe, -1, pmax, 0)
            elif version >= 9:
                for p, cle, offset, _lfe in partitions:
                    out += pack(p, cle, offset, -1, pmax)
            elif version >= 5:
                for p, _cle, offset, _lfe in partitions:
                    out += pack(p, offset, -1, pmax)
            else:
                for p, _cle, offset, _lfe in partitions:
                    out += pack(p, offset, pmax)
            if flexible:
                out += b"\x00"
        if version >= 7:
            out += _array_length(len(self._forgotten), flexible)
            for name, topic_id, ps in self._forgotten:
                out += topic_id.bytes if by_id else _string(name, flexible)
                out += _array_length(len(ps), flexible)
                out += struct.pack(f">{len(ps)}i", *ps)
                if flexible:
                    out += b"\x00"
        if version >= 11:
            out += _string(self.rack_id, flexible)
        if flexible:
            out += b"\x00"
        return bytes(out)

    # ---------------------------------------------------------------------- reading

    @property
    def topics(self) -> list[FetchRequestTopic]:
        pmax = int.from_bytes(self._bodies[-1], "big", signed=True)
        return [
            FetchRequestTopic(
                name,
                topic_id,
                [FetchRequestPartition(p, cle, off, lfe, -1, pmax) for p, cle, off, lfe in ps],
            )
            for name, topic_id, ps in self._topics
        ]

    @property
    def forgotten_topics_data(self) -> list[ForgottenFetchTopic]:
        return [ForgottenFetchTopic(n, tid, list(ps)) for n, tid, ps in self._forgotten]

    def __repr__(self) -> str:
        return (
            f"FetchRequest(v{self.API_VERSION}, session {self.session_id}/"
            f"{self.session_epoch}, topics={self.topics}, "
            f"forgotten={self.forgotten_topics_data})"
        )


FETCH_API_KEY: Final = 1
_FETCH_FLEXIBLE: Final = 12
_HEADER = struct.Struct(">hhi").pack
_I32_BYTES = struct.Struct(">i").pack
_FETCH_TOP = struct.Struct(">iiib").pack
_SESSION = struct.Struct(">ii").pack
#: A partition's fields by version (the flexible versions end it with no tagged fields).
_FETCH_PARTITION: Final = {
    4: struct.Struct(">iqi").pack,
    5: struct.Struct(">iqqi").pack,
    6: struct.Struct(">iqqi").pack,
    7: struct.Struct(">iqqi").pack,
    8: struct.Struct(">iqqi").pack,
    9: struct.Struct(">iiqqi").pack,
    10: struct.Struct(">iiqqi").pack,
    11: struct.Struct(">iiqqi").pack,
    12: struct.Struct(">iiqiqib").pack,
}


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _array_length(n: int, flexible: bool) -> bytes:
    if flexible:
        return bytes((n + 1,)) if n < 127 else _uvarint_bytes(n + 1)
    return _I32_BYTES(n)


def _string(text: str, flexible: bool) -> bytes:
    raw = text.encode("utf-8")
    n = len(raw)
    if flexible:
        return (bytes((n + 1,)) if n < 127 else _uvarint_bytes(n + 1)) + raw
    return n.to_bytes(2, "big") + raw


def fetch_request(
    entries: Iterable[FetchTarget],
    params: FetchParams,
    *,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: Iterable[tuple[TopicPartition, str | None]] = (),
    by_id: bool | None = None,
) -> tuple[FetchRequest, dict[uuid.UUID, str]]:
    """A Fetch for ``entries`` and the topic names by id (v13+ answers name topics by id
    only). Falls back to v12 (by name) when any topic's id is unknown.

    The defaults make a sessionless full fetch (KIP-227 id 0, epoch -1); a fetch session
    (``consumer/session.py``) passes its id, epoch, the partitions to forget (with their
    topic ids) and ``by_id``, the addressing the whole session uses."""
    if not isinstance(entries, (list, tuple)):
        entries = list(entries)
    if by_id is None:
        by_id = uses_topic_ids(entries, params)
    # By id, partitions of one topic may name two ids in one request (one has seen the
    # topic re-created, another not yet, or asks whether a leader serves another id): each
    # goes under its own. By name there is one entry per topic.
    by_topic: dict[tuple[str, str | None], list[tuple[int, int, int, int]]] = {}
    ids: dict[tuple[str, str | None], str | None] = {}
    for e in entries:
        tp = e.tp
        key = (tp.topic, e.topic_id if by_id else None)
        cle = e.current_leader_epoch
        lfe = e.last_fetched_epoch
        if cle is None:
            cle = _UNDEFINED
        elif cle < 0:
            epoch_to_wire(cle)  # raises
        if lfe is None:
            lfe = _UNDEFINED
        elif lfe < 0:
            epoch_to_wire(lfe, "last fetched epoch")  # raises
        partitions = by_topic.get(key)
        if partitions is None:
            partitions = by_topic[key] = []
            ids[key] = e.topic_id
        partitions.append((tp.partition, cle, e.offset, lfe))
    topics = []
    names: dict[uuid.UUID, str] = {}
    for key, partitions in by_topic.items():
        # By name, the topic's id (of its first partition) still names it in ``names``.
        tid = topic_id_to_wire(ids[key])
        if tid is not None:
            names[tid] = key[0]
        topics.append((key[0], ZERO_UUID if tid is None else tid, partitions))
    forget: dict[tuple[str, str | None], list[int]] = {}
    for tp, topic_id in forgotten:
        forget.setdefault((tp.topic, topic_id if by_id else None), []).append(tp.partition)
    gone = []
    for key, ps in forget.items():
        tid = topic_id_to_wire(key[1])
        gone.append((key[0], ZERO_UUID if tid is None else tid, ps))
    max_version = params.max_version
    if not by_id:
        max_version = min(max_version, FETCH_MAX_VERSION_BY_NAME)
    # A broker below Fetch v7 drops the session fields and answers in full without a session
    # id, which the session reads as "no session": full fetches, as before.
    request = FetchRequest(topics, gone, params, session_id, session_epoch, max_version)
    return request, names


def read_fetch(response: Any, names: Mapping[uuid.UUID, str]) -> FetchAnswer:
    """A Fetch answer; topics of v13+ answers are named through ``names`` (from
    :func:`fetch_request`), an id not asked for gives the topic name ``""``.

    ``response`` is a :class:`FetchFrame` (the consumer's connections) or kafka-python's
    decoded ``FetchResponse``; both give equal answers (tests/consumer/test_wire.py).
    Raises :class:`MalformedFetchResponse` for a frame that does not parse."""
    if type(response) is FetchFrame:
        return _read_fetch_frame(response, names)
    version = int(response.API_VERSION)
    top = error_from_wire(getattr(response, "error_code", 0))
    out: list[FetchedPartition] = []
    append = out.append
    for topic in response.responses:
        name = str(topic.topic) if version < 13 else names.get(topic.topic_id, "")
        for p in topic.partitions:
            div = p.diverging_epoch if version >= 12 else None
            diverging = None
            if div is not None and (div.epoch >= 0 or div.end_offset >= 0):
                diverging = EpochEnd(epoch_from_wire(div.epoch), offset_from_wire(div.end_offset))
            aborted = p.aborted_transactions
            preferred = getattr(p, "preferred_read_replica", -1) if version >= 11 else -1
            hint = getattr(p, "current_leader", None) if version >= 12 else None
            append(
                FetchedPartition(
                    TopicPartition(name, p.partition_index),
                    error_from_wire(p.error_code) if p.error_code else None,
                    p.high_watermark,
                    diverging,
                    p.records,
                    [(a.producer_id, a.first_offset) for a in aborted] if aborted else None,
                    preferred if preferred >= 0 else None,
                    int(getattr(p, "last_stable_offset", -1)),
                    None if hint is None else _leader_hint(hint.leader_id, hint.leader_epoch),
                )
            )
    session_id = int(getattr(response, "session_id", 0) or 0) if version >= 7 else 0
    endpoints = tuple(
        NodeEndpoint(e.node_id, str(e.host), e.port, e.rack)
        for e in (getattr(response, "node_endpoints", None) or () if version >= 16 else ())
    )
    return FetchAnswer(top, tuple(out), version, session_id, endpoints)


# ------------------------------------------------------------- Fetch: the lean response path


class MalformedFetchResponse(ERR.KafkaProtocolError):  # type: ignore[misc]
    """A Fetch response frame that does not parse as the version it claims (cut short, a
    length past its end, an unknown version)."""


class FetchFrame:
    """A Fetch response as it came off the socket: the bytes after the response header,
    not decoded. The connection layer (``client.py``) hands these to :func:`read_fetch`
    instead of kafka-python's ``FetchResponse`` objects, so records sections are never
    copied: each partition's records are a memoryview into ``data``."""

    __slots__ = ("API_VERSION", "data", "throttle_time_ms")

    def __init__(self, version: int, data: memoryview) -> None:
        if not FETCH_MIN_VERSION <= version <= FETCH_MAX_VERSION:
            raise MalformedFetchResponse(
                f"Fetch response v{version}: only v{FETCH_MIN_VERSION}-v{FETCH_MAX_VERSION} "
                "are read"
            )
        if len(data) < 4:
            raise MalformedFetchResponse(f"Fetch response v{version} of {len(data)} bytes")
        self.API_VERSION = version
        self.data = data
        # Read here, on the IO thread: kafka-python's connection throttles on it.
        self.throttle_time_ms: int = _I32(data, 0)[0]

    def __repr__(self) -> str:
        return f"FetchFrame(v{self.API_VERSION}, {len(self.data)} bytes)"


#: The lowest Fetch version requested (and so the lowest an answer can have).
FETCH_MIN_VERSION: Final = 4
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from
_EPOCH_END = struct.Struct(">iq").unpack_from
_LEADER = struct.Struct(">ii").unpack_from
_ABORTED = struct.Struct(">qq").unpack_from
# partition_index, error_code, high_watermark, last_stable_offset[, log_start_offset (v5+)]
_PARTITION_V4 = struct.Struct(">ihqq")
_PARTITION_V5 = struct.Struct(">ihqqq")


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 28:
            raise MalformedFetchResponse("unsigned varint longer than 5 bytes")


def skip_tagged_fields(buf: memoryview, pos: int) -> int:
    """The position after the tagged-field section at ``pos`` (flexible versions)."""
    n, pos = _uvarint(buf, pos)
    for _ in range(n):
        _tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


def _read_fetch_frame(frame: FetchFrame, names: Mapping[uuid.UUID, str]) -> FetchAnswer:
    buf = frame.data
    version = frame.API_VERSION
    flexible = version >= 12
    total = len(buf)
    try:
        pos = 4  # throttle_time_ms
        code = 0
        session_id = 0
        if version >= 7:
            code = _I16(buf, pos)[0]
            session_id = _I32(buf, pos + 2)[0]
            pos += 6
        if flexible:
            n_topics, pos = _uvarint(buf, pos)
            n_topics -= 1
        else:
            n_topics = _I32(buf, pos)[0]
            pos += 4
        head = _PARTITION_V5 if version >= 5 else _PARTITION_V4
        head_unpack = head.unpack_from
        head_size = head.size
        out: list[FetchedPartition] = []
        append = out.append
        for _ in range(n_topics):
            if version >= 13:
                if pos + 16 > total:
                    raise MalformedFetchResponse(f"topic id cut short at byte {pos}")
                name = names.get(uuid.UUID(bytes=bytes(buf[pos : pos + 16])), "")
                pos += 16
            else:
                if flexible:
                    n, pos = _uvarint(buf, pos)
                    n -= 1
                else:
                    n = _I16(buf, pos)[0]
                    pos += 2
                if n < 0 or pos + n > total:
                    raise MalformedFetchResponse(f"topic name of {n} bytes at byte {pos}")
                name = str(buf[pos : pos + n], "utf-8")
                pos += n
            if flexible:
                n_parts, pos = _uvarint(buf, pos)
                n_parts -= 1
            else:
                n_parts = _I32(buf, pos)[0]
                pos += 4
            for _p in range(n_parts):
                fields = head_unpack(buf, pos)
                pos += head_size
                aborted: list[tuple[int, int]] | None = None
                if flexible:
                    n, pos = _uvarint(buf, pos)
                    n -= 1
                else:
                    n = _I32(buf, pos)[0]
                    pos += 4
                if n > 0:
                    aborted = []
                    for _a in range(n):
                        aborted.append(_ABORTED(buf, pos))
                        pos += 16
                        if flexible:
                            pos = skip_tagged_fields(buf, pos)
                preferred = -1
                if version >= 11:
                    preferred = _I32(buf, pos)[0]
                    pos += 4
                if flexible:
                    n, pos = _uvarint(buf, pos)
                    n -= 1
                else:
                    n = _I32(buf, pos)[0]
                    pos += 4
                if n > total - pos:
                    raise MalformedFetchResponse(
                        f"records section of {n} bytes at byte {pos} of a {total}-byte frame"
                    )
                records = None
                if n >= 0:
                    records = buf[pos : pos + n]
                    pos += n
                diverging = None
                hint = None
                if flexible:
                    n_tags, pos = _uvarint(buf, pos)
                    for _t in range(n_tags):
                        tag, pos = _uvarint(buf, pos)
                        size, pos = _uvarint(buf, pos)
                        if tag == 0:  # DivergingEpoch
                            epoch, end_offset = _EPOCH_END(buf, pos)
                            if epoch >= 0 or end_offset >= 0:
                                diverging = EpochEnd(
                                    epoch_from_wire(epoch), offset_from_wire(end_offset)
                                )
                        elif tag == 1:  # CurrentLeader (KIP-951)
                            hint = _leader_hint(*_LEADER(buf, pos))
                        pos += size
                err = fields[1]
                append(
                    FetchedPartition(
                        TopicPartition(name, fields[0]),
                        error_from_wire(err) if err else None,
                        fields[2],
                        diverging,
                        records,
                        aborted,
                        preferred if preferred >= 0 else None,
                        fields[3],
                        hint,
                    )
                )
            if flexible:
                pos = skip_tagged_fields(buf, pos)
        endpoints: tuple[NodeEndpoint, ...] = ()
        if flexible:
            n_tags, pos = _uvarint(buf, pos)
            for _t in range(n_tags):
                tag, pos = _uvarint(buf, pos)
                size, pos = _uvarint(buf, pos)
                if tag == 0 and version >= 16:  # NodeEndpoints (KIP-951)
                    endpoints = _node_endpoints(buf, pos)
                pos += size
    except (struct.error, IndexError) as exc:
        raise MalformedFetchResponse(
            f"Fetch response v{version} of {total} bytes is cut short: {exc}"
        ) from None
    if pos > total:
        raise MalformedFetchResponse(
            f"Fetch response v{version} of {total} bytes claims {pos} bytes"
        )
    return FetchAnswer(error_from_wire(code), tuple(out), version, session_id, endpoints)


def _compact_string(buf: memoryview, pos: int) -> tuple[str | None, int]:
    n, pos = _uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = pos + n - 1
    if end > len(buf):
        raise MalformedFetchResponse(f"string of {n - 1} bytes at byte {pos}")
    return str(buf[pos:end], "utf-8"), end


def _node_endpoints(buf: memoryview, pos: int) -> tuple[NodeEndpoint, ...]:
    n, pos = _uvarint(buf, pos)
    out = []
    for _ in range(n - 1):
        node_id = _I32(buf, pos)[0]
        host, pos = _compact_string(buf, pos + 4)
        port = _I32(buf, pos)[0]
        rack, pos = _compact_string(buf, pos + 4)
        pos = skip_tagged_fields(buf, pos)
        out.append(NodeEndpoint(node_id, host or "", port, rack))
    return tuple(out)


# ------------------------------------------------------------------- OffsetForLeaderEpoch


@attrs.frozen
class EpochQuery:
    tp: TopicPartition
    current_leader_epoch: int | None
    leader_epoch: int


def offset_for_leader_epoch_request(queries: Iterable[EpochQuery]) -> Any:
    OT = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    by_topic: dict[str, list[Any]] = {}
    for q in queries:
        by_topic.setdefault(q.tp.topic, []).append(
            OT.OffsetForLeaderPartition(
                partition=q.tp.partition,
                current_leader_epoch=epoch_to_wire(q.current_leader_epoch),
                leader_epoch=epoch_to_wire(q.leader_epoch, "queried epoch"),
            )
        )
    return OffsetForLeaderEpochRequest(
        replica_id=-1,
        topics=[OT(topic=t, partitions=ps) for t, ps in by_topic.items()],
        min_version=OFFSET_FOR_LEADER_EPOCH_MIN_VERSION,
    )


def read_offset_for_leader_epoch(
    response: Any,
) -> list[tuple[TopicPartition, type[ERR.KafkaError] | None, EpochEnd]]:
    return [
        (
            tp,
            error_from_wire(p.error_code),
            EpochEnd(epoch_from_wire(p.leader_epoch), offset_from_wire(p.end_offset)),
        )
        for tp, p in _partitions(response, "topic", "partition")
    ]


# ----------------------------------------------------------------------------- ListOffsets


@attrs.frozen
class ListedOffset:
    tp: TopicPartition
    error: type[ERR.KafkaError] | None
    #: ``None``: no such offset (a timestamp past the last record).
    offset: int | None
    leader_epoch: int | None
    timestamp: int

    @property
    def error_code(self) -> int:
        return _errno(self.error)


def list_offsets_request(
    queries: Iterable[tuple[TopicPartition, int, int | None]],
    read_committed: bool,
    timeout_ms: int,
) -> Any:
    """``(tp, timestamp, current_leader_epoch)`` queries; timestamp -2 earliest, -1 latest.
    The current leader epoch fences the answer: a broker behind it (or ahead) refuses."""
    LT = ListOffsetsRequest.ListOffsetsTopic
    by_topic: dict[str, list[Any]] = {}
    for tp, timestamp, current_leader_epoch in queries:
        by_topic.setdefault(tp.topic, []).append(
            LT.ListOffsetsPartition(
                partition_index=tp.partition,
                current_leader_epoch=epoch_to_wire(current_leader_epoch),
                timestamp=timestamp,
            )
        )
    return ListOffsetsRequest(
        replica_id=-1,
        isolation_level=1 if read_committed else 0,
        topics=[LT(name=t, partitions=ps) for t, ps in by_topic.items()],
        timeout_ms=timeout_ms,
        min_version=LIST_OFFSETS_MIN_VERSION,
    )


def read_list_offsets(response: Any) -> list[ListedOffset]:
    return [
        ListedOffset(
            tp,
            error_from_wire(p.error_code),
            offset_from_wire(p.offset),
            epoch_from_wire(p.leader_epoch),
            p.timestamp,
        )
        for tp, p in _partitions(response)
    ]


# ------------------------------------------------------------------ DescribeProducers


def describe_producers_request(partitions: Iterable[TopicPartition]) -> Any:
    """KIP-664 DescribeProducers for partitions led by one broker."""
    TR = DescribeProducersRequest.TopicRequest
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return DescribeProducersRequest(
        topics=[TR(name=t, partition_indexes=ps) for t, ps in by_topic.items()]
    )


def read_describe_producers(
    response: Any,
) -> list[tuple[TopicPartition, type[ERR.KafkaError] | None, list[ProducerState]]]:
    """Each partition's error and producers; an open transaction's start offset, ``-1``
    on the wire when none is open, is ``None``."""
    return [
        (
            tp,
            error_from_wire(p.error_code),
            [
                ProducerState(
                    producer_id=s.producer_id,
                    producer_epoch=s.producer_epoch,
                    txn_start_offset=offset_from_wire(s.current_txn_start_offset),
                    last_timestamp=None if s.last_timestamp < 0 else s.last_timestamp,
                    coordinator_epoch=None if s.coordinator_epoch < 0 else s.coordinator_epoch,
                )
                for s in p.active_producers
            ],
        )
        for tp, p in _partitions(response)
    ]


# ------------------------------------------------------------------------ group: offsets


@attrs.frozen
class CommittedOffset:
    tp: TopicPartition
    error: type[ERR.KafkaError] | None
    #: ``None``: nothing committed.
    offset: int | None
    leader_epoch: int | None
    metadata: str | None


def offset_fetch_request(group_id: str, partitions: Iterable[TopicPartition]) -> Any:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    return OffsetFetchRequest(
        group_id=group_id,
        topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
        require_stable=True,
        max_version=7,
    )


def read_offset_fetch(response: Any) -> tuple[type[ERR.KafkaError] | None, list[CommittedOffset]]:
    """The request-level error (v2+) and every partition's committed offset."""
    parts = [
        CommittedOffset(
            tp,
            error_from_wire(p.error_code),
            offset_from_wire(p.committed_offset),
            # OffsetFetch below v5 has no committed epochs.
            epoch_from_wire(getattr(p, "committed_leader_epoch", None)),
            p.metadata,
        )
        for tp, p in _partitions(response)
    ]
    return error_from_wire(getattr(response, "error_code", 0)), parts


def offset_commit_request(
    group_id: str,
    offsets: Iterable[tuple[TopicPartition, int, int | None, str]],
    generation: int | None,
    member_id: str,
    group_instance_id: str | None,
    topic_ids: Mapping[TopicPartition, str | None] | None = None,
) -> Any:
    """OffsetCommit v6+ for ``(tp, offset, leader_epoch, metadata)``. ``generation`` ``None``:
    a commit outside group membership (``assign()`` users). By topic id (v10) when
    ``topic_ids`` names every partition's incarnation and the broker has v10
    (:func:`commit_topics`), by name (v6-v8) otherwise."""
    topics, by_id = commit_topics(offsets, topic_ids)
    return OffsetCommitRequest(
        group_id=group_id,
        generation_id_or_member_epoch=_UNDEFINED if generation is None else generation,
        member_id=member_id,
        group_instance_id=group_instance_id,
        retention_time_ms=-1,
        topics=topics,
        min_version=6,
        max_version=OFFSETS_BY_ID_VERSION if by_id else 8,
    )


def commit_errors(response: Any) -> set[type[ERR.KafkaError]]:
    """The distinct partition errors of an OffsetCommit answer (empty: all committed)."""
    errors = {error_from_wire(p.error_code) for _tp, p in _partitions(response)}
    return {e for e in errors if e is not None}


def commit_refused_topic_ids(response: Any) -> set[str]:
    """The topic ids an OffsetCommit v10 answer refused with UNKNOWN_TOPIC_ID (text; empty
    for an answer by name)."""
    refused: set[str] = set()
    for topic in response.topics:
        tid = topic_id_from_wire(getattr(topic, "topic_id", None))
        if tid is not None and any(
            p.error_code == ErrorCode.UNKNOWN_TOPIC_ID for p in topic.partitions
        ):
            refused.add(tid)
    return refused


# ------------------------------------------------- group: offsets by topic id (OffsetCommit v10)

#: OffsetCommit v10 names topics by id only (KIP-848). The coordinator resolves the id through
#: its own metadata and answers UNKNOWN_TOPIC_ID while it does not know it; by name it stores
#: the commit under whatever id its metadata gives the name. A coordinator whose metadata lags
#: a re-creation thus files a commit by name under the deleted topic's id, and drops it when
#: it applies the deletion (Kafka drops a deleted topic's commits stored under its id or
#: none); by id it refuses the commit until it knows the new topic, then keeps it.
OFFSETS_BY_ID_VERSION: Final = 10


def commit_topics(
    offsets: Iterable[tuple[TopicPartition, int, int | None, str]],
    topic_ids: Mapping[TopicPartition, str | None] | None,
) -> tuple[list[Any], bool]:
    """The topic entries of an OffsetCommit and whether they name topics by id: only when
    every partition's id is known (one unknown names them all by name, as Java's
    CommitRequestManager does). Entries carry both name and id, so kafka-python writes
    whichever the negotiated version has: a broker without v10 gets names."""
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    entries = list(offsets)
    ids = {tp: topic_id_to_wire((topic_ids or {}).get(tp)) for tp, *_ in entries}
    by_id = bool(entries) and all(i is not None for i in ids.values())
    grouped: dict[tuple[str, uuid.UUID | None], list[Any]] = {}
    for tp, offset, epoch, metadata in entries:
        # By id, two partitions of one name may belong to two incarnations (one has seen
        # the re-creation, the other not yet): each id is an entry of its own.
        grouped.setdefault((tp.topic, ids[tp] if by_id else None), []).append(
            T.OffsetCommitRequestPartition(
                partition_index=tp.partition,
                committed_offset=offset,
                committed_leader_epoch=epoch_to_wire(epoch, "committed leader epoch"),
                committed_metadata=metadata,
            )
        )
    topics = [
        T(name=name, topic_id=tid if tid is not None else ZERO_UUID, partitions=parts)
        for (name, tid), parts in grouped.items()
    ]
    return topics, by_id


# ------------------------------------------------- group: KIP-848 consumer protocol (API 68/69)

#: ConsumerGroupHeartbeat v1 is the first with a regex subscription, and the member makes up
#: its own member id (KIP-1082): a coordinator that lost the answer to a join still knows
#: the member by the id the retry carries.
CONSUMER_HEARTBEAT_MIN_VERSION: Final = 1
#: OffsetCommit v9 / OffsetFetch v9 are the first that carry a KIP-848 member epoch.
MEMBER_OFFSETS_MIN_VERSION: Final = 9
#: Member epochs with a meaning of their own on the wire (KIP-848).
_JOIN_EPOCH: Final = 0
_LEAVE_EPOCH: Final = -1
_STATIC_LEAVE_EPOCH: Final = -2


@attrs.frozen
class MemberHeartbeat:
    """One ConsumerGroupHeartbeat as the member decides it. ``None`` fields did not change
    since the last heartbeat the coordinator answered (the wire's null / -1)."""

    group_id: str
    member_id: str
    #: 0 joins; the epoch the coordinator gave otherwise.
    member_epoch: int
    #: ``"dynamic"`` leaves (-1 on the wire), ``"static"`` leaves a static member's
    #: assignment in place for its return (-2); ``None`` stays.
    leave: str | None = None
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int | None = None
    subscribed_topics: tuple[str, ...] | None = None
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    #: Owned partitions by topic id (text); ``None``: unchanged.
    owned: Mapping[str, frozenset[int]] | None = None


@attrs.frozen
class HeartbeatAnswer:
    error: type[ERR.KafkaError] | None
    error_message: str | None
    #: Set on the answer to a join (v0 coordinators make the id up); ``None`` otherwise.
    member_id: str | None
    #: ``None``: the member is out of the group (the answer to a leave, or an error).
    member_epoch: int | None
    heartbeat_interval_ms: int
    #: The partitions the member may own now, by topic id; ``None``: unchanged.
    assignment: Mapping[str, frozenset[int]] | None


def consumer_group_heartbeat_request(hb: MemberHeartbeat) -> Any:
    if hb.member_epoch < 0:
        raise WireValueError(f"member epoch must be >= 0, got {hb.member_epoch}")
    if hb.leave is None:
        epoch = hb.member_epoch
    elif hb.leave == "dynamic":
        epoch = _LEAVE_EPOCH
    elif hb.leave == "static":
        if hb.instance_id is None:
            raise WireValueError("a static leave (epoch -2) needs the member's instance id")
        epoch = _STATIC_LEAVE_EPOCH
    else:
        raise WireValueError(f"leave must be 'dynamic', 'static' or None, got {hb.leave!r}")
    if hb.rebalance_timeout_ms is not None and hb.rebalance_timeout_ms < 0:
        raise WireValueError(f"rebalance timeout must be >= 0, got {hb.rebalance_timeout_ms}")
    R = ConsumerGroupHeartbeatRequest
    owned = None
    if hb.owned is not None:
        owned = []
        for tid, parts in sorted(hb.owned.items()):
            wire_id = topic_id_to_wire(tid)
            if wire_id is None:
                raise WireValueError(f"owned partitions need a topic id, got {tid!r}")
            owned.append(R.TopicPartitions(topic_id=wire_id, partitions=sorted(parts)))
    return R(
        group_id=hb.group_id,
        member_id=hb.member_id,
        member_epoch=epoch,
        instance_id=hb.instance_id,
        rack_id=hb.rack_id,
        rebalance_timeout_ms=_UNDEFINED
        if hb.rebalance_timeout_ms is None
        else hb.rebalance_timeout_ms,
        subscribed_topic_names=None if hb.subscribed_topics is None else list(hb.subscribed_topics),
        subscribed_topic_regex=hb.subscribed_regex,
        server_assignor=hb.server_assignor,
        topic_partitions=owned,
        min_version=CONSUMER_HEARTBEAT_MIN_VERSION,
    )


def _assignment_from_wire(topics: Iterable[Any]) -> dict[str, frozenset[int]]:
    out: dict[str, frozenset[int]] = {}
    for t in topics:
        tid = topic_id_from_wire(t.topic_id)
        if tid is None:
            raise ERR.KafkaProtocolError("assignment names a topic by the zero uuid")
        out[tid] = out.get(tid, frozenset()) | frozenset(t.partitions)
    return out


def read_consumer_group_heartbeat(response: Any) -> HeartbeatAnswer:
    assignment = response.assignment
    return HeartbeatAnswer(
        error_from_wire(response.error_code),
        response.error_message,
        response.member_id or None,
        epoch_from_wire(response.member_epoch),
        int(response.heartbeat_interval_ms),
        None if assignment is None else _assignment_from_wire(assignment.topic_partitions),
    )


@attrs.frozen
class DescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int | None
    client_id: str
    client_host: str
    subscribed_topics: tuple[str, ...]
    subscribed_regex: str | None
    #: ``(topic name, partition)`` owned now / in the target assignment.
    assignment: frozenset[TopicPartition]
    target_assignment: frozenset[TopicPartition]


@attrs.frozen
class DescribedConsumerGroup:
    group_id: str
    error: type[ERR.KafkaError] | None
    error_message: str | None
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[DescribedMember, ...]


def consumer_group_describe_request(group_ids: Sequence[str]) -> Any:
    return ConsumerGroupDescribeRequest(
        group_ids=list(group_ids), include_authorized_operations=False
    )


def _named_partitions(assignment: Any) -> frozenset[TopicPartition]:
    if assignment is None:
        return frozenset()
    return frozenset(
        TopicPartition(t.topic_name, p) for t in assignment.topic_partitions for p in t.partitions
    )


def read_consumer_group_describe(response: Any) -> list[DescribedConsumerGroup]:
    return [
        DescribedConsumerGroup(
            g.group_id,
            error_from_wire(g.error_code),
            g.error_message,
            g.group_state,
            g.group_epoch,
            g.assignment_epoch,
            g.assignor_name,
            tuple(
                DescribedMember(
                    m.member_id,
                    m.instance_id,
                    m.rack_id,
                    epoch_from_wire(m.member_epoch),
                    m.client_id,
                    m.client_host,
                    tuple(m.subscribed_topic_names or ()),
                    m.subscribed_topic_regex,
                    _named_partitions(m.assignment),
                    _named_partitions(m.target_assignment),
                )
                for m in g.members
            ),
        )
        for g in response.groups
    ]


def member_offset_commit_request(
    group_id: str,
    offsets: Iterable[tuple[TopicPartition, int, int | None, str]],
    member_id: str,
    member_epoch: int,
    topic_ids: Mapping[TopicPartition, str | None] | None = None,
) -> Any:
    """OffsetCommit v9+ for a KIP-848 member: the coordinator checks ``member_epoch``
    against the member's (STALE_MEMBER_EPOCH when it moved on). By topic id (v10) as
    :func:`offset_commit_request`."""
    if member_epoch < 0:
        raise WireValueError(f"member epoch must be >= 0, got {member_epoch}")
    topics, by_id = commit_topics(offsets, topic_ids)
    return OffsetCommitRequest(
        group_id=group_id,
        generation_id_or_member_epoch=member_epoch,
        member_id=member_id,
        group_instance_id=None,
        retention_time_ms=-1,
        topics=topics,
        min_version=MEMBER_OFFSETS_MIN_VERSION,
        max_version=OFFSETS_BY_ID_VERSION if by_id else MEMBER_OFFSETS_MIN_VERSION,
    )


def member_offset_fetch_request(
    group_id: str,
    partitions: Iterable[TopicPartition],
    member_id: str | None,
    member_epoch: int | None,
) -> Any:
    """OffsetFetch v9 (batched groups) for a KIP-848 member; ``member_id`` ``None``: the
    fetch of a consumer that is not a member (yet), which the coordinator does not check."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    T = G.OffsetFetchRequestTopics
    return OffsetFetchRequest(
        groups=[
            G(
                group_id=group_id,
                member_id=member_id,
                member_epoch=epoch_to_wire(member_epoch, "member epoch"),
                topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
            )
        ],
        require_stable=True,
        min_version=MEMBER_OFFSETS_MIN_VERSION,
        max_version=MEMBER_OFFSETS_MIN_VERSION,
    )


def read_member_offset_fetch(
    response: Any,
) -> tuple[type[ERR.KafkaError] | None, list[CommittedOffset]]:
    """The group's error and every partition's committed offset (one group asked)."""
    if not response.groups:
        raise ERR.KafkaProtocolError("OffsetFetch v9 answer names no group")
    g = response.groups[0]
    parts = [
        CommittedOffset(
            TopicPartition(topic.name, p.partition_index),
            error_from_wire(p.error_code),
            offset_from_wire(p.committed_offset),
            epoch_from_wire(p.committed_leader_epoch),
            p.metadata,
        )
        for topic in g.topics
        for p in topic.partitions
    ]
    return error_from_wire(g.error_code), parts


# --------------------------------------------------------------------- group: membership


def find_coordinator_request(group_id: str) -> Any:
    return FindCoordinatorRequest(key=group_id, key_type=0, max_version=3)


def join_group_request(
    group_id: str,
    session_timeout_ms: int,
    rebalance_timeout_ms: int,
    member_id: str,
    group_instance_id: str | None,
    protocols: Sequence[tuple[str, bytes]],
) -> Any:
    return JoinGroupRequest(
        group_id=group_id,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        member_id=member_id,
        group_instance_id=group_instance_id,
        protocol_type="consumer",
        protocols=list(protocols),
        reason=None,
        max_version=7,
    )


def sync_group_request(
    group_id: str,
    generation: int,
    member_id: str,
    group_instance_id: str | None,
    protocol_name: str,
    assignments: Sequence[tuple[str, bytes]],
) -> Any:
    A = SyncGroupRequest.SyncGroupRequestAssignment
    return SyncGroupRequest(
        group_id=group_id,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=group_instance_id,
        protocol_type="consumer",
        protocol_name=protocol_name,
        assignments=[A(member_id=m, assignment=a) for m, a in assignments],
        max_version=5,
    )


def heartbeat_request(
    group_id: str, generation: int, member_id: str, group_instance_id: str | None
) -> Any:
    return HeartbeatRequest(
        group_id=group_id,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=group_instance_id,
        max_version=4,
    )


def leave_group_request(group_id: str, member_id: str, reason: str) -> Any:
    return LeaveGroupRequest(
        group_id=group_id,
        member_id=member_id,
        members=[
            LeaveGroupRequest.MemberIdentity(
                member_id=member_id, group_instance_id=None, reason=reason
            )
        ],
        max_version=4,
    )


# ---------------------------------------------------------------------- KIP-714 telemetry


def get_telemetry_subscriptions_request(client_instance_id: uuid.UUID) -> Any:
    """Ask which metrics the broker wants; the zero UUID asks it to assign this client's id."""
    return GetTelemetrySubscriptionsRequest(client_instance_id=client_instance_id)


def read_get_telemetry_subscriptions(response: Any) -> SubscriptionAnswer:
    error = error_from_wire(response.error_code)
    throttle = max(0, int(response.throttle_time_ms))
    if error is not None:
        return SubscriptionAnswer(error, throttle, None)
    interval = int(response.push_interval_ms)
    if interval <= 0:
        raise ERR.KafkaProtocolError(f"telemetry push interval must be > 0, got {interval}")
    return SubscriptionAnswer(
        None,
        throttle,
        TelemetrySubscription(
            client_instance_id=response.client_instance_id,
            subscription_id=int(response.subscription_id),
            accepted_compression_types=tuple(
                int(c) for c in response.accepted_compression_types or ()
            ),
            push_interval_ms=interval,
            telemetry_max_bytes=int(response.telemetry_max_bytes),
            delta_temporality=bool(response.delta_temporality),
            requested_metrics=tuple(response.requested_metrics or ()),
        ),
    )


def push_telemetry_request(
    subscription: TelemetrySubscription, terminating: bool, compression_type: int, metrics: bytes
) -> Any:
    return PushTelemetryRequest(
        client_instance_id=subscription.client_instance_id,
        subscription_id=subscription.subscription_id,
        terminating=terminating,
        compression_type=compression_type,
        metrics=metrics,
    )


def read_push_telemetry(response: Any) -> PushAnswer:
    return PushAnswer(error_from_wire(response.error_code), max(0, int(response.throttle_time_ms)))
