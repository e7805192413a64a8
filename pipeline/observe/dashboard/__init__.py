"""`drydock dashboard`: a local, read-only web page over a storage prefix.

    drydock dashboard --prefix P [--port N] [--host H]

Shows the experiments under P (from their manifests), each experiment's DAG and step states, and
per step its config, status events, logs, training loss curve and report. Modules: `data` reads
the prefix, `app` serves pages from it; this one listens and runs the server. The command line
is `pipeline.cli.dashboard`. FastAPI and uvicorn are imported only when the dashboard starts,
so `import pipeline` and planning never load them.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "is_loopback", "listen", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8008
"""Not 8265: that is Ray's own dashboard, often running on the same machine."""


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
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


def serve(prefix: str, sock: socket.socket, allowed_hosts: Sequence[str] = ()) -> None:
    """Serve the dashboard of `prefix` on the listening `sock` until Ctrl-C (or SIGTERM); requests
    must name a loopback host or one of `allowed_hosts` (see `app.create_app`)."""
    import uvicorn

    from pipeline.observe.dashboard.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(create_app(prefix, allowed_hosts), log_level="warning", access_log=False)
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
