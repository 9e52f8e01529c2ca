"""EpochConsumer with ``record_format="columns"``: ``poll_columns()`` hands out column
buffers with the same positions, epochs and truncation handling as ``poll()``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from epochguard.consumer import ConsumerConfigError, EpochConsumer
from epochguard.consumer.columns import RecordColumns
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.testing import EmbeddedCluster

from .conftest import TP0, diverge, make_consumer, setup_topic, unclean_elect

pytestmark = pytest.mark.timeout(60)


def _read_columns(
    consumer: EpochConsumer, n: int, max_records: int | None = None, timeout: float = 10.0
) -> list[tuple[Any, ...]]:
    """(offset, leader epoch, value) of ``n`` rows read with poll_columns."""
    rows: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + timeout
    while len(rows) < n and time.monotonic() < deadline:
        for tp, cols in consumer.poll_columns(timeout_ms=100, max_records=max_records).items():
            assert tp == TP0 and isinstance(cols, RecordColumns)
            arrays = cols.to_arrow()
            rows += zip(
                arrays["offset"].to_pylist(),
                arrays["leaderEpoch"].to_pylist(),
                arrays["value"].to_pylist(),
                strict=True,
            )
    return rows


def test_columns_carry_epochs_through_an_unclean_election(cluster: EmbeddedCluster) -> None:
    reports: list[TruncationReport] = []
    with make_consumer(
        cluster,
        record_format="columns",
        on_truncation="rewind",
        on_truncation_report=reports.append,
    ) as consumer:
        old, new = setup_topic(cluster)
        consumer.assign([TP0])
        # max_records 3: every fetch is handed out in slices (views of one fetch's columns).
        assert _read_columns(consumer, 10, max_records=3) == [
            (i, 0, b"kept-%d" % i) for i in range(10)
        ]
        diverge(cluster, old, new)
        assert _read_columns(consumer, 5) == [(10 + i, 0, b"maybe-lost-%d" % i) for i in range(5)]
        assert consumer.position_with_epoch(TP0) == EpochOffset(15, 0)
        unclean_elect(cluster, old, new)
        assert _read_columns(consumer, 8) == [(10 + i, 2, b"new-%d" % i) for i in range(8)]
        assert [(r.divergence, r.lost_count) for r in reports] == [(EpochOffset(10, 0), 5)]
        with pytest.raises(ConsumerConfigError, match=r"record_format.*poll_columns"):
            consumer.poll()
    with (
        make_consumer(cluster) as plain,
        pytest.raises(ConsumerConfigError, match=r"record_format.*'columns'"),
    ):
        plain.poll_columns()


def test_column_headers_come_from_the_fetch_with_their_rows(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=1)
    headers = [[("h", b"x"), ("n", None)], [], [("\u00e9", b"")]]
    cluster.append("t", 0, [(b"k%d" % i, b"v%d" % i, h) for i, h in enumerate(headers)] * 4)
    with make_consumer(cluster, record_format="columns", column_headers=True) as consumer:
        consumer.assign([TP0])
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while len(got) < 12 and time.monotonic() < deadline:
            for cols in consumer.poll_columns(timeout_ms=100, max_records=5).values():
                arrays = cols.to_arrow()
                got += zip(arrays["offset"].to_pylist(), arrays["headers"].to_pylist(), strict=True)
    expected = [[{"key": k, "value": v} for k, v in h] or None for h in headers] * 4
    assert got == list(enumerate(expected))


def test_record_format_is_checked_before_connecting() -> None:
    with pytest.raises(ConsumerConfigError, match=r"record_format.*'rows'"):
        EpochConsumer(bootstrap_servers="127.0.0.1:1", record_format="rows")
    with pytest.raises(ConsumerConfigError, match=r"column_headers.*record_format='columns'"):
        EpochConsumer(bootstrap_servers="127.0.0.1:1", column_headers=True)
    with pytest.raises(ConsumerConfigError, match=r"column_headers.*True or False"):
        EpochConsumer(bootstrap_servers="127.0.0.1:1", record_format="columns", column_headers=1)
    with pytest.raises(ConsumerConfigError, match=r"value_deserializer.*columns"):
        EpochConsumer(
            bootstrap_servers="127.0.0.1:1", record_format="columns", value_deserializer=bytes
        )
