"""Consumer configuration: kafka-python's ``KafkaConsumer`` names plus the epoch additions.

Unknown keys and invalid values raise :class:`ConsumerConfigError` naming the key, at
construction, before any connection is made.
"""

from __future__ import annotations

import difflib
import socket
from collections.abc import Callable, Mapping
from typing import Any

from kafka.coordinator.assignors.abstract import RebalanceProtocol
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from epochguard.consumer.errors import ConsumerConfigError
from epochguard.consumer.rebootstrap import RECOVERY_STRATEGIES

__all__ = ["DEFAULT_CONFIG", "IGNORED_KEYS", "build_config"]

DEFAULT_CONFIG: dict[str, Any] = {
    # kafka-python KafkaConsumer names and defaults
    "bootstrap_servers": "localhost",
    "client_id": "epochguard",
    "client_rack": "",
    "group_id": None,
    "group_instance_id": None,
    "key_deserializer": None,
    "value_deserializer": None,
    #: KIP-227 fetch sessions (incremental Fetch requests) with brokers of Fetch v7+.
    #: kafka-python's name; the Java client and librdkafka always use sessions, no switch.
    "enable_incremental_fetch_sessions": True,
    "fetch_max_wait_ms": 500,
    "fetch_min_bytes": 1,
    "fetch_max_bytes": 52428800,
    "max_partition_fetch_bytes": 1 * 1024 * 1024,
    "request_timeout_ms": 30000,
    "retry_backoff_ms": 100,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 30000,
    "max_in_flight_requests_per_connection": 5,
    "auto_offset_reset": "latest",
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5000,
    "default_offset_commit_callback": None,
    "check_crcs": True,
    "isolation_level": "read_uncommitted",
    "allow_auto_create_topics": True,
    "metadata_max_age_ms": 5 * 60 * 1000,
    #: Java's ``metadata.recovery.strategy`` (KIP-899): "rebootstrap" goes back to the
    #: bootstrap servers when no known broker can be reached, "none" never does.
    "metadata_recovery_strategy": "rebootstrap",
    #: Java's ``metadata.recovery.rebootstrap.trigger.ms`` (KIP-1102): rebootstrap when no
    #: metadata answer arrived for this long.
    "metadata_recovery_rebootstrap_trigger_ms": 300000,
    "client_dns_lookup": "use_all_dns_ips",
    "partition_assignment_strategy": (RangePartitionAssignor, RoundRobinPartitionAssignor),
    "max_poll_records": 500,
    "max_poll_interval_ms": 300000,
    "session_timeout_ms": 45000,
    "heartbeat_interval_ms": 3000,
    "receive_buffer_bytes": None,
    "send_buffer_bytes": None,
    "receive_message_max_bytes": 100_000_000,
    "socket_options": [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    "consumer_timeout_ms": float("inf"),
    "security_protocol": "PLAINTEXT",
    "ssl_context": None,
    "ssl_check_hostname": True,
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_crlfile": None,
    "ssl_password": None,
    "ssl_ciphers": None,
    "api_version": None,
    "bootstrap_timeout_ms": 30000,
    "connections_max_idle_ms": 9 * 60 * 1000,
    "metric_reporters": [],
    "metrics_enabled": True,
    #: KIP-714: answer a broker's client-metrics subscription by pushing this consumer's
    #: metrics to it (Java's and librdkafka's default: on). Nothing is pushed unless an
    #: operator created a subscription on the cluster.
    "enable_metrics_push": True,
    "metrics_num_samples": 2,
    "metrics_sample_window_ms": 30000,
    "metric_group_prefix": "consumer",
    "selector": None,
    "exclude_internal_topics": True,
    "sasl_mechanism": None,
    "sasl_plain_username": None,
    "sasl_plain_password": None,
    "sasl_kerberos_name": None,
    "sasl_kerberos_service_name": "kafka",
    "sasl_kerberos_domain_name": None,
    "sasl_oauth_token_provider": None,
    "proxy_url": None,
    "socks5_proxy": None,
    "kafka_client": None,
    # epochguard additions
    "on_truncation": "auto",
    "on_truncation_report": None,
    "offset_store": None,
    "close_timeout_ms": 5000,
    #: Java's ``socket.connection.setup.timeout.ms`` and ``.max.ms`` (kafka-python's
    #: connection manager has them too): how long a new connection may take to connect
    #: and answer its handshake (ApiVersions, TLS, SASL), growing exponentially to the
    #: maximum with failures in a row.
    "socket_connection_setup_timeout_ms": 10000,
    "socket_connection_setup_timeout_max_ms": 30000,
    #: How often a partition stopped by a truncation (or with no valid offset) logs
    #: ``partition_awaiting_seek`` while the application has not sought it.
    "awaiting_seek_log_interval_ms": 30000,
    #: Highest Fetch version to use (12 = LastFetchedEpoch/DivergingEpoch, 13 = topic ids,
    #: 16 = KIP-951 leader hints). Lower it to 11 to exercise the OffsetForLeaderEpoch-only
    #: path (Java's behaviour).
    "max_fetch_version": 17,
    #: Highest Metadata version (epochs need 7+, REBOOTSTRAP_REQUIRED 13). For tests of
    #: old-broker behaviour.
    "max_metadata_version": 13,
    #: Group membership, the Java client's names and default: "classic" (JoinGroup /
    #: SyncGroup, eager) or "consumer" (KIP-848: the broker assigns, incrementally).
    "group_protocol": "classic",
    #: "consumer" protocol only: the broker-side assignor ("uniform", "range"); None: the
    #: broker's default (group.consumer.assignors).
    "group_remote_assignor": None,
    #: read_committed only: the broker's ``transaction.max.timeout.ms`` (Kafka's default
    #: 15 minutes). A partition's last stable offset that stands longer than this, with
    #: records behind it, is held by a hanging transaction (no transaction may be open
    #: longer); the consumer then asks the leader which one (DescribeProducers).
    "transaction_max_timeout_ms": 900000,
    #: What a hanging transaction does: "raise" (``poll`` raises ``HangingTransactionError``
    #: once per stall) or "warn" (logged as ``hanging_transaction_detected`` and kept in
    #: ``hanging_transactions()``). A transaction reopened by a truncation, or decided again
    #: otherwise than read, follows it too (``ReopenedTransactionError``,
    #: ``transaction_reopened``, ``reopened_transactions()``).
    "on_hanging_transaction": "raise",
    #: "records": ``poll()`` returns ``ConsumerRecord`` lists. "columns": fetched records
    #: are decoded into column buffers instead and read with ``poll_columns()`` (Arrow
    #: layouts, no Python object per record; keys and values stay bytes).
    "record_format": "records",
    #: ``record_format="columns"`` only: keep the records' headers in the column buffers
    #: too (``RecordColumns.to_arrow()["headers"]``, Arrow's
    #: ``list<struct<key: string, value: binary>>``); off, they are checked but not kept.
    "column_headers": False,
    #: EpochConsumer: False (default), the threads that wait in the consumer (``poll()``,
    #: ``commit()``, a heartbeat awaiting its answer) serve the connections; True,
    #: kafka-python's IO thread does (reads answers while the application works, at the
    #: cost of handing the GIL between the two threads). AIOEpochConsumer refuses it.
    "io_thread": False,
}

#: Keys the "consumer" group protocol leaves to the broker (Java refuses them too).
_CLASSIC_ONLY = ("partition_assignment_strategy", "session_timeout_ms", "heartbeat_interval_ms")

#: Accepted for drop-in compatibility with kafka-python but without effect here.
IGNORED_KEYS = frozenset(
    {
        "receive_buffer_bytes",
        "send_buffer_bytes",
        "socket_options",
        "metric_reporters",
        "metrics_num_samples",
        "metrics_sample_window_ms",
        "metric_group_prefix",
        "selector",
        "ssl_ciphers",
        "kafka_client",  # EpochConsumer drives its own connections
    }
)

_POSITIVE_INT = (
    "fetch_max_bytes",
    "max_partition_fetch_bytes",
    "request_timeout_ms",
    "retry_backoff_ms",
    "reconnect_backoff_ms",
    "reconnect_backoff_max_ms",
    "max_in_flight_requests_per_connection",
    "auto_commit_interval_ms",
    "metadata_max_age_ms",
    "max_poll_records",
    "max_poll_interval_ms",
    "session_timeout_ms",
    "heartbeat_interval_ms",
    "receive_message_max_bytes",
    "bootstrap_timeout_ms",
    "connections_max_idle_ms",
    "socket_connection_setup_timeout_ms",
    "socket_connection_setup_timeout_max_ms",
    "close_timeout_ms",
    "awaiting_seek_log_interval_ms",
    "transaction_max_timeout_ms",
)
# fetch_max_wait_ms=0: the broker answers at once, for the lowest latency at the cost of a
# fetch loop that never waits (kafka-python and Java accept it too).
_NON_NEGATIVE_INT = (
    "fetch_min_bytes",
    "fetch_max_wait_ms",
    "metadata_recovery_rebootstrap_trigger_ms",
)
_BOOL = (
    "column_headers",
    "io_thread",
    "enable_incremental_fetch_sessions",
    "enable_auto_commit",
    "check_crcs",
    "allow_auto_create_topics",
    "exclude_internal_topics",
    "ssl_check_hostname",
    "metrics_enabled",
    "enable_metrics_push",
)


def _check_int(key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConsumerConfigError(key, f"must be an int, got {value!r}")
    if value < minimum:
        raise ConsumerConfigError(key, f"must be >= {minimum}, got {value}")


def build_config(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``configs`` over the defaults, validating every key and value."""
    unknown = sorted(set(configs) - set(DEFAULT_CONFIG))
    if unknown:
        close = difflib.get_close_matches(unknown[0], DEFAULT_CONFIG, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConsumerConfigError(
            unknown[0],
            f"unknown configuration key(s) {unknown}; {hint}"
            "EpochConsumer.DEFAULT_CONFIG lists every key and its default",
        )
    cfg = dict(DEFAULT_CONFIG)
    cfg.update(configs)
    for key in _POSITIVE_INT:
        _check_int(key, cfg[key], 1)
    for key in _NON_NEGATIVE_INT:
        _check_int(key, cfg[key], 0)
    for key in _BOOL:
        if not isinstance(cfg[key], bool):
            raise ConsumerConfigError(key, f"must be True or False, got {cfg[key]!r}")
    reset = cfg["auto_offset_reset"]
    if isinstance(reset, str):
        reset = {"smallest": "earliest", "largest": "latest"}.get(reset, reset)
    if reset not in ("earliest", "latest", "none"):
        raise ConsumerConfigError(
            "auto_offset_reset", f"must be 'earliest', 'latest' or 'none', got {reset!r}"
        )
    cfg["auto_offset_reset"] = reset
    if cfg["isolation_level"] not in ("read_uncommitted", "read_committed"):
        raise ConsumerConfigError(
            "isolation_level",
            f"must be 'read_uncommitted' or 'read_committed', got {cfg['isolation_level']!r}",
        )
    if cfg["on_hanging_transaction"] not in ("raise", "warn"):
        raise ConsumerConfigError(
            "on_hanging_transaction",
            f"must be 'raise' or 'warn', got {cfg['on_hanging_transaction']!r}",
        )
    strategy = cfg["metadata_recovery_strategy"]
    # Case-insensitive, as Java's.
    if not isinstance(strategy, str) or strategy.lower() not in RECOVERY_STRATEGIES:
        raise ConsumerConfigError(
            "metadata_recovery_strategy", f"must be 'rebootstrap' or 'none', got {strategy!r}"
        )
    cfg["metadata_recovery_strategy"] = strategy.lower()
    servers = cfg["bootstrap_servers"]
    if not servers or not isinstance(servers, str | list | tuple):
        raise ConsumerConfigError(
            "bootstrap_servers", f"must be 'host:port[,...]' or a list, got {servers!r}"
        )
    protocol = cfg["group_protocol"]
    if not isinstance(protocol, str) or protocol.lower() not in ("classic", "consumer"):
        raise ConsumerConfigError(
            "group_protocol", f"must be 'classic' or 'consumer', got {protocol!r}"
        )
    cfg["group_protocol"] = protocol.lower()
    assignor = cfg["group_remote_assignor"]
    if assignor is not None and (not isinstance(assignor, str) or not assignor):
        raise ConsumerConfigError(
            "group_remote_assignor", f"must be an assignor name or None, got {assignor!r}"
        )
    if cfg["group_protocol"] == "consumer":
        for key in _CLASSIC_ONLY:
            if key in configs:
                raise ConsumerConfigError(
                    key, "is not used with group_protocol='consumer' (the broker decides it)"
                )
    elif assignor is not None:
        raise ConsumerConfigError(
            "group_remote_assignor", "needs group_protocol='consumer' (a broker-side assignor)"
        )
    if cfg["group_instance_id"] is not None and cfg["group_id"] is None:
        raise ConsumerConfigError("group_instance_id", "requires group_id")
    instance = cfg["group_instance_id"]
    if instance is not None and (not isinstance(instance, str) or not instance.strip()):
        raise ConsumerConfigError(
            "group_instance_id", f"must be a non-empty string (KIP-345), got {instance!r}"
        )
    rack = cfg["client_rack"]
    if rack is None:
        rack = cfg["client_rack"] = ""
    if not isinstance(rack, str):
        raise ConsumerConfigError("client_rack", f"must be a string (broker.rack), got {rack!r}")
    if not cfg["fetch_max_wait_ms"] < cfg["request_timeout_ms"]:
        raise ConsumerConfigError(
            "request_timeout_ms",
            "must be larger than fetch_max_wait_ms "
            f"({cfg['request_timeout_ms']} <= {cfg['fetch_max_wait_ms']})",
        )
    if cfg["heartbeat_interval_ms"] >= cfg["session_timeout_ms"]:
        raise ConsumerConfigError("heartbeat_interval_ms", "must be lower than session_timeout_ms")
    strategies = cfg["partition_assignment_strategy"]
    if not isinstance(strategies, list | tuple) or not strategies:
        raise ConsumerConfigError(
            "partition_assignment_strategy", "must be a non-empty list of assignor classes"
        )
    instances = []
    common = {RebalanceProtocol.EAGER, RebalanceProtocol.COOPERATIVE}
    for s in strategies:
        assignor = s() if isinstance(s, type) else s
        if not hasattr(assignor, "assign") or not hasattr(assignor, "name"):
            raise ConsumerConfigError(
                "partition_assignment_strategy", f"{s!r} is not a kafka-python partition assignor"
            )
        protocols = getattr(assignor, "supported_protocols", None)
        offered = set(protocols()) if protocols is not None else {RebalanceProtocol.EAGER}
        if RebalanceProtocol.COOPERATIVE in offered and not hasattr(assignor, "set_owned"):
            # The member must be able to tell the assignor what it still owns (nothing,
            # after the group dropped it): otherwise it claims partitions another member
            # owns by now. kafka-python's cooperative assignor has no such hook.
            raise ConsumerConfigError(
                "partition_assignment_strategy",
                f"{assignor.name!r} is a cooperative (KIP-429) assignor without set_owned(); "
                "use epochguard.consumer.CooperativeStickyAssignor",
            )
        common &= offered
        instances.append(assignor)
    if not common:
        # A cooperative-only assignor leaves a moving partition unassigned until a follow-up
        # rebalance, which eager rebalancing never runs; an eager-only one expects every
        # member to give up everything first. The group cannot run both (as in Java).
        raise ConsumerConfigError(
            "partition_assignment_strategy",
            f"{[a.name for a in instances]} mix eager-only and cooperative-only (KIP-429) "
            "assignors; use CooperativeStickyAssignor alone, or only eager ones",
        )
    cfg["partition_assignment_strategy"] = instances
    for key in (
        "key_deserializer",
        "value_deserializer",
        "on_truncation_report",
        "default_offset_commit_callback",
    ):
        value = cfg[key]
        if value is not None and not callable(value) and not hasattr(value, "deserialize"):
            raise ConsumerConfigError(key, f"must be callable, got {value!r}")
    store = cfg["offset_store"]
    if store is not None and not (hasattr(store, "load") and hasattr(store, "save")):
        raise ConsumerConfigError(
            "offset_store", f"must be an OffsetStore (load/save), got {store!r}"
        )
    for key in ("max_fetch_version",):
        _check_int(key, cfg[key], 4)
        if cfg[key] > 17:
            raise ConsumerConfigError(key, "must be <= 17")
    if cfg["client_rack"] and cfg["max_fetch_version"] < 11:
        raise ConsumerConfigError(
            "client_rack",
            f"needs Fetch v11+ (KIP-392 rack_id), but max_fetch_version is "
            f"{cfg['max_fetch_version']}",
        )
    _check_int("max_metadata_version", cfg["max_metadata_version"], 1)
    if cfg["max_metadata_version"] > 13:
        raise ConsumerConfigError("max_metadata_version", "must be <= 13")
    if cfg["record_format"] not in ("records", "columns"):
        raise ConsumerConfigError(
            "record_format", f"must be 'records' or 'columns', got {cfg['record_format']!r}"
        )
    if cfg["column_headers"] and cfg["record_format"] != "columns":
        raise ConsumerConfigError(
            "column_headers", "needs record_format='columns' (records always carry headers)"
        )
    if cfg["record_format"] == "columns":
        for key in ("key_deserializer", "value_deserializer"):
            if cfg[key] is not None:
                raise ConsumerConfigError(
                    key,
                    "is not supported with record_format='columns' (keys and values "
                    "stay bytes in the column buffers)",
                )
    if cfg["socks5_proxy"] is not None and cfg["proxy_url"] is None:
        cfg["proxy_url"] = cfg["socks5_proxy"]
    # The frame of a fetch response may exceed fetch_max_bytes by one partition's worth.
    need = cfg["fetch_max_bytes"] + cfg["max_partition_fetch_bytes"] + 1024
    if cfg["receive_message_max_bytes"] < need:
        cfg["receive_message_max_bytes"] = need
    return cfg


Callback = Callable[..., Any]
