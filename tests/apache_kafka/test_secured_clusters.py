"""Secured clusters: EpochConsumer authenticates with kafka-python's own settings against both
test clusters (SASL_PLAINTEXT with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; SSL with a CA made
at test time), and on real Kafka with StandardAuthorizer an ACL refusal is a typed error.

One cluster of each kind per module; the EmbeddedCluster half needs no Java.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kafka.errors as kerrors
import pytest
from kafka import KafkaProducer
from kafka.structs import TopicPartition

from epochguard import EpochConsumer, EpochOffset
from epochguard.consumer import SslAuthenticationError
from epochguard.testing import ApacheKafkaCluster, EmbeddedCluster
from epochguard.testing.apache_kafka import ClusterError, KafkaJars
from epochguard.testing.tls import TlsMaterial, make_tls_material

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

USERS = {"alice": "alice-secret"}
TOPIC = "secured"
CLOSED_TOPIC = "closed"
GROUP = "sasl-group"
RECORDS = 5

#: (security_protocol, sasl_mechanism) pairs both clusters offer.
LOGINS = [
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SSL", None),
]
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

Secured = EmbeddedCluster | ApacheKafkaCluster


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def embedded_secured(tls: TlsMaterial) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=1, sasl_users=USERS, tls=tls) as cluster:
        cluster.create_topic(TOPIC, replication_factor=1)
        cluster.append(TOPIC, 0, [b"s%d" % i for i in range(RECORDS)])
        yield cluster


@pytest.fixture(scope="module")
def apache_secured(kafka_jars: KafkaJars, tls: TlsMaterial) -> Iterator[ApacheKafkaCluster]:
    with ApacheKafkaCluster(
        brokers=1, jars=kafka_jars, sasl_users=USERS, tls=tls, authorizer=True
    ) as cluster:
        cluster.create_topic(TOPIC, replication_factor=1)
        cluster.create_topic(CLOSED_TOPIC, replication_factor=1)
        # PLAINTEXT is the super user's listener: the producer needs no ACL.
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
        try:
            for i in range(RECORDS):
                producer.send(TOPIC, b"s%d" % i, partition=0).get(timeout=15)
        finally:
            producer.close(timeout=5)
        cluster.grant("alice", ("READ", "DESCRIBE"), topic=TOPIC)
        cluster.grant("alice", ("READ", "DESCRIBE"), group=GROUP)
        yield cluster


@pytest.fixture(params=["embedded", "apache"])
def secured(request: pytest.FixtureRequest) -> Secured:
    cluster: Secured = request.getfixturevalue(f"{request.param}_secured")
    return cluster


def _settings(
    cluster: Secured, protocol: str, mechanism: str | None, password: str = "alice-secret"
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap_servers": cluster.listener_bootstrap_servers(protocol),
        "security_protocol": protocol,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
    }
    if mechanism is not None:
        settings |= {
            "sasl_mechanism": mechanism,
            "sasl_plain_username": "alice",
            "sasl_plain_password": password,
        }
    if "SSL" in protocol:
        assert cluster.tls is not None
        settings["ssl_cafile"] = str(cluster.tls.cafile)
    return settings


def _consume(consumer: EpochConsumer, count: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got += records
    return got


@pytest.mark.parametrize(("protocol", "mechanism"), LOGINS)
def test_consumes_and_commits_with_epochs(
    secured: Secured, protocol: str, mechanism: str | None
) -> None:
    tp = TopicPartition(TOPIC, 0)
    epoch = secured.leader_epoch(TOPIC, 0)
    with EpochConsumer(**_settings(secured, protocol, mechanism), group_id=GROUP) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)  # every case of the module commits in this group
        got = _consume(consumer, RECORDS)
        assert [(r.offset, r.value, r.leader_epoch) for r in got] == [
            (i, b"s%d" % i, epoch) for i in range(RECORDS)
        ]
        consumer.commit()
        assert consumer.committed_with_epoch(tp) == EpochOffset(RECORDS, epoch)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_is_a_clear_error_at_construction(
    secured: Secured, mechanism: str
) -> None:
    started = time.monotonic()
    settings = _settings(secured, "SASL_PLAINTEXT", mechanism, password="wrong")
    with pytest.raises(kerrors.SaslAuthenticationFailedError) as info:
        EpochConsumer(**settings, bootstrap_timeout_ms=60_000)
    # Raised at the first refusal, as Java does, not after retrying for the whole timeout.
    assert time.monotonic() - started < 30
    assert settings["bootstrap_servers"] in str(info.value)
    expected = (
        "Invalid username or password"
        if mechanism == "PLAIN"
        else f"invalid credentials with SASL mechanism {mechanism}"
    )
    assert expected in str(info.value)


def test_an_unknown_scram_user_is_refused(secured: Secured) -> None:
    settings = _settings(secured, "SASL_PLAINTEXT", "SCRAM-SHA-256")
    settings["sasl_plain_username"] = "mallory"
    with pytest.raises(kerrors.SaslAuthenticationFailedError, match="SCRAM-SHA-256"):
        EpochConsumer(**settings, bootstrap_timeout_ms=60_000)


def test_an_untrusted_certificate_is_refused_at_once(secured: Secured, tmp_path: Path) -> None:
    other_ca = make_tls_material(tmp_path / "other").cafile
    settings = _settings(secured, "SSL", None) | {"ssl_cafile": str(other_ca)}
    # kafka-python retries a failed TLS handshake like any connection error, which would end
    # in a KafkaTimeoutError after the minute; Java fails at once (SslAuthenticationException).
    with pytest.raises(SslAuthenticationError, match="self-signed certificate") as info:
        EpochConsumer(**settings, bootstrap_timeout_ms=60_000)
    assert isinstance(info.value, kerrors.KafkaConnectionError)
    assert settings["bootstrap_servers"] in str(info.value)
    assert str(info.value).count("SslAuthenticationError") == 1


def test_clusters_without_security_have_no_secured_listeners(kafka_jars: KafkaJars) -> None:
    cluster = ApacheKafkaCluster(brokers=1, jars=kafka_jars)
    with pytest.raises(ClusterError, match="no SASL listener"):
        _ = cluster.sasl_bootstrap_servers
    with pytest.raises(ClusterError, match="no SSL listener"):
        _ = cluster.ssl_bootstrap_servers
    with pytest.raises(ValueError, match="SASL user"):
        ApacheKafkaCluster(brokers=1, jars=kafka_jars, sasl_users={"bad name": "x"})
    with pytest.raises(ValueError, match="SASL user"):
        ApacheKafkaCluster(brokers=1, jars=kafka_jars, sasl_users={"bob": "a,b"})
    with pytest.raises(ValueError, match="authorizer=True needs sasl_users"):
        ApacheKafkaCluster(brokers=1, jars=kafka_jars, authorizer=True)


# -- authorization (real Kafka, StandardAuthorizer) -------------------------------------------


def _alice(cluster: ApacheKafkaCluster, **kw: Any) -> EpochConsumer:
    return EpochConsumer(**_settings(cluster, "SASL_PLAINTEXT", "SCRAM-SHA-512"), **kw)


def test_a_topic_acl_denial_is_a_typed_error_without_a_request_storm(
    apache_secured: ApacheKafkaCluster,
) -> None:
    tp = TopicPartition(CLOSED_TOPIC, 0)
    with _alice(apache_secured) as consumer:
        consumer.assign([tp])
        with pytest.raises(kerrors.TopicAuthorizationFailedError, match=CLOSED_TOPIC):
            for _ in range(50):
                consumer.poll(timeout_ms=100)
        # An application that polls on through the errors: metadata is asked again with a
        # backoff, not once per poll or per loop turn.
        errors = 0
        for _ in range(20):
            try:
                consumer.poll(timeout_ms=100)
            except kerrors.TopicAuthorizationFailedError:
                errors += 1
        metrics = consumer.metrics(raw=True)
        assert metrics is not None
        assert errors >= 1
        assert metrics["metadata_requests"] <= 15, metrics["metadata_requests"]
        with pytest.raises(kerrors.TopicAuthorizationFailedError):
            consumer.position(tp, timeout_ms=5_000)


def test_subscribing_to_a_denied_topic_is_a_typed_error(
    apache_secured: ApacheKafkaCluster,
) -> None:
    with _alice(apache_secured, group_id=GROUP) as consumer:
        consumer.subscribe([CLOSED_TOPIC])
        with pytest.raises(kerrors.TopicAuthorizationFailedError, match=CLOSED_TOPIC):
            for _ in range(50):
                consumer.poll(timeout_ms=100)


def _committed_as_super_user(cluster: ApacheKafkaCluster, group: str) -> EpochOffset | None:
    with EpochConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group) as admin:
        return admin.committed_with_epoch(TopicPartition(TOPIC, 0))


def test_a_group_acl_denial_is_a_typed_error_and_commits_nothing(
    apache_secured: ApacheKafkaCluster,
) -> None:
    tp = TopicPartition(TOPIC, 0)
    with _alice(apache_secured, group_id="no-such-grant") as consumer:
        consumer.assign([tp])
        # The first poll asks for the committed offsets, and the refusal ends it: no retries
        # until a timeout, no partition left without a position and no error.
        with pytest.raises(kerrors.GroupAuthorizationFailedError, match="no-such-grant"):
            consumer.poll(timeout_ms=5_000)
        consumer.seek(tp, 0)
        assert [r.offset for r in _consume(consumer, RECORDS)] == list(range(RECORDS))
        with pytest.raises(kerrors.GroupAuthorizationFailedError):
            consumer.commit()
    assert _committed_as_super_user(apache_secured, "no-such-grant") is None


def test_subscribing_with_a_denied_group_is_a_typed_error(
    apache_secured: ApacheKafkaCluster,
) -> None:
    with _alice(apache_secured, group_id="denied-subscriber") as consumer:
        consumer.subscribe([TOPIC])
        with pytest.raises(kerrors.GroupAuthorizationFailedError, match="denied-subscriber"):
            consumer.poll(timeout_ms=5_000)
    assert _committed_as_super_user(apache_secured, "denied-subscriber") is None
