"""A Python streaming source of stamped records on a schedule, without Kafka: the floor of
a running query's latency for any Python data source.

``format("paced_stamps")`` reads a clock file (option ``clock``, JSON written by the
benchmark): record 0 exists from ``first`` on, record ``i >= 1`` from ``steady + (i - 1) /
rate``, up to ``count`` records; before ``first`` there are none. ``latestOffset`` counts
the records that exist, and ``read`` yields their values as ``benchmarks.spark_latency``
stamps them (scheduled time, index). So a query on it pays what Spark charges every Python
streaming source (the source runner's calls, a Python worker per task, the Arrow hand-off)
and nothing for I/O: ``benchmarks/spark_latency.py`` runs it next to both Kafka sources.

The classes are pickled by value (``register``): workers need not import ``benchmarks``.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

NAME = "paced_stamps"


def write_clock(path: str, first: float, steady: float | None = None) -> None:
    """Start the schedule (``first``), then its steady part (``steady``)."""
    with open(path + ".tmp", "w") as fh:
        json.dump({"first": first, "steady": steady}, fh)
    os.replace(path + ".tmp", path)


class PacedStamps(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "value binary"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        opts = self.options
        return _Reader(opts["clock"], float(opts["rate"]), int(opts["count"]), int(opts["bytes"]))


class _Reader(DataSourceStreamReader):
    def __init__(self, clock: str, rate: float, count: int, value_bytes: int) -> None:
        self.clock, self.rate, self.count, self.value_bytes = clock, rate, count, value_bytes

    def _schedule(self) -> tuple[float | None, float | None]:
        try:
            with open(self.clock) as fh:
                got = json.load(fh)
        except FileNotFoundError:
            return None, None
        return got["first"], got["steady"]

    def _existing(self, now: float) -> int:
        first, steady = self._schedule()
        if first is None or now < first:
            return 0
        if steady is None or now < steady:
            return 1
        return min(self.count, 2 + int((now - steady) * self.rate))

    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"n": self._existing(time.time())}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        if end["n"] <= start["n"]:
            return []
        first, steady = self._schedule()
        return [InputPartition((start["n"], end["n"], first, steady))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        begin, end, first, steady = partition.value
        stamp = struct.Struct(">dI")
        values = []
        for i in range(begin, end):
            sent = first if i == 0 else steady + (i - 1) / self.rate
            values.append(stamp.pack(sent, i).ljust(self.value_bytes, b"."))
        yield pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])

    def commit(self, end: dict[str, int]) -> None:
        pass


def register(spark: Any) -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(PacedStamps)
