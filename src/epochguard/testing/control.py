"""Drive a standalone EmbeddedCluster from another process: line-delimited JSON over TCP.

``epochguard cluster --control-port PORT`` listens on 127.0.0.1 only. A client sends one
JSON object per line and gets one JSON object per line back, in order, on as many
connections and requests as it likes::

    -> {"op": "elect_leader", "topic": "orders", "partition": 0, "broker": 2, "unclean": true}
    <- {"ok": true, "result": {"leader": 2, "leader_epoch": 3}}
    -> {"op": "stop_broker", "broker": 9}
    <- {"ok": false, "error": "unknown broker 9", "error_type": "cluster_error"}

The operations and their fields are in :data:`OPERATIONS` (and in docs/testing.md);
``epochguard cluster-ctl --control 127.0.0.1:PORT OP ...`` is a command-line client.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    # Only the server side needs the cluster; ``cluster-ctl`` (the client) starts without it.
    from epochguard.testing.embedded.cluster import EmbeddedCluster

__all__ = [
    "OPERATIONS",
    "ControlError",
    "ControlServer",
    "Operation",
    "Param",
    "ctl_main",
    "request",
]

HOST = "127.0.0.1"
#: Longest request line accepted; a longer one is answered with an error and the
#: connection is closed (a stray binary client must not make the runner buffer forever).
MAX_LINE_BYTES = 1 << 20


class ControlError(Exception):
    """The control port answered ``{"ok": false}``; ``error_type`` says whose fault it was."""

    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


@attrs.frozen
class Param:
    """One request field: its JSON type, and its default when it is optional."""

    name: str
    kind: type  # int, str, bool or list (of strings)
    required: bool = True
    default: Any = None
    help: str = ""


@attrs.frozen
class Operation:
    name: str
    params: tuple[Param, ...]
    run: Callable[[EmbeddedCluster, dict[str, Any]], Any]
    help: str


_TOPIC = Param("topic", str, help="topic name")
_PARTITION = Param("partition", int, help="partition number")
_BROKER = Param("broker", int, help="broker id")


def _describe_cluster(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    return {
        "bootstrap_servers": c.all_bootstrap_servers,
        "epochs": c.epochs,
        "brokers": [
            {"id": b, "address": c.broker_address(b), "running": c.is_running(b)}
            for b in c.broker_ids
        ],
    }


def _describe_partition(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    topic, partition = a["topic"], a["partition"]
    return {
        "leader": c.leader(topic, partition),
        "leader_epoch": c.leader_epoch(topic, partition),
        "replicas": c.replicas(topic, partition),
        "isr": c.isr(topic, partition),
        "log_start_offset": c.log_start_offset(topic, partition),
        "log_end_offset": c.log_end_offset(topic, partition),
        "high_watermark": c.high_watermark(topic, partition),
    }


def _create_topic(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    c.create_topic(a["topic"], a["partitions"], a["replication_factor"])
    return {"topic_id": c.topic_id(a["topic"])}


def _stop_broker(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    c.stop_broker(a["broker"])
    return {}


def _start_broker(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    c.start_broker(a["broker"])
    return {}


def _elect_leader(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    topic, partition = a["topic"], a["partition"]
    c.elect_leader(
        topic,
        partition,
        a["broker"],
        unclean=a["unclean"],
        failed_attempts=a["failed_attempts"],
    )
    return {"leader": c.leader(topic, partition), "leader_epoch": c.leader_epoch(topic, partition)}


def _flush(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    c.flush(a["topic"], a["partition"])
    return {}


def _delete_records(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    c.delete_records(a["topic"], a["partition"], a["before_offset"])
    return {"log_start_offset": c.log_start_offset(a["topic"], a["partition"])}


def _append(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    values = [v.encode() for v in a["values"]]
    return {"base_offset": c.append(a["topic"], a["partition"], values, batch_size=1)}


def _nothing(c: EmbeddedCluster, a: dict[str, Any]) -> Any:
    return {}


#: Every operation, by name. ``shutdown`` (no fields) is handled by the server itself.
OPERATIONS: Mapping[str, Operation] = {
    op.name: op
    for op in (
        Operation("ping", (), _nothing, "check the runner answers"),
        Operation("describe_cluster", (), _describe_cluster, "bootstrap servers, brokers, running"),
        Operation(
            "create_topic",
            (
                _TOPIC,
                Param("partitions", int, False, 1, "number of partitions (default 1)"),
                Param("replication_factor", int, False, None, "default min(3, brokers)"),
            ),
            _create_topic,
            "create a topic",
        ),
        Operation(
            "describe_partition",
            (_TOPIC, _PARTITION),
            _describe_partition,
            "leader, epoch, replicas, ISR, offsets",
        ),
        Operation("stop_broker", (_BROKER,), _stop_broker, "stop a broker (it stops listening)"),
        Operation("start_broker", (_BROKER,), _start_broker, "restart a broker on its port"),
        Operation(
            "elect_leader",
            (
                _TOPIC,
                _PARTITION,
                _BROKER,
                Param("unclean", bool, False, False, "allow a replica outside the ISR"),
                Param(
                    "failed_attempts",
                    int,
                    False,
                    0,
                    "Raft-term clusters: failed rounds first, a term each",
                ),
            ),
            _elect_leader,
            "make a replica the leader (clean unless unclean is true)",
        ),
        Operation(
            "flush",
            (_TOPIC, Param("partition", int, False, None, "default: every partition")),
            _flush,
            "running replicas write their records to disk (Raft terms: they survive a stop)",
        ),
        Operation(
            "delete_records",
            (_TOPIC, _PARTITION, Param("before_offset", int, help="-1: the high watermark")),
            _delete_records,
            "move the log start offset up (DeleteRecords)",
        ),
        Operation(
            "append",
            (_TOPIC, _PARTITION, Param("values", list, help="record values (UTF-8 strings)")),
            _append,
            "append records on the leader, one batch each",
        ),
        Operation("shutdown", (), _nothing, "close the cluster; the runner exits 0"),
    )
}


def _check_args(op: Operation, req: Mapping[str, Any]) -> dict[str, Any]:
    known = {p.name for p in op.params} | {"op", "id"}
    unknown = sorted(set(req) - known)
    if unknown:
        raise ValueError(f"{op.name}: unknown field(s) {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for p in op.params:
        if p.name not in req or req[p.name] is None:
            if p.required:
                raise ValueError(f"{op.name}: missing field {p.name!r}")
            out[p.name] = p.default
            continue
        v = req[p.name]
        # bool is an int subclass in Python but not in JSON: true is no partition number.
        ok = type(v) is p.kind
        if p.kind is list:
            ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
        if not ok:
            raise ValueError(f"{op.name}: field {p.name!r} must be {_json_type(p.kind)}")
        out[p.name] = v
    return out


def _json_type(kind: type) -> str:
    return {int: "an integer", str: "a string", bool: "true or false"}.get(
        kind, "a list of strings"
    )


class ControlServer:
    """The control port of one cluster, served by a daemon thread per connection."""

    def __init__(
        self,
        cluster: EmbeddedCluster,
        port: int = 0,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"control port must be in 0..65535, got {port}")
        self.cluster = cluster
        self._on_shutdown = on_shutdown
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                outer._serve(self.rfile, self.wfile)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((HOST, port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="epochguard-cluster-control",
            daemon=True,
        )

    @property
    def address(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"{host}:{port}"

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def _serve(self, rfile: Any, wfile: Any) -> None:
        while True:
            line = rfile.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                self._reply(wfile, None, _error(f"request longer than {MAX_LINE_BYTES} bytes"))
                return
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except ValueError as e:
                self._reply(wfile, None, _error(f"not JSON: {e}"))
                continue
            req_id = req.get("id") if isinstance(req, dict) else None
            resp = self.handle(req)
            self._reply(wfile, req_id, resp)
            if resp["ok"] and req["op"] == "shutdown" and self._on_shutdown is not None:
                # After the reply: the runner may exit as soon as this returns.
                self._on_shutdown()
                return

    def handle(self, req: Any) -> dict[str, Any]:
        """One request object to one response object (no I/O)."""
        if not isinstance(req, dict):
            return _error("a request is a JSON object")
        name = req.get("op")
        op = OPERATIONS.get(name) if isinstance(name, str) else None
        if op is None:
            return _error(f"unknown op {name!r}; one of {', '.join(OPERATIONS)}", "unknown_op")
        try:
            args = _check_args(op, req)
        except ValueError as e:
            return _error(str(e))
        from epochguard.testing.embedded.state import EmbeddedClusterError

        try:
            result = op.run(self.cluster, args)
        except (EmbeddedClusterError, ValueError) as e:
            return _error(str(e), "cluster_error")
        return {"ok": True, "result": result}

    @staticmethod
    def _reply(wfile: Any, req_id: Any, resp: dict[str, Any]) -> None:
        if req_id is not None:
            resp = {"id": req_id, **resp}
        wfile.write(json.dumps(resp).encode() + b"\n")
        wfile.flush()


def _error(message: str, error_type: str = "bad_request") -> dict[str, Any]:
    return {"ok": False, "error": message, "error_type": error_type}


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def request(address: str, op: str, *, timeout: float = 30.0, **fields: Any) -> Any:
    """Send one request to the control port at ``address`` (``HOST:PORT``); its result.

    Raises :class:`ControlError` when the runner answers ``ok: false``, ``OSError`` when it
    cannot be reached.
    """
    with socket.create_connection(_split_address(address), timeout=timeout) as sock:
        sock.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
        with sock.makefile("rb") as f:
            line = f.readline(MAX_LINE_BYTES + 1)
    if not line:
        raise ControlError(f"{address} closed the connection without answering", "io")
    resp = json.loads(line)
    if not resp.get("ok"):
        raise ControlError(str(resp.get("error")), str(resp.get("error_type")))
    return resp.get("result")


def ctl_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Send one command to a running `epochguard cluster` runner."
    )
    p.add_argument(
        "--control",
        required=True,
        metavar="HOST:PORT",
        help="the control address (second line of `epochguard cluster --control-port`)",
    )
    sub = p.add_subparsers(dest="op", required=True, metavar="OP")
    for op in OPERATIONS.values():
        sp = sub.add_parser(op.name.replace("_", "-"), help=op.help, description=op.help)
        for prm in op.params:
            if prm.kind is bool:
                sp.add_argument(f"--{prm.name.replace('_', '-')}", action="store_true")
            elif prm.kind is list:
                sp.add_argument(prm.name, nargs="+", help=prm.help)
            elif prm.required:
                sp.add_argument(prm.name, type=prm.kind, help=prm.help)
            else:
                sp.add_argument(
                    f"--{prm.name.replace('_', '-')}", type=prm.kind, default=None, help=prm.help
                )
    return p


def ctl_main(argv: Sequence[str] | None = None, prog: str = "epochguard cluster-ctl") -> int:
    """``epochguard cluster-ctl``: prints the JSON result; exit 1 when the runner says no."""
    args = ctl_parser(prog).parse_args(argv)
    name = args.op.replace("-", "_")
    fields = {
        p.name: getattr(args, p.name)
        for p in OPERATIONS[name].params
        if getattr(args, p.name) is not None
    }
    try:
        result = request(args.control, name, **fields)
    except ControlError as e:
        print(f"error ({e.error_type}): {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"error: cannot reach {args.control}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(ctl_main(prog="python -m epochguard.testing.control"))
