"""Shared by the examples: an EmbeddedCluster with a partition whose log gets truncated."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from typing import Any


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--bootstrap-servers",
        default=None,
        help="a real cluster (default: start an EmbeddedCluster and stage an "
        "unclean election on it)",
    )
    p.add_argument("--topic", default="orders")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to consume")
    return p


def quiet() -> None:
    """An application's logging set-up: epochguard's warnings (truncations) on stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


@contextlib.contextmanager
def cluster_or_none(bootstrap: str | None) -> Iterator[Any]:
    if bootstrap is not None:
        yield None
        return
    from epochguard.testing import EmbeddedCluster

    with EmbeddedCluster(brokers=3) as cluster:
        yield cluster


class Staging:
    """Drives an EmbeddedCluster partition into a truncation in three steps."""

    def __init__(self, cluster: Any, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic
        cluster.create_topic(topic, partitions=1, replication_factor=2)
        self.leader = cluster.leader(topic, 0)
        self.follower = next(b for b in cluster.replicas(topic, 0) if b != self.leader)
        self._step = 0

    def replicated(self, n: int) -> None:
        self.cluster.append(self.topic, 0, [b"order-%d" % i for i in range(n)], batch_size=1)

    def leader_only(self, start: int, n: int) -> None:
        """Records only the leader gets (the follower is down): they will be lost."""
        self.cluster.stop_broker(self.follower)
        self.cluster.append(
            self.topic, 0, [b"order-%d" % i for i in range(start, start + n)], batch_size=1
        )

    def advance(self, seen: int) -> bool:
        """The examples' script, driven by how many records the application has seen: 10
        replicated, 5 more on the leader only, then an unclean election that brings 8 new
        ones. True once all 23 are in."""
        if self._step == 0 and seen >= 10:
            self.leader_only(10, 5)
            self._step = 1
        elif self._step == 1 and seen >= 15:
            self.unclean_election(8)
            self._step = 2
        return self._step == 2 and seen >= 23

    def unclean_election(self, new_records: int) -> None:
        c = self.cluster
        c.stop_broker(self.leader)
        c.start_broker(self.follower)
        c.elect_leader(self.topic, 0, self.follower, unclean=True)
        c.append(self.topic, 0, [b"refund-%d" % i for i in range(new_records)], batch_size=1)
        c.start_broker(self.leader)
