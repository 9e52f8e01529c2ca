"""Command line entry point: ``epochguard cluster`` and friends."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(
            "usage: epochguard COMMAND [options] | --version\n"
            "  demo [--fast]   EpochConsumer on an embedded cluster through an unclean election\n"
            "  demo --sans-io  the sans-IO tracker alone on a simulated partition\n"
            "  cluster         run an EmbeddedCluster and print its bootstrap servers\n"
            "  cluster-ctl     drive a running `cluster --control-port` (elections, brokers...)\n"
            "  spark-compile-zips  compile the modules in Spark's pyspark and py4j zips\n"
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
    if args[0] == "spark-compile-zips":
        return _spark_compile_zips(args[1:])
    print(f"epochguard: unknown command {args[0]!r}", file=sys.stderr)
    return 2


def _spark_compile_zips(args: list[str]) -> int:
    import argparse

    from epochguard.spark_connector.compile_zips import (
        compile_zips,
        restore_zips,
        spark_zips,
        zip_state,
    )

    parser = argparse.ArgumentParser(
        prog="epochguard spark-compile-zips",
        description="Add compiled modules, for this Python, to the pyspark and py4j zips "
        "that Spark puts on its Python processes' path (each new process compiles them "
        "otherwise). The original zips are kept beside them as <name>.orig.",
    )
    parser.add_argument(
        "--spark-home", help="the Spark home (default: $SPARK_HOME, or pyspark's own)"
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="only say what the zips hold")
    what.add_argument("--restore", action="store_true", help="put the original zips back")
    opts = parser.parse_args(args)
    try:
        zips = spark_zips(opts.spark_home)
    except (FileNotFoundError, ImportError) as exc:
        print(f"epochguard spark-compile-zips: {exc}", file=sys.stderr)
        return 1
    if opts.restore:
        restored = set(restore_zips(zips))
        for path in zips:
            print(f"{path}: {'restored' if path in restored else 'left as it is'}")
        return 0
    states = [zip_state(z) for z in zips] if opts.check else compile_zips(zips)
    for state in states:
        print(
            f"{state.path}: {state.compiled} of {state.modules} modules compiled for "
            f"Python {sys.version_info.major}.{sys.version_info.minor}"
        )
    return 0 if opts.check or all(s.done for s in states) else 1


if __name__ == "__main__":
    raise SystemExit(main())
