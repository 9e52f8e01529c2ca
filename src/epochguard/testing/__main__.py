"""``python -m epochguard.testing``: run an EmbeddedCluster until Ctrl-C (or SIGTERM).

The first line printed is the bootstrap string, so scripts can read it; with
``--control-port`` the second line is the control address (see
:mod:`epochguard.testing.control`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from epochguard._log import cli_output
from epochguard.testing.control import ControlServer
from epochguard.testing.embedded.cluster import EmbeddedCluster, EmbeddedClusterError
from epochguard.testing.embedded.raft import EPOCH_RULES, KAFKA
from epochguard.testing.tls import make_tls_material


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


def _sasl_user(spec: str) -> tuple[str, str]:
    name, sep, password = spec.partition(":")
    if not sep or not name or not password:
        raise argparse.ArgumentTypeError(f"expected NAME:PASSWORD, got {spec!r}")
    return name, password


def parser(prog: str = "python -m epochguard.testing") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a pure-Python Kafka-protocol cluster on 127.0.0.1 until interrupted.",
    )
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="the first broker's port; broker i (ids start at 1) listens on PORT+i-1 "
        "(default: free ports)",
    )
    p.add_argument(
        "--control-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the JSON-lines control protocol on 127.0.0.1:PORT (0: a free port); "
        "its address is the second line printed",
    )
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
        "--sasl-user",
        type=_sasl_user,
        action="append",
        default=[],
        metavar="NAME:PASSWORD",
        help="add a SASL_PLAINTEXT listener (PLAIN, SCRAM-SHA-256/512) with this user "
        "(repeatable); its addresses are printed to stderr",
    )
    p.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a CA and a 127.0.0.1 certificate to DIR and add an SSL listener "
        "(SASL_SSL too with --sasl-user); clients trust DIR/ca.pem",
    )
    p.add_argument(
        "--epochs",
        choices=EPOCH_RULES,
        default=KAFKA,
        help="leader-epoch rules: kafka (default) or raft (Raft terms, as Redpanda's brokers: "
        "every election attempt takes a term, stop_broker is a power cut)",
    )
    p.add_argument(
        "--exit-after", type=float, default=None, metavar="SECONDS", help=argparse.SUPPRESS
    )
    return p


def main(argv: list[str] | None = None, prog: str = "python -m epochguard.testing") -> int:
    stop = threading.Event()
    # Handlers first: a signal that arrives once the bootstrap line is out must stop us.
    with _stop_on_signals(), cli_output(sys.stderr, logging.INFO):
        try:
            return _run(parser(prog).parse_args(argv), stop)
        except KeyboardInterrupt:
            return 0  # Ctrl-C is the normal way to stop; the cluster closed on the way out


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread, once.

    Python installs its KeyboardInterrupt handler only when SIGINT is not ignored at start-up;
    a runner started from a background job of a non-interactive shell (``make test &``, CI
    wrappers) inherits SIGINT ignored and never stopped on Ctrl-C. Likewise a blocked signal
    mask is inherited across fork and exec: a runner spawned by a thread that blocks SIGINT
    keeps it pending forever. Installing the handler and unblocking both signals here makes
    Ctrl-C work however the runner was started. A second signal while the cluster is closing
    is ignored, so the close runs to its end.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # in-process call from a worker thread: signals are not ours to take
        return
    fired = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise KeyboardInterrupt

    ours = {signal.SIGINT, signal.SIGTERM}
    saved = {s: signal.signal(s, on_signal) for s in ours}
    saved_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, ours)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
        for s, handler in saved.items():
            signal.signal(s, handler)


def _run(args: argparse.Namespace, stop: threading.Event) -> int:
    if args.brokers < 1:
        print("--brokers must be at least 1", file=sys.stderr)
        return 2
    try:
        tls = None if args.tls_dir is None else make_tls_material(args.tls_dir)
        cluster = EmbeddedCluster(
            brokers=args.brokers,
            auto_create_topics=args.auto_create_topics,
            port=args.port,
            sasl_users=dict(args.sasl_user),
            tls=tls,
            epochs=args.epochs,
        )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(cluster)
        except OSError as e:
            print(f"error: cannot listen on port {args.port}: {e}", file=sys.stderr)
            return 1
        for name, partitions, rf in args.topic:
            cluster.create_topic(name, partitions, rf)
        control = None
        if args.control_port is not None:
            control = ControlServer(cluster, args.control_port, on_shutdown=stop.set).start()
            stack.callback(control.close)
        print(cluster.bootstrap_servers, flush=True)
        if control is not None:
            print(control.address, flush=True)
        print(
            f"# {args.brokers} brokers{'' if args.epochs == KAFKA else ', Raft-term epochs'}, "
            "topics: "
            f"{', '.join(n for n, _, _ in args.topic) or 'none'}; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        for listener in ("SASL_PLAINTEXT", "SSL", "SASL_SSL"):
            with contextlib.suppress(EmbeddedClusterError):
                servers = cluster.listener_bootstrap_servers(listener)
                print(f"# {listener} {servers}", file=sys.stderr, flush=True)
        if tls is not None:
            print(f"# CA file {tls.cafile}", file=sys.stderr, flush=True)
        _wait(stop, args.exit_after)
    return 0


def _wait(stop: threading.Event, seconds: float | None) -> None:
    """Until ``stop`` is set or ``seconds`` passed, waking often enough to run signal handlers.

    Python runs signal handlers only in the main thread between bytecodes; waking every
    0.2 s bounds the delay even when the kernel hands the signal to another thread.
    """
    deadline = None if seconds is None else time.monotonic() + seconds
    while not stop.is_set():
        slice_s = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
        if slice_s <= 0:
            return
        stop.wait(slice_s)


if __name__ == "__main__":
    raise SystemExit(main())
