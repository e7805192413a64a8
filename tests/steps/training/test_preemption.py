"""A preemption notice (SIGTERM to the training's worker, as Ray, Kubernetes and spot VMs give)
saves the checkpoint of the step in hand and ends the attempt as PREEMPTED; the retry resumes from
that step, and no step is computed twice. Run as a user runs it: `drydock run` with its own Ray
instance, where the training has a worker process of its own. Its own training: it signals it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from steps.training.metrics import read_metrics
from tests.steps.tiny import QWEN, ROOT, env, experiment, ledger_of, step_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 80
INTERVAL = 10  # the experiment's checkpoint_interval


def test_sigterm_saves_the_step_in_hand_and_the_retry_resumes_from_it(tmp_path):
    exp = experiment(tmp_path, QWEN, dict(name="adamw", learning_rate=3e-3), steps=STEPS)
    prefix = tmp_path / "prefix"
    run = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix)],
        env={**env(), "RAY_AUTH_MODE": "disabled"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600

    def logged() -> list[int]:
        found = list(prefix.glob("train/test-*/metrics.jsonl"))
        return sorted(r["step"] for r in read_metrics(str(found[0])) if "loss" in r) if found else []

    # Signalled between two checkpoints (steps 21 to 28), so a save at an interval cannot pass
    # for the notice's.
    while not (steps := logged()) or steps[-1] < 21 or steps[-1] % INTERVAL in (0, 9):
        assert time.monotonic() < deadline and run.poll() is None, "the training did not reach step 21"
        time.sleep(0.02)
    train = step_dir(prefix, "train/test")
    pulse = json.loads((train / ".logs" / "attempt-1.pulse").read_text())
    pid = int(re.match(r"pid (\d+) on ", pulse["where"]).group(1))
    before = steps[-1]
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
