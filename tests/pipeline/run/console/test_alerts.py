"""Alerts (issue 31, part 2): a webhook on 127.0.0.1 hears about failures and the run's end; a
webhook that is down never fails the run; the rate limit holds back floods and says so; the URL,
a secret, is in no manifest, `.step.json` or log."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.run.console.alerts import Notifier, check_webhook
from pipeline.run.options import redact_argv
from tests.webhook import SECRET

ROOT = Path(__file__).resolve().parents[4]

EXPERIMENT = """
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import FailConfig, WriteConfig, fail, write_value

good = Step("data/good", write_value, WriteConfig(this_output(), versioned(1)))
bad = [Step(f"data/bad{{i}}", fail, FailConfig(this_output(), message=versioned(f"boom {{i}}")))
       for i in range({failures})]
if __name__ == "__main__":
    executor_main([good, *bad])
"""


def run(tmp_path: Path, failures: int, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exp = tmp_path / "alerting.py"
    exp.write_text(EXPERIMENT.format(failures=failures))
    command = [sys.executable, "-m", "pipeline", "run", str(exp), "--backend", "local"]
    return subprocess.run(
        [*command, "--prefix", str(tmp_path / "prefix"), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_failure_and_the_runs_end_reach_the_webhook_and_the_secret_stays_out_of_records(tmp_path, webhook):
    url, received = webhook
    result = run(tmp_path, 1, "--notify", url)
    assert result.returncode == 1, result.stderr  # the step failed; the alerts changed nothing
    kinds = [m["body"]["drydock"]["kind"] for m in received]
    assert kinds == ["failed", "finished"], received
    failed, finished = (m["body"] for m in received)
    assert failed["drydock"]["step"] == "data/bad0" and "failed data/bad0: " in failed["text"]
    assert failed["text"] == "[drydock] alerting: failed data/bad0: ValueError: boom 0"
    assert finished["text"] == "[drydock] alerting: finished: 1 succeeded, 1 failed (exit 1)"
    assert {m["path"] for m in received} == {f"/services/{SECRET}"}
    # The secret is nowhere under the prefix (manifests, run records, .step.json, logs), nor in
    # what the run printed.
    for path in (tmp_path / "prefix").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in result.stderr + result.stdout
    (manifest,) = (tmp_path / "prefix" / "experiments").glob("*.json")
    assert "--notify" in json.loads(manifest.read_text())["argv"]  # recorded, with its value redacted
    # What was sent is recorded for the run page, per run.
    run_id = failed["drydock"]["run_id"]
    lines = (tmp_path / "prefix" / "experiments" / "alerts" / f"{run_id}.jsonl").read_text().splitlines()
    recorded = [json.loads(line) for line in lines]
    assert [(r["kind"], r["step"], r["delivered"], r["held"]) for r in recorded] == [
        ("failed", "data/bad0", True, False),
        ("finished", None, True, False),
    ]
    assert recorded[0]["text"] == failed["text"]


def test_a_webhook_that_is_down_never_fails_the_run(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run(tmp_path, 0, env={"DRYDOCK_NOTIFY": f"http://127.0.0.1:{port}/services/{SECRET}"})
    assert result.returncode == 0, result.stderr
    assert f"alert not delivered to the webhook at 127.0.0.1:{port}" in result.stderr
    assert SECRET not in result.stderr and "Traceback" not in result.stderr
    (log,) = (tmp_path / "prefix" / "experiments" / "alerts").glob("*.jsonl")
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["kind"] == "finished" and entry["delivered"] is False and SECRET not in entry["error"]


def test_a_flood_of_failures_is_held_back_and_counted(tmp_path, webhook):
    url, received = webhook
    result = run(tmp_path, 9, "--notify", url)
    assert result.returncode == 1
    kinds = [m["body"]["drydock"]["kind"] for m in received]
    assert kinds.count("failed") == 6 and kinds[-1] == "finished"  # six a minute
    assert "(and 3 more alerts held back)" in received[-1]["body"]["text"]
    (log,) = (tmp_path / "prefix" / "experiments" / "alerts").glob("*.jsonl")
    recorded = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(r["held"] for r in recorded) == 3 and sum(r["delivered"] is True for r in recorded) == 7


@pytest.mark.parametrize("bad", ["ftp://hooks.example.com/x", "hooks.example.com/x", "http://"])
def test_a_webhook_that_is_not_http_is_one_clear_error(tmp_path, bad):
    result = run(tmp_path, 0, "--notify", bad)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: experiment, field `--notify`: the webhook is not an http(s) URL"
    assert not (tmp_path / "prefix").exists()


def test_the_rate_limit_and_the_redaction_on_their_own():
    sent: list[bytes] = []
    clock = [0.0]
    notifier = Notifier(
        "http://h/x", "exp", "run1", per_minute=2, repeat_after=600, clock=lambda: clock[0],
        send=lambda url, body, timeout: sent.append(body),
    )  # fmt: skip
    assert notifier.alert("failed", "a", "boom") and notifier.alert("failed", "b", "boom")
    assert not notifier.alert("failed", "c", "boom")  # third in a minute
    clock[0] = 61.0
    assert not notifier.alert("failed", "a", "boom")  # the same about the same step: 10 minutes
    assert notifier.alert("failed", "c", "boom")
    notifier.close()
    assert [json.loads(b)["drydock"]["step"] for b in sent] == ["a", "b", "c"]
    assert "(and 2 more alerts held back)" in json.loads(sent[-1])["text"]
    assert check_webhook("https://hooks.slack.com/services/x") is None
    argv = ["x.py", "--notify", "https://h/secret", "--notify=https://h/s2", "--prefix", "p"]
    assert redact_argv(argv) == ["x.py", "--notify", "<redacted>", "--notify=<redacted>", "--prefix", "p"]


@contextmanager
def not_http(reply: bytes) -> Iterator[int]:
    """A server on 127.0.0.1 that answers every connection with `reply` and hangs up: its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"garbage\r\n\r\n",  # http.client.BadStatusLine
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",  # http.client.IncompleteRead
    ],
)
def test_a_reply_that_is_not_http_never_stops_alerting_or_the_alert_log(tmp_path, reply):
    """Regression: such a reply raised an exception the sender did not retry, which ended its
    thread: the run's end was never sent and no alert log written."""
    with not_http(reply) as port:
        result = run(tmp_path, 1, "--notify", f"http://127.0.0.1:{port}/services/{SECRET}")
    assert result.returncode == 1, result.stderr
    assert "Exception in thread" not in result.stderr
    assert f"alert not delivered to the webhook at 127.0.0.1:{port}" in result.stderr
    (log,) = (tmp_path / "prefix" / "experiments" / "alerts").glob("*.jsonl")
    recorded = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["kind"], r["delivered"]) for r in recorded] == [("failed", False), ("finished", False)]
    assert all(r["error"] and SECRET not in r["error"] for r in recorded)


def test_credentials_in_the_webhook_url_are_sent_as_basic_auth_and_never_printed(tmp_path, webhook):
    """Regression: the delivery error named the host as `user:password@host` (urllib cannot send
    such a URL, so every alert failed and printed the password)."""
    url, received = webhook
    password = "pa55-w0rd-secret"
    with_credentials = url.replace("http://", f"http://alerts:{password}@")
    result = run(tmp_path, 1, "--notify", with_credentials)
    assert result.returncode == 1, result.stderr
    assert [m["body"]["drydock"]["kind"] for m in received] == ["failed", "finished"]
    expected = "Basic " + base64.b64encode(f"alerts:{password}".encode()).decode()
    assert {m["authorization"] for m in received} == {expected}
    assert password not in result.stderr + result.stdout
    for path in (tmp_path / "prefix").rglob("*"):
        if path.is_file():
            assert password not in path.read_text(errors="replace"), path

    # Undeliverable: the warning and the record name the host only.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = tmp_path / "down"
    down.mkdir()
    result = run(down, 0, "--notify", f"http://alerts:{password}@127.0.0.1:{port}/services/{SECRET}")
    assert result.returncode == 0, result.stderr
    assert f"alert not delivered to the webhook at 127.0.0.1:{port}:" in result.stderr
    assert password not in result.stderr and SECRET not in result.stderr
    for path in (down / "prefix").rglob("*"):
        if path.is_file():
            assert password not in path.read_text(errors="replace"), path


def test_what_a_step_wrote_cannot_ping_a_channel_or_dress_a_link(tmp_path, webhook):
    """Regression: exception messages went into the chat text unescaped."""
    url, received = webhook
    exp = tmp_path / "markup.py"
    exp.write_text(MARKUP_EXPERIMENT)
    command = [sys.executable, "-m", "pipeline", "run", str(exp), "--backend", "local"]
    result = subprocess.run(
        [*command, "--notify", url, "--prefix", str(tmp_path / "prefix")],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    failed = received[0]["body"]["text"]
    assert "<" not in failed and ">" not in failed, failed
    assert failed.endswith(
        "ValueError: &lt;!channel&gt; log in again at "
        "&lt;https://evil.example/login|the Drydock dashboard&gt; &amp; now"
    )
    # The run's own record keeps the text as written (the run page escapes it as HTML).
    (log,) = (tmp_path / "prefix" / "experiments" / "alerts").glob("*.jsonl")
    first = json.loads(log.read_text().splitlines()[0])
    assert "<!channel> log in again" in first["text"]


MARKUP_EXPERIMENT = """
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import FailConfig, fail

message = "<!channel> log in again at <https://evil.example/login|the Drydock dashboard> & now"
if __name__ == "__main__":
    executor_main([Step("data/bad", fail, FailConfig(this_output(), message=versioned(message)))])
"""
