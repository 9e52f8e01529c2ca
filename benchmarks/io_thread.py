"""EpochConsumer with and without kafka-python's IO thread, side by side with
confluent-kafka: does serving the connections from the thread that calls ``poll()``
(``io_thread=False``: no GIL hand-off between an IO thread and the poll thread) read faster?

Method: ``benchmarks/matrix.py``'s, client for client (fresh process per run, CRC checks on,
every key and value touched and the byte total checked, timed from the first poll to the
last record, clients interleaved within a case, ``MATRIX_REPEAT`` rounds); the clients:

* ``epochguard-io-thread``: ``EpochConsumer(io_thread=True)``, kafka-python's IO thread
  reads the sockets and the answers are decoded on the thread calling ``poll()``;
* ``epochguard-inline``: ``EpochConsumer(io_thread=False)``, ``poll()`` steps the
  connections' selector itself;
* ``confluent-kafka``: the matrix's confluent-kafka client;
* ``embedded-alone`` (EmbeddedCluster only): what the test broker serves with no decoding.

Each row has both drivers' best and median rates, CPU seconds per million records (median
and per round) and the ratios of each to confluent-kafka (best and median rounds), and the
load average before and after the case.

``IO_THREAD_BROKERS`` picks the brokers (default ``embedded``): ``embedded`` (the
EmbeddedCluster, cases ``MATRIX_CASES``, default
``1024x1,1024x8,100x1,10240x1,1024x1:lz4,1024x1:zstd,1024x8:lz4``) and
``apache`` (one Apache Kafka 4.3.1 broker as ``benchmarks/matrix_apache.py`` runs it, cases
``MATRIX_APACHE_CASES``, default ``1024x1,1024x8``). A run keeps the previous result's
section of a broker it did not run. Record counts: the matrix's, scaled by ``MATRIX_SCALE``
(the committed result: 0.5, ``MATRIX_REPEAT=5``).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import matrix

DRIVERS = ["epochguard-io-thread", "epochguard-inline"]
CLIENTS = [*DRIVERS, "confluent-kafka"]
RESULT = Path(__file__).resolve().parent / "results" / "io_thread.json"


def _ratios(row: dict[str, Any]) -> None:
    """Each driver against confluent-kafka and inline against the IO thread, of the best
    and of the median rounds."""
    pairs = [(d, "confluent-kafka") for d in DRIVERS] + [tuple(reversed(DRIVERS))]
    for mine, other in pairs:
        if row.get(mine) and row.get(other):
            row[f"{mine}_vs_{other}"] = round(row[mine] / row[other], 2)
            row[f"{mine}_vs_{other}_median"] = round(
                statistics.median(row[f"{mine}_rounds"])
                / statistics.median(row[f"{other}_rounds"]),
                2,
            )
    for client in CLIENTS:
        rounds = row.get(f"{client}_rounds")
        if rounds:
            row[f"{client}_median"] = round(statistics.median(rounds))
    # matrix.summarise compares "epochguard" with the others; no such client here.
    for key in [k for k in row if k.startswith("epochguard_vs_")]:
        del row[key]


def run_embedded() -> dict[str, Any]:
    cases = matrix.parse_cases(
        os.environ.get(
            "MATRIX_CASES", "1024x1,1024x8,100x1,10240x1,1024x1:lz4,1024x1:zstd,1024x8:lz4"
        )
    )
    rows = []
    for size, parts, codec in cases:
        row = matrix.run_case(size, parts, codec, [*CLIENTS, "embedded-alone"])
        _ratios(row)
        rows.append(row)
    return {"scale": matrix.SCALE, "repeat": matrix.REPEAT, "cases": rows}


def run_apache() -> dict[str, Any]:
    import logging

    from benchmarks import matrix_apache
    from epochguard.testing.apache_kafka import ApacheKafkaCluster

    logging.disable(logging.CRITICAL)
    cases = matrix.parse_cases(os.environ.get("MATRIX_APACHE_CASES", "1024x1,1024x8"))
    rows = []
    with ApacheKafkaCluster(brokers=1) as cluster:
        for size, parts, codec in cases:
            row = matrix_apache.run_case(cluster, size, parts, codec, CLIENTS)
            _ratios(row)
            rows.append(row)
        version = cluster.kafka_version
    return {
        "broker": f"Apache Kafka {version}, one broker, KRaft",
        "scale": matrix.SCALE,
        "repeat": matrix.REPEAT,
        "cases": rows,
    }


def run() -> dict[str, Any]:
    brokers = [b.strip() for b in os.environ.get("IO_THREAD_BROKERS", "embedded").split(",")]
    previous: dict[str, Any] = {}
    previous_at = None
    if RESULT.exists():
        record = json.loads(RESULT.read_text())
        previous, previous_at = record.get("result", {}), record.get("started_at")
    result: dict[str, Any] = {"method": __doc__, "settings": matrix.SETTINGS["epochguard"]}
    for broker, runner in (("embedded", run_embedded), ("apache", run_apache)):
        if broker in brokers:
            result[broker] = runner()
            result[broker]["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        elif broker in previous:
            result[broker] = previous[broker]
            result[broker].setdefault("measured_at", previous_at)
    return result
