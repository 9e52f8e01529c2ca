"""Admin APIs through kafka-python's KafkaAdminClient, the control API, fault injection."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import NotLeaderForPartitionError

from epochguard.testing import Cluster, EmbeddedCluster, EmbeddedClusterError, wait_until

pytestmark = pytest.mark.timeout(60)


def _metadata_v12() -> Any:
    """A Metadata v12 request for every topic, sent raw with ``Wire``."""
    from kafka.protocol.metadata import MetadataRequest

    return MetadataRequest(
        version=12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


@pytest.fixture
def admin(cluster: EmbeddedCluster) -> Iterator[KafkaAdminClient]:
    a = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    yield a
    a.close()


def test_embedded_cluster_implements_the_cluster_protocol(cluster: EmbeddedCluster) -> None:
    assert isinstance(cluster, Cluster)
    assert cluster.broker_ids == [1, 2, 3]
    assert len(cluster.bootstrap_servers.split(",")) == 3


def test_create_describe_delete_and_recreate_topic(
    cluster: EmbeddedCluster, admin: KafkaAdminClient
) -> None:
    admin.create_topics(
        {
            "a": {
                "num_partitions": 2,
                "replication_factor": 2,
                "configs": {"min.insync.replicas": "2"},
            }
        }
    )
    assert cluster.replicas("a", 1) and len(cluster.replicas("a", 1)) == 2
    first_id = cluster.topic_id("a")
    res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "a")])
    assert "min.insync.replicas" in str(res)
    admin.delete_topics(["a"])
    with pytest.raises(EmbeddedClusterError):
        cluster.leader("a", 0)
    cluster.create_topic("a")
    assert cluster.topic_id("a") != first_id
    assert cluster.leader_epoch("a", 0) == 0


def test_delete_records_moves_log_start(cluster: EmbeddedCluster, admin: KafkaAdminClient) -> None:
    cluster.create_topic("t")
    cluster.append("t", 0, [b"%d" % i for i in range(10)], batch_size=1)
    admin.delete_records({TopicPartition("t", 0): 4})
    for b in cluster.replicas("t", 0):
        assert cluster.log_start_offset("t", 0, broker=b) == 4
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        consumer.assign([TopicPartition("t", 0)])
        assert consumer.beginning_offsets([TopicPartition("t", 0)]) == {TopicPartition("t", 0): 4}
    finally:
        consumer.close()


def test_admin_elect_leaders_unclean_and_preferred(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=2)
    first, second = cluster.replicas("t", 0)
    assert cluster.leader("t", 0) == first
    cluster.stop_broker(second)
    cluster.stop_broker(first)  # last ISR member: leaderless, and it moves to the ELR
    assert cluster.leader("t", 0) is None
    assert (cluster.isr("t", 0), cluster.elr("t", 0)) == ([], [first])
    cluster.start_broker(second)
    assert cluster.leader("t", 0) is None  # out of sync, unclean election disabled
    # A fresh admin client: kafka-python keeps using a controller it found stopped.
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    admin.elect_leaders(1, {"t": [0]})
    assert cluster.leader("t", 0) == second
    assert cluster.isr("t", 0) == [second]
    cluster.start_broker(first)
    # It joins the ISR once it has caught up, after the leader.
    wait_until("first back in sync", lambda: cluster.isr("t", 0) == [second, first])
    admin.close()
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    admin.elect_leaders(0, {"t": [0]})  # preferred: back to the first replica
    admin.close()
    assert cluster.leader("t", 0) == first
    assert cluster.leader_epoch("t", 0) == 3


def test_control_api_elections(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=3)
    leader, f1, f2 = cluster.replicas("t", 0)
    cluster.elect_leader("t", 0, f1)
    assert (cluster.leader("t", 0), cluster.leader_epoch("t", 0)) == (f1, 1)
    cluster.pause_replication(f2)
    assert f2 not in cluster.isr("t", 0)
    cluster.append("t", 0, [b"x"])
    assert cluster.log_end_offset("t", 0, f2) == 0
    with pytest.raises(EmbeddedClusterError, match="not in the ISR"):
        cluster.elect_leader("t", 0, f2)
    cluster.resume_replication(f2)
    assert cluster.log_end_offset("t", 0, f2) == 1
    wait_until("f2 back in sync", lambda: f2 in cluster.isr("t", 0))
    cluster.stop_broker(f1)
    assert cluster.leader("t", 0) in (leader, f2)
    assert cluster.leader_epoch("t", 0) == 2
    with pytest.raises(EmbeddedClusterError, match="not running"):
        cluster.elect_leader("t", 0, f1, unclean=True)


def test_unclean_election_enabled_topic_elects_on_restart(cluster: EmbeddedCluster) -> None:
    cluster.create_topic(
        "t", replication_factor=2, config={"unclean.leader.election.enable": "true"}
    )
    first, second = cluster.replicas("t", 0)
    cluster.stop_broker(second)
    cluster.stop_broker(first)
    cluster.start_broker(second)
    assert cluster.leader("t", 0) == second


def test_injected_errors_and_delays(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=3)
    leader = cluster.leader("t", 0)
    assert leader is not None
    cluster.faults.inject_error(api_key=0, error_code=6, count=2, broker=leader)
    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap_servers, retries=0, enable_idempotence=False
    )
    try:
        with pytest.raises(NotLeaderForPartitionError):
            producer.send("t", b"a", partition=0).get(timeout=10)
        cluster.faults.clear()
        cluster.faults.delay_responses(0.5, api_key=0, broker=leader, count=1)
        t0 = time.monotonic()
        producer.send("t", b"b", partition=0).get(timeout=10)
        assert time.monotonic() - t0 >= 0.45
    finally:
        producer.close()
    assert cluster.read_records("t", 0)[-1][2] == b"b"


def test_dropped_and_disconnected_responses(cluster: EmbeddedCluster) -> None:
    from kafka.protocol.metadata import MetadataResponse

    from .wire import Wire

    req = _metadata_v12()
    cluster.faults.disconnect_on(api_key=3, broker=1)
    w = Wire.to(cluster, 1)
    w.send(req)
    assert w.closed_by_peer()
    cluster.faults.drop_responses(api_key=3, broker=1, count=1)
    w = Wire.to(cluster, 1)
    w.sock.settimeout(0.5)
    w.send(req)
    with pytest.raises(TimeoutError):
        w.receive(MetadataResponse, 12)
    w.sock.settimeout(5)
    w.send(req)
    assert w.receive(MetadataResponse, 12).brokers
    w.close()


def test_a_held_request_is_handled_after_its_client_gave_up(cluster: EmbeddedCluster) -> None:
    from .wire import Wire

    req = _metadata_v12()
    before = cluster.requests_seen().get((3, 12), 0)
    cluster.faults.hold_requests(0.5, api_key=3, broker=1)
    w = Wire.to(cluster, 1)
    w.send(req)
    w.close()
    time.sleep(0.3)
    assert cluster.requests_seen().get((3, 12), 0) == before  # still on its way
    wait_until("the held request handled", lambda: cluster.requests_seen()[3, 12] == before + 1)


def test_stop_broker_closes_listener_and_connections(cluster: EmbeddedCluster) -> None:
    from kafka.protocol.metadata import MetadataResponse

    from .wire import Wire

    w = Wire.to(cluster, 2)
    req = _metadata_v12()
    assert w.call(req, MetadataResponse).brokers  # the broker has accepted this connection
    cluster.stop_broker(2)
    assert w.closed_by_peer()
    assert not cluster.is_running(2)
    with pytest.raises(OSError):
        Wire.to(cluster, 2)
    assert cluster.broker_address(2) not in cluster.bootstrap_servers
    cluster.start_broker(2)
    Wire.to(cluster, 2).close()


@pytest.mark.parametrize("controlled", [True, False], ids=["controlled", "killed"])
def test_a_controlled_stop_moves_leaderships_while_the_broker_still_answers(
    cluster: EmbeddedCluster, controlled: bool
) -> None:
    """Kafka's controlled shutdown hands every partition the broker leads to another ISR
    replica before the broker stops, and the broker answers what still reaches it with
    NOT_LEADER_OR_FOLLOWER; a kill cuts its connections at once. Either way an EpochConsumer
    reads on without a report."""
    import threading

    from kafka.protocol.metadata import MetadataResponse

    from epochguard import EpochConsumer

    from .wire import Wire

    cluster.create_topic("cs", partitions=3, replication_factor=2)
    led = [p for p in range(3) if cluster.leader("cs", p) == 1]
    assert led, "broker 1 leads a partition"
    for p in range(3):
        cluster.append("cs", p, [b"%d-%d" % (p, i) for i in range(5)])
    epochs = {p: cluster.leader_epoch("cs", p) for p in led}
    consumer = EpochConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    w = Wire.to(cluster, 1)
    metadata = _metadata_v12()
    try:
        consumer.assign([TopicPartition("cs", p) for p in range(3)])
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 20
        while len(got) < 15:
            assert time.monotonic() < deadline
            got += [(r.partition, r.offset) for rs in consumer.poll(100).values() for r in rs]
        stopping = threading.Thread(
            target=cluster.stop_broker, args=(1,), kwargs={"controlled": controlled, "grace_s": 1.0}
        )
        stopping.start()
        while any(cluster.leader("cs", p) == 1 for p in led):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # The leaderships moved (one clean election each); a controlled stop leaves the
        # broker answering meanwhile, a kill does not.
        assert all(cluster.leader_epoch("cs", p) == epochs[p] + 1 for p in led)
        if controlled:
            assert cluster.is_running(1)
            answer = w.call(metadata, MetadataResponse)
            leaders = {p.partition_index: p.leader_id for t in answer.topics for p in t.partitions}
            assert all(leaders[p] not in (1, -1) for p in led), leaders
        stopping.join(10)
        assert not cluster.is_running(1) and w.closed_by_peer()
        for p in range(3):
            cluster.append("cs", p, [b"after"])
        while len(got) < 18:
            assert time.monotonic() < deadline
            got += [(r.partition, r.offset) for rs in consumer.poll(100).values() for r in rs]
        assert len(got) == len(set(got)) == 18
        assert consumer.truncation_reports() == []
    finally:
        w.close()
        consumer.close()
        cluster.start_broker(1)


def test_enabling_unclean_election_by_config_elects_a_leader(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=2)
    first, second = cluster.replicas("t", 0)
    cluster.stop_broker(second)
    cluster.stop_broker(first)
    cluster.start_broker(second)
    assert cluster.leader("t", 0) is None
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    "t",
                    configs={"unclean.leader.election.enable": "true"},
                )
            ],
            raise_on_unknown=False,
            incremental=True,
        )
        assert (cluster.leader("t", 0), cluster.leader_epoch("t", 0)) == (second, 2)
        cluster_info = admin.describe_cluster()
    finally:
        admin.close()
    assert sorted(b["broker_id"] for b in cluster_info["brokers"]) == sorted(
        b for b in cluster.broker_ids if b != first
    )
    assert cluster_info["controller_id"] == min(b for b in cluster.broker_ids if b != first)
    assert any(k == 44 for k, _ in cluster.requests_seen())  # IncrementalAlterConfigs


def test_create_partitions(cluster: EmbeddedCluster, admin: KafkaAdminClient) -> None:
    cluster.create_topic("t", partitions=1)
    admin.create_partitions({"t": 3})
    assert cluster.leader("t", 2) is not None
    cluster.append("t", 2, [b"x"])
    assert cluster.high_watermark("t", 2) == 1


def test_injected_fetch_errors_are_retried_by_clients(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", replication_factor=3)
    cluster.append("t", 0, [b"%d" % i for i in range(5)])
    cluster.faults.inject_error(api_key=1, error_code=74, count=3)  # FENCED_LEADER_EPOCH
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition("t", 0)])
        deadline = time.monotonic() + 15
        while len(got) < 5 and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                got += [r.value for r in recs]
    finally:
        consumer.close()
    assert got == [b"%d" % i for i in range(5)]
    # The three fenced answers were served: more Fetches than the one that succeeded.
    assert sum(n for (k, _), n in cluster.requests_seen().items() if k == 1) >= 4
    assert cluster.faults.take_error(broker=1, api_key=1) == 0  # no rule left


def test_brokers_listen_below_the_ephemeral_range_and_restart_on_their_port() -> None:
    # A restarted broker binds its old port again; an ephemeral port may meanwhile be the
    # local end of another process's connection (a chaos run of 5,000 schedules, six
    # clusters at a time, once failed "address already in use").
    from epochguard.testing.ports import _ephemeral_low

    with EmbeddedCluster(brokers=2) as c:
        ports = [int(s.rsplit(":", 1)[1]) for s in c.all_bootstrap_servers.split(",")]
        assert all(10_000 <= p < _ephemeral_low() for p in ports), ports
        c.stop_broker(1)
        c.start_broker(1)
        assert [int(s.rsplit(":", 1)[1]) for s in c.all_bootstrap_servers.split(",")] == ports
