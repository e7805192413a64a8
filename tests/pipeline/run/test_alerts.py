"""Alerts (issue 31, part 2): a webhook on 127.0.0.1 hears about failures and the run's end; a
webhook that is down never fails the run; the rate limit holds back floods and says so; the URL,
a secret, is in no manifest, `.step.json` or log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.run.alerts import Notifier, check_webhook, redact_argv
from tests.webhook import SECRET

ROOT = Path(__file__).resolve().parents[3]

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
    import socket

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
