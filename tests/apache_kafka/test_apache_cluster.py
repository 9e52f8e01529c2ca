"""ApacheKafkaCluster's control interface against real Kafka 4.x KRaft brokers."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from epochguard.testing import ApacheKafkaCluster, Cluster, produce
from epochguard.testing.apache_kafka import ClusterError, ElectionError, KafkaJars, process
from epochguard.testing.apache_kafka.cluster import CONTROLLER_ID

pytestmark = pytest.mark.timeout(180)

_names = itertools.count()


def new_topic(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def consume_all(cluster: ApacheKafkaCluster, topic: str, expected: int) -> list[tuple[int, str]]:
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10000,
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        out: list[tuple[int, str]] = []
        for message in consumer:
            out.append((message.offset, message.value.decode()))
            if len(out) >= expected:
                break
        return out
    finally:
        consumer.close()


def wait_for_leo(cluster: ApacheKafkaCluster, topic: str, broker: int, want: int) -> int:
    deadline = time.monotonic() + 20
    while True:
        got = cluster.log_end_offset(topic, 0, broker)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_cluster_implements_the_protocol(cluster: ApacheKafkaCluster) -> None:
    assert isinstance(cluster, Cluster)
    assert cluster.broker_ids == [0, 1, 2]
    assert len(cluster.bootstrap_servers.split(",")) == 3
    assert cluster.kafka_version.startswith("4.")
    assert cluster.start_seconds is not None and cluster.start_seconds > 0


def test_create_topic_reports_replicas_isr_and_leader(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("create")
    cluster.create_topic(topic, partitions=2, replication_factor=3)
    for partition in (0, 1):
        replicas = cluster.replicas(topic, partition)
        assert sorted(replicas) == [0, 1, 2]
        assert sorted(cluster.isr(topic, partition)) == [0, 1, 2]
        assert cluster.leader(topic, partition) == replicas[0]
        assert cluster.leader_epoch(topic, partition) == 0
        assert cluster.log_end_offset(topic, partition) == 0
    with pytest.raises(ClusterError, match="TopicAlreadyExists"):
        cluster.create_topic(topic)


def test_produce_and_consume_with_kafka_python(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("produce")
    cluster.create_topic(topic, replication_factor=3)
    values = [f"v{i}" for i in range(10)]
    produce(cluster, topic, values)
    assert consume_all(cluster, topic, 10) == list(enumerate(values))
    assert cluster.high_watermark(topic, 0) == 10
    for broker in cluster.broker_ids:
        assert wait_for_leo(cluster, topic, broker, 10) == 10
    latest = cluster.list_offsets(topic, 0)
    assert (latest.offset, latest.leader_epoch) == (10, 0)


def test_stopped_follower_leaves_isr_and_catches_up(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("isr")
    cluster.create_topic(topic, assignments={0: [0, 1, 2]})
    produce(cluster, topic, ["a", "b", "c"])
    assert wait_for_leo(cluster, topic, 2, 3) == 3
    cluster.stop_broker(2)
    assert "2" not in {s.rsplit(":", 1)[0] for s in cluster.bootstrap_servers.split(",")}
    assert cluster.running_broker_ids == [0, 1]
    state = cluster.wait_for_isr(topic, 0, [0, 1])
    assert state.leader == 0 and state.leader_epoch == 0
    produce(cluster, topic, ["d", "e"])
    assert cluster.log_end_offset(topic, 0, broker=2) == 3  # read from its segment files
    assert cluster.log_end_offset(topic, 0) == 5
    cluster.start_broker(2)
    cluster.wait_for_isr(topic, 0, [0, 1, 2])
    assert wait_for_leo(cluster, topic, 2, 5) == 5


def test_stopping_the_leader_moves_leadership_and_bumps_the_epoch(
    cluster: ApacheKafkaCluster,
) -> None:
    topic = new_topic("failover")
    cluster.create_topic(topic, assignments={0: [0, 1, 2]})
    produce(cluster, topic, ["x"])
    # acks=1: without this wait the controlled shutdown can hand leadership to a follower
    # that has not fetched "x" yet, and "x" is gone (broker 0 truncates it when it returns).
    assert wait_for_leo(cluster, topic, 1, 1) == 1 and wait_for_leo(cluster, topic, 2, 1) == 1
    cluster.stop_broker(0)
    state = cluster.wait_for_partition(topic, 0, lambda s: s.leader in (1, 2), "a new leader")
    assert state.leader_epoch == 1
    assert 0 not in state.isr
    assert cluster.log_end_offset(topic, 0) == 1


def test_clean_election_of_a_chosen_replica(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("clean")
    cluster.create_topic(topic, assignments={0: [0, 1, 2]})
    produce(cluster, topic, ["a", "b"])
    cluster.wait_for_isr(topic, 0, [0, 1, 2])
    # acks=1: records above the high watermark may be missing on broker 2; a clean election
    # keeps only what is below it.
    for broker in (1, 2):
        assert wait_for_leo(cluster, topic, broker, 2) == 2
    cluster.elect_leader(topic, 0, 2)
    assert cluster.leader(topic, 0) == 2
    assert cluster.leader_epoch(topic, 0) == 1
    assert cluster.replicas(topic, 0)[0] == 2  # reordered, same replica set
    assert sorted(cluster.replicas(topic, 0)) == [0, 1, 2]
    cluster.elect_leader(topic, 0, 2)  # already leader: no new epoch
    assert cluster.leader_epoch(topic, 0) == 1
    # unclean=True with the target in the ISR and a live leader is just a clean election.
    cluster.elect_leader(topic, 0, 1, unclean=True)
    assert (cluster.leader(topic, 0), cluster.leader_epoch(topic, 0)) == (1, 2)
    assert cluster.log_end_offset(topic, 0) == 2
    end = cluster.offset_for_leader_epoch(topic, 0, 0)
    assert (end.error, end.leader_epoch, end.end_offset) == ("NoError", 0, 2)


def test_election_errors_name_the_problem(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("elect-errors")
    cluster.create_topic(topic, assignments={0: [0, 1]})
    with pytest.raises(ElectionError, match="has no replica"):
        cluster.elect_leader(topic, 0, 2)
    cluster.stop_broker(1)
    with pytest.raises(ElectionError, match="not running"):
        cluster.elect_leader(topic, 0, 1)


def test_delete_records_moves_the_log_start(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("delete-records")
    cluster.create_topic(topic, replication_factor=2)
    produce(cluster, topic, [str(i) for i in range(6)])
    cluster.delete_records(topic, 0, 4)  # waits for the high watermark to pass 4 first
    assert cluster.list_offsets(topic, 0, timestamp=-2).offset == 4
    assert consume_all(cluster, topic, 2) == [(4, "4"), (5, "5")]
    for broker in cluster.broker_ids:
        if broker in cluster.replicas(topic, 0):
            assert cluster.list_offsets(topic, 0, -2, broker=broker, replica_id=-2).offset == 4


def test_delete_topic_then_recreate(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("delete")
    cluster.create_topic(topic, replication_factor=2)
    produce(cluster, topic, ["old"])
    cluster.delete_topic(topic)
    with pytest.raises(ClusterError):
        cluster.leader(topic, 0)
    cluster.create_topic(topic, replication_factor=2)
    assert cluster.log_end_offset(topic, 0) == 0


@pytest.mark.slow
def test_killed_broker_is_fenced_and_recovers(cluster: ApacheKafkaCluster) -> None:
    topic = new_topic("kill")
    cluster.create_topic(topic, assignments={0: [1, 2]})
    produce(cluster, topic, ["a", "b", "c"])
    assert wait_for_leo(cluster, topic, 2, 3) == 3
    cluster.stop_broker(2, kill=True)
    cluster.wait_for_isr(topic, 0, [1])
    cluster.start_broker(2)
    cluster.wait_for_isr(topic, 0, [1, 2])
    assert wait_for_leo(cluster, topic, 2, 3) == 3


def test_a_broker_started_from_a_short_lived_thread_keeps_running(
    cluster: ApacheKafkaCluster,
) -> None:
    # The JVM's death signal follows the thread that forked it: a broker restarted from a
    # worker thread must outlive that thread.
    before = set(process.live_pids())
    cluster.stop_broker(2)
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            cluster.start_broker(2)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=restart)
    worker.start()
    worker.join(120)
    assert not worker.is_alive() and not errors, errors
    (pid,) = set(process.live_pids()) - before
    # The signal arrives as the thread ends; a JVM it killed is gone within milliseconds.
    time.sleep(1.0)
    assert _alive(pid)
    assert 2 in cluster.running_broker_ids
    topic = new_topic("thread-started")
    cluster.create_topic(topic, replication_factor=3)
    assert 2 in cluster.isr(topic, 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent's wait is missing.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


@pytest.mark.slow
def test_no_jvm_survives_a_killed_test_process(kafka_jars: KafkaJars, tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from epochguard.testing.apache_kafka import ApacheKafkaCluster, KafkaJars
        from epochguard.testing.apache_kafka.process import live_pids
        jars = KafkaJars(version=sys.argv[1], home=Path(sys.argv[2]))
        # Its own work dir (the killed process cannot remove it): pytest's tmp_path does.
        cluster = ApacheKafkaCluster(brokers=1, jars=jars, work_dir=Path(sys.argv[3])).start()
        print("PIDS", *live_pids(), flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, kafka_jars.version, str(kafka_jars.home), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = ""
        for line in child.stdout:  # skip anything printed before the PIDS line
            if line.startswith("PIDS"):
                break
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2  # controller + broker
        assert all(_alive(p) for p in pids)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)]


def _mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/maps")
def test_every_jvm_maps_the_class_archive_of_its_role(cluster: ApacheKafkaCluster) -> None:
    # make kafka-jars dumps the archives; a node that did not map its archive starts with
    # every class parsed from the jars again, and nothing else would show it.
    from epochguard.testing.apache_kafka import class_archive

    class_archive.ensure_class_archives(cluster.jars)
    for node_id, role in [
        (CONTROLLER_ID, "controller"),
        *((b, "broker") for b in cluster.broker_ids),
    ]:
        pid = cluster._procs[node_id].pid
        assert str(class_archive.archive_path(cluster.jars, role)) in _mapped_files(pid), role
    topic = new_topic("archive")
    cluster.create_topic(topic, replication_factor=1)
    with cluster.java_probe(topic, 0, "earliest") as probe:
        archive = class_archive.archive_path(cluster.jars, "probe")
        assert str(archive) in _mapped_files(probe._proc.pid)


def test_a_class_archive_made_for_other_jars_is_skipped_quietly(kafka_jars: KafkaJars) -> None:
    # The probes' archive was made with their jar ahead of Kafka's: the JVM must refuse it
    # for Kafka's jars alone, run without it, and say nothing on the output tests read.
    from epochguard.testing.apache_kafka import class_archive

    class_archive.ensure_class_archives(kafka_jars)
    probe_archive = class_archive.jvm_options(kafka_jars, "probe")
    assert probe_archive, "make kafka-jars made no probe archive"
    done = subprocess.run(
        ["java", *probe_archive, "-cp", kafka_jars.classpath, "kafka.Kafka", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cds" not in done.stdout + done.stderr
    assert kafka_jars.version in done.stdout


def test_kafka_jars_goes_on_without_class_archives(
    kafka_jars: KafkaJars, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The archives only speed JVMs up: failing to make them must not fail `make kafka-jars`.
    from epochguard.testing.apache_kafka import class_archive, jars

    def cannot(_: KafkaJars) -> list[Path]:
        raise RuntimeError("staged failure")

    monkeypatch.setattr(class_archive, "ensure_class_archives", cannot)
    assert jars.main([]) == 0
    err = capsys.readouterr().err
    assert "warning: no class archives" in err and "staged failure" in err


def test_later_clusters_reuse_the_formatted_checkpoint(
    kafka_jars: KafkaJars, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The session's clusters formatted their storage already (or this one does): a later
    # cluster copies the checkpoint and writes its own ids, with no kafka-storage JVM.
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    with ApacheKafkaCluster(brokers=1, jars=kafka_jars, work_dir=tmp_path / "first"):
        pass
    launched: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(args: list[str], *rest: object, **kwargs: object) -> subprocess.Popen[bytes]:
        launched.append(list(args))
        return real_popen(args, *rest, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with ApacheKafkaCluster(brokers=2, jars=kafka_jars, work_dir=tmp_path / "second") as cluster:
        topic = new_topic("formatted")
        cluster.create_topic(topic, replication_factor=2)
        produce(cluster, topic, ["a", "b"])
        metas = [
            dict(
                line.split("=", 1)
                for line in (tmp_path / "second" / name / "data" / "meta.properties")
                .read_text()
                .splitlines()
                if "=" in line
            )
            for name in ("controller", "broker-0", "broker-1")
        ]
    assert not [a for a in launched if "kafka.tools.StorageTool" in a]
    assert {m["cluster.id"] for m in metas} == {cluster._cluster_id}
    assert [m["node.id"] for m in metas] == [str(CONTROLLER_ID), "0", "1"]
    assert len({m["directory.id"] for m in metas}) == 3
