"""A partition whose replicas are all down, reached through the loopback fault proxy: the
proxy accepts every connection for a broker that is down (and then resets it, or blackholes
it), so the probes are never refused. Both drivers leave such replicas to the trackers'
backoff after a few accepted probes in a row, instead of waiting for the dark refresh, and
find the leader elected at the replica's return."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from epochguard import AIOEpochConsumer, EpochConsumer
from epochguard.consumer.metadata import DARK_REFRESH_S
from epochguard.testing import EmbeddedCluster
from epochguard.testing.netfault import FaultProxy

from .conftest import TP0, consumer_config, setup_topic

pytestmark = pytest.mark.timeout(120)

METADATA = 3
REQUEST_TIMEOUT_S = 5.0
CLIENT_ID = "behind-proxy"


@pytest.fixture
def proxied() -> Iterator[tuple[EmbeddedCluster, FaultProxy]]:
    with EmbeddedCluster(brokers=3) as cluster, FaultProxy() as proxy:
        proxy.attach_embedded(cluster)
        yield cluster, proxy


def _metadata_requests(cluster: EmbeddedCluster) -> int:
    return cluster.requests_by_client().get((CLIENT_ID, METADATA), 0)


async def _scenario(
    cluster: EmbeddedCluster,
    proxy: FaultProxy,
    c: Any,
    poll: Callable[[], Awaitable[int]],
    blackhole: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def read(n: int) -> None:
        got, deadline = 0, time.monotonic() + 10
        while got < n:
            assert time.monotonic() < deadline, f"{got} of {n} records read"
            got += await poll()

    old, new = setup_topic(cluster, kept=3)
    c.assign([TP0])
    await read(3)
    cluster.stop_broker(new)
    cluster.append("t", 0, [b"lost-%d" % i for i in range(2)], batch_size=1)
    await read(2)
    cluster.stop_broker(old)
    if blackhole:
        proxy.blackhole(old)
        proxy.blackhole(new)
    dark_from = _metadata_requests(cluster)
    # Both replicas down for longer than the probes take to give up on them, plus one
    # request timeout: a request that goes out first on a connection the proxy accepted and
    # never answers waits that long (seen in about one run in ten of the threaded driver
    # with 2.5 s alone: no Metadata request reached a broker in them).
    deadline = time.monotonic() + 2.5 + REQUEST_TIMEOUT_S
    while time.monotonic() < deadline:
        await poll()
    # Asked at once, then on the trackers' backoff (100 ms doubling up to 1 s), where the
    # dark watch would ask once in DARK_REFRESH_S (twice in this window at most).
    assert _metadata_requests(cluster) - dark_from >= 4
    unwatched = {
        r.msg["node"]
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg["event"] == "leaderless_replica_unwatchable"
    }
    assert unwatched and unwatched <= {old, new}
    proxy.heal()
    cluster.start_broker(new)
    cluster.elect_leader("t", 0, new, unclean=True)
    cluster.append("t", 0, [b"new-%d" % i for i in range(4)], batch_size=1)
    deadline = time.monotonic() + DARK_REFRESH_S * 4
    while not c.truncation_reports():
        assert time.monotonic() < deadline, "the new leader was never found"
        await poll()
    (report,) = c.truncation_reports()
    assert report.lost_from == 3
    metrics = c.metrics(raw=True)
    assert metrics is not None
    assert metrics["replicas_back"] == 0  # no probe ever saw a return


def _config(proxy: FaultProxy, cluster: EmbeddedCluster) -> dict[str, Any]:
    return consumer_config(
        cluster,
        bootstrap_servers=proxy.bootstrap_servers,
        client_id=CLIENT_ID,
        metadata_max_age_ms=300000,
        retry_backoff_ms=100,
        request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000),
    )


@pytest.mark.parametrize("blackhole", [False, True], ids=["upstream-refused", "blackhole"])
@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_replicas_behind_an_accepting_proxy_are_asked_for_on_the_backoff(
    proxied: tuple[EmbeddedCluster, FaultProxy],
    caplog: pytest.LogCaptureFixture,
    blackhole: bool,
    driver: str,
) -> None:
    cluster, proxy = proxied

    async def main() -> None:
        if driver == "threads":
            c: Any = EpochConsumer(**_config(proxy, cluster))

            async def poll() -> int:
                return sum(len(r) for r in c.poll(timeout_ms=50).values())

            try:
                await _scenario(cluster, proxy, c, poll, blackhole, caplog)
            finally:
                c.close()
            return
        c = AIOEpochConsumer(**_config(proxy, cluster))
        await c.start()

        async def apoll() -> int:
            batch = c.getmany(timeout_ms=50)
            got = await batch if inspect.isawaitable(batch) else batch
            return sum(len(r) for r in got.values())

        try:
            await _scenario(cluster, proxy, c, apoll, blackhole, caplog)
        finally:
            await c.stop()

    with caplog.at_level(logging.INFO, logger="epochguard"):
        asyncio.run(main())
