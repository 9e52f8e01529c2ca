"""EpochConsumer's security settings reach the wire: real Kafka with a SASL_PLAINTEXT (PLAIN)
listener, kafka-python's config names passed through unchanged."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka import KafkaProducer
from kafka.structs import TopicPartition

from epochguard import EpochConsumer, EpochOffset
from epochguard.testing import ApacheKafkaCluster
from epochguard.testing.apache_kafka import ClusterError, KafkaJars

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

USERS = {"alice": "alice-secret"}
TOPIC = "secured"


@pytest.fixture(scope="module")
def sasl_cluster(kafka_jars: KafkaJars) -> Iterator[ApacheKafkaCluster]:
    with ApacheKafkaCluster(brokers=1, jars=kafka_jars, sasl_users=USERS) as cluster:
        cluster.create_topic(TOPIC, replication_factor=1)
        producer = KafkaProducer(
            bootstrap_servers=cluster.sasl_bootstrap_servers,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="alice",
            sasl_plain_password="alice-secret",
        )
        try:
            for i in range(5):
                producer.send(TOPIC, b"s%d" % i, partition=0).get(timeout=15)
        finally:
            producer.close(timeout=5)
        yield cluster


def _sasl(cluster: ApacheKafkaCluster, password: str, **kw: Any) -> EpochConsumer:
    return EpochConsumer(
        bootstrap_servers=cluster.sasl_bootstrap_servers,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password=password,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **kw,
    )


def test_consumes_and_commits_with_epochs_over_sasl_plain(
    sasl_cluster: ApacheKafkaCluster,
) -> None:
    tp = TopicPartition(TOPIC, 0)
    with _sasl(sasl_cluster, "alice-secret", group_id="sasl-group") as consumer:
        consumer.assign([tp])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got += records
        assert [(r.offset, r.value, r.leader_epoch) for r in got] == [
            (i, b"s%d" % i, 0) for i in range(5)
        ]
        consumer.commit()
        assert consumer.committed_with_epoch(tp) == EpochOffset(5, 0)


def test_a_wrong_password_is_a_clear_error_at_construction(
    sasl_cluster: ApacheKafkaCluster,
) -> None:
    started = time.monotonic()
    with pytest.raises(kerrors.SaslAuthenticationFailedError) as info:
        _sasl(sasl_cluster, "wrong", bootstrap_timeout_ms=60_000)
    # Raised at the first refusal, as Java does, not after retrying for the whole timeout.
    assert time.monotonic() - started < 30
    assert sasl_cluster.sasl_bootstrap_servers in str(info.value)
    assert "Invalid username or password" in str(info.value)


def test_a_cluster_without_sasl_users_has_no_sasl_listener(kafka_jars: KafkaJars) -> None:
    cluster = ApacheKafkaCluster(brokers=1, jars=kafka_jars)
    with pytest.raises(ClusterError, match="no SASL listener"):
        _ = cluster.sasl_bootstrap_servers
    with pytest.raises(ValueError, match="SASL user"):
        ApacheKafkaCluster(brokers=1, jars=kafka_jars, sasl_users={"bad name": "x"})
