"""A preemption notice (SIGTERM to the training's worker, as Ray, Kubernetes and spot VMs give;
a Google Cloud VM's maintenance event, from its metadata server)
saves the checkpoint of the step in hand and ends the attempt as PREEMPTED; the retry resumes from
that step, and no step is computed twice. Run as a user runs it: `drydock run` with its own Ray
instance, where the training has a worker process of its own. Its own training: it signals it."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from steps.training.metrics_file import read_metrics
from tests.steps.tiny import QWEN, ROOT, command, env, experiment, ledger_of, seed, step_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 80
INTERVAL = 10  # the experiment's checkpoint_interval


def between_checkpoints(prefix: Path, run: subprocess.Popen, avoid: tuple[int, ...]) -> int:
    """Wait until the training of `run` has logged step 21 or later, at a step whose remainder by
    the checkpoint interval is not in `avoid` (too near a checkpoint); that step."""
    deadline = time.monotonic() + 600
    while True:
        found = list(prefix.glob("train/test-*/metrics.jsonl"))
        steps = sorted(r["step"] for r in read_metrics(str(found[0])) if "loss" in r) if found else []
        if steps and steps[-1] >= 21 and steps[-1] % INTERVAL not in avoid:
            return steps[-1]
        assert time.monotonic() < deadline and run.poll() is None, "the training did not reach step 21"
        time.sleep(0.02)


def test_sigterm_saves_the_step_in_hand_and_the_retry_resumes_from_it(tmp_path):
    exp = experiment(tmp_path, QWEN, dict(name="adamw", learning_rate=3e-3), steps=STEPS)
    prefix = tmp_path / "prefix"
    seed(prefix)
    run = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix)],
        env={**env(), "RAY_AUTH_MODE": "disabled"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Signalled between two checkpoints (steps 21 to 28), so a save at an interval cannot pass
    # for the notice's.
    before = between_checkpoints(prefix, run, (0, 9))
    train = step_dir(prefix, "train/test")
    pulse = json.loads((train / ".logs" / "attempt-1.pulse").read_text())
    pid = int(re.match(r"pid (\d+) on ", pulse["where"]).group(1))
    os.kill(pid, signal.SIGTERM)
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out[-3000:]

    events = [json.loads(line) for line in (train / ".status").read_text().splitlines()]
    events = [e for e in events if e["event"] != "WARNING"]
    assert [e["event"] for e in events] == ["RUNNING", "PREEMPTED", "RUNNING", "SUCCESS"], events
    message = events[1]["message"]
    saved = int(re.search(r"saved the checkpoint of step (\d+)", message).group(1))
    assert "preemption notice (SIGTERM)" in message
    # The step in hand when the notice came, or the next one: not the interval's checkpoint before.
    assert before <= saved <= before + 2 and saved % INTERVAL != 0, (before, saved)
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["resumed_from_step"] == saved
    assert outcome["final_step"] == STEPS - 1
    # Every step's loss once: nothing lost, nothing computed twice.
    after = sorted(r["step"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r)
    assert after == list(range(2, STEPS)), after
    log = (train / ".logs" / "attempt-2.log").read_text()
    assert f"resuming from the checkpoint at step {saved}" in log

    # The ledger: the notice lost nothing; each attempt's split sums to its held time.
    ledger = ledger_of(prefix, "train/test")
    first, second = ledger["attempts"]
    assert (first["ending"], second["ending"]) == ("PREEMPTED", "SUCCESS")
    assert ledger["redone_steps"] == 0 and first["redone_steps"] == 0
    assert first["seconds"]["steps"] > 0 and first["seconds"]["compilation"] > 0
    assert first["seconds"].get("lost", 0.0) < 0.1 * first["held_seconds"], first
    assert second["seconds"]["restore"] > 0  # it loaded the notice's checkpoint
    assert 0 < ledger["goodput"] < 1 and ledger["devices"] == {"kind": "CPU", "count": 1.0}


class _Metadata(http.server.BaseHTTPRequestHandler):
    """A GCE metadata server on loopback: `maintenance-event` is NONE until the test sets
    `terminate`, then TERMINATE_ON_HOST_MAINTENANCE once (the retry's VM is a new one)."""

    state: dict = {}

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_response(403)
            self.end_headers()
            return
        path = self.path.split("?")[0]
        if path.endswith("/instance/maintenance-event"):
            value = "NONE"
            if self.state.get("terminate") and not self.state.get("served"):
                value, self.state["served"] = "TERMINATE_ON_HOST_MAINTENANCE", True
        elif path.endswith("/instance/preempted"):
            value = "FALSE"
        else:
            self.send_response(404)
            self.end_headers()
            return
        body = value.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_gce_maintenance_event_is_a_notice_too(tmp_path):
    _Metadata.state = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1"
        exp = experiment(tmp_path, QWEN, dict(name="adamw", learning_rate=3e-3), steps=STEPS)
        prefix = tmp_path / "prefix"
        run = subprocess.Popen(
            command(exp, prefix),
            env={**env(), "DRYDOCK_GCE_METADATA_URL": url},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        between_checkpoints(prefix, run, (0, 8, 9))
        _Metadata.state["terminate"] = True
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, out[-3000:]
    finally:
        server.shutdown()
    train = step_dir(prefix, "train/test")
    events = [json.loads(line) for line in (train / ".status").read_text().splitlines()]
    events = [e for e in events if e["event"] != "WARNING"]
    assert [e["event"] for e in events] == ["RUNNING", "PREEMPTED", "RUNNING", "SUCCESS"], events
    message = events[1]["message"]
    assert message.startswith(
        "preemption notice (the metadata server says maintenance-event = TERMINATE_ON_HOST_MAINTENANCE)"
    ), message
    saved = int(re.search(r"saved the checkpoint of step (\d+)", message).group(1))
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["resumed_from_step"] == saved and saved % INTERVAL != 0
    after = sorted(r["step"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r)
    assert after == list(range(2, STEPS)), after
