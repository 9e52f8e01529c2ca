"""What a secured connection costs: EpochConsumer from construction to its first record, and
to the error of a refused login, per listener and mechanism, on the EmbeddedCluster.

Each case runs ``ROUNDS`` times with a fresh consumer (one broker, one record); the median
and the best round are reported with the load average of the machine, since other work on
it slows single rounds. ``login_s`` targets: well under a second for every mechanism (SCRAM
adds two round trips and the client's PBKDF2 of 4096 iterations); a refused login must be
an error within a second, not a timeout.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import kafka.errors as kerrors
from kafka.structs import TopicPartition

from epochguard import EpochConsumer
from epochguard.testing import EmbeddedCluster
from epochguard.testing.tls import make_tls_material

ROUNDS = int(os.environ.get("SECURED_CONNECT_ROUNDS", "10"))
PASSWORD = "alice-secret"
CASES: list[tuple[str, str | None]] = [
    ("PLAINTEXT", None),
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SSL", None),
    ("SASL_SSL", "SCRAM-SHA-512"),
]


def _settings(
    cluster: EmbeddedCluster, cafile: Path, protocol: str, mechanism: str | None, password: str
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap_servers": cluster.listener_bootstrap_servers(protocol),
        "security_protocol": protocol,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "bootstrap_timeout_ms": 30_000,
    }
    if mechanism is not None:
        settings |= {
            "sasl_mechanism": mechanism,
            "sasl_plain_username": "alice",
            "sasl_plain_password": password,
        }
    if "SSL" in protocol:
        settings["ssl_cafile"] = str(cafile)
    return settings


def _first_record(settings: dict[str, Any]) -> float:
    tp = TopicPartition("t", 0)
    started = time.perf_counter()
    with EpochConsumer(**settings) as consumer:
        consumer.assign([tp])
        while not consumer.poll(timeout_ms=100).get(tp):
            if time.perf_counter() - started > 30:
                raise RuntimeError("no record within 30 s")
        return time.perf_counter() - started


def _refused(settings: dict[str, Any]) -> float:
    started = time.perf_counter()
    try:
        EpochConsumer(**settings)
    except kerrors.SaslAuthenticationFailedError:
        return time.perf_counter() - started
    raise RuntimeError("a wrong password was accepted")


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(samples), 4),
        "best_s": round(min(samples), 4),
    }


def run() -> dict[str, Any]:
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tls = make_tls_material(Path(tmp))
        with EmbeddedCluster(brokers=1, sasl_users={"alice": PASSWORD}, tls=tls) as cluster:
            cluster.create_topic("t", replication_factor=1)
            cluster.append("t", 0, [b"x"])
            for protocol, mechanism in CASES:
                name = protocol if mechanism is None else f"{protocol}/{mechanism}"
                ok = _settings(cluster, tls.cafile, protocol, mechanism, PASSWORD)
                case: dict[str, Any] = {
                    "first_record": _summary([_first_record(ok) for _ in range(ROUNDS)])
                }
                if mechanism is not None:
                    bad = _settings(cluster, tls.cafile, protocol, mechanism, "wrong")
                    case["refused_login"] = _summary([_refused(bad) for _ in range(ROUNDS)])
                results[name] = case
    return {
        "rounds": ROUNDS,
        "cases": results,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
