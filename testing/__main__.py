"""``python -m epochguard.testing``: run an EmbeddedCluster until Ctrl-C.

The first line printed is the bootstrap string, so scripts can read it.
"""

from __future__ import annotations

import argparse
import sys
import threading

import structlog

from epochguard.testing.embedded.cluster import EmbeddedCluster


def _topic(spec: str) -> tuple[str, int, int | None]:
    parts = spec.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected name[:partitions[:rf]], got {spec!r}")
    try:
        partitions = int(parts[1]) if len(parts) > 1 else 1
        rf = int(parts[2]) if len(parts) > 2 else None
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"bad number in {spec!r}") from e
    return parts[0], partitions, rf


def parser(prog: str = "python -m epochguard.testing") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a pure-Python Kafka-protocol cluster on 127.0.0.1 until interrupted.",
    )
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    p.add_argument(
        "--topic",
        type=_topic,
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS[:RF]]",
        help="create a topic (repeatable)",
    )
    p.add_argument(
        "--auto-create-topics",
        action="store_true",
        help="create unknown topics on Metadata requests",
    )
    p.add_argument(
        "--exit-after", type=float, default=None, metavar="SECONDS", help=argparse.SUPPRESS
    )
    return p


def main(argv: list[str] | None = None, prog: str = "python -m epochguard.testing") -> int:
    args = parser(prog).parse_args(argv)
    # stdout carries only the bootstrap string; the cluster's events go to stderr.
    saved = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is the normal way to stop; the cluster closed on the way out
    finally:
        structlog.configure(**saved)


def _run(args: argparse.Namespace) -> int:
    if args.brokers < 1:
        print("--brokers must be at least 1", file=sys.stderr)
        return 2
    with EmbeddedCluster(
        brokers=args.brokers, auto_create_topics=args.auto_create_topics
    ) as cluster:
        for name, partitions, rf in args.topic:
            cluster.create_topic(name, partitions, rf)
        print(cluster.bootstrap_servers, flush=True)
        print(
            f"# {args.brokers} brokers, topics: "
            f"{', '.join(n for n, _, _ in args.topic) or 'none'}; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        threading.Event().wait(args.exit_after)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
