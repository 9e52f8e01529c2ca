"""Which of the Spark Kafka connector's jars are passed to Spark (no Maven, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochguard.testing.apache_kafka import KafkaUnavailableError
from epochguard.testing.apache_kafka.spark_kafka import (
    artifact_name,
    ensure_spark_kafka_jars,
    jars_to_add,
)


@pytest.mark.parametrize(
    ("jar", "name"),
    [
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("scala-parallel-collections_2.13-1.2.0.jar", "scala-parallel-collections_2.13"),
        ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
        ("commons-pool2-2.13.1.jar", "commons-pool2"),
    ],
)
def test_artifact_name_drops_the_version(jar: str, name: str) -> None:
    assert artifact_name(Path(jar)) == name


def test_only_artifacts_the_runtime_lacks_are_added() -> None:
    closure = [
        Path(n)
        for n in (
            "commons-pool2-2.13.1.jar",
            "kafka-clients-3.9.2.jar",
            "lz4-java-1.10.1.jar",
            "scala-library-2.13.15.jar",
            "spark-sql-kafka-0-10_2.13-4.2.0.jar",
            "spark-tags_2.13-4.2.0.jar",
        )
    ]
    shipped = [
        Path(n)
        for n in ("lz4-java-1.11.0.jar", "scala-library-2.13.18.jar", "spark-tags_2.13-4.3.0.jar")
    ]
    added = jars_to_add(closure, shipped)
    assert [p.name for p in added] == [
        "commons-pool2-2.13.1.jar",
        "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    ]


def test_a_connector_newer_than_the_runtime_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KafkaUnavailableError, match="newer than the installed pyspark"):
        ensure_spark_kafka_jars("99.0.0", root=tmp_path)
    assert not list(tmp_path.iterdir())
