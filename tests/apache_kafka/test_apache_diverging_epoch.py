"""Fetch DivergingEpoch (KIP-595) as the consumer's validation on real Kafka 4.x brokers.

A consumer whose new leader answered its Fetch v12+ before sends no OffsetForLeaderEpoch
after a leader change: the next fetch carries LastFetchedEpoch and the broker compares it
(Partition.readRecords). After an unclean election that answer is DivergingEpoch, and the
truncation report equals the one a Fetch v11 consumer (validating by OffsetForLeaderEpoch)
gets from the same brokers at the same time, but for ``detected_by``.

Topic RF=2 on brokers A=0 and B=1 (min.insync.replicas=1); broker 2 stays up throughout.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import attrs
import pytest
from kafka import TopicPartition

from epochguard import EpochConsumer
from epochguard.offsets.report import DetectedBy
from epochguard.testing import produce
from epochguard.testing.apache_kafka import ApacheKafkaCluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

A, B = 0, 1
_names = itertools.count()


def _read_to(consumers: dict[str, EpochConsumer], tp: TopicPartition, offset: int) -> None:
    deadline = time.monotonic() + 60
    for c in consumers.values():
        while (pos := c.position_with_epoch(tp)) is None or pos.offset < offset:
            assert time.monotonic() < deadline, f"consumer stuck at {pos}, wanted {offset}"
            c.poll(timeout_ms=100)


def _metric(c: EpochConsumer, name: str) -> int:
    metrics: Any = c.metrics(raw=True)
    return int(metrics[name])


def test_diverging_epoch_reports_what_offset_for_leader_epoch_reports(
    cluster: ApacheKafkaCluster,
) -> None:
    topic = f"diverging-{os.getpid()}-{next(_names)}"
    tp = TopicPartition(topic, 0)
    cluster.create_topic(topic, assignments={0: [A, B]}, config={"min.insync.replicas": "1"})
    produce(cluster, topic, [f"a{i}" for i in range(5)])
    cluster.wait_for_isr(topic, 0, [A, B])
    settings = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 200,
    }
    consumers = {
        "v17": EpochConsumer(**settings, client_id="diverging-v17"),
        "v11": EpochConsumer(**settings, client_id="diverging-v11", max_fetch_version=11),
    }
    try:
        for c in consumers.values():
            c.assign([tp])
        _read_to(consumers, tp, 5)
        # Two clean changes, A -> B -> A, with a record read from each leader: both
        # brokers have now answered this consumer's fetches.
        for leader, value in ((B, "c0"), (A, "c1")):
            cluster.wait_for_isr(topic, 0, [A, B])
            cluster.elect_leader(topic, 0, leader)
            produce(cluster, topic, [value])
            _read_to(consumers, tp, 6 if value == "c0" else 7)
        cluster.wait_for_isr(topic, 0, [A, B])
        # The unclean change: A alone takes d0..d2 (offsets 7..9), the consumers read them;
        # A stops, B is elected uncleanly and takes b0, b1 at offsets 7, 8.
        cluster.stop_broker(B)
        cluster.wait_for_isr(topic, 0, [A])
        produce(cluster, topic, ["d0", "d1", "d2"])
        _read_to(consumers, tp, 10)
        asked = {
            name: _metric(c, "offset_for_leader_epoch_requests") for name, c in consumers.items()
        }
        a_epoch = cluster.leader_epoch(topic, 0)
        cluster.stop_broker(A)
        cluster.wait_for_partition(topic, 0, lambda s: s.leader < 0, "no leader")
        cluster.start_broker(B)
        cluster.elect_leader(topic, 0, B, unclean=True)
        produce(cluster, topic, ["b0", "b1"])
        deadline = time.monotonic() + 60
        got: dict[str, list[tuple[int, bytes]]] = {name: [] for name in consumers}
        for name, c in consumers.items():
            # Both rewind to the divergence and read the new leader's records there.
            while not c.truncation_reports() or len(got[name]) < 2:
                assert time.monotonic() < deadline, f"{name}: {c.truncation_reports()} {got}"
                for records in c.poll(timeout_ms=100).values():
                    got[name] += [(r.offset, r.value) for r in records]
            assert got[name][:2] == [(7, b"b0"), (8, b"b1")]
        [by_fetch] = consumers["v17"].truncation_reports()
        [by_request] = consumers["v11"].truncation_reports()
        assert by_fetch.detected_by is DetectedBy.DIVERGING_EPOCH
        assert (by_fetch.lost_from, by_fetch.lost_to) == (7, 10)
        assert by_fetch.divergence is not None and by_fetch.divergence.leader_epoch == a_epoch
        assert attrs.evolve(by_fetch, detected_by=by_request.detected_by) == by_request
        assert _metric(consumers["v17"], "offset_for_leader_epoch_requests") == asked["v17"]
        assert _metric(consumers["v11"], "offset_for_leader_epoch_requests") > asked["v11"]
        assert _metric(consumers["v17"], "diverging_epoch_responses") >= 1
    finally:
        for c in consumers.values():
            c.close()
