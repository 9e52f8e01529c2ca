"""Small helpers for tests written against the ``Cluster`` protocol (either cluster)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from kafka import KafkaProducer

from epochguard.testing.cluster import Cluster

__all__ = ["WaitTimeout", "produce", "wait_until"]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """``wait_until`` gave up; the message names what it waited for and the last error."""


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = 30.0,
               interval: float = 0.1) -> T:
    """Call ``probe`` until it returns something other than ``None``/``False``; return it.

    Exceptions from ``probe`` count as "not yet" (clusters raise while they catch up); the
    last one is named if ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}"
                              + (f" (last error: {last!r})" if last is not None else ""))
        time.sleep(interval)


def produce(cluster: Cluster, topic: str, values: Sequence[str | bytes], partition: int = 0,
            timeout: float = 15.0) -> None:
    """Write ``values`` in order to one partition through its leader, as a producer with
    ``acks=1`` (one request, so one batch, per record), waiting for each acknowledgement.

    ``acks=1`` is what lets a leader accept records its followers never get: the way to
    stage an unclean election with lost records.
    """
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, acks=1,
                             enable_idempotence=False, linger_ms=0, retries=5)
    try:
        for value in values:
            data = value.encode() if isinstance(value, str) else value
            producer.send(topic, data, partition=partition).get(timeout=timeout)
    finally:
        producer.close(timeout=5)
