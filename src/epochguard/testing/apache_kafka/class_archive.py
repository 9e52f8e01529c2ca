"""Class-data-sharing archives for the Kafka JVMs the tests start.

A broker, a controller or a ``kafka-storage format`` run parses and verifies a few thousand
classes from the jars before it does anything; mapped from a dynamic class-data-sharing
archive (JDK 13+) they start in about half the time and CPU. The Java probes (reference
consumers) get one too. ``make kafka-jars`` dumps one
archive per role from a small cluster that replicates, serves a group and moves records
(:func:`ensure_class_archives`); nodes then map the archive of their role when it is there
(:func:`jvm_options`). An archive is named after the JVM and the jars it was made with, and
the JVM itself skips an archive that does not match (its warning turned off), so a stale
archive costs start-up time, never a failure.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal

from epochguard._log import get_logger
from epochguard.testing.apache_kafka.jars import KafkaJars, _locked, ensure_probe_classes

log = get_logger("epochguard.testing.apache_kafka")

Role = Literal["broker", "controller", "probe"]
ROLES: tuple[Role, ...] = ("broker", "controller", "probe")
#: A mismatched archive is not an error (the JVM runs without it): keep its warning out of
#: the output that tests read.
_QUIET = "-Xlog:cds=off,cds+dynamic=off"


@functools.cache
def _java_identity() -> str:
    java = shutil.which("java")
    if java is None:
        return "no-java"
    real = os.path.realpath(java)
    return f"{real}:{os.stat(real).st_mtime_ns}"


def archive_path(jars: KafkaJars, role: Role) -> Path:
    """Where the archive of ``role`` lives for these jars and this JVM."""
    jar_names = sorted(p.name for p in jars.lib_dir.glob("*.jar"))
    # The Java probes run with their compiled classes ahead of the jars.
    classes = [str(ensure_probe_classes(jars))] if role == "probe" else []
    key = hashlib.sha256("\0".join([_java_identity(), *classes, *jar_names]).encode())
    return jars.home / "class-archives" / f"{role}-{key.hexdigest()[:16]}.jsa"


def jvm_options(jars: KafkaJars, role: Role) -> tuple[str, ...]:
    """The options that map ``role``'s archive, or none when it has not been made."""
    path = archive_path(jars, role)
    if not path.is_file():
        return ()
    return (f"-XX:SharedArchiveFile={path}", _QUIET)


def ensure_class_archives(jars: KafkaJars) -> list[Path]:
    """Dump the archives of every role unless they exist; returns their paths."""
    paths = [archive_path(jars, role) for role in ROLES]
    if all(p.is_file() for p in paths):
        return paths
    with _locked(jars.home):
        if not all(p.is_file() for p in paths):
            _dump(jars, paths)
    return paths


def _consume_in_a_group(bootstrap_servers: str, topic: str, count: int) -> None:
    from epochguard import EpochConsumer

    consumer = EpochConsumer(
        topic,
        bootstrap_servers=bootstrap_servers,
        group_id="class-archive",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        read = 0
        deadline = time.monotonic() + 60
        while read < count and time.monotonic() < deadline:
            read += sum(len(batch) for batch in consumer.poll(timeout_ms=500).values())
        consumer.commit()
    finally:
        consumer.close()


def _dump(jars: KafkaJars, paths: list[Path]) -> None:
    # Imported here: the cluster module maps the archives this module makes.
    from epochguard.testing.apache_kafka.cluster import ApacheKafkaCluster
    from epochguard.testing.apache_kafka.probe import JavaTruncationProbe
    from epochguard.testing.helpers import produce

    started = time.monotonic()
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=paths[0].parent) as staging:
        dumped = {role: Path(staging) / f"{role}.jsa" for role in ROLES}
        # Two brokers and a replicated topic, so the archive holds the follower's classes too.
        with ApacheKafkaCluster(brokers=2, jars=jars, class_archive_dump=dumped) as cluster:
            cluster.create_topic("class-archive", partitions=2, replication_factor=2)
            for partition in (0, 1):
                produce(cluster, "class-archive", [b"r%d" % i for i in range(50)], partition)
            _consume_in_a_group(cluster.bootstrap_servers, "class-archive", 100)
            with JavaTruncationProbe(
                cluster.all_bootstrap_servers,
                "class-archive",
                0,
                "earliest",
                props={"group.id": "class-archive-java"},
                jars=jars,
                log_dir=Path(staging),
                class_archive_dump=dumped["probe"],
            ) as probe:
                probe.poll(50)
                probe.commit()
        for role, path in zip(ROLES, paths, strict=True):
            if not dumped[role].is_file():
                raise RuntimeError(f"the {role} JVM exited without writing its class archive")
            dumped[role].replace(path)
    log.info(
        "class_archives_dumped",
        paths=[str(p) for p in paths],
        seconds=round(time.monotonic() - started, 1),
    )
