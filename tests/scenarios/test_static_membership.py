"""KIP-345 static membership on both clusters: a rolling restart of a static group, each
member back within the session timeout, causes no rebalance (every generation stays, no
member rejoins) and every member resumes from its committed positions."""

from __future__ import annotations

import os
import threading
import time

import pytest
from kafka.structs import TopicPartition

from epochguard.consumer import EpochConsumer
from epochguard.consumer.records import ConsumerRecord
from epochguard.testing import ApacheKafkaCluster, Cluster, produce, wait_until

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 6
MEMBERS = 3


class Member(threading.Thread):
    """One group member polling in its own thread (a join blocks until all members join)."""

    def __init__(self, cluster: Cluster, topic: str, group: str, instance: str) -> None:
        super().__init__(daemon=True, name=f"member-{instance}")
        self.consumer = EpochConsumer(
            bootstrap_servers=cluster.all_bootstrap_servers,
            group_id=group,
            group_instance_id=instance,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=20000,
            heartbeat_interval_ms=500,
            max_poll_interval_ms=60000,
            fetch_max_wait_ms=100,
            request_timeout_ms=10000,
        )
        self.consumer.subscribe([topic])
        self.records: list[ConsumerRecord] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                with self._lock:
                    got = self.consumer.poll(timeout_ms=50)
                for recs in got.values():
                    self.records += recs
        except BaseException as exc:
            self.error = exc

    def assigned(self) -> set[TopicPartition]:
        with self._lock:
            return set(self.consumer.assignment())

    def state(self) -> tuple[int, int]:
        """(generation, rebalances this member went through)."""
        with self._lock:
            m = self.consumer.metrics(raw=True)
            assert m is not None
            return self.consumer.group_metadata().generation_id, int(m["rebalances"])

    def shut_down(self) -> None:
        """Stop polling, commit what was delivered, close (a static member sends no
        LeaveGroup, so its partitions wait for it)."""
        self._halt.set()
        self.join(10)
        assert self.error is None, self.error
        if self.consumer.assignment():
            self.consumer.commit()
        self.consumer.close()


def _kind(cluster: Cluster) -> str:
    return "apache" if isinstance(cluster, ApacheKafkaCluster) else "embedded"


def test_rolling_restart_of_a_static_group_causes_no_rebalance(cluster: Cluster) -> None:
    topic = f"static-{_kind(cluster)}-{os.getpid()}"
    group = f"g-{topic}"
    cluster.create_topic(topic, partitions=PARTITIONS, replication_factor=1)
    for p in range(PARTITIONS):
        produce(cluster, topic, [f"{p}-{i}" for i in range(5)], partition=p)
    members = [Member(cluster, topic, group, f"instance-{k}") for k in range(MEMBERS)]
    for m in members:
        m.start()
    all_tps = {TopicPartition(topic, p) for p in range(PARTITIONS)}

    def settled() -> bool:
        sets = [m.assigned() for m in members]
        return sum(map(len, sets)) == PARTITIONS and set().union(*sets) == all_tps

    wait_until("the group formed", settled, timeout=60)
    wait_until("first records", lambda: sum(len(m.records) for m in members) == 5 * PARTITIONS)
    wait_until("one generation", lambda: len({m.state()[0] for m in members}) == 1)
    generation = members[0].state()[0]
    # How many joins each survivor went through while the group formed: must not grow.
    joins = {k: m.state()[1] for k, m in enumerate(members)}
    records: list[ConsumerRecord] = []
    for k in range(MEMBERS):
        old = members[k]
        owned = old.assigned()
        old.shut_down()
        records += old.records
        new = Member(cluster, topic, group, f"instance-{k}")
        members[k] = new
        new.start()
        wait_until(
            f"instance-{k} back", lambda new=new, owned=owned: new.assigned() == owned, timeout=30
        )
        joins[k] = 1  # the restarted member's own join
        # Nobody else noticed: same generation, no rejoin.
        states = {j: m.state() for j, m in enumerate(members)}
        assert states == {j: (generation, joins[j]) for j in range(MEMBERS)}, (k, states)
    for p in range(PARTITIONS):
        produce(cluster, topic, [f"{p}-{i}" for i in range(5, 8)], partition=p)
    wait_until("the new records", lambda: sum(len(m.records) for m in members) == 3 * PARTITIONS)
    time.sleep(0.5)  # a duplicate would arrive within this window
    for m in members:
        m.shut_down()
        records += m.records
    seen = sorted((r.partition, r.offset) for r in records)
    assert seen == sorted((p, i) for p in range(PARTITIONS) for i in range(8)), (
        "every record exactly once across the restarts"
    )
