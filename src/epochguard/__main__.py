"""Command line entry point: ``epochguard cluster`` and friends."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(
            "usage: epochguard {demo,core-demo,cluster} [options]\n"
            "  demo       EpochConsumer on an embedded cluster through an unclean election\n"
            "  core-demo  the sans-IO tracker alone on a simulated partition\n"
            "  cluster    run an EmbeddedCluster and print its bootstrap servers"
        )
        return 0
    if args[0] == "demo":
        from epochguard.consumer.demo import run_demo

        return run_demo(fast="--fast" in args[1:])
    if args[0] == "core-demo":
        from epochguard.offsets._demo import run_demo as run_core_demo

        return run_core_demo()
    if args[0] == "cluster":
        from epochguard.testing.__main__ import main as cluster_main

        return cluster_main(args[1:], prog="epochguard cluster")
    print(f"epochguard: unknown command {args[0]!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
