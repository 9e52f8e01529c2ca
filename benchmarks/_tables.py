"""``python -m benchmarks._tables``: write the benchmark tables of docs/ from benchmarks/results.

A generated table sits between two markers in a Markdown file under docs/:

    <!-- table: matrix -->
    ...generated, never edited by hand...
    <!-- /table: matrix -->

``python -m benchmarks._tables`` rewrites every marked section from the current result
files; ``--check`` changes nothing and exits 1 naming each section that differs (the docs
test runs the same check). Each table says when its figures were measured and on what, from
the result file itself. A section whose name has no table here, or a table whose result file
is missing, is an error naming it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"

SECTION = re.compile(
    r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table: (?P=name) -->)", re.S
)

CLIENTS = ("epochguard", "kafka-python", "aiokafka", "confluent-kafka")
CLIENT_NAMES = {
    "epochguard": "EpochConsumer",
    "epochguard-pure-python": "EpochConsumer (pure Python)",
    "epochguard-asyncio": "AIOEpochConsumer",
    "kafka-python": "kafka-python",
    "aiokafka": "aiokafka",
    "confluent-kafka": "confluent-kafka",
    "confluent-asyncio": "confluent-kafka AIOConsumer",
    "embedded-alone": "test broker alone",
    "java": "Java KafkaConsumer",
}


class TableError(Exception):
    """A marked section that cannot be generated (unknown table, missing result)."""


def load(name: str, results: Path = RESULTS) -> dict[str, Any]:
    """The record of ``results/<name>.json``."""
    path = results / f"{name}.json"
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise TableError(f"no result file {path.relative_to(path.parents[2])}") from None
    return record


def result_of(record: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = record.get("result", record)
    return out


# ------------------------------------------------------------------------- formatting


def rate(n: float | None) -> str:
    """Records (or rows) per second: ``1.98M``, ``975k``, ``-`` for none."""
    if n is None:
        return "-"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    return f"{n / 1e3:,.0f}k"


def size(n: int) -> str:
    """A value size in bytes: ``100 B``, ``1 KB``, ``10 KB``."""
    return f"{n // 1024} KB" if n >= 1024 else f"{n} B"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def load_text(values: Sequence[float] | float | None) -> str:
    if values is None:
        return "not recorded"
    if isinstance(values, (int, float)):
        return f"{values:g}"
    return f"{values[0]:g}"


def load_range(result: Mapping[str, Any]) -> str:
    """A run's load average from its start to its end (``load_average_before``/``_after``)."""
    return f"{load_text(result['load_average_before'])}-{load_text(result['load_average_after'])}"


def measured(record: dict[str, Any], extra: str = "") -> str:
    """The line under a table: when, on what, how loaded the shared machine was."""
    host = record.get("host") or {}
    when = str(record.get("started_at", "date not recorded"))[:10]
    on = f"{host['cpus']} cores, Python {host['python']}" if host else "host not recorded"
    tail = f"; {extra}" if extra else ""
    return f"\n*Measured {when} ({on}){tail}.*\n"


# ----------------------------------------------------------------------------- tables


def _rounds(record: Any) -> str:
    """How many rounds the rows took: a partial run keeps the other rows' own."""
    counts = sorted(
        {c.get("repeat", result_of(record)["repeat"]) for c in result_of(record)["cases"]}
    )
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def matrix(results: Path) -> str:
    record = load("matrix", results)
    cases = result_of(record)["cases"]
    clients = [*CLIENTS, "embedded-alone"]
    rows = [
        [
            size(c["value_bytes"]),
            c["partitions"],
            c["compression"],
            *(f"**{rate(c.get(k))}**" if k == "epochguard" else rate(c.get(k)) for k in clients),
        ]
        for c in cases
    ]
    first = min(c["measured_at"] for c in cases)[:10]
    last = max(c["measured_at"] for c in cases)[:10]
    when = first if first == last else f"{first} to {last}"
    out = table(["value", "partitions", "codec", *(CLIENT_NAMES[k] for k in clients)], rows)
    loads = [c["load_avg_1m_before"] for c in cases]
    return out + (
        f"\n*Records/s, best of {_rounds(record)} rounds per client; measured {when}"
        f" on one EmbeddedCluster broker in its own process; load average "
        f"{min(loads):g}-{max(loads):g}.*\n"
    )


def _median_ratio(case: dict[str, Any], ours: str, other: str) -> float | None:
    if f"{ours}_vs_{other}_median" in case:
        return float(case[f"{ours}_vs_{other}_median"])
    mine, theirs = case.get(f"{ours}_rounds"), case.get(f"{other}_rounds")
    if not mine or not theirs:
        return None
    return round(statistics.median(mine) / statistics.median(theirs), 2)


def _block(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f} ms"


def matrix_asyncio(results: Path) -> str:
    """The asyncio clients of the matrix: the cases AIOEpochConsumer was measured in."""
    record = load("matrix", results)
    ours, peers = "epochguard-asyncio", ("aiokafka", "confluent-asyncio")
    cases = [c for c in result_of(record)["cases"] if c.get(ours)]
    rows = []
    for c in cases:
        ratios = [
            f"{ratio(c.get(f'{ours}_vs_{p}'))} / {ratio(_median_ratio(c, ours, p))}" for p in peers
        ]
        rows.append(
            [
                size(c["value_bytes"]),
                c["partitions"],
                c["compression"],
                f"**{rate(c.get(ours))}**",
                *(rate(c.get(p)) for p in peers),
                *ratios,
                " / ".join(_block(c.get(f"{k}_loop_block_ms")) for k in (ours, *peers)),
            ]
        )
    header = [
        "value",
        "partitions",
        "codec",
        CLIENT_NAMES[ours],
        *(CLIENT_NAMES[p] for p in peers),
        *(f"vs {CLIENT_NAMES[p]} (best / median)" for p in peers),
        "loop blocked (ours / aiokafka / AIOConsumer)",
    ]
    first = min(c["measured_at"] for c in cases)[:10]
    last = max(c["measured_at"] for c in cases)[:10]
    when = first if first == last else f"{first} to {last}"
    loads = [c["load_avg_1m_before"] for c in cases]
    return table(header, rows) + (
        f"\n*Records/s, best of {_rounds(record)} rounds per client, in the same "
        f"runs as the table above; ratios of the best and of the median rounds; loop blocked: "
        f"the longest the event loop went without running a 1 ms ticker task (median over "
        f"rounds). Measured {when}; load average {min(loads):g}-{max(loads):g}.*\n"
    )


def matrix_apache(results: Path) -> str:
    record = load("matrix_apache", results)
    r = result_of(record)
    rows = [
        [
            size(c["value_bytes"]),
            c["partitions"],
            c["compression"],
            *(f"**{rate(c.get(k))}**" if k == "epochguard" else rate(c.get(k)) for k in CLIENTS),
        ]
        for c in r["cases"]
    ]
    out = table(["value", "partitions", "codec", *(CLIENT_NAMES[k] for k in CLIENTS)], rows)
    return out + measured(record, f"{r['broker']}; records/s, best of {r['repeat']} rounds")


def io_thread(results: Path) -> str:
    """EpochConsumer with and without kafka-python's IO thread beside confluent-kafka."""
    record = load("io_thread", results)
    r = result_of(record)
    drivers = ("epochguard-inline", "epochguard-io-thread", "confluent-kafka")
    rows = []
    loads: list[float] = []
    for broker, title in (("embedded", "EmbeddedCluster"), ("apache", "Apache Kafka")):
        for c in r.get(broker, {}).get("cases", []):
            loads += [c["load_avg_1m_before"], c["load_avg_1m_after"]]
            rows.append(
                [
                    title,
                    size(c["value_bytes"]),
                    c["partitions"],
                    c.get("compression", "none"),
                    *(f"{rate(c.get(k))} / {rate(c.get(k + '_median'))}" for k in drivers),
                    " / ".join(f"{c.get(k + '_cpu_s_per_million', 0):.2f}" for k in drivers),
                    *(
                        f"{ratio(c.get(k + '_vs_confluent-kafka'))} / "
                        f"{ratio(c.get(k + '_vs_confluent-kafka_median'))}"
                        for k in drivers[:2]
                    ),
                ]
            )
    header = [
        "broker",
        "value",
        "partitions",
        "codec",
        "`io_thread=False` (default)",
        "`io_thread=True`",
        "confluent-kafka",
        "CPU-s per million (False / True / confluent-kafka)",
        "False vs confluent-kafka",
        "True vs confluent-kafka",
    ]
    repeat = r.get("embedded", r.get("apache", {})).get("repeat")
    load_avg = f"{min(loads):g}-{max(loads):g}" if loads else "not recorded"
    # A run keeps the section of a broker it did not run: each says when it was measured.
    dates = [
        f"{title} {str(r[broker]['measured_at'])[:10]}"
        for broker, title in (("embedded", "EmbeddedCluster"), ("apache", "Apache Kafka"))
        if r.get(broker, {}).get("measured_at")
    ]
    return table(header, rows) + measured(
        record,
        (f"rows measured: {', '.join(dates)}; " if dates else "")
        + f"records/s, best / median of {repeat} rounds, clients interleaved; "
        f"load average {load_avg}",
    )


def latency(results: Path) -> str:
    record = load("latency", results)
    r = result_of(record)
    rows = [
        [
            "Apache Kafka" if x["cluster"] == "apache" else "EmbeddedCluster",
            CLIENT_NAMES[x["client"]],
            x["fetch_max_wait_ms"],
            *(
                ("error", "", "")
                if "error" in x
                else (f"{x['p50_ms']} ms", f"{x['p99_ms']} ms", f"{x['max_ms']} ms")
            ),
        ]
        for x in r["rows"]
    ]
    s = r["settings"]
    out = table(["broker", "client", "`fetch_max_wait_ms`", "p50", "p99", "max"], rows)
    return out + measured(
        record, f"{s['rate_per_s']} records/s of {s['value_bytes']} B for {s['seconds']:g} s"
    )


def commit_latency(results: Path) -> str:
    record = load("commit_latency", results)
    r = result_of(record)
    rows = [
        [
            "Apache Kafka" if x["cluster"] == "apache" else "EmbeddedCluster",
            CLIENT_NAMES[x["client"]],
            *(
                ("error", "", "", "")
                if "error" in x
                else (f"{x['p50_ms']} ms", f"{x['p99_ms']} ms", f"{x['max_ms']} ms", x["cpu_s"])
            ),
        ]
        for x in r["rows"]
    ]
    s = r["settings"]
    out = table(["broker", "client", "p50", "p99", "max", "CPU-s of the commits"], rows)
    loads = [x["load_before"] for x in r["rows"]] + [x["load_after"] for x in r["rows"]]
    return out + measured(
        record,
        f"{s['commits']} commits per client, the best of {s['repeat']} rounds by p99; "
        f"`fetch_max_wait_ms` {s['fetch_max_wait_ms']}; load average {min(loads):g} to "
        f"{max(loads):g}",
    )


def load_(results: Path) -> str:
    record = load("load", results)
    r = result_of(record)
    labels = {
        "single_sessions": "1 consumer, fetch sessions",
        "single_no_sessions": "1 consumer, no fetch sessions",
        "group": "group",
    }
    rows = []
    for key, label in labels.items():
        x = r[key]
        d = x["detection_latency_s"]
        rows.append(
            [
                label,
                x["partitions"],
                x["consumers"],
                rate(x["throughput_records_per_s"]),
                f"{x['idle_fetch_request_bytes_per_s']:,}",
                f"{x['elections']} / {x['reports']} / {x['missed_truncations']}",
                f"{seconds(d['p50'])} / {seconds(d['p99'])}",
            ]
        )
    out = table(
        [
            "case",
            "partitions",
            "consumers",
            "records/s",
            "idle Fetch bytes/s",
            "elections / reports / missed",
            "detection p50 / p99",
        ],
        rows,
    )
    return out + measured(record, "EmbeddedCluster, 100 B records")


def soak(results: Path) -> str:
    record = load("soak", results)
    r = result_of(record)
    faults = ", ".join(f"{n} {kind}" for kind, n in r["faults_by_kind"].items())
    # A run that stalled has no final read: no counts from the consumer.
    finished = "records_consumed" in r
    d = r["detection_latency_s"] if finished else {"p50": None, "p99": None}
    rows = [
        [
            f"{r['minutes']:g} min",
            r["partitions"],
            f"{r['produce_rate_records_per_s']:,}",
            f"{r['records_consumed']:,}" if finished else "-",
            f"{r['elections']} / {r['reports']} / {r['missed_truncations']}"
            if finished
            else f"{r['elections']} / - / -",
            f"{r['faults']} ({faults})",
            f"{seconds(d['p50'])} / {seconds(d['p99'])}",
            r["violations"] if finished else "-",
            "passed" if r["passed"] else "failed: " + "; ".join(r["problems"]),
        ]
    ]
    out = table(
        [
            "duration",
            "partitions",
            "produced/s",
            "records read",
            "elections / reports / missed",
            "network faults",
            "detection p50 / p99",
            "violations",
            "verdict",
        ],
        rows,
    )
    names = {"rss_mib": "RSS (MiB)", "fds": "open file descriptors", "threads": "threads"}
    resources = table(
        ["consumer process", "at warm-up end", "at the end", "largest after warm-up", "bound"],
        [
            [
                names[key],
                f"{f['at_warmup_end']:g}",
                f"{f['end']:g}",
                f"{f['max_after_warmup']:g} ({f['growth']:+g})",
                f"+{f['bound']:g}",
            ]
            for key, f in r["resources"].items()
        ],
    )
    return (
        out
        + "\n"
        + resources
        + measured(
            record,
            f"EmbeddedCluster behind the fault proxy, {r['warmup_minutes']:g} min warm-up, "
            "load average (1 min) {:g} to {:g} over the samples".format(
                *r["load_average_1min_range"]
            ),
        )
    )


def consumer_memory(results: Path) -> str:
    record = load("consumer_memory", results)
    r = result_of(record)
    by_client: dict[str, dict[int, float]] = {}
    for row in r["rows"]:
        if "error" not in row:
            by_client.setdefault(row["client"], {})[row["topic_mb"]] = row[
                "peak_above_baseline_mib"
            ]
    sizes = sorted({mb for d in by_client.values() for mb in d})
    rows = [
        [CLIENT_NAMES[c], *(f"{d[mb]:.1f}" if mb in d else "-" for mb in sizes)]
        for c, d in by_client.items()
    ]
    out = table(["client", *(f"{mb} MB topic" for mb in sizes)], rows)
    return out + measured(
        record,
        f"peak RSS above the process's baseline, MiB; {r['partitions']} partitions of "
        f"{size(r['value_bytes'])} records, `max_partition_fetch_bytes` "
        f"{r['max_partition_fetch_bytes'] // 1024} KiB",
    )


def consumer_throughput(results: Path) -> str:
    record = load("consumer_throughput", results)
    r = result_of(record)
    rows = [
        [size(x["value_bytes"]), rate(x["c"]), rate(x["python"]), ratio(x["c_vs_python"])]
        for x in r["decoder_only_records_per_s"]
    ]
    out = table(["value", "C decoder", "pure-Python decoder", "C / Python"], rows)
    return out + measured(record, "records/s decoding a 1 MiB fetch in one process")


def detection(results: Path) -> str:
    record = load("consumer_throughput", results)
    r = result_of(record)["detection_after_unclean_election"]
    rows = []
    for client, x in r.items():
        requests = ", ".join(f"{k} {v}" for k, v in x["requests"].items())
        after = x.get("first_record_after")
        rows.append(
            [
                CLIENT_NAMES[client],
                "yes" if x["detected"] else "no",
                f"{x['ms']:.1f} ms",
                requests,
                "-" if after is None else after,
            ]
        )
    out = table(
        ["client", "detected", "time to detect", "requests", "next record read at offset"], rows
    )
    return out + measured(record, "EmbeddedCluster, one unclean election of 5 records")


_CLUSTER_NAMES = {"embedded": "EmbeddedCluster", "apache": "Apache Kafka"}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g} ms"


def _requests_per_change(x: dict[str, Any]) -> str:
    """``5: Metadata 0.1, OffsetForLeaderEpoch 1, Fetch 3.9; hints used 0.97`` (the total
    first), and who counted them when it was the client itself."""
    counts = x.get("requests_per_change")
    if counts is None:
        return "not counted"
    if any(v < 0 for v in counts.values()):
        # librdkafka's statistics count per broker connection and start over when a broker
        # restarts: across restarts its own counts say nothing.
        return "not counted (its counters started over)"
    hints = counts.get("leader hints used")
    apis = [k for k in counts if k != "leader hints used"]
    apis.sort(key=lambda k: (k == "Fetch", k))
    total = round(sum(counts[k] for k in apis), 2)
    text = f"{total:g}: " + (", ".join(f"{k} {counts[k]:g}" for k in apis) or "none")
    if hints is not None:
        text += f"; hints used {hints:g}"
    if x.get("requests_counted_by") not in (None, "brokers"):
        text += f" ({x['requests_counted_by']}, whole run)"
    return text


def _leader_change_rows(
    r: dict[str, Any], section: str, cells: Callable[[dict[str, Any]], list[object]]
) -> list[list[object]]:
    rows: list[list[object]] = []
    for cluster, c in r["clusters"].items():
        for client, x in c[section]["clients"].items():
            name = CLIENT_NAMES.get(client, client)
            if client.startswith("epochguard"):
                name = f"**{name}**"
            rows.append([_CLUSTER_NAMES.get(cluster, cluster), name, *cells(x)])
    return rows


def _leader_change_footer(record: dict[str, Any], r: dict[str, Any], section: str) -> str:
    parts = []
    for cluster, c in r["clusters"].items():
        load_avg = c["load_avg_before"][0]
        extra = ""
        if section == "clean":
            floor = c["clean"]["marker_written"]
            extra = f", marker written {_ms(floor['p50_ms'])} / {_ms(floor['p99_ms'])} after it"
        idle = c[section].get("idle_long_polls_per_change")
        if idle is not None:
            extra += f", idle long polls outside the changes {idle:g} per change"
        day = str(c.get("started_at", ""))[:10]
        when = f" (run of {day})" if day and day != str(record.get("started_at", ""))[:10] else ""
        parts.append(
            f"{_CLUSTER_NAMES.get(cluster, cluster)}{when}: {c[section]['changes']} "
            f"changes{extra}, load average {load_avg:g}"
        )
    return measured(record, "; ".join(parts))


def leader_change(results: Path) -> str:
    record = load("leader_change", results)
    r = result_of(record)

    def cells(x: dict[str, Any]) -> list[object]:
        missed = f" ({x['missed']} missed)" if x["missed"] else ""
        after = x["after_marker_written"]
        return [
            _ms(x["p50_ms"]) + missed,
            _ms(x["p99_ms"]),
            f"{_ms(after['p50_ms'])} / {_ms(after['p99_ms'])}",
            _requests_per_change(x),
        ]

    rows = _leader_change_rows(r, "clean", cells)
    header = ["cluster", "client", "p50", "p99", "p50 / p99 after the record was committed"]
    out = table([*header, "requests per change"], rows)
    return out + _leader_change_footer(record, r, "clean")


def leader_change_unclean(results: Path) -> str:
    record = load("leader_change", results)
    r = result_of(record)

    def cells(x: dict[str, Any]) -> list[object]:
        otherwise = "; ".join(f"{what}: {n}" for what, n in x["when_not_detected"].items())
        return [
            f"{x['detected']} / {x['detected'] + x['not_detected']}",
            x["divergence_given"],
            _ms(x["p50_ms"]),
            _ms(x["p99_ms"]),
            otherwise or "-",
            _requests_per_change(x),
        ]

    rows = _leader_change_rows(r, "unclean", cells)
    header = ["cluster", "client", "detected", "with the divergence point", "p50", "p99"]
    out = table([*header, "not detected: what it did", "requests per change"], rows)
    return out + _leader_change_footer(record, r, "unclean")


def rebalance(results: Path) -> str:
    record = load("rebalance", results)
    r = result_of(record)
    names = {
        "classic_eager": "classic, eager (range)",
        "classic_cooperative": "classic, cooperative-sticky",
        "kip848": "consumer (KIP-848)",
    }

    def stop(x: dict[str, Any], event: str) -> str:
        top, mean = x[f"{event}_kept_stop_max_s"], x[f"{event}_kept_stop_mean_s"]
        return "0 s" if not top else f"{top:.2f} / {mean:.2f} s"

    rows = [
        [
            x["cluster"],
            names.get(x["protocol"], x["protocol"]),
            f"{x['join_settle_s']:.2f} s",
            stop(x, "join"),
            f"{x['leave_settle_s']:.2f} s",
            stop(x, "leave"),
        ]
        for x in r["rows"]
    ]
    out = table(
        [
            "cluster",
            "protocol",
            "join: settle",
            "join: stop (max / mean member)",
            "leave: settle",
            "leave: stop (max / mean member)",
        ],
        rows,
    )
    return out + measured(
        record,
        f"{r['members']} members on {r['partitions']} partitions, a member joins then leaves; "
        f"{r['heartbeat_interval_ms']} ms heartbeats; medians of {r['repeats']} runs",
    )


def rebalance_pause(results: Path) -> str:
    record = load("rebalance_pause", results)
    r = result_of(record)
    rows = []
    for key, label in (
        ("eager_range", "eager, range"),
        ("cooperative_sticky", "cooperative-sticky"),
    ):
        x = r[key]
        cells: list[str] = [label]
        for event in ("join", "leave"):
            e = x[event]
            p, b = e["kept_pause"], e["baseline_gap"]
            cells += [
                f"{e['settle_s']:.2f} s",
                f"{seconds(p['median_s'])} / {seconds(p['max_s'])}",
                f"{seconds(b['median_s'])} / {seconds(b['max_s'])}",
            ]
        rows.append(cells)
    out = table(
        [
            "assignor",
            "join: settle",
            "join: pause of kept partitions (median / max)",
            "baseline",
            "leave: settle",
            "leave: pause",
            "baseline",
        ],
        rows,
    )
    return out + measured(
        record,
        f"EmbeddedCluster; {r['members']} members on {r['partitions']} partitions with a "
        f"backlog, {r['records_per_poll']} records per poll",
    )


def cross_rack(results: Path) -> str:
    record = load("cross_rack", results)
    r = result_of(record)
    rows = [
        [
            cluster,
            "none" if x["client_rack"] is None else f'`"{x["client_rack"]}"`',
            megabytes(x["bytes_total"]),
            f"{megabytes(x['bytes_cross_rack'])} ({x['cross_rack_share'] * 100:.1f} %)",
        ]
        for key, cluster in (("embedded", "EmbeddedCluster"), ("apache_kafka", "Apache Kafka"))
        for x in r[key]
    ]
    out = table(["cluster", "`client_rack`", "record bytes fetched", "from other racks"], rows)
    return out + measured(
        record,
        f"consumer in {r['consumer_rack']}, {r['partitions']} partitions x "
        f"{r['records_per_partition']} records of {size(r['value_bytes'])}, RF 3",
    )


def secured_connect(results: Path) -> str:
    record = load("secured_connect", results)
    r = result_of(record)
    rows = [
        [
            f"`{name}`",
            seconds(c["first_record"]["median_s"]),
            seconds(c["refused_login"]["median_s"]) if "refused_login" in c else "-",
        ]
        for name, c in r["cases"].items()
    ]
    out = table(["security", "to the first record (median)", "a refused login raised"], rows)
    return out + measured(record, f"EmbeddedCluster, medians of {r['rounds']} rounds")


def logging_cost(results: Path) -> str:
    record = load("logging_cost", results)
    r = result_of(record)
    rows = [
        ["a debug event, debug disabled", f"{r['disabled_debug_ns']:.0f} ns"],
        ["a debug event, enabled, formatted and written", f"{r['enabled_debug_ns'] / 1000:.1f} µs"],
    ]
    return table(["call", "cost"], rows) + measured(record, f"{r['calls']:,} calls each")


def tracker(results: Path) -> str:
    record = load("tracker", results)
    r = result_of(record)
    rows = [
        ["`on_records` per batch", f"{r['on_records_ns_per_batch']:.0f} ns"],
        ["`next_action` + `on_records`", f"{r['next_action_plus_on_records_ns']:.0f} ns"],
        ["the driver's loop alone", f"{r['driver_floor_ns']:.0f} ns"],
    ]
    extra = f"{r['batches']:,} batches, Python {r['python']}"
    return table(["per batch", "time"], rows) + f"\n*PartitionTracker alone; {extra}.*\n"


def embedded_fetch(results: Path) -> str:
    record = load("embedded_fetch", results)
    r = result_of(record)
    rows = [
        [
            f"{r['records']:,} x {r['value_bytes']} B",
            rate(r["records_per_s"]),
            rate(r["records_per_s_median"]),
            f"{r['cluster_cpu_share'] * 100:.1f} %",
        ]
    ]
    out = table(["records", "records/s (best)", "median", "broker's share of the CPU"], rows)
    return out + measured(record, "confluent-kafka reading one EmbeddedCluster partition")


def lean_fetch(results: Path) -> str:
    record = load("lean_fetch", results)
    r = result_of(record)
    rows = [
        [
            f"{size(c['value_bytes'])} x {c['partitions']}",
            rate(c["before_records_per_s"]),
            rate(c["after_records_per_s"]),
            f"{c['before_cpu_s_per_million']:.3f} / {c['after_cpu_s_per_million']:.3f}",
        ]
        for c in r["cases"]
    ]
    out = table(
        [
            "records",
            "kafka-python's parser (`EPOCHGUARD_KAFKA_PYTHON_IO=1`)",
            "lean Fetch path (default)",
            "CPU-s per million",
        ],
        rows,
    )
    return out + measured(record, f"EmbeddedCluster; best of {r['repeat']} rounds")


def spark_source(results: Path) -> str:
    record = load("spark_source", results)
    r = result_of(record)
    rows = []
    for run in r["runs"]:
        best = run["best_rows_per_s"]
        shape = f"{size(run['value_bytes'])} x {run['partitions']}"
        if run.get("include_headers"):
            shape += ", 3 headers"
        rows.append(
            [
                shape,
                rate(best["kafka"]),
                f"**{rate(best['epochguard'])}**",
                rate(best.get("ready_batches")),
                f"**{ratio(run['ours_vs_spark'])}**",
                ratio(run.get("ours_vs_spark_per_cpu")),
            ]
        )
    out = table(
        [
            "shape",
            "Spark's Kafka source",
            "epochguard",
            "ready Arrow batches (no Kafka)",
            "epochguard / Spark",
            "rows per CPU-s, epochguard / Spark",
        ],
        rows,
    )
    loads = f"load average {load_range(r)}"
    return out + measured(
        record,
        f"rows/s, best of the runs; Spark's connector {r['spark_kafka_connector']}, "
        f"`{r['session']}`, availableNow into `noop`; {loads}",
    )


def spark_cpu(results: Path) -> str:
    """Rows per CPU-second per shape, both sources, from the same run as ``spark_source``;
    with the run's small query, rows per CPU-second beyond it too."""
    record = load("spark_source", results)
    r = result_of(record)
    small = r.get("small_query")
    rows = []
    for run in r["runs"]:
        shape = f"{size(run['value_bytes'])} x {run['partitions']}"
        if run.get("include_headers"):
            shape += ", 3 headers"
        per_cpu = run["median_rows_per_cpu_s"]
        row = [
            shape,
            f"{run['records']:,}",
            rate(per_cpu["kafka"]),
            rate(per_cpu["epochguard"]),
            f"**{ratio(run['ours_vs_spark_per_cpu'])}**",
        ]
        if small is not None:
            beyond = run["median_rows_per_cpu_s_beyond_small_query"]
            row += [
                rate(beyond["kafka"]),
                rate(beyond["epochguard"]),
                ratio(run["ours_vs_spark_per_cpu_beyond_small_query"]),
            ]
        rows.append(row)
    header = [
        "shape",
        "rows",
        "Spark's Kafka source, rows per CPU-s",
        "epochguard, rows per CPU-s",
        "epochguard / Spark",
    ]
    note = ""
    if small is not None:
        header += [
            "Spark's, beyond a small query",
            "epochguard's, beyond a small query",
            "epochguard / Spark, beyond a small query",
        ]
        note = (
            f'; "beyond a small query": rows per CPU-second above the median CPU of a '
            f"query of {small['rows']} records in the same run"
        )
    loads = f"load average {load_range(r)}"
    return table(header, rows) + measured(
        record,
        f"CPU of the Spark JVM, the processes it starts for the query, its Python workers and "
        f"the broker; medians of {len(r['runs'][0]['kafka'])} queries per source{note}; "
        f"Spark's connector {r['spark_kafka_connector']}, `{r['session']}`, availableNow "
        f"into `noop`; {loads}",
    )


def spark_query_cost(results: Path) -> str:
    """What a query of a few records costs each source, end to end."""
    record = load("spark_import_cost", results)
    r = result_of(record)
    q = r["small_query"]
    names = {
        "kafka": "Spark's Kafka source",
        "epochguard": "epochguard",
        "ready_batches": "a Python source that reads nothing (the floor)",
    }
    # Results before the compiled zips were measured have only the first.
    runs = [("as shipped", q), ("compiled", r.get("small_query_compiled_zips"))]
    rows = [
        [
            names[fmt],
            zips,
            seconds(m["wall_s"]),
            f"{m['cpu_s']:.2f}",
            f"{m['cpu_s_by_part']['spark_jvm_own']:.2f}",
            f"{m['cpu_s_by_part']['spark_jvm_reaped_children']:.2f}",
            f"{m['cpu_s_by_part']['python_under_jvm']:.2f}",
            f"{m['cpu_s_by_part']['kafka_broker']:.2f}",
        ]
        for fmt in q["median"]
        for zips, run in runs
        if run is not None
        for m in (run["median"][fmt],)
    ]
    out = table(
        [
            "source",
            "Spark's pyspark zips",
            "start to end",
            "CPU-s",
            "Spark JVM",
            "Python processes started for the query",
            "Python workers",
            "broker",
        ],
        rows,
    )
    imp = r["imports"]
    return out + measured(
        record,
        f"an availableNow query of {q['rows']} records into `noop` in a warm `{q['session']}` "
        f"session, medians of {q['reps']} per source; imports per process of ours, CPU-s: "
        f"planner {imp['planner']['cpu_s_median']:.2f}, source runner "
        f"{imp['source_runner']['cpu_s_median']:.2f}, executor worker "
        f"{imp['executor']['cpu_s_median']:.2f} (pyspark's own in a planner: "
        f"{imp['spark_floor']['cpu_s_median']:.2f}){_zip_imports(r)}; load average "
        f"{load_range(r)}",
    )


def _zip_imports(r: Mapping[str, Any]) -> str:
    z = r.get("pyspark_from_spark_zips")
    if not z:
        return ""
    return (
        "; the source runner's own module from Spark's zips as shipped "
        f"{z['zip_as_shipped']['cpu_s_median']:.2f} CPU-s, compiled "
        f"{z['zip_compiled']['cpu_s_median']:.2f}, from the installed pyspark "
        f"{z['installed_package']['cpu_s_median']:.2f}"
    )


def spark_profile(results: Path) -> str:
    record = load("spark_profile", results)
    r = result_of(record)
    names = {"kafka": "Spark's Kafka source", "epochguard": "epochguard"}
    rows = [
        [
            names[run["source"]],
            f"{run['rows']:,} x {size(run['value_bytes'])}",
            f"{run['cpu_s']['spark_jvm']:.2f}",
            f"{run['cpu_s']['spark_python']:.2f}",
            f"{run['cpu_s']['kafka_broker']:.2f}",
            rate(run["rows_per_s"]),
        ]
        for run in r["runs"]
    ]
    out = table(
        ["source", "rows", "Spark JVM CPU-s", "Python workers CPU-s", "broker CPU-s", "rows/s"],
        rows,
    )
    loads = f"load average {load_range(r)}"
    return out + measured(record, f"one query per row, 1 partition; {loads}")


def spark_latency(results: Path) -> str:
    record = load("spark_latency", results)
    r = result_of(record)
    names = {
        "kafka": "Spark's Kafka source",
        "epochguard": "epochguard",
        "epochguard_driver_read": "epochguard, `driverReadMaxOffsets=10000`",
        "paced_stamps": "Python source without I/O",
    }
    parts = ("latestOffset", "walCommit", "addBatch", "commitOffsets", "triggerExecution")

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:,.0f} ms"

    def cpu(src: Mapping[str, Any]) -> str:
        # Results before CPU was measured have no figure.
        c = src.get("cpu_s_per_s")
        if not c:
            return "-"
        broker = c.get("kafka_broker") or 0.0
        return f"{c['total'] - broker:.2f} + {broker:.2f}"

    rows = []
    for fmt, src in r["sources"].items():
        batch = src["batch_duration_ms"]
        rows.append(
            [
                names.get(fmt, fmt),
                *(ms(src[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
                *(ms(batch[p]["p50_ms"]) if p in batch else "-" for p in parts),
                cpu(src),
            ]
        )
    out = table(
        [
            "source",
            "p50",
            "p90",
            "p99",
            "max",
            *(f"`{p}` (p50)" for p in parts),
            "CPU-s per second: Spark + broker",
        ],
        rows,
    )
    s = r["settings"]
    loads = [
        x for src in r["sources"].values() for run in src["runs"] for x in run["load_average_1m"]
    ]
    spread = f"{min(loads):g}-{max(loads):g}" if loads else "not recorded"
    return out + measured(
        record,
        f"record send to `foreachBatch`, {s['records']} records per run at {s['rate_per_s']:g}/s "
        f"after warm-up, {s['rounds']} runs per source taking turns; `durationMs` per "
        f"micro-batch; Spark's connector {r['spark_kafka_connector']}, `{r['session']}`, "
        f"default trigger; load average {spread} over the runs",
    )


def spark_pushdown(results: Path) -> str:
    record = load("spark_pushdown", results)
    r = result_of(record)
    names = {
        "epochguard": "epochguard, `filterPushdown=true`",
        "epochguard_no_pushdown": "epochguard, without pushdown (the default)",
        "kafka": "Spark's Kafka source",
    }
    rows = [
        [names.get(fmt, fmt), megabytes(m["fetched_bytes"]), seconds(m["wall_s"])]
        for fmt, m in r["median"].items()
    ]
    out = table(["reader", "bytes fetched", "time"], rows)
    return out + measured(
        record,
        f"{r['records']:,} records of {size(r['value_bytes'])} in {r['partitions']} partitions "
        f"of an EmbeddedCluster, the last 10 % by time ({r['rows_selected']:,} rows) into "
        f"`noop`; medians of {len(r['runs']['epochguard'])} runs; Spark's connector "
        f"{r['spark_kafka_connector']}, `{r['session']}`; load average "
        f"{load_range(r)}",
    )


def chaos_scoreboard(results: Path) -> str:
    record = load("chaos_scoreboard", results)
    r = result_of(record)
    keys = ("silent_losses", "silent_rereads", "spurious_reports", "stalls", "raise_breaches")
    rows = [
        [
            CLIENT_NAMES.get(name, name),
            f"{c['schedules_failed']} / {c['schedules']}",
            *(c[k] for k in keys),
            c["reports"],
            c["records_delivered"],
        ]
        for name, c in r["clients"].items()
    ]
    out = table(
        [
            "client",
            "schedules failed",
            "silent losses",
            "silent re-reads",
            "spurious reports",
            "stalls",
            "raise breaches",
            "reports",
            "records delivered",
        ],
        rows,
    )
    return out + measured(record, f"{r['cluster']}, seeds {r['seeds']}")


def chaos_apache(results: Path) -> str:
    record = load("chaos_scoreboard", results)
    a = result_of(record).get("apache_kafka")
    if not a:
        raise TableError("chaos_scoreboard.json has no apache_kafka section")
    rows = []
    for name, c in a["clients"].items():
        failed = c.get("schedules_failed", len(c.get("failed_seeds", [])))
        rows.append(
            [
                CLIENT_NAMES.get(name, name),
                f"{failed} / {c['schedules']}",
                c.get("silent_losses", "-"),
                c.get("silent_rereads", "-"),
                c.get("spurious_reports", "-"),
                c.get("stalls", "-"),
                c.get("reports", "-"),
            ]
        )
    out = table(
        [
            "client",
            "schedules failed",
            "silent losses",
            "silent re-reads",
            "spurious reports",
            "stalls",
            "reports",
        ],
        rows,
    )
    # A run of the EmbeddedCluster rows keeps this section with the day it was measured.
    when = {**record, "started_at": a.get("started_at", record.get("started_at"))}
    return out + measured(when, f"{a['cluster']}, `{a['generator']}`")


_VERDICT_HEADER = [
    "client",
    "schedules failed",
    "silent losses",
    "silent re-reads",
    "spurious reports",
    "stalls",
    "raise breaches",
    "reports",
    "records delivered",
]
_VERDICT_KEYS = ("silent_losses", "silent_rereads", "spurious_reports", "stalls", "raise_breaches")


def _verdict_rows(clients: dict[str, Any]) -> list[list[object]]:
    return [
        [
            CLIENT_NAMES.get(name, name),
            f"{c['schedules_failed']} / {c['schedules']}",
            *(c[k] for k in _VERDICT_KEYS),
            c["reports"],
            f"{c['records_delivered']:,}",
        ]
        for name, c in clients.items()
    ]


def _section(name: str, results: Path) -> dict[str, Any]:
    section: dict[str, Any] | None = result_of(load("chaos_scoreboard", results)).get(name)
    if not section:
        raise TableError(f"chaos_scoreboard.json has no {name} section")
    return section


def _load_range(section: dict[str, Any]) -> str:
    return (
        f"load average {load_text(section['load_average_before'])} before, "
        f"{load_text(section['load_average_after'])} after"
    )


def chaos_apache_network(results: Path) -> str:
    a = _section("apache_kafka_network", results)
    faults = ", ".join(f"{k} {v}" for k, v in a["network_faults"].items())
    return table(_VERDICT_HEADER, _verdict_rows(a["clients"])) + (
        f"\n*Measured {a['started_at'][:10]}; {a['cluster']}, `{a['generator']}`, seeds "
        f"{a['seeds']}; network faults: {faults} ({a['injected_delay_s']:g} s of injected "
        f"delays); {a['seconds'] / 60:.0f} minutes, {_load_range(a)}.*\n"
    )


def chaos_scoreboard_network(results: Path) -> str:
    n = _section("network", results)
    minutes = sum(c["seconds"] for c in n["clients"].values()) / 60
    return table(_VERDICT_HEADER, _verdict_rows(n["clients"])) + (
        f"\n*Measured {n['started_at'][:10]}; {n['cluster']}, `{n['generator']}`, seeds "
        f"{n['seeds']}, one client at a time, {n['workers']} schedules at a time; "
        f"{minutes:.0f} minutes, {_load_range(n)}.*\n"
    )


def chaos_at_scale(results: Path, name: str = "chaos_at_scale") -> str:
    r = load(name, results)
    keys = ("silent_losses", "silent_rereads", "spurious_reports", "stalls", "raise_breaches")
    if r.get("epochs", "kafka") == "raft":
        kind = "Raft-term brokers"
    else:
        kind = "clean elections" if r.get("clean") else "unclean elections"
    rows = [
        [
            f"{r['first']}..{r['first'] + r['seeds'] - 1}",
            kind,
            len(r["failed_seeds"]),
            *(r[k] for k in keys),
            f"{r['reports']:,}",
            f"{r['delivered']:,}",
        ]
    ]
    return table(
        [
            "seeds",
            "schedules",
            "failed",
            "silent losses",
            "silent re-reads",
            "spurious reports",
            "stalls",
            "raise breaches",
            "reports",
            "records delivered",
        ],
        rows,
    ) + (
        f"\n*{CLIENT_NAMES.get(r['client'], r['client'])}, `make chaos SEEDS={r['seeds']}"
        f"{_chaos_args(r)}`.*\n"
    )


def _chaos_args(r: dict[str, Any]) -> str:
    """The ``CHAOS_ARGS`` that reproduce a chaos-at-scale record ("" for the defaults)."""
    args = [] if r["client"] == "epochguard" else [f"--client {r['client']}"]
    if r.get("epochs", "kafka") == "raft":
        args.append("--raft")
    joined = " ".join(args)
    return (
        "" if not args else f' CHAOS_ARGS="{joined}"' if " " in joined else f" CHAOS_ARGS={joined}"
    )


def chaos_raft_at_scale(results: Path) -> str:
    return chaos_at_scale(results, "chaos_raft_at_scale")


def chaos_asyncio_at_scale(results: Path) -> str:
    return chaos_at_scale(results, "chaos_asyncio_at_scale")


#: Failures counted apart in the transactional tables; the rest are summed.
_OTHER_FAILURES = ("silent_rereads", "spurious_reports", "stalls", "raise_breaches")
_TXN_HEADER = [
    "schedules",
    "failed (only decided again)",
    "aborted deliveries",
    "committed losses",
    "silent losses",
    "losses decided again",
    "decided again, reported (reopened reports)",
    "unreported hanging",
    "spurious hanging",
    "other failures",
    "hanging transactions (reported)",
    "truncation reports",
    "committed records lost by the cluster",
    "records delivered",
]


def _txn_row(counts: dict[str, Any], schedules: int, failed: int) -> list[object]:
    again = len(counts.get("failed_only_decided_again", []))
    return [
        f"{schedules:,}",
        f"{failed} ({again})",
        counts["aborted_deliveries"],
        counts["committed_losses"],
        counts["silent_losses"],
        counts["decided_again"],
        f"{counts.get('decided_again_reported', 0)} ({counts.get('reopened_reports', 0)})",
        counts["unreported_hanging"],
        counts["spurious_hanging"],
        sum(counts[k] for k in _OTHER_FAILURES),
        f"{counts['hanging_transactions']} ({counts['hanging_reports']})",
        f"{counts['reports']:,}",
        f"{counts['committed_lost_by_cluster']:,}",
        f"{counts.get('delivered', counts.get('records_delivered', 0)):,}",
    ]


def chaos_transactions(results: Path) -> str:
    r = load("chaos_transactions", results)
    seeds = f"{r['first']}..{r['first'] + r['seeds'] - 1}"
    row = [seeds, *_txn_row(r, r["schedules"], len(r["failed_seeds"]))]
    return table(["seeds", *_TXN_HEADER], [row]) + (
        f"\n*{CLIENT_NAMES.get(r['client'], r['client'])} on the EmbeddedCluster, `make chaos "
        f"SEEDS={r['seeds']} FIRST={r['first']} CHAOS_ARGS=--transactions`; "
        f"{r['seconds'] / 60:.0f} minutes, 2 at a time, load average "
        f"{load_text(r.get('load_average'))} at the end.*\n"
    )


def chaos_transactions_apache(results: Path) -> str:
    r = load("chaos_transactions_apache", results)
    rows = [
        [
            CLIENT_NAMES.get(name, name),
            *_txn_row(c, c["schedules"], c["schedules_failed"]),
        ]
        for name, c in r["clients"].items()
    ]
    return table(["client", *_TXN_HEADER], rows) + (
        f"\n*{r['cluster']}, `{r['generator']}`, seeds {r['seeds']}; "
        f"{r['seconds'] / 60:.0f} minutes.*\n"
    )


TABLES: dict[str, Callable[[Path], str]] = {
    "matrix": matrix,
    "matrix_asyncio": matrix_asyncio,
    "matrix_apache": matrix_apache,
    "io_thread": io_thread,
    "latency": latency,
    "commit_latency": commit_latency,
    "load": load_,
    "soak": soak,
    "consumer_memory": consumer_memory,
    "decoder": consumer_throughput,
    "detection": detection,
    "leader_change": leader_change,
    "leader_change_unclean": leader_change_unclean,
    "rebalance": rebalance,
    "rebalance_pause": rebalance_pause,
    "cross_rack": cross_rack,
    "secured_connect": secured_connect,
    "logging_cost": logging_cost,
    "tracker": tracker,
    "embedded_fetch": embedded_fetch,
    "lean_fetch": lean_fetch,
    "spark_source": spark_source,
    "spark_profile": spark_profile,
    "spark_cpu": spark_cpu,
    "spark_query_cost": spark_query_cost,
    "spark_latency": spark_latency,
    "spark_pushdown": spark_pushdown,
    "chaos_scoreboard": chaos_scoreboard,
    "chaos_apache": chaos_apache,
    "chaos_apache_network": chaos_apache_network,
    "chaos_scoreboard_network": chaos_scoreboard_network,
    "chaos_at_scale": chaos_at_scale,
    "chaos_raft_at_scale": chaos_raft_at_scale,
    "chaos_asyncio_at_scale": chaos_asyncio_at_scale,
    "chaos_transactions": chaos_transactions,
    "chaos_transactions_apache": chaos_transactions_apache,
}


def render(text: str, results: Path = RESULTS) -> str:
    """``text`` with every marked section regenerated."""

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise TableError(f"no table named {name!r} (have: {', '.join(sorted(TABLES))})")
        return f"{m.group(1)}{TABLES[name](results)}{m.group(4)}"

    return SECTION.sub(one, text)


def stale_sections(path: Path, results: Path = RESULTS) -> list[str]:
    """Names of the sections of ``path`` that differ from what the results give."""
    text = path.read_text()
    fresh = render(text, results)
    old = {m.group("name"): m.group("body") for m in SECTION.finditer(text)}
    new = {m.group("name"): m.group("body") for m in SECTION.finditer(fresh)}
    return [name for name in old if old[name] != new[name]]


def marked_files(docs: Path = DOCS) -> list[Path]:
    return [p for p in sorted(docs.rglob("*.md")) if SECTION.search(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks._tables", description=__doc__)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = ap.parse_args(argv)
    stale = []
    for path in marked_files():
        if args.check:
            stale += [f"{path.relative_to(ROOT)}: {n}" for n in stale_sections(path)]
        else:
            text = path.read_text()
            fresh = render(text)
            if fresh != text:
                path.write_text(fresh)
                print(f"updated {path.relative_to(ROOT)}")
    if stale:
        print("tables that differ from benchmarks/results:\n  " + "\n  ".join(stale))
        print("run: python -m benchmarks._tables")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
