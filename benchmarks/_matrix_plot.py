"""``python -m benchmarks._matrix_plot``: draw ``benchmarks/results/matrix.json`` as
``docs/img/consumer_matrix.png`` (records/s per client, one group of bars per case, log
scale) and print the rows as a Markdown table. ``make bench`` runs it after the benchmarks;
the table in docs/performance.md is ``python -m benchmarks._tables``'s."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "matrix.json"
PNG = ROOT / "docs" / "img" / "consumer_matrix.png"
CLIENTS = ["epochguard", "kafka-python", "aiokafka", "confluent-kafka", "embedded-alone"]


def _label(row: dict[str, Any]) -> str:
    size = {100: "100 B", 1024: "1 KB", 10240: "10 KB"}.get(
        row["value_bytes"], str(row["value_bytes"])
    )
    codec = "" if row["compression"] == "none" else f" {row['compression']}"
    return f"{size} x{row['partitions']}{codec}"


def _rate(v: Any) -> str:
    if not v:
        return "-"
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}k"


def _measured(row: dict[str, Any]) -> str:
    """When (UTC) and at what scale and rounds: a partial run mixes rows of two runs."""
    at = row.get("measured_at")
    if not at:
        return "-"
    return f"{at[5:10]} {at[11:16]}, x{row.get('scale')}, {row.get('repeat')} rounds"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| case | measured (UTC) | load 1m | EpochConsumer | kafka-python | aiokafka "
        "| confluent-kafka | cluster alone | vs kafka-python | vs aiokafka | vs confluent "
        "| CPU s/M: EpochConsumer "
        "| kafka-python | aiokafka | confluent |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        cpu = [r.get(f"{c}_cpu_s_per_million") for c in CLIENTS[:4]]
        lines.append(
            f"| {_label(r)} | {_measured(r)} "
            f"| {r.get('load_avg_1m_before')}-{r.get('load_avg_1m_after')} | "
            + " | ".join(_rate(r.get(c)) for c in CLIENTS)
            + " | "
            + " | ".join(
                f"{r[k]}x" if r.get(k) else "-"
                for k in (
                    "epochguard_vs_kafka-python",
                    "epochguard_vs_aiokafka",
                    "epochguard_vs_confluent-kafka",
                )
            )
            + " | "
            + " | ".join("-" if c is None else f"{c:.2f}" for c in cpu)
            + " |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], out: Path = PNG) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [_label(r) for r in rows]
    runs = {(r.get("measured_at") or "")[:16] for r in rows}
    if len(runs) > 1:  # a partial run merged into an older one: say which is which
        labels = [
            f"{label} ({(r.get('measured_at') or '?')[11:16]})"
            for label, r in zip(labels, rows, strict=True)
        ]
    width = 0.16
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(rows)), 4.5))
    for i, client in enumerate(CLIENTS):
        xs = [j + (i - 2) * width for j in range(len(rows))]
        ax.bar(xs, [r.get(client) or 0 for r in rows], width, label=client)
    ax.set_yscale("log")
    ax.set_ylabel("records/s (log)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    title = "Consumer throughput, CRC on, keys and values read (benchmarks/matrix.py)"
    if len(runs) > 1:
        title += "; rows of several runs (UTC time of each)"
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main() -> int:
    if not RESULT.exists():
        print(f"{RESULT} not found: run python -m benchmarks matrix first", file=sys.stderr)
        return 1
    rows = json.loads(RESULT.read_text())["result"]["cases"]
    print(f"wrote {plot(rows)}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
