"""Differential: the same transactional workload through kafka-python's and confluent-kafka's
transactional producers against real Kafka and the EmbeddedCluster gives the same answers:
record offsets, high watermarks and last stable offsets, the aborted transactions of a
read_committed Fetch, what read_committed readers (kafka-python, librdkafka, EpochConsumer)
see, the group offsets committed in the transaction, and the admin APIs' view
(DescribeTransactions, ListTransactions, DescribeProducers)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from epochguard.testing import EmbeddedCluster
from epochguard.testing.apache_kafka import ApacheKafkaCluster

from .. import txn_workload as w

pytestmark = pytest.mark.timeout(180)

WORKLOADS: dict[str, Callable[[str, str, str, tuple[str, str]], Any]] = {
    "kafka-python": w.kafka_python_workload,
    "confluent-kafka": w.confluent_workload,
}


def _run(
    bootstrap: str, create: Callable[[str], None], client: str, run_id: str
) -> tuple[w.Observation, Any]:
    topic = f"txn-{client}-{run_id}"
    group = f"group-{client}-{run_id}"
    ids = (f"{client}-a-{run_id}", f"{client}-b-{run_id}")
    create(topic)
    left_open = WORKLOADS[client](bootstrap, topic, group, ids)
    try:
        observed = w.observe(bootstrap, topic, group, ids)
        # KIP-664's abort of the open transaction, as an operator frees a hanging one.
        after_abort = w.abort_with_admin(bootstrap, topic, 0, ids[1], ids)
    finally:
        if client == "kafka-python":
            left_open.abort_transaction()
            left_open.close()
        else:
            left_open.abort_transaction(20)
    # The names carry the run id; compare them without it.
    hw, lso, aborted = after_abort
    return _without(observed, f"-{run_id}"), (
        hw,
        lso,
        [(t.removesuffix(f"-{run_id}"), o) for t, o in aborted],
    )


def _without(observed: w.Observation, suffix: str) -> w.Observation:
    def name(n: str) -> str:
        return n.removesuffix(suffix)

    return attrs.evolve(
        observed,
        fetch_answers={
            p: (hw, lso, [(name(t), o) for t, o in aborted])
            for p, (hw, lso, aborted) in observed.fetch_answers.items()
        },
        transactions={name(k): v for k, v in observed.transactions.items()},
        ongoing=[name(t) for t in observed.ongoing],
        producers={
            p: [(name(t), epoch, seq, start) for t, epoch, seq, start in states]
            for p, states in observed.producers.items()
        },
    )


@pytest.mark.parametrize("client", sorted(WORKLOADS))
def test_transactional_workload_answers_as_real_kafka(
    cluster: ApacheKafkaCluster, client: str
) -> None:
    run_id = uuid.uuid4().hex[:8]
    real, real_abort = _run(
        cluster.bootstrap_servers,
        lambda t: cluster.create_topic(t, partitions=2, replication_factor=3),
        client,
        run_id,
    )
    with EmbeddedCluster(brokers=3) as embedded:
        mine, my_abort = _run(
            embedded.bootstrap_servers,
            lambda t: embedded.create_topic(t, partitions=2, replication_factor=3),
            client,
            run_id,
        )
    assert real.read_uncommitted == w.EXPECTED_UNCOMMITTED
    assert real.kafka_python_committed == w.EXPECTED_COMMITTED
    assert mine == real
    # The admin abort wrote an ABORT marker at 7: the partition is stable again.
    assert real_abort == (8, 8, [(f"{client}-a", 3), (f"{client}-b", 6)])
    assert my_abort == real_abort


def test_fencing_answers_as_real_kafka(cluster: ApacheKafkaCluster) -> None:
    """A zombie producer and a stale group member are fenced alike on both clusters."""
    run_id = uuid.uuid4().hex[:8]
    topic, group, txn_id = f"fence-{run_id}", f"fence-group-{run_id}", f"fence-{run_id}"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    real = w.fencing_scenario(cluster.bootstrap_servers, topic, group, txn_id)
    with EmbeddedCluster(brokers=3) as embedded:
        embedded.create_topic(topic, partitions=1, replication_factor=3)
        mine = w.fencing_scenario(embedded.bootstrap_servers, topic, group, txn_id)
    assert real["zombie_commit"] == "ProducerFencedError"
    assert mine == real


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_epoch_consumer_group_metadata_answers_as_real_kafka(
    cluster: ApacheKafkaCluster, group_protocol: str
) -> None:
    """EpochConsumer's group metadata in a transaction (KIP-447): a stale generation or
    member epoch is refused alike, a current one commits the position with its epoch."""
    run_id = uuid.uuid4().hex[:8]
    topic, group, txn_id = f"meta-{run_id}", f"meta-group-{run_id}", f"meta-{run_id}"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    real = w.group_metadata_scenario(
        cluster.bootstrap_servers, topic, group, txn_id, group_protocol
    )
    with EmbeddedCluster(brokers=3) as embedded:
        embedded.create_topic(topic, partitions=1, replication_factor=3)
        mine = w.group_metadata_scenario(
            embedded.bootstrap_servers, topic, group, txn_id, group_protocol
        )
    assert real["committed"] == (3, 0)
    assert mine == real
