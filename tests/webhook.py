"""A webhook on 127.0.0.1 that records what it is sent (for the alert tests)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "T000/B000/very-secret-token"
"""The path of the webhook's URL: a credential, as in a Slack webhook."""


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        authorization = self.headers["Authorization"]
        received = {"path": self.path, "body": json.loads(body), "authorization": authorization}
        self.server.received.append(received)  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def webhook_server() -> Iterator[tuple[str, list[dict]]]:
    """A webhook listening on 127.0.0.1: (its URL, the list of requests it got: path and JSON body)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/services/{SECRET}", server.received  # type: ignore[attr-defined]
    finally:
        server.shutdown()
