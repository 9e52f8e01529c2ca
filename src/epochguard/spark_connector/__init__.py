"""epochguard.spark_connector: a PySpark data source whose offsets carry leader epochs.

``register(spark)`` makes ``spark.read.format("epochguard")`` and
``spark.readStream.format("epochguard")`` available (pyspark >= 4.2 and pyarrow: the
``spark`` extra). The decision logic (options, offsets, planning) is sans-IO and imports
without pyspark. See docs/guides/spark.md.
"""

from __future__ import annotations

from typing import Any

from epochguard.spark_connector.errors import (
    LOG_TRUNCATION_CODE,
    OffsetsJsonError,
    SourceOptionError,
    SparkLogTruncationError,
)
from epochguard.spark_connector.offsets import SourceOffset
from epochguard.spark_connector.options import SourceOptions, parse_options

__all__ = [
    "FILTER_PUSHDOWN_CONF",
    "LOG_TRUNCATION_CODE",
    "OffsetsJsonError",
    "SourceOffset",
    "SourceOptionError",
    "SourceOptions",
    "SparkLogTruncationError",
    "parse_options",
    "register",
]


FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
"""Spark's switch for filter pushdown into Python data sources (off by default). A batch
read with the option ``filterPushdown=true`` needs it on in the session: Spark fails a read
whose reader takes filters while it is off."""


def register(spark: Any) -> None:
    """Register the ``epochguard`` data source with a SparkSession."""
    # Imported here: the sans-IO modules above must work without pyspark installed.
    from epochguard.spark_connector.datasource import EpochGuardDataSource

    spark.dataSource.register(EpochGuardDataSource)
