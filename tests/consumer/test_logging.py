"""The library logs like a library: stdlib ``logging`` under ``epochguard.*``, no own output."""

from __future__ import annotations

import enum
import io
import json
import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kafka.structs import TopicPartition

from epochguard._log import EventDict, get_logger
from epochguard.offsets import EpochOffset
from epochguard.offsets.events import TruncationDetected, TruncationOutcome, log_events
from epochguard.offsets.report import DetectedBy, PositionSource, TruncationReport

from .conftest import TP0, make_consumer, read, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)

DOCS = Path(__file__).resolve().parents[2] / "docs"

# A library run: an EmbeddedCluster, a producer-free append, an EpochConsumer that reads
# everything and commits. Any print or structlog default output would show up here.
CONSUMER_RUN = """
import logging, sys
{setup}
from kafka.structs import TopicPartition
from epochguard import EpochConsumer
from epochguard.testing import EmbeddedCluster
with EmbeddedCluster(brokers=3) as cluster:
    cluster.create_topic("t", partitions=1, replication_factor=2)
    cluster.append("t", 0, [b"r%d" % i for i in range(20)])
    with EpochConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id="g",
                       auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign([TopicPartition("t", 0)])
        got = 0
        while got < 20:
            got += sum(len(v) for v in c.poll(timeout_ms=200).values())
        c.commit()
        assert c.position(TopicPartition("t", 0)) == 20
"""


def _run(setup: str) -> subprocess.CompletedProcess[str]:
    code = CONSUMER_RUN.format(setup=setup)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False
    )


def test_library_run_prints_nothing_with_default_logging() -> None:
    done = _run("")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr == ""


def test_basic_config_at_warning_hides_info_and_info_shows_it() -> None:
    warning = _run("logging.basicConfig(level=logging.WARNING)")
    assert warning.returncode == 0, warning.stderr
    assert warning.stdout == "" and "broker_listening" not in warning.stderr
    # The same run at INFO: the events exist and reach the application's handler.
    info = _run("logging.basicConfig(level=logging.INFO)")
    assert info.returncode == 0, info.stderr
    assert "INFO:epochguard.testing.embedded:broker_listening broker=1" in info.stderr
    assert info.stdout == ""


def test_truncation_detected_reaches_caplog_with_its_keys(
    cluster, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="epochguard"),
        make_consumer(cluster, on_truncation="rewind") as consumer,
    ):
        old, new = setup_topic(cluster)
        consumer.assign([TP0])
        assert len(read(consumer, 10)) == 10
        cluster.stop_broker(new)
        cluster.append("t", 0, [b"lost-%d" % i for i in range(5)], batch_size=1)
        assert len(read(consumer, 5)) == 5
        unclean_elect(cluster, old, new)
        assert len(read(consumer, 8)) == 8
    (record,) = [
        r
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg["event"] == "truncation_detected"
    ]
    assert record.name == "epochguard.consumer" and record.levelno == logging.WARNING
    event = record.msg
    assert isinstance(event, dict)
    assert {
        "topic",
        "partition",
        "consumed_to",
        "divergence",
        "lost_from",
        "lost_to",
        "lost_count",
        "new_leader_epoch",
        "detected_by",
        "position_source",
        "decision",
        "new_position",
    } <= set(event)
    assert (event["topic"], event["partition"]) == ("t", 0)
    assert (event["lost_from"], event["lost_to"], event["lost_count"]) == (10, 15, 5)
    assert event["decision"] == "rewind"
    # A plain formatter shows the event name and its fields.
    assert record.getMessage().startswith("truncation_detected topic='t' partition=0 ")


def test_disabled_levels_do_not_build_the_event() -> None:
    class Loud:
        def __repr__(self) -> str:
            raise AssertionError("formatted although the level is disabled")

    log = get_logger("epochguard.test_disabled")
    logging.getLogger("epochguard.test_disabled").setLevel(logging.WARNING)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger("epochguard.test_disabled").addHandler(handler)
    try:
        log.debug("hot_path", value=Loud())
        log.info("hot_path", value=Loud())
        log.warning("shown", n=1)
    finally:
        logging.getLogger("epochguard.test_disabled").removeHandler(handler)
        logging.getLogger("epochguard.test_disabled").setLevel(logging.NOTSET)
    assert stream.getvalue() == "shown n=1\n"


def test_records_point_at_the_caller_and_keep_exceptions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = get_logger("epochguard.test_exc").bind(conn=7)
    with caplog.at_level(logging.ERROR, logger="epochguard.test_exc"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("handler_failed", api_key=1)
    (record,) = caplog.records
    assert record.funcName == "test_records_point_at_the_caller_and_keep_exceptions"
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert record.msg["conn"] == 7 and record.msg["api_key"] == 1
    assert "RuntimeError: boom" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="epochguard.test_exc"):
        log.warning("slow_close", stack_info=True)
    (record,) = caplog.records
    assert record.stack_info is not None and "test_records_point_at_the_caller" in (
        record.stack_info
    )


def test_logger_names_are_checked() -> None:
    with pytest.raises(ValueError, match=r"start with 'epochguard\.'"):
        get_logger("consumer")


def test_event_dict_renders_as_name_and_fields() -> None:
    assert str(EventDict(event="x")) == "x"
    assert str(EventDict(event="x", a=1, b="s", exc_info=None)) == "x a=1 b='s'"


def _json_recipe() -> str:
    text = (DOCS / "guides" / "operations.md").read_text().split("\n## Logging\n", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return block


def test_docs_json_recipe_gives_one_json_object_per_event(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace: dict[str, Any] = {}
    root = logging.getLogger()
    saved_level = root.level
    exec(compile(_json_recipe(), "docs/guides/operations.md:logging-json", "exec"), namespace)
    try:
        get_logger("epochguard.consumer").warning(
            "truncation_detected", topic="orders", partition=0, lost_count=5
        )
        get_logger("epochguard.consumer").debug("fetch_failed", node=1)  # below INFO
        # Another library's plain record (not "kafka": the demo and examples, run in this
        # process by other tests, set that logger's level as applications).
        logging.getLogger("otherlib.conn").warning("plain %s record", "otherlib")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            get_logger("epochguard.testing.embedded").exception("handler_failed", broker=1)
    finally:
        root.removeHandler(namespace["handler"])
        root.setLevel(saved_level)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 3
    first, plain, failed = lines
    assert {k: first[k] for k in ("event", "topic", "partition", "lost_count", "level")} == {
        "event": "truncation_detected",
        "topic": "orders",
        "partition": 0,
        "lost_count": 5,
        "level": "warning",
    }
    assert first["logger"] == "epochguard.consumer" and "timestamp" in first
    assert plain["event"] == "plain otherlib record" and plain["logger"] == "otherlib.conn"
    assert failed["event"] == "handler_failed" and failed["broker"] == 1
    assert "RuntimeError: boom" in failed["exception"]


def test_cli_runner_sends_events_to_stderr_only() -> None:
    code = textwrap.dedent(
        """
        from epochguard.__main__ import main
        raise SystemExit(main(["cluster", "--brokers", "1", "--exit-after", "0"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("127.0.0.1:")
    assert "broker_listening broker=1" in done.stderr


class _Color(enum.Enum):
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


def test_enum_fields_log_as_plain_values(caplog: pytest.LogCaptureFixture) -> None:
    """A truncation report's fields, as the tracker's event gives them (``position_source``
    a PositionSource, ``decision`` a TruncationOutcome), log as the same plain values a
    field given as a string does: in the text, and in the dict a JSON formatter reads."""
    report = TruncationReport(
        tp=TopicPartition("orders", 0),
        consumed_to=EpochOffset(9, 3),
        divergence=EpochOffset(7, 3),
        detected_by=DetectedBy.DIVERGING_EPOCH,
        new_leader_epoch=4,
        position_source=PositionSource.RESET_EARLIEST,
    )
    event = TruncationDetected(report, TruncationOutcome.REWIND, EpochOffset(7, 4))
    with caplog.at_level(logging.DEBUG, logger="epochguard"):
        log_events([event])
        get_logger("epochguard.test_enums").info("other", color=_Color.RED, level=_Level.HIGH)
    first, other = caplog.records
    assert first.msg["position_source"] == "reset_earliest"
    assert type(first.msg["position_source"]) is str
    assert type(first.msg["decision"]) is str and first.msg["decision"] == "rewind"
    text = first.getMessage()
    assert "position_source='reset_earliest'" in text and "decision='rewind'" in text
    assert "<" not in text, text
    assert other.getMessage() == "other color='red' level=3"
    assert type(other.msg["level"]) is int
    rendered = json.loads(json.dumps(dict(first.msg)))
    assert rendered["position_source"] == "reset_earliest"
