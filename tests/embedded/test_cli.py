"""The standalone runners: ``python -m epochguard.testing`` and ``epochguard cluster``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from epochguard.__main__ import main as epochguard_main

pytestmark = pytest.mark.timeout(60)


def test_module_runner_prints_bootstrap_and_serves_topics() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "epochguard.testing",
            "--brokers",
            "2",
            "--topic",
            "a:3:2",
            "--topic",
            "b",
            "--exit-after",
            "20",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        bootstrap = proc.stdout.readline().strip()
        assert len(bootstrap.split(",")) == 2 and bootstrap.startswith("127.0.0.1:")
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            topics = {t["name"]: t for t in admin.describe_topics(["a", "b"])}
        finally:
            admin.close()
        assert len(topics["a"]["partitions"]) == 3
        assert all(len(p["replica_nodes"]) == 2 for p in topics["a"]["partitions"])
        assert len(topics["b"]["partitions"]) == 1
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        assert producer.send("a", b"x", partition=2).get(timeout=10).offset == 0
        producer.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_ctrl_c_stops_the_runner_cleanly() -> None:
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "epochguard.testing", "--brokers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_epochguard_cluster_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        epochguard_main(["cluster", "--brokers", "1", "--topic", "x:2:1", "--exit-after", "0.1"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("127.0.0.1:") >= 1
    with pytest.raises(SystemExit):
        epochguard_main(["cluster", "--topic", "bad:notanumber"])


def test_auto_create_topics(capsys: pytest.CaptureFixture[str]) -> None:
    from epochguard.testing import EmbeddedCluster

    with EmbeddedCluster(brokers=1, auto_create_topics=True) as cluster:
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
        assert producer.send("fresh", b"x").get(timeout=10).offset == 0
        producer.close()
        assert cluster.log_end_offset("fresh", 0) == 1
