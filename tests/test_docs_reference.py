"""The reference pages and the operations guide name everything the code has: every
exception class, every metric, every command-line option and control operation; and the
testing guides' control API tables name only methods the clusters have."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import epochguard.consumer.errors as consumer_errors
import epochguard.offsets.errors as core_errors
import epochguard.spark_connector.errors as spark_errors
import epochguard.testing as testing
from epochguard.consumer.fetcher import FetcherMetrics
from epochguard.testing.__main__ import parser as cluster_parser
from epochguard.testing.control import OPERATIONS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _exceptions(module: object) -> set[str]:
    return {
        name
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, Exception)
        and obj.__module__ == getattr(module, "__name__", None)
    }


def test_every_error_class_is_in_the_errors_reference() -> None:
    text = (DOCS / "reference" / "errors.md").read_text()
    names = _exceptions(consumer_errors) | _exceptions(core_errors) | _exceptions(spark_errors)
    assert {"LogTruncationError", "SourceOptionError", "OffsetStoreError"} <= names
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, missing
    assert spark_errors.LOG_TRUNCATION_CODE in text


def test_every_metric_is_in_the_operations_guide() -> None:
    text = (DOCS / "guides" / "operations.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    counters = set(vars(FetcherMetrics())) | {
        "heartbeats_sent",
        "rebalances",
        "assigned_partitions",
        "partitions_awaiting_seek",
        "rebootstraps",
        "telemetry_pushes",
    }
    missing = sorted(c for c in counters if f"`{c}`" not in section)
    assert not missing, missing


def test_every_cluster_option_and_control_operation_is_in_the_cli_reference() -> None:
    text = (DOCS / "reference" / "cli.md").read_text()
    options = [  # the documented ones: hidden options (help suppressed) are for tests
        s
        for a in cluster_parser()._actions
        if a.help != argparse.SUPPRESS
        for s in a.option_strings
        if s.startswith("--")
    ]
    assert "--control-port" in options
    missing = sorted(o for o in options if o != "--help" and f"`{o}" not in text)
    assert not missing, missing
    ops = sorted(name.replace("_", "-") for name in OPERATIONS)
    assert not [op for op in ops if f"`{op}`" not in text]


def _first_column_names(text: str, start: str, end: str) -> set[str]:
    """Names opening a backticked span (`name(` or `name`) in the first column of the tables
    between the two headings."""
    section = text.split(start, 1)[1].split(end, 1)[0]
    cells = [
        line.strip("|").split("|")[0]
        for line in section.splitlines()
        if line.startswith("|") and not line.startswith("|---")
    ]
    return {name for cell in cells for name in re.findall(r"`([a-z_]+)[(`]", cell)}


def test_control_api_tables_name_existing_methods() -> None:
    guides = DOCS / "guides"
    for page, start, end, cls in (
        ("testing.md", "## Control API", "## Behaviour worth knowing", testing.EmbeddedCluster),
        (
            "testing-real-kafka.md",
            "## The control API",
            "### Per-replica",
            testing.ApacheKafkaCluster,
        ),
    ):
        names = _first_column_names((guides / page).read_text(), start, end)
        assert {"create_topic", "elect_leader"} <= names, (page, names)
        # A method of the cluster, or a helper of epochguard.testing (produce, wait_until).
        unknown = sorted(n for n in names if not hasattr(cls, n) and not hasattr(testing, n))
        assert not unknown, (page, unknown)
