"""The benchmarks' shared helpers (one producer, one percentile) and their results: one
current file per benchmark, every benchmark module importable. The benchmarks themselves
are run by ``make bench``, not here."""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochguard.testing import EmbeddedCluster
from epochguard.testing.embedded.records import build_batch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def common() -> Iterator[ModuleType]:
    """``benchmarks._common``, imported with the repository root on ``sys.path`` for this
    module only (the test run never puts it there)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        yield importlib.import_module("benchmarks._common")


def benchmark_names() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules([str(BENCHMARKS)]) if not m.name.startswith("_")
    )


# ------------------------------------------------------------------------ percentile


def test_percentile_by_nearest_rank(common: ModuleType) -> None:
    values = [15, 20, 35, 40, 50]
    assert [common.percentile(values, q) for q in (5, 30, 40, 50, 100)] == [15, 20, 20, 35, 50]
    assert common.percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    assert common.percentile([], 50) is None
    for q in (0, -1, 101):
        with pytest.raises(ValueError, match="not in"):
            common.percentile(values, q)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0.01, 100))
def test_percentile_is_a_value_with_at_least_q_percent_at_or_below(
    values: list[float], q: float
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        from benchmarks._common import percentile
    p = percentile(values, q)
    assert p in values
    assert sum(v <= p for v in values) >= q / 100 * len(values)
    assert sum(v < p for v in values) < q / 100 * len(values)  # and it is the smallest such
    assert percentile(values, 100) == max(values)


def test_the_loop_ticker_tells_a_blocked_loop_from_a_full_collection(common: ModuleType) -> None:
    import asyncio
    import gc

    async def main() -> Any:
        ticker = common.LoopTicker()
        ticker.start()
        await asyncio.sleep(0.01)
        time.sleep(0.03)  # the loop blocked by the program itself
        await asyncio.sleep(0.01)
        # A full collection of 0.5 s, as the garbage collector's callbacks announce one.
        ticker._on_gc("start", {"generation": 2})
        time.sleep(0.5)
        ticker._on_gc("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
        await asyncio.sleep(0.01)
        gc.collect()  # a real one: the ticker hears of it
        await asyncio.sleep(0.01)
        ticker.stop()
        return ticker

    ticker = asyncio.run(main())
    assert ticker.full_collections >= 2 and ticker.longest_full_s >= 0.5
    # The ticker's lateness is past its own millisecond of sleep.
    assert ticker.worst_s >= 0.5 - 0.001
    # The program's own block stays; the collection's is taken out.
    assert 0.03 - 0.001 <= ticker.worst_outside_gc_s < 0.45
    assert ticker.results()["gc_full_collections"] == ticker.full_collections
    assert ticker._on_gc not in gc.callbacks


# --------------------------------------------------------------------------- produce


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(brokers=1) as c:
        yield c


def _values(cluster: EmbeddedCluster, topic: str, partition: int) -> list[Any]:
    return [value for _offset, _key, value in cluster.read_records(topic, partition)]


def test_produce_appends_whole_batches_to_an_embedded_cluster(
    common: ModuleType, cluster: EmbeddedCluster
) -> None:
    cluster.create_topic("batches", partitions=3)
    batch = build_batch([b"v%d" % i for i in range(4)])
    common.produce(cluster, "batches", 24, partitions=3, batch=batch, batch_records=4)
    for p in range(3):
        assert _values(cluster, "batches", p) == [b"v0", b"v1", b"v2", b"v3"] * 2


def test_produce_refuses_records_that_do_not_fill_whole_batches(
    common: ModuleType, cluster: EmbeddedCluster
) -> None:
    batch = build_batch([b"x"] * 4)
    with pytest.raises(ValueError, match="whole batches of 4"):
        common.produce(cluster, "batches", 10, partitions=2, batch=batch, batch_records=4)
    with pytest.raises(TypeError, match="needs an EmbeddedCluster"):
        common.produce("127.0.0.1:9", "batches", 4, batch=batch, batch_records=4)
    with pytest.raises(ValueError, match="records=-1"):
        common.produce(cluster, "batches", -1)


def test_produce_through_a_producer_spreads_records_with_keys_and_headers(
    common: ModuleType, cluster: EmbeddedCluster
) -> None:
    cluster.create_topic("sent", partitions=2)
    common.produce(
        cluster,  # a cluster's bootstrap servers; a string works the same
        "sent",
        6,
        partitions=2,
        value=lambda i: b"value-%d" % i,
        key=lambda i: b"key-%d" % i,
        headers=lambda i: [("n", b"%d" % i)],
        acks="all",
    )
    assert _values(cluster, "sent", 0) == [b"value-0", b"value-2", b"value-4"]
    assert _values(cluster, "sent", 1) == [b"value-1", b"value-3", b"value-5"]
    assert [k for _o, k, _v in cluster.read_records("sent", 1)] == [b"key-1", b"key-3", b"key-5"]


def test_produce_paces_records_and_makes_each_value_when_it_is_sent(
    common: ModuleType, cluster: EmbeddedCluster
) -> None:
    cluster.create_topic("paced")
    made: list[float] = []

    def value(i: int) -> bytes:
        made.append(time.monotonic())
        return b"%d" % i

    common.produce(cluster.bootstrap_servers, "paced", 5, value=value, linger_ms=0, rate=50)
    assert _values(cluster, "paced", 0) == [b"0", b"1", b"2", b"3", b"4"]
    # Record i is made no earlier than i/rate after the first: pacing is a lower bound.
    assert all(t - made[0] >= i / 50 - 0.002 for i, t in enumerate(made))


# --------------------------------------------------------------------------- results


def test_compile_package_writes_what_a_wheel_install_writes(
    common: ModuleType, tmp_path: Path
) -> None:
    """Benchmarks measure the package as installed: with compiled modules, even where the
    environment says not to write them (PYTHONDONTWRITEBYTECODE, as here)."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    sources = [package / "__init__.py", package / "sub" / "__init__.py", package / "sub" / "m.py"]
    for source in sources:
        source.write_text("VALUE = 1\n")
    common.compile_package(str(package))
    for source in sources:
        assert Path(importlib.util.cache_from_source(str(source))).is_file(), source


def test_every_benchmark_module_imports() -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        for name in benchmark_names():
            module = importlib.import_module(f"benchmarks.{name}")
            assert callable(getattr(module, "run", None)), name


def test_one_current_result_file_per_benchmark() -> None:
    # soak.json: make soak; chaos_at_scale.json, chaos_raft_at_scale.json,
    # chaos_asyncio_at_scale.json and chaos_transactions.json: make chaos;
    # chaos_transactions_apache.json: the real-Kafka chaos command with --transactions
    # (benchmarks/README.md).
    by_commands = {
        "soak",
        "chaos_at_scale",
        "chaos_raft_at_scale",
        "chaos_asyncio_at_scale",
        "chaos_transactions",
        "chaos_transactions_apache",
    }
    writers = set(benchmark_names()) | by_commands
    files = {p.stem for p in (BENCHMARKS / "results").glob("*.json")}
    assert files <= writers, f"result files no benchmark writes: {sorted(files - writers)}"
    assert not list((BENCHMARKS / "results").glob("*.tmp"))


def test_the_real_kafka_scoreboard_merges_into_the_one_result_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    board = importlib.import_module("benchmarks.chaos_scoreboard")
    common = importlib.import_module("benchmarks._common")
    monkeypatch.setattr(board, "RESULTS", tmp_path)
    monkeypatch.setattr(board, "OUT", tmp_path / "chaos_scoreboard.json")
    common.write_record(tmp_path, "chaos_scoreboard", time.time(), {"clients": {"x": 1}})
    monkeypatch.setattr(
        board, "score_apache", lambda n, first=0, network=False: {"seeds": f"{first}..{n}"}
    )
    section = board.run_apache_only(3, first=2)
    assert section == {"seeds": "2..3"}
    assert [p.name for p in tmp_path.iterdir()] == ["chaos_scoreboard.json"]
    assert board._previous() == {"clients": {"x": 1}, "apache_kafka": {"seeds": "2..3"}}


# ---------------------------------------------------------------------- spark_latency


def _progress(batch_id: int, started: float, rows: int, **durations: int) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started))
    millis = round((started % 1) * 1000)
    return {
        "batchId": batch_id,
        "timestamp": f"{stamp}.{millis:03d}Z",
        "numInputRows": rows,
        "durationMs": durations,
    }


def test_spark_latency_summarises_what_the_sink_saw() -> None:
    """The running query's figures come from each record's stamp (send time, index), the
    time its batch reached the sink and the progress of that batch; the warm-up's records
    and micro-batches stay out of them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        bench = importlib.import_module("benchmarks.spark_latency")
    assert bench.unstamp(bench.stamp(7, 1234.5)) == (7, 1234.5)
    assert len(bench.stamp(7, 1234.5)) == bench.VALUE_BYTES
    t = 1_800_000_000.0
    arrivals = [
        (1, t + 5.0, [bench.stamp(0, t)]),  # warm-up: 5 s, the first batch
        (2, t + 1.3, [bench.stamp(1, t + 1.0), bench.stamp(2, t + 1.1)]),
        (3, t + 1.7, [bench.stamp(3, t + 1.25)]),
    ]
    progress = [
        _progress(1, t + 0.1, 1, latestOffset=900, addBatch=4000, triggerExecution=4900),
        _progress(2, t + 1.15, 2, latestOffset=10, addBatch=100, triggerExecution=150),
        _progress(3, t + 1.5, 1, latestOffset=30, addBatch=120, triggerExecution=200),
    ]
    out = bench.summarise(arrivals, progress, warmup=1, records=3)
    assert out["latencies_ms"] == [300.0, 200.0, 450.0]
    assert (out["p50_ms"], out["p90_ms"], out["max_ms"]) == (300.0, 450.0, 450.0)
    assert out["sent_to_trigger_ms"]["max_ms"] == 250.0  # record 3: sent 1.25, trigger 1.5
    assert out["trigger_to_sink_ms"]["p50_ms"] == 150.0
    assert out["batches_with_rows"] == 2
    assert out["batch_duration_ms"]["latestOffset"] == {"p50_ms": 10, "p90_ms": 30, "max_ms": 30}
    with pytest.raises(RuntimeError, match=r"missing at the sink: \[3\]"):
        bench.summarise(arrivals[:2], progress, warmup=1, records=3)
    with pytest.raises(RuntimeError, match=r"twice: \[2\]"):
        bench.summarise([*arrivals, (4, t + 2, [bench.stamp(2, t)])], progress, 1, 3)


# ---------------------------------------------------------------------- leader_change


@pytest.fixture(scope="module")
def leader_change() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        yield importlib.import_module("benchmarks.leader_change")


def test_leader_change_reads_times_reports_and_counts_from_client_lines(
    leader_change: ModuleType,
) -> None:
    t0 = 1000.0
    events = [
        {"value": "marker-0", "offset": 4, "at": t0 - 5},  # before the election: not it
        {"counts": {"Fetch": 10, "Metadata": 2}, "label": "count-mark"},
        {"report": {"divergence": 7, "detail": "x"}, "at": t0 + 0.03},
        {"value": "marker-0", "offset": 9, "at": t0 + 0.05},
        {"counts": {"Fetch": 70, "Metadata": 2, "OffsetForLeaderEpoch": 30}, "label": "end"},
    ]
    assert leader_change.first_record(events, "marker-0", t0) == t0 + 0.05
    assert leader_change.first_record(events, "marker-0") == t0 - 5
    assert leader_change.first_record(events, "marker-1") is None
    assert leader_change.first_report(events, t0)["report"]["divergence"] == 7
    assert leader_change.first_report(events, t0 + 1) is None
    counted = leader_change.counts_between(events, "count-mark", "end")
    assert counted == {"Fetch": 60, "OffsetForLeaderEpoch": 30}  # Metadata: none in between
    assert leader_change.per_change(counted, 30) == {"Fetch": 2.0, "OffsetForLeaderEpoch": 1.0}
    assert leader_change.counts_between(events[:3], "count-mark", "end") == {}
    s = leader_change.summary([30.0, 10.0, 20.0])
    assert (s["p50_ms"], s["p99_ms"], s["max_ms"]) == (20.0, 30.0, 30.0)
    assert leader_change.summary([])["p50_ms"] is None


def test_leader_change_counts_each_change_from_its_start_to_the_clients_signal(
    leader_change: ModuleType,
) -> None:
    me = leader_change.CLIENT_ID + "me"

    def req(api: int, at: float, answered: float | None, **kw: Any) -> dict[str, Any]:
        entry = {"client": me, "api": api, "broker": 1, "at": at, **kw}
        return entry if answered is None else {**entry, "answered": answered}

    trace = [
        req(1, 9.0, 9.5, max_wait_ms=500),  # an idle poll before the change: not counted
        req(1, 9.7, None, max_wait_ms=500),  # in flight at the stop, never answered
        {**req(3, 10.05, 10.06), "client": "someone-else"},
        req(3, 10.05, 10.06),
        req(18, 10.2, 10.21),
        req(1, 10.22, 10.23, max_wait_ms=500),  # answered: the signal
        req(1, 10.24, 10.74, max_wait_ms=500),  # after the signal: idle again
        req(1, 20.1, 20.2, max_wait_ms=500),  # in flight at the next change's start
        req(1, 20.3, 20.4, max_wait_ms=500),
    ]
    windows = [(10.0, 10.23), (20.15, 20.35)]
    counted = leader_change.window_counts(trace, "me", windows)
    assert counted == {"ApiVersions": 0.5, "Fetch": 2.0, "Metadata": 0.5}
    assert leader_change.window_counts(trace, "me", []) == {}
    # changes 10 s apart; the median window (0.23 s, 0.2 s) leaves 9.77 s of idle polls
    assert leader_change.idle_baseline([10.0, 20.0, 30.0], windows) == 19.6
    assert leader_change.idle_baseline([10.0], windows) == 0.0


def test_leader_timeline_takes_a_change_apart(leader_change: ModuleType) -> None:
    timeline_mod = importlib.import_module("benchmarks._leader_timeline")
    me = leader_change.CLIENT_ID + "me"
    trace = [
        {"client": me, "api": 1, "broker": 1, "at": 9.0, "answered": 9.5, "max_wait_ms": 500},
        {"client": me, "api": 1, "broker": 1, "at": 9.7, "max_wait_ms": 500},  # cut
        {"client": me, "api": 3, "broker": 3, "at": 10.05, "answered": 10.06},
        {"client": me, "api": 18, "broker": 2, "at": 10.2, "answered": 10.21},
        {"client": me, "api": 1, "broker": 2, "at": 10.22, "answered": 10.23, "errors": [0, -1]},
        {"client": me, "api": 1, "broker": 2, "at": 10.24, "answered": 10.241, "errors": [0, 0]},
    ]
    timeline = {
        "changes": [{"start": 10.0, "stopped": 10.0, "t0": 10.1, "written": 10.11}],
        "events": {"me": [{"report": {"divergence": 3, "detail": ""}, "at": 10.235}]},
        "trace": trace,
    }
    text = timeline_mod.take_apart(timeline)
    assert "1 x  Fetch Metadata ApiVersions Fetch!" in text
    # outside: the full wait before, the one answered at once after the signal
    assert (
        "Fetch outside the changes per change: 2.00 (answered at once 1.00, full wait 1.00)" in text
    )


def test_leader_change_sees_librdkafkas_counters_start_over(leader_change: ModuleType) -> None:
    # librdkafka drops a broker that leaves metadata and counts from zero once it is back:
    # the sums over brokers then count nothing reliable.
    def stats(**brokers: dict[str, int]) -> str:
        return json.dumps({"brokers": {n: {"req": req} for n, req in brokers.items()}})

    rd = leader_change.RdkafkaStats()
    restarted = leader_change.RESTARTED
    rd.add(stats(b0={"Fetch": 5, "Metadata": 1}, b1={"Fetch": 2}))
    rd.add(stats(b0={"Fetch": 9, "Metadata": 1}, b1={"Fetch": 4}))
    assert rd.totals[-1] == {"Fetch": 13, "Metadata": 1, restarted: 0}
    rd.add(stats(b0={"Fetch": 10, "Metadata": 1}))  # b1 dropped
    rd.add(stats(b0={"Fetch": 11, "Metadata": 1}, b1={"Fetch": 1}))  # back, from zero
    rd.add(stats(b0={"Fetch": 1}, b1={"Fetch": 2}))  # b0 started over while not looked at
    assert [t[restarted] for t in rd.totals] == [0, 0, 1, 1, 2]


@pytest.mark.parametrize(
    ("offset", "what"),
    [
        (13, "read on past the lost records (new records at their offsets skipped)"),
        (10, "read on at the divergence point"),
        (0, "re-read from before the divergence"),
        (11, "re-read records at the lost records' offsets"),
        (None, "nothing read"),
    ],
)
def test_leader_change_says_where_a_client_without_a_signal_read_on(
    leader_change: ModuleType, offset: int | None, what: str
) -> None:
    t0 = 50.0
    events: list[dict[str, Any]] = [{"value": "lost-0-2", "offset": 12, "at": t0 - 1}]
    if offset is not None:
        events.append({"value": "v", "offset": offset, "at": t0 + 0.2})
    assert leader_change._what_it_did(events, t0, divergence=10, last_read=12) == what


def test_leader_change_keeps_the_other_clusters_section_from_the_result_file(
    leader_change: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    sections = {
        "embedded": {"started_at": "2026-11-26T11:00:00Z", "clean": {}},
        "apache": {"started_at": "2026-11-26T10:00:00Z", "clean": {}},
    }
    (results / "leader_change.json").write_text(json.dumps({"result": {"clusters": sections}}))
    monkeypatch.setattr(leader_change, "ROOT", tmp_path)
    monkeypatch.setattr(leader_change, "CLUSTERS", ["apache"])
    assert leader_change._earlier_sections() == {"embedded": sections["embedded"]}
    monkeypatch.setattr(leader_change, "CLUSTERS", ["embedded", "apache"])
    assert leader_change._earlier_sections() == {}
    (results / "leader_change.json").write_text('{"result": {"clients": {}}}')  # older form
    monkeypatch.setattr(leader_change, "CLUSTERS", ["apache"])
    assert leader_change._earlier_sections() == {}
