"""Telling people: a webhook called when a run needs someone (Slack-compatible JSON).

    drydock run x.py --notify https://hooks.slack.com/services/...     (or $DRYDOCK_NOTIFY,
                                                                         or executor_main(notify=...))

What is sent, one message each: a step that failed for good (its retries spent, a divergence
among them), a hang the watchdog found, a step preempted again and again (at its 3rd, 10th,
100th... preemption), what a step's progress reports ask to be told of (a training's rewind, its
eval loss leaving the predicted interval: their `alerts`), and the run's end. The
body is `{"text": "...", "drydock": {"kind", "experiment", "step", "run_id"}}`: Slack shows the
text, anything else can read the rest.

Three promises:
  - **never fails the run**: messages are sent by a background thread, each with a timeout and
    two retries; a webhook that is down costs a warning in the log, nothing else;
  - **rate-limited**: at most `per_minute` messages a minute; the same kind of message about the
    same step at most once every `repeat_after` seconds; what is held back is counted and said in
    the next message ("and 12 more alerts");
  - **keeps the secret**: a webhook URL is a credential (its path is the token, and it may
    carry `user:password@`, sent as HTTP basic authentication). It is never logged (only its host
    and port are), errors are scrubbed of it, and `options.redact_argv` takes it out of the command line
    that manifests and `.step.json` record;
  - **says only what Drydock means**: the text quotes exception and progress messages, which
    anyone's step writes; `&`, `<` and `>` are escaped as Slack asks, so a message cannot ping a
    channel (`<!channel>`) or dress a link (`<https://...|the dashboard>`).

Any failure of the webhook (down, slow, a reply that is not HTTP) is retried and then recorded
as not delivered; none stops the thread that sends the rest, nor the run's alert log.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "AlertLog",
    "Notifier",
    "check_webhook",
    "escape_chat",
    "webhook_host",
]

logger = logging.getLogger(__name__)


def check_webhook(url: str) -> str | None:
    """Why `url` cannot be a webhook, or None: it must be an http(s) URL with a host."""
    try:
        parsed = urllib.parse.urlsplit(url)
        parsed.port  # noqa: B018 -- raises for a port that is not a number
    except ValueError:
        return "is not an http(s) URL"
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "is not an http(s) URL"
    return None


def webhook_host(url: str) -> str:
    """What logs and records may show of a webhook URL: its host and port, never its path or
    credentials."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or "?"
    try:
        port = parsed.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


def _without_credentials(url: str) -> tuple[str, str | None]:
    """(`url` without `user:password@`, the HTTP basic `Authorization` header they make, or None):
    urllib cannot send a URL that carries them."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.username is None and parsed.password is None:
        return url, None
    netloc = parsed.netloc.rpartition("@")[2]
    user = urllib.parse.unquote(parsed.username or "")
    password = urllib.parse.unquote(parsed.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc)), f"Basic {token}"


def escape_chat(text: str) -> str:
    """`text` with `&`, `<` and `>` escaped as Slack's message format asks, so that what a step
    wrote reads as text, never as a mention or a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class AlertLog:
    """The alerts a run sent, kept at `<prefix>/experiments/alerts/<run id>.jsonl` (the run page
    lists a step's): one JSON line each, the whole file rewritten as one grows (object stores cannot
    append; alerts are few, rate-limited to `per_minute`)."""

    def __init__(self, storage: Any, path: str, keep: int = 1000) -> None:
        self._storage, self._path, self._keep = storage, path, keep
        self._lines: list[str] = []
        self._lock = threading.Lock()

    def add(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._lines.append(json.dumps(entry, default=str))
            del self._lines[: -self._keep]
            self._storage.write(self._path, ("\n".join(self._lines) + "\n").encode())


def _post(url: str, body: bytes, timeout: float) -> None:
    url, authorization = _without_credentials(url)
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()


class Notifier:
    """Sends alerts to one webhook for one run (see the module docstring)."""

    def __init__(
        self,
        url: str,
        experiment: str,
        run_id: str,
        *,
        per_minute: int = 6,
        repeat_after: float = 600.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        send: Callable[[str, bytes, float], None] = _post,
        record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._url, self._experiment, self._run_id = url, experiment, run_id
        self._record = record
        """Told of every alert: sent (and whether the webhook took it) or held back."""
        self._per_minute, self._repeat_after, self._timeout = per_minute, repeat_after, timeout
        self._clock, self._send = clock, send
        self._where = webhook_host(url)  # what logs may show of the URL
        parsed = urllib.parse.urlsplit(url)
        # Every form in which the URL's secret parts could appear in an error's text.
        self._secrets = sorted(
            {url, _without_credentials(url)[0], parsed.path, parsed.netloc, parsed.password or ""}
            - {"", "/"},
            key=len,
            reverse=True,
        )
        self._sent: list[float] = []
        self._last: dict[tuple[str, str], float] = {}
        self._held = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[bytes, dict[str, Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="drydock-alerts", daemon=True)
        self._thread.start()
        self.delivered = 0
        """Messages the webhook accepted (for the run's summary and tests)."""

    def alert(self, kind: str, step: str | None, text: str, *, force: bool = False) -> bool:
        """Queue a message; False if the rate limit held it back. `force`: the run's end, which is
        always sent (with the count of what was held back)."""
        now = self._clock()
        with self._lock:
            key = (kind, step or "")
            self._sent = [t for t in self._sent if now - t < 60.0]
            repeat = now - self._last.get(key, float("-inf")) < self._repeat_after
            if not force and (repeat or len(self._sent) >= self._per_minute):
                self._held += 1
                self._note(
                    {"time": now, "kind": kind, "step": step, "text": text, "delivered": None, "held": True}
                )
                return False
            self._last[key] = now
            self._sent.append(now)
            held, self._held = self._held, 0
        where = f" {step}" if step else ""
        more = f" (and {held} more alert{'s' if held != 1 else ''} held back)" if held else ""
        body = {
            "text": escape_chat(f"[drydock] {self._experiment}: {kind}{where}: {text}{more}"),
            "drydock": {"kind": kind, "experiment": self._experiment, "step": step, "run_id": self._run_id},
        }
        entry = {
            "time": now,
            "kind": kind,
            "step": step,
            "text": f"[drydock] {self._experiment}: {kind}{where}: {text}{more}",
            "delivered": None,
            "held": False,
        }
        self._queue.put((json.dumps(body).encode(), entry))
        return True

    def _note(self, entry: dict[str, Any]) -> None:
        if self._record is None:
            return
        try:
            self._record(entry)
        except Exception as e:  # a record is for people reading later: never worth failing the run
            logger.warning("could not record an alert: %s", e)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            body, entry = item
            try:
                self._deliver(body, entry)
            except Exception as e:  # nothing may end the thread: the next alerts still go
                error = self._scrub(e)
                logger.warning("alert not delivered to the webhook at %s: %s", self._where, error)
                entry.update(delivered=False, error=error)
            self._note(entry)

    def _deliver(self, body: bytes, entry: dict[str, Any]) -> None:
        """Send, with two retries; raises the last error."""
        for attempt in range(3):
            try:
                self._send(self._url, body, self._timeout)
            # Any exception: a reply that is not HTTP raises http.client's BadStatusLine or
            # IncompleteRead, which are neither OSError nor ValueError.
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.5 * (attempt + 1))
            else:
                self.delivered += 1
                entry["delivered"] = True
                return

    def _scrub(self, error: BaseException) -> str:
        """The error's text without the webhook URL, its path or its credentials."""
        text = f"{type(error).__name__}: {error}" if not str(error) else str(error)
        for secret in self._secrets:
            text = text.replace(secret, "<webhook>")
        return text

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued (waiting at most `timeout` seconds), then stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def describe(self) -> dict[str, Any]:
        """What a record of the run may say about its alerts: where they went (the host only)."""
        return {"webhook": self._where, "delivered": self.delivered}


def report_alerts(report: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    """(kind, count, message) of each alert a step's progress report asks for: a step lists them
    in its report's data as `alerts: {kind: {"count": n, "message": ...}}` (a training's
    rewinds, its eval loss leaving the predicted interval); the runner sends each once per new
    count. Malformed entries are skipped (the report is a file anyone may have written)."""
    data = report.get("data")
    alerts = data.get("alerts") if isinstance(data, Mapping) else None
    if not isinstance(alerts, Mapping):
        return []
    out = []
    for kind, entry in alerts.items():
        count = entry.get("count") if isinstance(entry, Mapping) else None
        if type(count) is not int or not isinstance(kind, str):
            continue
        message = entry.get("message")
        out.append((kind, count, message if isinstance(message, str) else kind))
    return out
