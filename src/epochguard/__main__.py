"""Command line entry point: ``epochguard cluster`` and friends."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(
            "usage: epochguard {demo,cluster,cluster-ctl} [options] | --version\n"
            "  demo [--fast]   EpochConsumer on an embedded cluster through an unclean election\n"
            "  demo --sans-io  the sans-IO tracker alone on a simulated partition\n"
            "  cluster         run an EmbeddedCluster and print its bootstrap servers\n"
            "  cluster-ctl     drive a running `cluster --control-port` (elections, brokers...)\n"
            "  --version       print the installed version"
        )
        return 0
    if args[0] in {"-V", "--version"}:
        from epochguard import __version__

        print(f"epochguard {__version__}")
        return 0
    if args[0] == "demo":
        if "--sans-io" in args[1:]:
            # The tracker alone, driven by a scripted two-broker log (no sockets).
            from epochguard.offsets._demo import run_demo as run_sans_io_demo

            return run_sans_io_demo()
        from epochguard.consumer.demo import run_demo

        return run_demo(fast="--fast" in args[1:])
    if args[0] == "cluster":
        from epochguard.testing.__main__ import main as cluster_main

        return cluster_main(args[1:], prog="epochguard cluster")
    if args[0] == "cluster-ctl":
        from epochguard.testing.control import ctl_main

        return ctl_main(args[1:], prog="epochguard cluster-ctl")
    print(f"epochguard: unknown command {args[0]!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
