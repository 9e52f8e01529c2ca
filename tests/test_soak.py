"""The soak's verdicts (``benchmarks/_soak.py``), fed samples and reports: the bounds on
resource growth and the matching of truncation reports to elections can fail here, without
an hour's run. The soak itself is run by ``make soak``, not here."""

from __future__ import annotations

import importlib
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from epochguard.testing.netfault import FaultProxy

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def soak() -> Iterator[ModuleType]:
    """``benchmarks._soak``, imported with the repository root on ``sys.path`` for this
    test only, and read again after it (tests change its environment knobs)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        module = importlib.import_module("benchmarks._soak")
        yield module
    importlib.reload(module)


def _samples(**series: list[float]) -> list[dict[str, Any]]:
    """One sample a minute; each resource's values, the others flat."""
    n = max(len(v) for v in series.values())
    flat = {"rss_mib": [60.0] * n, "fds": [16] * n, "threads": [2] * n}
    flat.update(series)
    return [{"second": 60.0 * i, **{k: v[i] for k, v in flat.items()}} for i in range(n)]


def test_flat_resources_pass_and_warmup_growth_does_not_count(soak: ModuleType) -> None:
    # RSS climbs by 20 MiB during the 3-minute warm-up (the ledger fills), then stays.
    samples = _samples(rss_mib=[40, 50, 58, 60, 60.5, 61, 60.8, 61])
    figures, problems = soak.judge_resources(samples, 180.0, soak.Bounds(16, 8, 2))
    assert problems == []
    assert figures["rss_mib"] == {
        "at_warmup_end": 60,
        "end": 61,
        "max_after_warmup": 61,
        "growth": 1.0,
        "bound": 16,
    }
    assert figures["fds"]["growth"] == 0
    assert figures["threads"]["growth"] == 0


@pytest.mark.parametrize(
    ("key", "values", "word"),
    [
        ("rss_mib", [60, 60, 60, 60, 70, 80, 90], "rss_mib grew by 30 MiB"),
        ("fds", [16, 16, 16, 16, 20, 25, 34], "fds grew by 18"),
        ("threads", [2, 2, 2, 2, 3, 4, 5], "threads grew by 3"),
    ],
)
def test_growth_past_a_bound_fails(
    soak: ModuleType, key: str, values: list[float], word: str
) -> None:
    _figures, problems = soak.judge_resources(
        _samples(**{key: values}), 180.0, soak.Bounds(16, 8, 2)
    )
    assert len(problems) == 1
    assert problems[0].startswith(word)


def test_a_transient_peak_after_warmup_counts(soak: ModuleType) -> None:
    # Back to the start by the end, but 12 descriptors more at one sample: the peak is judged.
    samples = _samples(fds=[16, 16, 16, 16, 28, 16, 16])
    figures, problems = soak.judge_resources(samples, 180.0, soak.Bounds(16, 8, 2))
    assert figures["fds"]["max_after_warmup"] == 28
    assert problems == ["fds grew by 12 after the warm-up (from 16, bound 8)"]


def test_growth_within_the_bound_passes(soak: ModuleType) -> None:
    samples = _samples(fds=[16, 16, 16, 16, 24, 20], threads=[2, 2, 2, 2, 4, 3])
    _figures, problems = soak.judge_resources(samples, 180.0, soak.Bounds(16, 8, 2))
    assert problems == []


def test_too_few_samples_after_warmup_fail(soak: ModuleType) -> None:
    figures, problems = soak.judge_resources(_samples(fds=[16] * 4), 180.0, soak.Bounds())
    assert figures == {}
    assert problems == ["1 samples after the warm-up: too few to judge flatness"]


def test_every_election_reported_at_its_point_passes(soak: ModuleType) -> None:
    elections = [(3, 100), (7, 40), (3, 180)]
    figures, problems = soak.judge_truncations(elections, [(7, 40), (3, 180), (3, 100)])
    assert problems == []
    assert figures == {"missed": [], "wrong_point": [], "unexpected": []}


def test_a_missed_truncation_fails(soak: ModuleType) -> None:
    figures, problems = soak.judge_truncations([(3, 100), (7, 40)], [(3, 100)])
    assert figures["missed"] == [[7, 40]]
    assert problems == ["1 truncations not reported at their divergence point"]


def test_a_report_at_the_wrong_point_fails(soak: ModuleType) -> None:
    figures, problems = soak.judge_truncations([(3, 100), (7, 40)], [(3, 100), (7, 41)])
    assert figures["missed"] == [[7, 40]]
    assert figures["wrong_point"] == [[7, 41]]
    assert problems == [
        "1 truncations not reported at their divergence point",
        "1 reports at the wrong point of a truncated partition",
    ]


def test_a_report_twice_or_without_an_election_fails(soak: ModuleType) -> None:
    figures, problems = soak.judge_truncations([(3, 100)], [(3, 100), (3, 100), (9, 5)])
    assert figures["unexpected"] == [[3, 100], [9, 5]]
    assert problems == ["2 reports that match no election"]


def test_warmup_is_a_third_of_the_run_at_most_ten_minutes(soak: ModuleType) -> None:
    assert soak.warmup_seconds(180) == 60
    assert soak.warmup_seconds(600) == 200
    assert soak.warmup_seconds(3600) == 600


@pytest.mark.parametrize(
    ("env", "seconds"),
    [
        ({"SOAK_DURATION_S": "3600"}, 3600.0),
        ({"SOAK_DURATION_S": "3600", "SOAK_MINUTES": "3"}, 3600.0),
        # make soak without DURATION passes an empty SOAK_DURATION_S
        ({"SOAK_DURATION_S": "", "SOAK_MINUTES": "3"}, 180.0),
        ({}, 600.0),
    ],
)
def test_duration_knobs(
    soak: ModuleType, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], seconds: float
) -> None:
    monkeypatch.delenv("SOAK_DURATION_S", raising=False)
    monkeypatch.delenv("SOAK_MINUTES", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    duration = importlib.reload(soak).DURATION_S
    assert duration == seconds


def test_process_resources_sees_new_descriptors_and_threads(soak: ModuleType) -> None:
    load_common = importlib.import_module("benchmarks._load_common")
    before = load_common.process_resources(os.getpid())
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with open(__file__) as _fh:
            during = load_common.process_resources(os.getpid())
    finally:
        release.set()
        worker.join()
    assert during["fds"] == before["fds"] + 1
    assert during["threads"] == before["threads"] + 1
    assert during["rss_kib"] > 0


def test_injected_faults_reach_the_proxy(soak: ModuleType) -> None:
    rng = random.Random(5)
    kinds: dict[str, int] = {}
    with FaultProxy() as proxy:
        for broker in (1, 2, 3):
            proxy.route(broker, "127.0.0.1", 9)
        for _ in range(40):
            kind, broker = soak.inject_fault(proxy, rng)
            kinds[kind] = kinds.get(kind, 0) + 1
            faults = proxy.faults_of(broker)
            if kind == "partition":
                assert faults.partitioned
            elif kind == "blackhole":
                assert faults.blackhole
            elif kind == "latency":
                assert faults.latency_s >= 0.05
            elif kind == "bandwidth":
                assert faults.bandwidth_bps is not None
            proxy.heal()
        # Seeded: the same generator draws the same schedule.
        again = random.Random(5)
        drawn = [soak.inject_fault(proxy, again) for _ in range(40)]
        proxy.heal()
    assert set(kinds) == set(soak.FAULT_KINDS)
    assert sorted(k for k, _ in drawn) == sorted(k for k, n in kinds.items() for _ in range(n))


def test_the_docs_table_shows_a_failed_run_and_why(soak: ModuleType, tmp_path: Path) -> None:
    # A run that stalled: no final read, so no counts from the consumer.
    common = importlib.import_module("benchmarks._common")
    tables = importlib.import_module("benchmarks._tables")
    samples = _samples(fds=[16, 16, 16, 16, 30])
    resources, problems = soak.judge_resources(samples, 180.0, soak.Bounds())
    problems.append("the consumer stopped making progress: doomed read: not reached in 300 s")
    result = {
        "minutes": 4.0,
        "partitions": 100,
        "produce_rate_records_per_s": 2000,
        "elections": 35,
        "faults": 12,
        "faults_by_kind": {k: 2 for k in soak.FAULT_KINDS},
        "warmup_minutes": 3.0,
        "resources": resources,
        "load_average_1min_range": [5.0, 9.5],
        "passed": False,
        "problems": problems,
        "samples": samples,
    }
    common.write_record(tmp_path, "soak", 0.0, result)
    text = tables.soak(tmp_path)
    assert "| 4 min | 100 | 2,000 | - | 35 / - / - | 12 (2 reset, 2 cut," in text
    assert "failed: fds grew by 14 after the warm-up (from 16, bound 8); the consumer" in text
    assert "| open file descriptors | 16 | 30 | 30 (+14) | +8 |" in text
