"""epochguard.spark_connector: a PySpark data source whose offsets carry leader epochs.

The decision logic (options, offsets, planning) is sans-IO and imports
without pyspark. See docs/spark.md.
"""

from __future__ import annotations

from epochguard.spark_connector.errors import (
    LOG_TRUNCATION_CODE,
    OffsetsJsonError,
    SourceOptionError,
    SparkLogTruncationError,
)
from epochguard.spark_connector.offsets import SourceOffset
from epochguard.spark_connector.options import SourceOptions, parse_options

__all__ = [
    "LOG_TRUNCATION_CODE",
    "OffsetsJsonError",
    "SourceOffset",
    "SourceOptionError",
    "SourceOptions",
    "SparkLogTruncationError",
    "parse_options",
]
