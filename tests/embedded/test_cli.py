"""The standalone runners: ``python -m epochguard.testing`` and ``epochguard cluster``."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _runner(*extra: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "epochguard.testing", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        **popen,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_stops_a_runner_started_with_sigint_ignored() -> None:
    """A background job of a non-interactive shell (``make test &``) starts with SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler: the runner must."""
    proc = _runner("--brokers", "1", preexec_fn=_ignore_sigint)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        _stop(proc)


def _block_sigint() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def test_ctrl_c_stops_a_runner_started_with_sigint_blocked() -> None:
    """The signal mask is inherited across fork and exec: a runner spawned by a thread that
    blocks SIGINT would keep the signal pending forever."""
    proc = _runner("--brokers", "1", preexec_fn=_block_sigint)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        _stop(proc)


def test_sigterm_closes_the_cluster_and_exits_0() -> None:
    proc = _runner("--brokers", "1")
    try:
        assert proc.stdout is not None
        bootstrap = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        with pytest.raises(OSError):
            socket.create_connection(_host_port(bootstrap), timeout=2).close()
    finally:
        _stop(proc)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _free_port_block(n: int) -> int:
    """A base port with ``n`` consecutive free ports after it (checked by binding them)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for i in range(n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", base + i))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise AssertionError("no block of free ports found")


def test_port_sets_the_first_broker_and_the_others_follow() -> None:
    base = _free_port_block(3)
    proc = _runner("--brokers", "3", "--port", str(base), "--exit-after", "20")
    try:
        assert proc.stdout is not None
        bootstrap = proc.stdout.readline().strip()
        assert bootstrap == ",".join(f"127.0.0.1:{base + i}" for i in range(3))
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_port_help_matches_where_each_broker_listens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from epochguard.testing import EmbeddedCluster

    with pytest.raises(SystemExit):
        epochguard_main(["cluster", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "broker i (ids start at 1) listens on PORT+i-1" in help_text
    base = _free_port_block(3)
    with EmbeddedCluster(brokers=3, port=base) as cluster:
        for i in cluster.broker_ids:
            assert cluster.broker_address(i) == f"127.0.0.1:{base + i - 1}"


def test_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert epochguard_main(["cluster", "--brokers", "1", "--port", str(port)]) == 1
    assert f"cannot listen on port {port}" in capsys.readouterr().err


def _ctl(control: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epochguard", "cluster-ctl", "--control", control, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _ok(control: str, *args: str) -> Any:
    done = _ctl(control, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_control_port_drives_an_unclean_election_from_another_process() -> None:
    proc = _runner("--brokers", "3", "--topic", "t:1:2", "--control-port", "0")
    try:
        assert proc.stdout is not None
        bootstrap = proc.stdout.readline().strip()
        control = proc.stdout.readline().strip()
        assert control.startswith("127.0.0.1:") and control not in bootstrap

        before = _ok(control, "describe-partition", "t", "0")
        leader, epoch = before["leader"], before["leader_epoch"]
        follower = next(b for b in before["replicas"] if b != leader)
        assert _ok(control, "append", "t", "0", "a", "b", "c") == {"base_offset": 0}
        assert _ok(control, "stop-broker", str(follower)) == {}
        assert _ok(control, "append", "t", "0", "only-on-leader") == {"base_offset": 3}
        assert _ok(control, "stop-broker", str(leader)) == {}
        assert _ok(control, "start-broker", str(follower)) == {}
        # A clean election of a replica outside the ISR is refused, with the reason.
        refused = _ctl(control, "elect-leader", "t", "0", str(follower))
        assert refused.returncode == 1 and "not in the ISR" in refused.stderr
        elected = _ok(control, "elect-leader", "t", "0", str(follower), "--unclean")
        assert elected["leader"] == follower and elected["leader_epoch"] > epoch
        after = _ok(control, "describe-partition", "t", "0")
        assert after["log_end_offset"] == 3  # the record only the old leader had is gone
        assert _ok(control, "delete-records", "t", "0", "2") == {"log_start_offset": 2}
        brokers = _ok(control, "describe-cluster")["brokers"]
        assert {b["id"]: b["running"] for b in brokers} == {
            leader: False,
            follower: True,
            next(b for b in (1, 2, 3) if b not in (leader, follower)): True,
        }
        # The bootstrap string from line 1 reaches the new leader: a real client sees it.
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            (desc,) = admin.describe_topics(["t"])
        finally:
            admin.close()
        assert desc["partitions"][0]["leader_id"] == follower
        assert _ok(control, "shutdown") == {}
        assert proc.wait(timeout=20) == 0
    finally:
        _stop(proc)


def test_a_raft_term_runner_reelects_under_new_terms_and_loses_unflushed_records() -> None:
    proc = _runner("--brokers", "3", "--topic", "t:1:3", "--control-port", "0", "--epochs", "raft")
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        control = proc.stdout.readline().strip()
        assert _ok(control, "describe-cluster")["epochs"] == "raft"
        first = _ok(control, "describe-partition", "t", "0")
        leader = first["leader"]
        assert first["leader_epoch"] == 1  # the first election's term
        assert _ok(control, "append", "t", "0", "kept") == {"base_offset": 0}
        assert _ok(control, "flush", "t") == {}
        assert _ok(control, "append", "t", "0", "unflushed") == {"base_offset": 1}
        # The same leader again, after two failed rounds: the epoch skips two numbers.
        again = _ok(control, "elect-leader", "t", "0", str(leader), "--failed-attempts", "2")
        assert again == {"leader": leader, "leader_epoch": 4}
        refused = _ctl(control, "elect-leader", "t", "0", str(leader), "--unclean")
        assert refused.returncode == 1 and "no unclean elections" in refused.stderr
        # Each broker in turn loses power and starts again: the new term flushed record 1
        # on the leader and on its followers, so it survives.
        for b in [b for b in first["replicas"] if b != leader] + [leader]:
            assert _ok(control, "stop-broker", str(b)) == {}
            assert _ok(control, "start-broker", str(b)) == {}
        after = _ok(control, "describe-partition", "t", "0")
        assert after["log_end_offset"] == 2 and after["leader_epoch"] > 4
        assert _ok(control, "shutdown") == {}
        assert proc.wait(timeout=20) == 0
    finally:
        _stop(proc)


def test_control_protocol_is_json_lines_with_typed_errors() -> None:
    """What a client in another language sees: one JSON object per line, in order."""
    proc = _runner("--brokers", "2", "--topic", "t:1:2", "--control-port", "0")
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        control = proc.stdout.readline().strip()
        with socket.create_connection(_host_port(control), timeout=10) as sock:
            f = sock.makefile("rwb")
            requests = [
                b'{"op": "ping", "id": 1}',
                b"not json",
                b'{"op": "fly"}',
                b'{"op": "stop_broker"}',
                b'{"op": "stop_broker", "broker": true}',
                b'{"op": "stop_broker", "broker": 9}',
                b'{"op": "describe_partition", "topic": "t", "partition": 0, "x": 1}',
                b'{"op": "elect_leader", "topic": "t", "partition": 0, "broker": 2, '
                b'"unclean": true, "id": "e"}',
            ]
            f.write(b"\n".join(requests) + b"\n")
            f.flush()
            answers = [json.loads(f.readline()) for _ in requests]
        assert answers[0] == {"id": 1, "ok": True, "result": {}}
        assert [a["ok"] for a in answers[1:7]] == [False] * 6
        assert [a["error_type"] for a in answers[1:7]] == [
            "bad_request",
            "unknown_op",
            "bad_request",
            "bad_request",
            "cluster_error",
            "bad_request",
        ]
        assert "missing field 'broker'" in answers[3]["error"]
        assert "must be an integer" in answers[4]["error"]
        assert answers[5]["error"] == "unknown broker 9"
        assert "unknown field(s) x" in answers[6]["error"]
        assert answers[7]["id"] == "e" and answers[7]["ok"] is True
        assert answers[7]["result"]["leader"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_cluster_ctl_reports_an_unreachable_runner() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    done = _ctl(f"127.0.0.1:{port}", "ping")
    assert done.returncode == 1 and "cannot reach" in done.stderr


def test_secured_runner_prints_its_listeners(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["cluster", "--brokers", "1", "--sasl-user", "alice:pw", "--tls-dir", str(tmp_path)]
    assert epochguard_main([*args, "--exit-after", "0.1"]) == 0
    err = capsys.readouterr().err
    for listener in ("SASL_PLAINTEXT", "SSL", "SASL_SSL"):
        assert f"# {listener} 127.0.0.1:" in err
    assert f"# CA file {tmp_path / 'ca.pem'}" in err
    assert (tmp_path / "ca.pem").read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    with pytest.raises(SystemExit):
        epochguard_main(["cluster", "--sasl-user", "no-password"])
