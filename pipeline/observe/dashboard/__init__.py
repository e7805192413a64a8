"""`drydock dashboard`: a local, read-only web page over a storage prefix.

    drydock dashboard --prefix P [--port N] [--host H]

Shows the experiments under P (from their manifests), each experiment's DAG and step states, and
per step its config, status events, logs, training loss curve and evaluation table. Modules:
`data` reads the prefix, `app` serves pages from it; this one parses the command line and runs
the server. FastAPI and uvicorn are imported only when the dashboard starts, so `import pipeline`
and planning never load them.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from collections.abc import Sequence

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "main"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8008
"""Not 8265: that is Ray's own dashboard, often running on the same machine."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drydock dashboard",
        description="Serve a read-only web page of the experiments under a storage prefix.",
    )
    parser.add_argument(
        "--prefix", default=None, help="storage prefix (default $DRYDOCK_PREFIX, else ./drydock-runs)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free port)"
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only)",
    )
    return parser


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket; bound before the server starts so that `--port 0` can report its port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the dashboard until Ctrl-C; returns the exit code (2 for bad options or prefix)."""
    from pipeline.run.options import resolve_prefix

    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help, or a usage error argparse has already printed
        return e.code if isinstance(e.code, int) else 2
    if not 0 <= args.port <= 65535:
        print(f"error: dashboard --port: {args.port} is not a TCP port (0-65535)", file=sys.stderr)
        return 2
    prefix = resolve_prefix(args.prefix)
    if "://" not in prefix and not os.path.isdir(prefix):
        print(f"error: dashboard --prefix: {prefix!r} is not a directory", file=sys.stderr)
        return 2
    try:
        sock = _listen(args.host, args.port)
    except OSError as e:
        print(
            f"error: dashboard --host/--port: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr
        )
        return 2

    import uvicorn

    from pipeline.observe.dashboard.app import create_app

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"Drydock dashboard of {prefix}: http://{shown}:{port}/  (Ctrl-C to stop)", flush=True)
    if not _is_loopback(args.host):
        print(
            f"note: listening on {args.host}: anyone who can reach this port can read the prefix",
            file=sys.stderr,
        )
    server = uvicorn.Server(uvicorn.Config(create_app(prefix), log_level="warning", access_log=False))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
