"""`drydock dashboard [--prefix P] [--port N] [--host H] [--allow-host NAME]`: serve the read-only
web page of a prefix.

The pages and the server are `pipeline.observe.dashboard`; this parses the command line, checks
the prefix and the address, and starts it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from pipeline.cli.common import Parser
from pipeline.errors import StepDeclarationError
from pipeline.observe.dashboard import DEFAULT_HOST, DEFAULT_PORT, is_loopback, listen, serve
from pipeline.run.options import resolve_prefix

__all__ = ["main"]


def _parser() -> Parser:
    parser = Parser(
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
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name requests may use besides loopback ones (repeatable; with --host 0.0.0.0, "
        "the name people reach this machine by)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the dashboard until Ctrl-C; returns the exit code (2 for bad options or prefix)."""
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except StepDeclarationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"error: dashboard --port: {args.port} is not a TCP port (0-65535)", file=sys.stderr)
        return 2
    prefix = resolve_prefix(args.prefix)
    if "://" not in prefix and not os.path.isdir(prefix):
        print(f"error: dashboard --prefix: {prefix!r} is not a directory", file=sys.stderr)
        return 2
    try:
        sock = listen(args.host, args.port)
    except OSError as e:
        print(
            f"error: dashboard --host/--port: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr
        )
        return 2
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"Drydock dashboard of {prefix}: http://{shown}:{port}/  (Ctrl-C to stop)", flush=True)
    if not is_loopback(args.host):
        print(
            f"note: listening on {args.host}: anyone who can reach this port can read the prefix",
            file=sys.stderr,
        )
    allowed = list(args.allow_host)
    if not is_loopback(args.host) and args.host not in ("0.0.0.0", "::"):
        allowed.append(args.host)  # the address it was asked to listen on names it
    # uvicorn stops on Ctrl-C, then raises it again: stopping is what was asked.
    with contextlib.suppress(KeyboardInterrupt):
        serve(prefix, sock, allowed)
    return 0
