"""The matrix's headline cells on real Apache Kafka: the same four clients, the same
reading loops, a broker that is not ours.

Method (``benchmarks/matrix.py`` is the reference; what differs is said here):

* One Apache Kafka 4.3.1 broker (KRaft, the jars ``make kafka-jars`` caches) runs as its
  own JVM process (:class:`~epochguard.testing.apache_kafka.ApacheKafkaCluster`). Each
  case's topic is written before any client starts, by confluent-kafka's producer
  (``acks=1``, ``linger.ms`` 50, ``batch.size`` ``PRELOAD_BATCH_BYTES``, default 1 MiB as
  librdkafka's, the case's ``compression.type``), with the matrix's 8-byte keys and
  text-like values. Batch sizes are therefore the producer's, not the matrix's 500-record
  batches (whether the batch shape moves one client more than another was not settled:
  single runs on the shared machine moved by 2x either way).
* Each client run is a fresh process running ``benchmarks.matrix``'s own client code
  (CRC checks on, every key and value touched and the byte total checked), timed from its
  first poll to its last record; clients interleaved, ``MATRIX_REPEAT`` rounds, best rate
  and median CPU kept. There is no ``embedded-alone`` row: the broker is not ours to walk.
* The load average is recorded before and after each case.

Cases: ``MATRIX_APACHE_CASES`` (default ``100x1,100x8,1024x1,1024x8,1024x1:lz4``), record
counts from the matrix scaled by ``MATRIX_SCALE``.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

from benchmarks import matrix
from benchmarks._common import produce

CLIENTS = [c for c in matrix.CLIENTS if c != "embedded-alone"]
DEFAULT_CASES = "100x1,100x8,1024x1,1024x8,1024x1:lz4"


def cases() -> list[tuple[int, int, str]]:
    return matrix.parse_cases(os.environ.get("MATRIX_APACHE_CASES", DEFAULT_CASES))


def preload(bootstrap: str, size: int, parts: int, codec: str, total: int) -> None:
    values = matrix._values(size, random.Random(0))
    produce(
        bootstrap,
        matrix.TOPIC,
        total,
        partitions=parts,
        value=lambda i: values[i % len(values)],
        key=lambda i: i.to_bytes(matrix.KEY_BYTES, "big"),
        compression=codec,
        linger_ms=50,
        batch_bytes=int(os.environ.get("PRELOAD_BATCH_BYTES", 1024 * 1024)),
    )


def run_case(
    cluster: Any, size: int, parts: int, codec: str, clients: list[str] | None = None
) -> dict[str, Any]:
    total = int(matrix.RECORDS[size] * matrix.SCALE)
    total -= total % parts
    cluster.create_topic(matrix.TOPIC, partitions=parts, replication_factor=1)
    try:
        preload(cluster.bootstrap_servers, size, parts, codec, total)
        row: dict[str, Any] = {
            "value_bytes": size,
            "key_bytes": matrix.KEY_BYTES,
            "partitions": parts,
            "compression": codec,
            "records": total,
        }
        runs = matrix.run_rounds(
            clients or CLIENTS, cluster.bootstrap_servers, size, parts, total, row
        )
    finally:
        cluster.delete_topic(matrix.TOPIC)
    matrix.summarise(row, runs, total)
    print(json.dumps(row), flush=True)
    return row


def run() -> dict[str, Any]:
    import logging

    from epochguard.testing.apache_kafka import ApacheKafkaCluster

    logging.disable(logging.CRITICAL)
    with ApacheKafkaCluster(brokers=1) as cluster:
        rows = [run_case(cluster, *case) for case in cases()]
        version = cluster.kafka_version
    return {
        "method": __doc__,
        "broker": f"Apache Kafka {version}, one broker, KRaft",
        "settings": {c: matrix.SETTINGS[c] for c in CLIENTS},
        "preload_batch_bytes": int(os.environ.get("PRELOAD_BATCH_BYTES", 1024 * 1024)),
        "repeat": matrix.REPEAT,
        "scale": matrix.SCALE,
        "cases": rows,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
