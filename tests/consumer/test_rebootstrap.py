"""Rebootstrap on the EmbeddedCluster: every broker moves to a new port while the bootstrap
address stays (a loopback forwarder stands in for a DNS name whose target changes, as a
Kubernetes service in front of restarted pods), a broker answers REBOOTSTRAP_REQUIRED, and
``metadata_recovery_strategy="none"`` keeps to the brokers it knows."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError

from epochguard import AIOEpochConsumer, EpochConsumer
from epochguard._errors import ErrorCode
from epochguard.consumer import LogTruncationError
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport
from epochguard.testing import EmbeddedCluster
from epochguard.testing.netfault import FaultProxy

from .conftest import TP0, aread, consumer_config, diverge, poll_until, read, setup_topic

pytestmark = pytest.mark.timeout(90)

METADATA = 3
#: The forwarder's route that plays the bootstrap name (no broker has id 0).
ALIAS = 0


@pytest.fixture
def alias(cluster: EmbeddedCluster) -> Iterator[FaultProxy]:
    """A bootstrap address in front of broker 1; :func:`point_alias` moves its target."""
    with FaultProxy() as proxy:
        point_alias(proxy, cluster, cluster.broker_ids[0])
        yield proxy


def point_alias(proxy: FaultProxy, cluster: EmbeddedCluster, broker_id: int) -> None:
    host, port = cluster.broker_address(broker_id).rsplit(":", 1)
    proxy.route(ALIAS, host, int(port))


def alias_address(proxy: FaultProxy) -> str:
    host, port = proxy.address(ALIAS)
    return f"{host}:{port}"


def move_every_broker(cluster: EmbeddedCluster, proxy: FaultProxy) -> None:
    """Every broker stops and starts again on a new port; the alias follows."""
    before = {b: cluster.broker_address(b) for b in cluster.broker_ids}
    for b in cluster.running_broker_ids:
        cluster.stop_broker(b)
    for b in cluster.broker_ids:
        cluster.start_broker(b, port=0)
    after = {b: cluster.broker_address(b) for b in cluster.broker_ids}
    assert not set(before.values()) & set(after.values())
    point_alias(proxy, cluster, cluster.broker_ids[0])


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [
        dict(r.msg)
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") == name
    ]


def test_group_member_follows_every_broker_to_new_ports(
    cluster: EmbeddedCluster, alias: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """A committing group member: records before and after the move, each read once; the
    membership (generation), the commits and the positions with their epochs survive."""
    caplog.set_level(logging.INFO, logger="epochguard.consumer")
    cluster.create_topic("t", replication_factor=3)
    cluster.append("t", 0, [b"before-%d" % i for i in range(10)], batch_size=1)
    config = consumer_config(cluster, bootstrap_servers=alias_address(alias), group_id="g")
    with EpochConsumer("t", **config) as c:
        assert [r.value for r in read(c, 10)] == [b"before-%d" % i for i in range(10)]
        c.commit()
        generation = c.group_metadata().generation_id
        assert c.committed(TP0) == 10 and c.metrics(raw=True)["rebootstraps"] == 0

        move_every_broker(cluster, alias)
        cluster.append("t", 0, [b"after-%d" % i for i in range(10)], batch_size=1)
        got = read(c, 10, timeout=30)
        assert [r.value for r in got] == [b"after-%d" % i for i in range(10)]
        assert [r.offset for r in got] == list(range(10, 20))
        assert c.poll(timeout_ms=300) == {}  # nothing read twice
        c.commit()
        assert c.committed(TP0) == 20
        # The records after the move were written under the leader elected as it restarted.
        assert c.position_with_epoch(TP0) == EpochOffset(20, cluster.leader_epoch("t", 0))
        assert c.group_metadata().generation_id == generation
        assert c.truncation_reports() == []
        assert c.metrics(raw=True)["rebootstraps"] >= 1

    rebootstraps = events(caplog, "rebootstrap")
    assert rebootstraps and rebootstraps[0]["reason"] == "no_reachable_broker"
    assert rebootstraps[0]["bootstrap_servers"] == alias_address(alias)
    assert rebootstraps[0]["known_brokers"] == cluster.broker_ids
    assert "ECONNREFUSED" in rebootstraps[0]["last_connection_error"]
    assert {e["node"] for e in events(caplog, "broker_moved")} == set(cluster.broker_ids)


def test_truncation_while_the_brokers_moved_is_reported_asyncio(
    cluster: EmbeddedCluster, alias: FaultProxy
) -> None:
    """AIOEpochConsumer: while every broker moves, the partition's new leader is elected
    uncleanly without the five records the consumer had read; after the rebootstrap the
    truncation is reported exactly, and the records produced after it are read."""
    reports: list[TruncationReport] = []
    config = consumer_config(
        cluster,
        bootstrap_servers=alias_address(alias),
        on_truncation="raise",
        on_truncation_report=reports.append,
    )

    async def main() -> None:
        async with AIOEpochConsumer(**config) as c:
            old, new = setup_topic(cluster)
            c.assign([TP0])
            assert [r.offset for r in await aread(c, 10, timeout=30.0)] == list(range(10))
            diverge(cluster, old, new)  # 10..14 on the old leader only
            assert [r.offset for r in await aread(c, 5, timeout=30.0)] == list(range(10, 15))

            for b in cluster.running_broker_ids:
                cluster.stop_broker(b)
            cluster.start_broker(new, port=0)
            cluster.elect_leader("t", 0, new, unclean=True)
            cluster.append("t", 0, [b"new-%d" % i for i in range(8)], batch_size=1)
            for b in cluster.broker_ids:
                cluster.start_broker(b, port=0)
            point_alias(alias, cluster, new)

            with pytest.raises(LogTruncationError) as info:
                await aread(c, 1, timeout=30.0)
            err = info.value
            assert err.truncation_offsets() == {TP0: EpochOffset(10, 0)}
            assert err.truncations[TP0].lost_count == 5
            c.seek(TP0, err.truncation_offsets()[TP0])
            got = await aread(c, 8, timeout=30.0)
            assert [r.value for r in got] == [b"new-%d" % i for i in range(8)]
            assert c.metrics(raw=True)["rebootstraps"] >= 1

    asyncio.run(main())
    assert len(reports) == 1 and reports[0].divergence == EpochOffset(10, 0)


def test_truncation_while_the_brokers_moved_is_reported_threaded(
    cluster: EmbeddedCluster, alias: FaultProxy
) -> None:
    """The same unclean move under the default policy ("auto": rewind to the divergence),
    with a committing group member: the report comes once, then the new leader's records."""
    reports: list[TruncationReport] = []
    config = consumer_config(
        cluster,
        bootstrap_servers=alias_address(alias),
        group_id="g",
        on_truncation_report=reports.append,
    )
    old, new = setup_topic(cluster)
    with EpochConsumer("t", **config) as c:
        assert [r.offset for r in read(c, 10)] == list(range(10))
        diverge(cluster, old, new)
        assert [r.offset for r in read(c, 5)] == list(range(10, 15))
        c.commit()
        for b in cluster.running_broker_ids:
            cluster.stop_broker(b)
        cluster.start_broker(new, port=0)
        cluster.elect_leader("t", 0, new, unclean=True)
        cluster.append("t", 0, [b"new-%d" % i for i in range(8)], batch_size=1)
        for b in cluster.broker_ids:
            cluster.start_broker(b, port=0)
        point_alias(alias, cluster, new)
        got = read(c, 8, timeout=30)
        assert [(r.offset, r.value) for r in got] == [(10 + i, b"new-%d" % i) for i in range(8)]
        assert len(reports) == 1
        assert reports[0].divergence == EpochOffset(10, 0) and reports[0].lost_count == 5
        c.commit()
        assert c.committed(TP0) == 18


def test_rebootstrap_required_goes_back_to_the_bootstrap_address(
    cluster: EmbeddedCluster, alias: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """Brokers that answer Metadata with REBOOTSTRAP_REQUIRED (KIP-1102): the consumer asks
    the bootstrap address again; the fetch session with the leader, whose connection is
    left alone, goes on under the same id, and no record is lost or read twice."""
    caplog.set_level(logging.INFO, logger="epochguard.consumer")
    cluster.create_topic("t", replication_factor=3)
    cluster.append("t", 0, [b"a-%d" % i for i in range(5)], batch_size=1)
    config = consumer_config(cluster, bootstrap_servers=alias_address(alias))
    with EpochConsumer(**config) as c:
        c.assign([TP0])
        assert [r.offset for r in read(c, 5)] == list(range(5))
        leader = cluster.leader("t", 0)
        assert leader is not None
        sessions = set(cluster.fetch_sessions(leader))
        assert len(sessions) == 1
        rebootstrap_connections = alias.stats["accepted"]

        cluster.faults.inject_error(METADATA, ErrorCode.REBOOTSTRAP_REQUIRED, count=None)
        got: list[Any] = []
        poll_until(c, lambda: bool(events(caplog, "rebootstrap")), timeout=20, sink=got)
        cluster.faults.clear()
        assert events(caplog, "rebootstrap")[0]["reason"] == "rebootstrap_required"
        assert events(caplog, "rebootstrap_requested")
        cluster.append("t", 0, [b"b-%d" % i for i in range(5)], batch_size=1)
        got += read(c, 5 - len(got), timeout=20)
        assert [r.offset for r in got] == list(range(5, 10))
        # The bootstrap address was connected to again, the leader's session kept.
        poll_until(c, lambda: alias.stats["accepted"] > rebootstrap_connections, timeout=10)
        assert set(cluster.fetch_sessions(leader)) == sessions
        assert c.metrics(raw=True)["fetch_session_resets"] == 0


def test_strategy_none_keeps_to_the_known_brokers(
    cluster: EmbeddedCluster, alias: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """metadata_recovery_strategy="none": after every broker moved the consumer never asks
    the bootstrap address again. It does not hang: polls return on time, lookups fail with
    the cause, the log says why once, and close() is prompt."""
    caplog.set_level(logging.INFO, logger="epochguard.consumer")
    cluster.create_topic("t", replication_factor=3)
    cluster.append("t", 0, [b"a-%d" % i for i in range(5)], batch_size=1)
    config = consumer_config(
        cluster,
        bootstrap_servers=alias_address(alias),
        metadata_recovery_strategy="none",
        group_id="g",
    )
    c = EpochConsumer(**config)
    try:
        c.assign([TP0])
        assert len(read(c, 5)) == 5
        move_every_broker(cluster, alias)
        accepted = alias.stats["accepted"]
        cluster.append("t", 0, [b"b-%d" % i for i in range(5)], batch_size=1)
        # Polls go on for at least 3 s, and until the consumer has found every broker
        # unreachable: on a loaded machine that takes longer than on an idle one.
        polling_since = time.monotonic()
        while time.monotonic() - polling_since < 3 or not events(caplog, "rebootstrap_disabled"):
            assert time.monotonic() - polling_since < 20, "no rebootstrap_disabled event"
            started = time.monotonic()
            assert c.poll(timeout_ms=200) == {}
            assert time.monotonic() - started < 1.0
        declined = events(caplog, "rebootstrap_disabled")
        assert [e["reason"] for e in declined] == ["no_reachable_broker"]
        assert "ECONNREFUSED" in declined[0]["last_connection_error"]
        # The lookup may time out while backing off or just after a refused connect: both
        # name the cause.
        with pytest.raises(KafkaTimeoutError, match="ECONNREFUSED"):
            c.end_offsets([TP0])
        with pytest.raises(KafkaTimeoutError, match="ECONNREFUSED"):
            c.committed(TP0)
        assert events(caplog, "rebootstrap") == []
        assert c.metrics(raw=True)["rebootstraps"] == 0
        assert alias.stats["accepted"] == accepted  # the bootstrap address was not asked
    finally:
        started = time.monotonic()
        c.close()
        assert time.monotonic() - started < 5


def test_strategy_none_ignores_rebootstrap_required(
    cluster: EmbeddedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="epochguard.consumer")
    cluster.create_topic("t", replication_factor=3)
    config = consumer_config(cluster, metadata_recovery_strategy="none")
    with EpochConsumer(**config) as c:
        c.assign([TP0])
        cluster.faults.inject_error(METADATA, ErrorCode.REBOOTSTRAP_REQUIRED, count=None)
        poll_until(c, lambda: bool(events(caplog, "rebootstrap_disabled")), timeout=20)
        cluster.faults.clear()
        cluster.append("t", 0, [b"x"])
        assert [r.value for r in read(c, 1)] == [b"x"]
        assert [e["reason"] for e in events(caplog, "rebootstrap_disabled")] == [
            "rebootstrap_required"
        ]
        assert events(caplog, "rebootstrap") == []


def test_no_metadata_answer_for_the_trigger_interval_rebootstraps(
    cluster: EmbeddedCluster, alias: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """Brokers that accept connections but never answer Metadata: once the trigger
    interval passed without an answer, the bootstrap address is asked again."""
    caplog.set_level(logging.INFO, logger="epochguard.consumer")
    cluster.create_topic("t", replication_factor=3)
    config = consumer_config(
        cluster,
        bootstrap_servers=alias_address(alias),
        metadata_recovery_rebootstrap_trigger_ms=500,
        request_timeout_ms=1500,
    )
    with EpochConsumer(**config) as c:
        c.assign([TP0])
        c.poll(timeout_ms=200)
        cluster.faults.drop_responses(METADATA, count=None)
        poll_until(c, lambda: bool(events(caplog, "rebootstrap")), timeout=20)
        cluster.faults.clear()
        assert events(caplog, "rebootstrap")[0]["reason"] == "metadata_timeout"
        cluster.append("t", 0, [b"x"])
        assert [r.value for r in read(c, 1, timeout=20)] == [b"x"]
