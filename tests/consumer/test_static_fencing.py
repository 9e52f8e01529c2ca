"""KIP-345: a second process with the same ``group_instance_id`` fences the first, whose
``poll()`` then raises ``FencedInstanceIdError`` instead of fighting for the identity."""

from __future__ import annotations

import time

import kafka.errors as kerrors
import pytest

from epochguard.consumer import ConsumerConfigError, EpochConsumer
from epochguard.testing import EmbeddedCluster

from .conftest import make_consumer

pytestmark = pytest.mark.timeout(60)


def test_a_duplicate_instance_id_fences_the_older_member(cluster: EmbeddedCluster) -> None:
    cluster.create_topic("t", partitions=2, replication_factor=1)
    kw = {
        "group_id": "static",
        "group_instance_id": "only-one",
        "session_timeout_ms": 10000,
        "heartbeat_interval_ms": 100,
    }
    first = make_consumer(cluster, **kw)
    second = make_consumer(cluster, **kw)
    try:
        first.subscribe(["t"])
        deadline = time.monotonic() + 10
        while not first.assignment():
            assert time.monotonic() < deadline
            first.poll(timeout_ms=50)
        second.subscribe(["t"])
        while not second.assignment():
            assert time.monotonic() < deadline
            second.poll(timeout_ms=50)
        with pytest.raises(kerrors.FencedInstanceIdError):
            while time.monotonic() < deadline:
                first.poll(timeout_ms=50)
        assert second.assignment()  # the newer process keeps the identity
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("bad", ["", "   ", 7])
def test_group_instance_id_must_be_a_non_empty_string(bad: object) -> None:
    with pytest.raises(ConsumerConfigError, match="group_instance_id"):
        EpochConsumer(group_id="g", group_instance_id=bad)


def test_client_rack_must_be_a_string_and_needs_fetch_v11() -> None:
    with pytest.raises(ConsumerConfigError, match="client_rack"):
        EpochConsumer(client_rack=3)
    with pytest.raises(ConsumerConfigError, match="Fetch v11"):
        EpochConsumer(client_rack="rack-a", max_fetch_version=10)
