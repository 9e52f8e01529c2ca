"""A Python streaming source that yields ready Arrow batches: the ceiling of the hand-off.

``format("ready_batches")`` reads no Kafka: each of its ``parts`` tasks yields one Arrow
batch of ``batch`` rows (our source's schema, ``value_bytes`` values) again and again until
it has yielded ``rows / parts`` rows. What Spark then does with the batches (reading them
from the Python worker, turning columns into rows, the sink) is what any Python data source
pays, ours included; its rows/s is the most a Python source can reach in that session, and
``benchmarks/spark_source.py`` runs it next to both Kafka sources.

The classes are pickled by value (``register``): workers need not import ``benchmarks``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

NAME = "ready_batches"


class ReadyBatches(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Our source's schema, written out: this source imports nothing of epochguard, so
        # its planner processes and workers pay pyspark's imports alone.
        return (
            "key binary, value binary, topic string, partition int, offset long, "
            "timestamp timestamp, timestampType int, leaderEpoch int"
        )

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        opts = self.options
        return _Reader(
            int(opts.get("rows", "300000")),
            int(opts.get("value_bytes", "1024")),
            int(opts.get("batch", "4096")),
            int(opts.get("parts", "1")),
        )


class _Reader(DataSourceStreamReader):
    def __init__(self, rows: int, value_bytes: int, batch: int, parts: int) -> None:
        self.rows, self.value_bytes, self.batch, self.parts = rows, value_bytes, batch, parts

    def initialOffset(self) -> dict[str, int]:
        return {"done": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"done": 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        if start == end:
            return []
        return [InputPartition(i) for i in range(self.parts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        schema = pa.schema(
            [
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
                ("timestampType", pa.int32()),
                ("leaderEpoch", pa.int32()),
            ]
        )
        n = self.batch
        cols = [
            pa.array([b"%d" % i for i in range(n)], pa.binary()),
            pa.array([b"v" * self.value_bytes] * n, pa.binary()),
            pa.repeat(pa.scalar("t", pa.string()), n),
            pa.repeat(pa.scalar(0, pa.int32()), n),
            pa.array(range(n), pa.int64()),
            pa.array([0] * n, pa.timestamp("us", tz="UTC")),
            pa.array([0] * n, pa.int32()),
            pa.array([0] * n, pa.int32()),
        ]
        batch = pa.RecordBatch.from_arrays(cols, schema=schema)
        left = self.rows // self.parts
        while left > 0:
            out = batch if left >= n else batch.slice(0, left)
            left -= out.num_rows
            yield out

    def commit(self, end: dict[str, int]) -> None:
        pass


def register(spark: Any) -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(ReadyBatches)
