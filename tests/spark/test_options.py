"""Option parsing: Spark's names, defaults and checks; unknown or contradictory -> named error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.structs import TopicPartition

from epochguard.offsets import EpochOffset
from epochguard.spark_connector.errors import SourceOptionError
from epochguard.spark_connector.options import (
    KAFKA_PARAMS,
    OPTIONS,
    REJECTED_KAFKA_PARAMS,
    Assign,
    EarliestOffsets,
    GlobalTimestamp,
    LatestOffsets,
    PartitionTimestamps,
    SpecificOffsets,
    Subscribe,
    SubscribePattern,
    parse_options,
    parse_time_ms,
)

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "t"}
DOCS = Path(__file__).resolve().parents[2] / "docs"


def parse(streaming: bool = True, **extra: str) -> Any:
    return parse_options({**BASE, **extra}, streaming=streaming)


def error(streaming: bool = True, base: dict[str, str] | None = None, **extra: str) -> Any:
    with pytest.raises(SourceOptionError) as info:
        parse_options({**(BASE if base is None else base), **extra}, streaming=streaming)
    return info.value


def test_defaults_are_sparks() -> None:
    s = parse(streaming=True)
    assert s.strategy == Subscribe(("t",))
    assert s.bootstrap_servers == "h:9092"
    assert s.starting == LatestOffsets()
    assert s.fail_on_data_loss is True
    assert s.max_offsets_per_trigger is None
    assert s.min_offsets_per_trigger is None
    assert s.max_trigger_delay_ms == 15 * 60 * 1000
    assert s.min_partitions is None
    assert s.max_records_per_partition is None
    assert s.include_headers is False
    assert s.on_truncation == "fail"
    assert s.commit_to_group is False
    assert s.fetch_offset_num_retries == 3
    assert s.fetch_offset_retry_interval_ms == 1000
    b = parse(streaming=False)
    assert b.starting == EarliestOffsets()
    assert b.ending == LatestOffsets()


def test_names_are_case_insensitive_like_spark() -> None:
    s = parse(MAXOFFSETSPERTRIGGER="10", includeheaders="TRUE")
    assert s.max_offsets_per_trigger == 10
    assert s.include_headers is True


def test_same_option_twice_in_two_spellings() -> None:
    e = error(maxOffsetsPerTrigger="1", maxoffsetspertrigger="2")
    assert e.option == "maxoffsetspertrigger"


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
        ("startingOffset", "startingOffsets"),
        ("failOnDataloss", None),  # case-insensitive: this one is simply valid
        ("kafka.bootstrap.server", "kafka.bootstrap.servers"),
        ("subscribePatern", "subscribePattern"),
    ],
)
def test_misspelt_options_are_named_with_a_suggestion(key: str, suggestion: str | None) -> None:
    if suggestion is None:
        assert parse(**{key: "false"}).fail_on_data_loss is False
        return
    e = error(**{key: "1"})
    assert e.option == key
    assert f"did you mean '{suggestion}'" in str(e)


def test_unknown_option_without_suggestion() -> None:
    e = error(colour="blue")
    assert e.option == "colour"
    assert "unknown option" in str(e)


@pytest.mark.parametrize("java_key", sorted(REJECTED_KAFKA_PARAMS))
def test_kafka_keys_spark_rejects_are_rejected_with_sparks_reason(java_key: str) -> None:
    e = error(**{f"kafka.{java_key}": "x"})
    assert e.option == f"kafka.{java_key}"
    assert f"Kafka option '{java_key}' is not supported" in str(e)


def test_unknown_kafka_key_is_an_error() -> None:
    e = error(**{"kafka.fetch.max.wait": "100"})
    assert e.option == "kafka.fetch.max.wait"
    assert "kafka.fetch.max.wait.ms" in str(e)


def test_kafka_params_become_consumer_settings() -> None:
    s = parse(
        **{
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                'username="alice" password="s3cret";'
            ),
            "kafka.fetch.max.wait.ms": "250",
            "kafka.receive.buffer.bytes": "65536",  # accepted, no effect
            "kafka.group.id": "g1",
        }
    )
    kw = s.consumer_kwargs()
    assert kw["security_protocol"] == "SASL_PLAINTEXT"
    assert kw["sasl_mechanism"] == "PLAIN"
    assert kw["sasl_plain_username"] == "alice"
    assert kw["sasl_plain_password"] == "s3cret"
    assert kw["fetch_max_wait_ms"] == 250
    assert kw["bootstrap_servers"] == "h:9092"
    # The source decides every position: never the consumer's reset or auto commit.
    assert kw["auto_offset_reset"] == "none"
    assert kw["enable_auto_commit"] is False
    assert "group_id" not in kw
    assert s.group_id == "g1"


def test_jaas_config_without_credentials() -> None:
    e = error(**{"kafka.sasl.jaas.config": "x required;"})
    assert e.option == "kafka.sasl.jaas.config"


def test_bad_numeric_kafka_value() -> None:
    e = error(**{"kafka.fetch.max.wait.ms": "soon"})
    assert e.option == "kafka.fetch.max.wait.ms"


def test_strategy_required_and_exclusive() -> None:
    e = error(base={"kafka.bootstrap.servers": "h"})
    assert "One of the following options must be specified" in str(e)
    e = error(subscribePattern="t.*")
    assert "Only one of the following options can be specified" in str(e)
    assert e.option == "subscribePattern"


def test_strategies() -> None:
    base = {"kafka.bootstrap.servers": "h"}
    s = parse_options({**base, "subscribe": " a, b ,,"}, streaming=True)
    assert s.strategy == Subscribe(("a", "b"))
    s = parse_options({**base, "subscribePattern": "t-.*"}, streaming=True)
    assert isinstance(s.strategy, SubscribePattern)
    assert s.strategy.matches("t-1") and not s.strategy.matches("xt-1")
    s = parse_options({**base, "assign": '{"a": [0, 2]}'}, streaming=True)
    assert s.strategy == Assign(frozenset({TopicPartition("a", 0), TopicPartition("a", 2)}))


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("subscribe", " , ", "No topics to subscribe to"),
        ("subscribePattern", "  ", "Pattern to subscribe is empty"),
        ("subscribePattern", "(", "not a valid regular expression"),
        ("assign", "a:0", "No topicpartitions to assign"),
        ("assign", '{"a": [-1]}', "not a non-negative integer"),
        ("assign", '{"a": 0}', "list of partitions"),
    ],
)
def test_bad_strategy_values(key: str, value: str, text: str) -> None:
    e = error(base={"kafka.bootstrap.servers": "h"}, **{key: value})
    assert e.option == key
    assert text in str(e)


def test_bootstrap_servers_required() -> None:
    e = error(base={"subscribe": "t"})
    assert e.option == "kafka.bootstrap.servers"
    assert "must be specified" in str(e)


def test_starting_offsets_forms() -> None:
    assert parse(startingOffsets="EARLIEST").starting == EarliestOffsets()
    s = parse(startingOffsets='{"t": {"0": 23, "1": -2, "2": {"offset": 5, "leader_epoch": 3}}}')
    assert isinstance(s.starting, SpecificOffsets)
    assert s.starting.as_dict() == {
        TopicPartition("t", 0): EpochOffset(23),
        TopicPartition("t", 1): -2,
        TopicPartition("t", 2): EpochOffset(5, 3),
    }
    s = parse(startingTimestamp="1000")
    assert s.starting == GlobalTimestamp(1000)
    s = parse(startingOffsetsByTimestamp='{"t": {"0": 1000}}')
    assert s.starting == PartitionTimestamps(((TopicPartition("t", 0), 1000),))


def test_two_starting_points_contradict() -> None:
    e = error(startingOffsets="earliest", startingTimestamp="5")
    assert e.option == "startingOffsetsByTimestamp" or e.option == "startingOffsets"
    assert "contradicts option 'startingTimestamp'" in str(e)


def test_bad_starting_values() -> None:
    e = error(startingTimestamp="yesterday")
    assert "Expected a single long value, got yesterday" in str(e)
    e = error(startingOffsets='{"t": {"0": -3}}')
    assert e.option == "startingOffsets"
    assert "t-0" in str(e)
    e = error(startingOffsets='{"t": {"0": {"offset": 1, "epoch": 2}}}')
    assert "unknown keys" in str(e)
    e = error(startingOffsets="{not json")
    assert "not valid JSON" in str(e)
    e = error(startingOffsetsByTimestampStrategy="nearest")
    assert e.option == "startingOffsetsByTimestampStrategy"


def test_specific_offsets_must_be_for_topics_read() -> None:
    e = error(startingOffsets='{"other": {"0": 1}}')
    assert e.option == "startingOffsets"
    assert "other-0" in str(e)
    e = error(
        base={"kafka.bootstrap.servers": "h", "assign": '{"t": [0, 1]}'},
        startingOffsets='{"t": {"0": 1}}',
    )
    assert "exactly the assigned partitions" in str(e)


def test_batch_only_and_stream_only_options() -> None:
    e = error(endingOffsets="latest")
    assert str(e).endswith("ending offset not valid in streaming queries")
    e = error(endingTimestamp="5")
    assert "ending timestamp not valid in streaming queries" in str(e)
    e = error(streaming=False, startingOffsets="latest")
    assert "starting offset can't be latest for batch queries on Kafka" in str(e)
    e = error(streaming=False, startingOffsets='{"t": {"0": -1}}')
    assert "can't be latest for batch queries" in str(e)
    e = error(streaming=False, endingOffsets="earliest")
    assert "ending offset can't be earliest for batch queries on Kafka" in str(e)
    e = error(streaming=False, endingOffsets='{"t": {"0": -2}}')
    assert "can't be earliest for batch queries" in str(e)


def test_batch_start_and_end_must_agree() -> None:
    e = error(
        streaming=False,
        startingOffsets='{"t": {"0": 5}}',
        endingOffsets='{"t": {"0": 4}}',
    )
    assert e.option == "endingOffsets"
    assert "before its starting offset 5" in str(e)
    e = error(
        streaming=False,
        startingOffsets='{"t": {"0": 5}}',
        endingOffsets='{"t": {"1": 9}}',
    )
    assert "must name the same partitions" in str(e)
    e = error(
        streaming=False,
        startingOffsetsByTimestamp='{"t": {"0": 5}}',
        endingOffsetsByTimestamp='{"t": {"0": 4}}',
    )
    assert "before its starting timestamp" in str(e)
    ok = parse(streaming=False, startingOffsets='{"t": {"0": 5}}', endingOffsets='{"t": {"0": -1}}')
    assert isinstance(ok.ending, SpecificOffsets)


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("minPartitions", "0", "minPartitions must be positive"),
        ("minPartitions", "two", "must be an integer"),
        ("maxRecordsPerPartition", "-1", "maxRecordsPerPartition must be positive"),
        ("maxOffsetsPerTrigger", "0", "must be >= 1"),
        ("failOnDataLoss", "yes", "must be 'true' or 'false'"),
        ("includeHeaders", "1", "must be 'true' or 'false'"),
        ("onTruncation", "ignore", "must be 'fail' or 'rewind'"),
        ("maxTriggerDelay", "5 parsecs", "is not a duration"),
        ("maxTriggerDelay", "5y", "unknown time unit"),
    ],
)
def test_bad_values_name_the_option(key: str, value: str, text: str) -> None:
    e = error(**{key: value})
    assert e.option == key
    assert text in str(e)


def test_min_above_max_offsets_per_trigger() -> None:
    e = error(minOffsetsPerTrigger="10", maxOffsetsPerTrigger="5")
    assert "The value of minOffsetPerTrigger(10) is higher than the maxOffsetsPerTrigger(5)." in (
        str(e)
    )


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("15m", 900_000),
        ("10s", 10_000),
        ("250", 250),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("3min", 180_000),
        ("500ms", 500),
        (" 7S ", 7000),
    ],
)
def test_time_strings(text: str, ms: int) -> None:
    assert parse_time_ms("maxTriggerDelay", text) == ms


def test_rewind_and_commit_to_group_parse() -> None:
    s = parse(
        onTruncation="REWIND", commitToGroup="true", groupIdPrefix="p", **{"kafka.group.id": "g"}
    )
    assert s.on_truncation == "rewind"
    assert s.commit_to_group is True
    assert s.group_id_prefix == "p"
    assert s.group_id == "g"


def test_commit_to_group_needs_a_group_and_a_stream() -> None:
    e = error(commitToGroup="true")
    assert e.option == "commitToGroup"
    assert "needs 'kafka.group.id'" in str(e)
    e = error(streaming=False, commitToGroup="true", **{"kafka.group.id": "g"})
    assert "streaming queries only" in str(e)


def test_docs_list_every_option() -> None:
    text = (DOCS / "reference" / "spark-options.md").read_text()
    for name in OPTIONS:
        assert f"| `{name}` |" in text, name
    for java_key in REJECTED_KAFKA_PARAMS:
        assert f"`kafka.{java_key}`" in text, java_key
    for java_key, setting in KAFKA_PARAMS.items():
        assert f"| `kafka.{java_key}` | `{setting}`" in text, java_key


KNOWN = {name.lower() for name in OPTIONS}


@given(st.text(min_size=1, max_size=30).filter(lambda k: k.lower() not in KNOWN))
def test_any_other_option_name_is_refused_by_name(key: str) -> None:
    if key.lower().startswith("kafka."):
        key = "x" + key  # kafka.* keys have their own table, tested above
    with pytest.raises(SourceOptionError) as info:
        parse_options({**BASE, key: "1"}, streaming=True)
    assert info.value.option == key
    assert key in str(info.value)


@given(
    st.integers(1, 2**62),
    st.integers(1, 2**62),
    st.integers(1, 10**6),
    st.sampled_from(["", " ", "  "]),
)
def test_numeric_options_round_trip(max_rows: int, min_rows: int, parts: int, pad: str) -> None:
    opts = {**BASE, "maxOffsetsPerTrigger": f"{pad}{max_rows}{pad}", "minPartitions": str(parts)}
    if min_rows > max_rows:
        with pytest.raises(SourceOptionError) as info:
            parse_options({**opts, "minOffsetsPerTrigger": str(min_rows)}, streaming=True)
        assert info.value.option == "minOffsetsPerTrigger"
        return
    s = parse_options({**opts, "minOffsetsPerTrigger": str(min_rows)}, streaming=True)
    assert (s.max_offsets_per_trigger, s.min_offsets_per_trigger, s.min_partitions) == (
        max_rows,
        min_rows,
        parts,
    )


def test_initial_offsets_path_is_for_streams_and_names_a_file() -> None:
    assert parse(initialOffsetsPath=" /chk/q/initial.json ").initial_offsets_path == (
        "/chk/q/initial.json"
    )
    assert parse().initial_offsets_path is None
    e = error(streaming=False, initialOffsetsPath="/chk/initial.json")
    assert e.option == "initialOffsetsPath" and "streaming queries only" in str(e)
    assert error(initialOffsetsPath=" ").option == "initialOffsetsPath"
