"""The EmbeddedCluster's secured listeners on the wire: SASL state rules, advertised
addresses per listener, one exchange per failed login, and confluent-kafka (librdkafka, an
independent SASL/SCRAM and TLS implementation) as a client."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka.errors as kerrors
import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kafka.structs import TopicPartition

from epochguard import EpochConsumer
from epochguard._errors import ErrorCode
from epochguard.testing import EmbeddedCluster, EmbeddedClusterError
from epochguard.testing.tls import TlsMaterial, make_tls_material

from .wire import Wire

USERS = {"alice": "alice-secret"}
SASL_AUTHENTICATE = 36


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def secured(tls: TlsMaterial) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=3, sasl_users=USERS, tls=tls) as cluster:
        yield cluster


def _sasl_wire(cluster: EmbeddedCluster, broker: int = 1) -> Wire:
    address = cluster.sasl_bootstrap_servers.split(",")[sorted(cluster.broker_ids).index(broker)]
    return Wire(address)


def _metadata() -> Any:
    return MetadataRequest(
        version=12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def test_a_sasl_listener_closes_a_connection_that_skips_authentication(
    secured: EmbeddedCluster,
) -> None:
    w = _sasl_wire(secured)
    w.send(_metadata())
    assert w.closed_by_peer()


def test_a_handshake_names_the_mechanisms_and_refuses_unknown_ones(
    secured: EmbeddedCluster,
) -> None:
    w = _sasl_wire(secured)
    resp = w.call(SaslHandshakeRequest(version=1, mechanism="GSSAPI"), SaslHandshakeResponse)
    assert resp.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert resp.mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert w.closed_by_peer()


def test_plaintext_listener_refuses_a_sasl_handshake(secured: EmbeddedCluster) -> None:
    w = Wire.to(secured, 1)
    resp = w.call(SaslHandshakeRequest(version=1, mechanism="PLAIN"), SaslHandshakeResponse)
    assert resp.error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert resp.mechanisms == []


def test_plain_login_on_the_wire_then_requests_are_served(secured: EmbeddedCluster) -> None:
    secured.create_topic("t", replication_factor=3)
    w = _sasl_wire(secured)
    hs = w.call(SaslHandshakeRequest(version=1, mechanism="PLAIN"), SaslHandshakeResponse)
    assert hs.error_code == 0
    auth = w.call(
        SaslAuthenticateRequest(version=1, auth_bytes=b"\0alice\0alice-secret"),
        SaslAuthenticateResponse,
    )
    assert (auth.error_code, auth.error_message) == (0, None)
    meta = w.call(_metadata(), MetadataResponse)
    # Brokers are advertised on the listener the request came in on.
    sasl_ports = {int(a.rsplit(":", 1)[1]) for a in secured.sasl_bootstrap_servers.split(",")}
    assert {b.port for b in meta.brokers} == sasl_ports
    assert [t.name for t in meta.topics] == ["t"]


@pytest.mark.parametrize(
    ("mechanism", "exchanges"), [("PLAIN", 1), ("SCRAM-SHA-256", 2), ("SCRAM-SHA-512", 2)]
)
def test_a_wrong_password_costs_one_exchange_per_server_not_a_retry_storm(
    secured: EmbeddedCluster, mechanism: str, exchanges: int
) -> None:
    with pytest.raises(kerrors.SaslAuthenticationFailedError):
        EpochConsumer(
            bootstrap_servers=secured.sasl_bootstrap_servers,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_plain_username="alice",
            sasl_plain_password="wrong",
            bootstrap_timeout_ms=60_000,
        )
    counts = secured._state.request_counts  # the brokers' own request counter
    sent = sum(n for (key, _v), n in counts.items() if key == SASL_AUTHENTICATE)
    # At most one refused login per bootstrap server (kafka-python may try the next one
    # before the consumer gives up), never a loop of retries.
    assert exchanges <= sent <= exchanges * len(secured.broker_ids), sent


def test_scram_consumer_follows_leaders_on_other_brokers_over_sasl_ssl(
    secured: EmbeddedCluster, tls: TlsMaterial
) -> None:
    secured.create_topic("spread", partitions=3, replication_factor=1)
    for p in range(3):
        secured.append("spread", p, [b"p%d" % p])
    assert len({secured.leader("spread", p) for p in range(3)}) == 3
    with EpochConsumer(
        bootstrap_servers=secured.listener_bootstrap_servers("SASL_SSL").split(",")[0],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="alice",
        sasl_plain_password="alice-secret",
        ssl_cafile=str(tls.cafile),
        auto_offset_reset="earliest",
    ) as consumer:
        consumer.assign([TopicPartition("spread", p) for p in range(3)])
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                got |= {tp.partition: records[-1].value}
        assert got == {p: b"p%d" % p for p in range(3)}


def test_asyncio_consumer_logs_in_with_scram_over_tls_on_its_event_loop(
    secured: EmbeddedCluster, tls: TlsMaterial
) -> None:
    """AIOEpochConsumer: the TLS handshakes and SCRAM exchanges with three brokers run on
    the application's event loop (no thread is started), and a wrong password is the same
    typed error as for EpochConsumer."""
    import asyncio
    import threading

    from epochguard import AIOEpochConsumer

    secured.create_topic("spread", partitions=3, replication_factor=1)
    for p in range(3):
        secured.append("spread", p, [b"p%d" % p])
    common: dict[str, Any] = {
        "bootstrap_servers": secured.listener_bootstrap_servers("SASL_SSL").split(",")[0],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "ssl_cafile": str(tls.cafile),
        "auto_offset_reset": "earliest",
    }

    async def main() -> None:
        threads = set(threading.enumerate())
        async with AIOEpochConsumer(sasl_plain_password="alice-secret", **common) as c:
            c.assign([TopicPartition("spread", p) for p in range(3)])
            got: dict[int, bytes] = {}
            deadline = time.monotonic() + 20
            while len(got) < 3 and time.monotonic() < deadline:
                for tp, records in (await c.getmany(timeout_ms=200)).items():
                    got |= {tp.partition: records[-1].value}
            assert got == {p: b"p%d" % p for p in range(3)}
            assert set(threading.enumerate()) == threads
        wrong = AIOEpochConsumer(sasl_plain_password="nope", bootstrap_timeout_ms=10000, **common)
        with pytest.raises(kerrors.SaslAuthenticationFailedError):
            await wrong.start()

    asyncio.run(main())


def test_secured_ports_survive_a_broker_restart(secured: EmbeddedCluster) -> None:
    before = secured.listener_bootstrap_servers("SSL")
    secured.stop_broker(2)
    assert secured.listener_bootstrap_servers("SSL").count(",") == 1
    secured.start_broker(2)
    assert secured.listener_bootstrap_servers("SSL") == before


@pytest.mark.parametrize(
    "settings",
    [
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        },
        {"security.protocol": "SSL"},
    ],
    ids=["scram-sha-256", "ssl"],
)
def test_confluent_kafka_authenticates_against_the_embedded_cluster(
    secured: EmbeddedCluster, tls: TlsMaterial, settings: dict[str, str]
) -> None:
    secured.create_topic("c", replication_factor=3)
    secured.append("c", 0, [b"one", b"two"])
    listener = settings["security.protocol"]
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": secured.listener_bootstrap_servers(listener),
            "group.id": "confluent",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "ssl.ca.location": str(tls.cafile),
            **settings,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("c", 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(values) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                values.append(msg.value())
        assert values == [b"one", b"two"]
    finally:
        consumer.close()


def test_confluent_kafka_reports_a_wrong_scram_password(secured: EmbeddedCluster) -> None:
    errors: list[Any] = []
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": secured.sasl_bootstrap_servers,
            "group.id": "confluent",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "wrong",
            "error_cb": errors.append,
        }
    )
    try:
        deadline = time.monotonic() + 20
        while not errors and time.monotonic() < deadline:
            consumer.poll(0.2)
    finally:
        consumer.close()
    assert errors, "librdkafka reported no error"
    assert any("SCRAM-SHA-512" in str(e) or "uthentication" in str(e) for e in errors), errors


def test_bad_security_arguments_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SASL user ''"):
        EmbeddedCluster(sasl_users={"": "x"})
    with pytest.raises(ValueError, match="password"):
        EmbeddedCluster(sasl_users={"bob": ""})
    with pytest.raises(TypeError, match="tls must be a TlsMaterial"):
        EmbeddedCluster(tls="certs/")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one day"):
        make_tls_material(tmp_path, days=0)
    with EmbeddedCluster(brokers=1) as plain:
        with pytest.raises(EmbeddedClusterError, match="no SSL listener"):
            _ = plain.ssl_bootstrap_servers
        with pytest.raises(EmbeddedClusterError, match="no SASL_PLAINTEXT listener"):
            _ = plain.sasl_bootstrap_servers


def test_the_secured_cluster_example_in_docs_runs() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "make_tls_material" in b]
    exec(compile(block, "docs/guides/testing.md:secured", "exec"), {})


def test_a_fetch_refused_by_an_acl_is_raised_then_retried(secured: EmbeddedCluster) -> None:
    # An ACL removed while consuming: the broker refuses the Fetch (Kafka puts
    # TOPIC_AUTHORIZATION_FAILED on the partition), which used to be retried silently.
    secured.create_topic("revoked", replication_factor=3)
    secured.append("revoked", 0, [b"r0"])
    tp = TopicPartition("revoked", 0)
    with EpochConsumer(
        bootstrap_servers=secured.bootstrap_servers, auto_offset_reset="earliest"
    ) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 0
        secured.faults.inject_error(1, ErrorCode.TOPIC_AUTHORIZATION_FAILED, count=1)
        with pytest.raises(kerrors.TopicAuthorizationFailedError, match="revoked"):
            for _ in range(50):
                assert consumer.poll(timeout_ms=100) == {}
        # Granted again (the fault is spent): the partition carries on where it was.
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=200).get(tp, [])
        assert [(r.offset, r.value) for r in got] == [(0, b"r0")]
