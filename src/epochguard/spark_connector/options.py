"""The source's options: Spark's Kafka source names and defaults, validated before any job.

Sans-IO (no pyspark import). :func:`parse_options` turns the option map a query was given
into a :class:`SourceOptions`, or raises :class:`SourceOptionError` naming the option.
Option names are case-insensitive, as in Spark. The checks follow Spark's
``KafkaSourceProvider`` (``validateGeneralOptions``, ``validateStreamOptions``,
``validateBatchOptions``) and use its wording where it has one; unlike Spark, an unknown
option is an error (Spark ignores it, so a misspelt ``maxOffsetPerTrigger`` silently does
nothing), and so are two ways of choosing the same starting point.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from epochguard.offsets.position import EpochOffset
from epochguard.spark_connector.errors import OffsetsJsonError, SourceOptionError
from epochguard.spark_connector.offsets import (
    EARLIEST,
    LATEST,
    PartitionSpec,
    SourceOffset,
    parse_partition_offsets,
    parse_partition_timestamps,
    parse_partitions,
)

if TYPE_CHECKING:
    from kafka.structs import TopicPartition

__all__ = [
    "KAFKA_PARAMS",
    "OPTIONS",
    "REJECTED_KAFKA_PARAMS",
    "Assign",
    "EarliestOffsets",
    "GlobalTimestamp",
    "LatestOffsets",
    "OffsetLimit",
    "PartitionTimestamps",
    "SourceOptions",
    "SpecificOffsets",
    "Strategy",
    "Subscribe",
    "SubscribePattern",
    "check_checkpoint",
    "parse_options",
    "parse_time_ms",
]


# ---------------------------------------------------------------- strategies


@attrs.frozen
class Subscribe:
    """``subscribe``: a comma-separated list of topics."""

    topics: tuple[str, ...]

    def matches(self, topic: str) -> bool:
        return topic in self.topics

    def describe(self) -> str:
        return f"subscribe={','.join(self.topics)}"


@attrs.frozen
class SubscribePattern:
    """``subscribePattern``: a Java regex matched against the whole topic name."""

    pattern: str

    def matches(self, topic: str) -> bool:
        return re.fullmatch(self.pattern, topic) is not None

    def describe(self) -> str:
        return f"subscribePattern={self.pattern}"


@attrs.frozen
class Assign:
    """``assign``: fixed partitions, ``{"topic": [0, 1]}``."""

    partitions: frozenset[TopicPartition]

    def matches(self, topic: str) -> bool:
        return any(tp.topic == topic for tp in self.partitions)

    def describe(self) -> str:
        parts = sorted(self.partitions)
        return "assign=" + ",".join(f"{tp.topic}-{tp.partition}" for tp in parts)


Strategy = Subscribe | SubscribePattern | Assign


# ---------------------------------------------------------------- offset limits


@attrs.frozen
class EarliestOffsets:
    pass


@attrs.frozen
class LatestOffsets:
    pass


@attrs.frozen
class SpecificOffsets:
    """Per-partition positions (epochs optional) or the sentinels -2 (earliest) / -1 (latest)."""

    offsets: tuple[tuple[TopicPartition, PartitionSpec], ...]

    def as_dict(self) -> dict[TopicPartition, PartitionSpec]:
        return dict(self.offsets)


@attrs.frozen
class PartitionTimestamps:
    """``*OffsetsByTimestamp``: per-partition timestamps (ms)."""

    timestamps: tuple[tuple[TopicPartition, int], ...]

    def as_dict(self) -> dict[TopicPartition, int]:
        return dict(self.timestamps)


@attrs.frozen
class GlobalTimestamp:
    """``startingTimestamp``/``endingTimestamp``: one timestamp (ms) for every partition."""

    timestamp: int


OffsetLimit = (
    EarliestOffsets | LatestOffsets | SpecificOffsets | PartitionTimestamps | GlobalTimestamp
)


# ---------------------------------------------------------------- the option list

#: Every source option (Spark's spelling) and its default as text (None: no default).
OPTIONS: dict[str, str | None] = {
    "kafka.bootstrap.servers": None,
    "subscribe": None,
    "subscribePattern": None,
    "assign": None,
    "startingOffsets": None,  # latest for streams, earliest for batch
    "startingOffsetsByTimestamp": None,
    "startingTimestamp": None,
    "startingOffsetsByTimestampStrategy": "error",
    "endingOffsets": None,  # batch only; latest
    "endingOffsetsByTimestamp": None,
    "endingTimestamp": None,
    "failOnDataLoss": "true",
    "maxOffsetsPerTrigger": None,
    "minOffsetsPerTrigger": None,
    "maxTriggerDelay": "15m",
    "minPartitions": None,
    "maxRecordsPerPartition": None,
    "includeHeaders": "false",
    "groupIdPrefix": None,  # spark-kafka-source / spark-kafka-relation
    "kafkaConsumer.pollTimeoutMs": "120000",  # Spark: spark.network.timeout (120s)
    "fetchOffset.numRetries": "3",
    "fetchOffset.retryIntervalMs": "1000",
    # epochguard additions
    "onTruncation": "fail",
    "commitToGroup": "false",
    "failOnMissingTopic": "false",
    "filterPushdown": "false",
    "initialOffsetsPath": None,
    "driverReadMaxOffsets": "0",
}
_BY_LOWER = {name.lower(): name for name in OPTIONS}

#: ``kafka.*`` keys (Java consumer names) and the EpochConsumer setting each becomes.
KAFKA_PARAMS: dict[str, str] = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "client.rack": "client_rack",
    "group.id": "group_id",
    "group.instance.id": "group_instance_id",
    "fetch.max.wait.ms": "fetch_max_wait_ms",
    "fetch.min.bytes": "fetch_min_bytes",
    "fetch.max.bytes": "fetch_max_bytes",
    "max.partition.fetch.bytes": "max_partition_fetch_bytes",
    "request.timeout.ms": "request_timeout_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "reconnect.backoff.ms": "reconnect_backoff_ms",
    "reconnect.backoff.max.ms": "reconnect_backoff_max_ms",
    "max.poll.records": "max_poll_records",
    "max.poll.interval.ms": "max_poll_interval_ms",
    "session.timeout.ms": "session_timeout_ms",
    "heartbeat.interval.ms": "heartbeat_interval_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "check.crcs": "check_crcs",
    "isolation.level": "isolation_level",
    "client.dns.lookup": "client_dns_lookup",
    "security.protocol": "security_protocol",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
    "ssl.truststore.location": "ssl_cafile",  # PEM only (ssl.truststore.type=PEM)
    "ssl.keystore.location": "ssl_certfile",  # PEM only (ssl.keystore.type=PEM)
    "ssl.key.password": "ssl_password",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.jaas.config": "sasl_plain_username",  # username/password of a PLAIN/SCRAM login
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
}

#: Accepted for parity with Java clients and Spark but without effect (kafka-python has no
#: equivalent, or the value Spark itself forces is the only one that makes sense here).
_IGNORED_KAFKA_PARAMS = frozenset(
    {
        "receive.buffer.bytes",
        "send.buffer.bytes",
        "ssl.truststore.type",
        "ssl.keystore.type",
        "allow.auto.create.topics",
    }
)

_BOOTSTRAP = "kafka.bootstrap.servers"

#: The ``kafka.*`` keys Spark's source rejects, with Spark's reason.
REJECTED_KAFKA_PARAMS: dict[str, str] = {
    "auto.offset.reset": (
        "Kafka option 'auto.offset.reset' is not supported. Instead set the source option "
        "'startingOffsets' to 'earliest' or 'latest' to specify where to start. Structured "
        "Streaming manages which offsets are consumed internally, rather than relying on the "
        "kafkaConsumer to do it. This will ensure that no data is missed when new "
        "topics/partitions are dynamically subscribed. Note that 'startingOffsets' only "
        "applies when a new Streaming query is started, and that resuming will always pick "
        "up from where the query left off."
    ),
    "key.deserializer": (
        "Kafka option 'key.deserializer' is not supported as keys are deserialized as byte "
        "arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly "
        "deserialize the keys."
    ),
    "value.deserializer": (
        "Kafka option 'value.deserializer' is not supported as values are deserialized as "
        "byte arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly "
        "deserialize the values."
    ),
    "enable.auto.commit": "Kafka option 'enable.auto.commit' is not supported",
    "interceptor.classes": "Kafka option 'interceptor.classes' is not supported",
}

_STRATEGY_NAMES = ("subscribe", "subscribePattern", "assign")
_STRATEGY_LIST = "assign, subscribe, subscribepattern"  # Spark's message lists them so


# ---------------------------------------------------------------- value parsers


def _bool(name: str, value: str) -> bool:
    # Scala's String.toBoolean: "true"/"false" in any case, nothing else.
    low = value.strip().lower()
    if low not in ("true", "false"):
        raise SourceOptionError(name, f"must be 'true' or 'false', got {value!r}")
    return low == "true"


def _int(name: str, value: str, minimum: int | None = None, what: str = "") -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise SourceOptionError(name, f"must be an integer, got {value!r}") from None
    if minimum is not None and n < minimum:
        raise SourceOptionError(name, what or f"must be >= {minimum}, got {n}")
    return n


_TIME_UNITS_MS = {
    "us": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def parse_time_ms(name: str, value: str) -> int:
    """Spark's ``Utils.timeStringAsMs``: ``"15m"``, ``"10s"``, ``"500ms"``; no unit = ms."""
    match = re.fullmatch(r"(-?[0-9]+)([a-z]+)?", value.strip().lower())
    if match is None:
        raise SourceOptionError(name, f"is not a duration like '15m', '10s' or '500': {value!r}")
    number, unit = int(match.group(1)), match.group(2) or "ms"
    if unit not in _TIME_UNITS_MS:
        units = ", ".join(_TIME_UNITS_MS)
        raise SourceOptionError(name, f"unknown time unit {unit!r} in {value!r} (use {units})")
    if number < 0:
        raise SourceOptionError(name, f"must not be negative, got {value!r}")
    return int(number * _TIME_UNITS_MS[unit])


def _jaas_credentials(value: str) -> tuple[str, str]:
    creds = dict(re.findall(r'(username|password)\s*=\s*"([^"]*)"', value))
    if set(creds) != {"username", "password"}:
        raise SourceOptionError(
            "kafka.sasl.jaas.config",
            'needs username="..." and password="..." (a PLAIN or SCRAM login module)',
        )
    return creds["username"], creds["password"]


def _kafka_value(java_key: str, value: str) -> dict[str, Any]:
    """One ``kafka.*`` setting as EpochConsumer keyword(s)."""
    option = f"kafka.{java_key}"
    target = KAFKA_PARAMS[java_key]
    if java_key == "sasl.jaas.config":
        user, password = _jaas_credentials(value)
        return {"sasl_plain_username": user, "sasl_plain_password": password}
    if java_key == "ssl.endpoint.identification.algorithm":
        return {target: value.strip().lower() == "https"}
    if java_key == "check.crcs":
        return {target: _bool(option, value)}
    if target.endswith(("_ms", "_bytes", "_records")):
        return {target: _int(option, value, 0)}
    return {target: value}


# ---------------------------------------------------------------- the parsed options


@attrs.frozen
class SourceOptions:
    """Every option of one query, parsed and checked (docs/reference/spark-options.md)."""

    streaming: bool
    strategy: Strategy
    bootstrap_servers: str
    #: ``kafka.*`` settings as EpochConsumer keywords (security settings included).
    consumer_config: tuple[tuple[str, Any], ...]
    starting: OffsetLimit
    ending: OffsetLimit
    no_match_strategy: Literal["error", "latest"] = "error"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    group_id_prefix: str | None = None
    group_id: str | None = None
    poll_timeout_ms: int = 120_000
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    on_truncation: Literal["fail", "rewind"] = "fail"
    commit_to_group: bool = False
    #: A subscribed topic that does not exist fails the query (otherwise a warning per
    #: batch while it is missing: streams may start before their topic).
    fail_on_missing_topic: bool = False
    #: A batch read narrows its ranges by the filters Spark pushes (streams never do).
    filter_pushdown: bool = False
    #: Streams: the file that keeps the starting offsets resolved at the first start, read
    #: back at every later start (:mod:`~epochguard.spark_connector.initial_offsets`).
    initial_offsets_path: str | None = None
    #: Streams: a micro-batch of at most this many records is read by the query's source
    #: process on the driver and handed to Spark with the plan (0: always by tasks).
    driver_read_max_offsets: int = 0

    def consumer_kwargs(self) -> dict[str, Any]:
        """EpochConsumer keywords: the ``kafka.*`` settings plus what the source forces
        (no auto commit, no reset: the source decides every position itself)."""
        kw = dict(self.consumer_config)
        kw["bootstrap_servers"] = self.bootstrap_servers
        kw["enable_auto_commit"] = False
        kw["auto_offset_reset"] = "none"
        kw["on_truncation"] = "raise"
        kw.pop("group_id", None)  # reads use assign(); a group is only for commitToGroup
        return kw


def _normalise_keys(options: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """lower-case key -> (key as given, value); two spellings of one option is an error."""
    out: dict[str, tuple[str, str]] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise SourceOptionError(str(key), "option names must be strings")
        low = key.lower()
        if low in out:
            raise SourceOptionError(key, f"given twice (as {out[low][0]!r} and {key!r})")
        if not isinstance(value, str):
            value = str(value)
        out[low] = (key, value)
    return out


def _unknown(key: str) -> SourceOptionError:
    candidates = [*OPTIONS, *(f"kafka.{k}" for k in KAFKA_PARAMS)]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    if not close:
        lowered = {c.lower(): c for c in candidates}
        close = [
            lowered[c]
            for c in difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.75)
        ]
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return SourceOptionError(key, f"unknown option for the epochguard source{hint}")


def _strategy(opts: dict[str, tuple[str, str]]) -> Strategy:
    given = [name for name in _STRATEGY_NAMES if name.lower() in opts]
    if not given:
        raise SourceOptionError(
            "subscribe",
            "One of the following options must be specified for Kafka source: "
            f"{_STRATEGY_LIST}. See the docs for more details.",
        )
    if len(given) > 1:
        raise SourceOptionError(
            given[1],
            "Only one of the following options can be specified for Kafka source: "
            f"{_STRATEGY_LIST}. See the docs for more details.",
        )
    name = given[0]
    value = opts[name.lower()][1]
    if name == "assign":
        if not value.strip().startswith("{"):
            raise SourceOptionError(
                name,
                f"No topicpartitions to assign as specified value for option 'assign' is '{value}'",
            )
        try:
            return Assign(parse_partitions(value, "assign"))
        except OffsetsJsonError as exc:
            raise SourceOptionError(name, str(exc)) from exc
    if name == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise SourceOptionError(
                name,
                f"No topics to subscribe to as specified value for option 'subscribe' is '{value}'",
            )
        return Subscribe(topics)
    pattern = value.strip()
    if not pattern:
        raise SourceOptionError(
            name,
            "Pattern to subscribe is empty as specified value for option "
            f"'subscribePattern' is '{value}'",
        )
    try:
        re.compile(pattern)
    except re.error as exc:
        raise SourceOptionError(name, f"is not a valid regular expression: {exc}") from exc
    return SubscribePattern(pattern)


def _offset_limit(
    opts: dict[str, tuple[str, str]], prefix: str, default: OffsetLimit
) -> tuple[OffsetLimit, str | None]:
    """startingX / endingX: the limit and the option it came from (None: the default)."""
    names = (f"{prefix}Timestamp", f"{prefix}OffsetsByTimestamp", f"{prefix}Offsets")
    given = [n for n in names if n.lower() in opts]
    if len(given) > 1:
        # Spark silently prefers the first; two starting points is a mistake worth naming.
        raise SourceOptionError(
            given[1], f"contradicts option '{given[0]}': give only one of {', '.join(names)}"
        )
    if not given:
        return default, None
    name = given[0]
    value = opts[name.lower()][1].strip()
    try:
        if name == names[0]:
            try:
                return GlobalTimestamp(int(value)), name
            except ValueError:
                raise SourceOptionError(
                    name, f"Expected a single long value, got {value}"
                ) from None
        if name == names[1]:
            ts = parse_partition_timestamps(value, name)
            return PartitionTimestamps(tuple(sorted(ts.items()))), name
        low = value.lower()
        if low == "latest":
            return LatestOffsets(), name
        if low == "earliest":
            return EarliestOffsets(), name
        offsets = parse_partition_offsets(value, name)
        return SpecificOffsets(tuple(sorted(offsets.items(), key=lambda i: i[0]))), name
    except OffsetsJsonError as exc:
        raise SourceOptionError(name, str(exc)) from exc


def _check_batch_limits(
    start: OffsetLimit, start_name: str, end: OffsetLimit, end_name: str
) -> None:
    if isinstance(start, LatestOffsets):
        raise SourceOptionError(
            start_name, "starting offset can't be latest for batch queries on Kafka"
        )
    if isinstance(start, SpecificOffsets):
        for tp, off in start.offsets:
            if off == LATEST:
                raise SourceOptionError(
                    start_name,
                    f"startingOffsets for {tp.topic}-{tp.partition} can't be latest for "
                    "batch queries on Kafka",
                )
    if isinstance(end, EarliestOffsets):
        raise SourceOptionError(
            end_name, "ending offset can't be earliest for batch queries on Kafka"
        )
    if isinstance(end, SpecificOffsets):
        for tp, off in end.offsets:
            if off == EARLIEST:
                raise SourceOptionError(
                    end_name,
                    f"ending offset for {tp.topic}-{tp.partition} can't be earliest for "
                    "batch queries on Kafka",
                )
    # Spark's checkOffsetLimitValidity: same partitions, start <= end where both are known.
    if isinstance(start, SpecificOffsets) and isinstance(end, SpecificOffsets):
        s, e = start.as_dict(), end.as_dict()
        if set(s) != set(e):
            raise SourceOptionError(
                end_name,
                f"names partitions {_tps(set(e))} but {start_name} names {_tps(set(s))}; "
                "they must name the same partitions",
            )
        for tp, so in s.items():
            eo = e[tp]
            if (
                isinstance(so, EpochOffset)
                and isinstance(eo, EpochOffset)
                and so.offset > eo.offset
            ):
                raise SourceOptionError(
                    end_name,
                    f"ending offset {eo.offset} of {tp.topic}-{tp.partition} is before "
                    f"its starting offset {so.offset}",
                )
    if isinstance(start, PartitionTimestamps) and isinstance(end, PartitionTimestamps):
        st, et = start.as_dict(), end.as_dict()
        if set(st) != set(et):
            raise SourceOptionError(
                end_name,
                f"names partitions {_tps(set(et))} but {start_name} names {_tps(set(st))}; "
                "they must name the same partitions",
            )
        for tp, ts in st.items():
            if ts > et[tp]:
                raise SourceOptionError(
                    end_name,
                    f"ending timestamp {et[tp]} of {tp.topic}-{tp.partition} is before its "
                    f"starting timestamp {ts}",
                )


def _tps(tps: set[TopicPartition]) -> str:
    return "[" + ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps)) + "]"


def _check_fits_strategy(limit: OffsetLimit, name: str, strategy: Strategy) -> None:
    named: set[TopicPartition]
    if isinstance(limit, SpecificOffsets):
        named = {tp for tp, _ in limit.offsets}
    elif isinstance(limit, PartitionTimestamps):
        named = {tp for tp, _ in limit.timestamps}
    else:
        return
    if isinstance(strategy, Assign):
        if named != set(strategy.partitions):
            # Spark's fetchSpecificOffsets asserts the same at the first batch.
            raise SourceOptionError(
                name,
                f"names partitions {_tps(named)} but assign is {_tps(set(strategy.partitions))}:"
                " with assign, specific offsets must name exactly the assigned partitions",
            )
        return
    stray = {tp for tp in named if not strategy.matches(tp.topic)}
    if stray:
        raise SourceOptionError(
            name,
            f"names partitions {_tps(stray)} of topics the query does not read "
            f"({strategy.describe()})",
        )


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check and parse a query's options (``streaming``: readStream rather than read)."""
    opts = _normalise_keys(options)
    kafka: dict[str, Any] = {}
    for low, (key, value) in opts.items():
        if low.startswith("kafka.") and low not in _BY_LOWER:
            java_key = key[len("kafka.") :]
            java_low = java_key.lower()
            if java_low in REJECTED_KAFKA_PARAMS:
                raise SourceOptionError(key, REJECTED_KAFKA_PARAMS[java_low])
            if java_low in _IGNORED_KAFKA_PARAMS:
                continue
            if java_low not in KAFKA_PARAMS:
                raise _unknown(key)
            kafka.update(_kafka_value(java_low, value))
        elif low not in _BY_LOWER:
            raise _unknown(key)

    def get(name: str) -> str | None:
        item = opts.get(name.lower())
        return None if item is None else item[1]

    if streaming:
        # Spark's validateStreamOptions
        if get("endingOffsets") is not None:
            raise SourceOptionError("endingOffsets", "ending offset not valid in streaming queries")
        for name in ("endingOffsetsByTimestamp", "endingTimestamp"):
            if get(name) is not None:
                raise SourceOptionError(name, "ending timestamp not valid in streaming queries")
    strategy = _strategy(opts)
    bootstrap = get(_BOOTSTRAP)
    if bootstrap is None or not bootstrap.strip():
        raise SourceOptionError(
            _BOOTSTRAP,
            "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer",
        )

    def opt_int(name: str, minimum: int, what: str = "") -> int | None:
        raw = get(name)
        return None if raw is None else _int(name, raw, minimum, what)

    min_partitions = opt_int("minPartitions", 1, "minPartitions must be positive")
    max_records = opt_int("maxRecordsPerPartition", 1, "maxRecordsPerPartition must be positive")
    max_per_trigger = opt_int("maxOffsetsPerTrigger", 1)
    min_per_trigger = opt_int("minOffsetsPerTrigger", 1)
    if (
        min_per_trigger is not None
        and max_per_trigger is not None
        and min_per_trigger > max_per_trigger
    ):
        raise SourceOptionError(
            "minOffsetsPerTrigger",
            f"The value of minOffsetPerTrigger({min_per_trigger}) is higher than the "
            f"maxOffsetsPerTrigger({max_per_trigger}).",
        )
    delay_raw = get("maxTriggerDelay")
    delay_ms = parse_time_ms("maxTriggerDelay", delay_raw if delay_raw is not None else "15m")

    no_match_raw = (get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if no_match_raw not in ("error", "latest"):
        raise SourceOptionError(
            "startingOffsetsByTimestampStrategy",
            f"must be 'error' or 'latest', got {no_match_raw!r}",
        )
    no_match: Literal["error", "latest"] = "error" if no_match_raw == "error" else "latest"

    default_start: OffsetLimit = LatestOffsets() if streaming else EarliestOffsets()
    starting, start_name = _offset_limit(opts, "starting", default_start)
    _check_fits_strategy(starting, start_name or "startingOffsets", strategy)
    ending: OffsetLimit = LatestOffsets()
    if not streaming:
        ending, end_name = _offset_limit(opts, "ending", LatestOffsets())
        _check_fits_strategy(ending, end_name or "endingOffsets", strategy)
        _check_batch_limits(
            starting, start_name or "startingOffsets", ending, end_name or "endingOffsets"
        )

    on_truncation = (get("onTruncation") or "fail").strip().lower()
    if on_truncation not in ("fail", "rewind"):
        raise SourceOptionError(
            "onTruncation", f"must be 'fail' or 'rewind', got {on_truncation!r}"
        )

    def opt_bool(name: str, default: bool) -> bool:
        raw = get(name)
        return default if raw is None else _bool(name, raw)

    group_id = kafka.get("group_id")
    commit_to_group = opt_bool("commitToGroup", False)
    if commit_to_group and not streaming:
        raise SourceOptionError("commitToGroup", "applies to streaming queries only")
    if commit_to_group and not group_id:
        # Spark's generated group ids are new at every run: lag tools could not follow them.
        raise SourceOptionError(
            "commitToGroup", "needs 'kafka.group.id': the consumer group to commit to"
        )
    initial_offsets_path = get("initialOffsetsPath")
    if initial_offsets_path is not None:
        initial_offsets_path = initial_offsets_path.strip()
        if not streaming:
            raise SourceOptionError("initialOffsetsPath", "applies to streaming queries only")
        if not initial_offsets_path:
            raise SourceOptionError("initialOffsetsPath", "must name a file, got ''")
    driver_read = opt_int("driverReadMaxOffsets", 0) or 0
    if driver_read and not streaming:
        raise SourceOptionError("driverReadMaxOffsets", "applies to streaming queries only")
    return SourceOptions(
        streaming=streaming,
        strategy=strategy,
        bootstrap_servers=bootstrap.strip(),
        consumer_config=tuple(sorted(kafka.items())),
        starting=starting,
        ending=ending,
        no_match_strategy=no_match,
        fail_on_data_loss=opt_bool("failOnDataLoss", True),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=delay_ms,
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        include_headers=opt_bool("includeHeaders", False),
        group_id_prefix=get("groupIdPrefix"),
        group_id=group_id,
        poll_timeout_ms=opt_int("kafkaConsumer.pollTimeoutMs", 1) or 120_000,
        fetch_offset_num_retries=_int(
            "fetchOffset.numRetries", get("fetchOffset.numRetries") or "3", 0
        ),
        fetch_offset_retry_interval_ms=_int(
            "fetchOffset.retryIntervalMs", get("fetchOffset.retryIntervalMs") or "1000", 0
        ),
        on_truncation="fail" if on_truncation == "fail" else "rewind",
        commit_to_group=commit_to_group,
        fail_on_missing_topic=opt_bool("failOnMissingTopic", False),
        filter_pushdown=opt_bool("filterPushdown", False),
        initial_offsets_path=initial_offsets_path,
        driver_read_max_offsets=driver_read,
    )


def check_checkpoint(
    offset: SourceOffset, strategy: Strategy, what: str = "the checkpoint"
) -> None:
    """A checkpointed offset must be for the partitions this query reads: an error names
    the partitions that differ (a checkpoint reused with other ``subscribe`` options)."""
    tps = {tp for tp, _ in offset.positions}
    if isinstance(strategy, Assign):
        extra, missing = tps - strategy.partitions, strategy.partitions - tps
        if extra or missing:
            parts = []
            if extra:
                parts.append(f"has partitions {_tps(extra)} the query does not assign")
            if missing:
                parts.append(f"lacks assigned partitions {_tps(set(missing))}")
            raise OffsetsJsonError(f"{what} {' and '.join(parts)} ({strategy.describe()})")
        return
    stray = {tp for tp in tps if not strategy.matches(tp.topic)}
    if stray:
        topics = sorted({tp.topic for tp in stray})
        raise OffsetsJsonError(
            f"{what} is for topics {topics} that the query does not read "
            f"({strategy.describe()}); was it written by another query?"
        )
