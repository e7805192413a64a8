"""A run's budget (issue 49): refused at plan when the estimate exceeds it; spent mid-run, the
training stops at a checkpoint (CANCELLED, exit 3, nothing else starts), and a run with the budget
raised resumes it from there, every step's loss logged once. Its own training: it stops it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from steps.training.metrics_file import read_metrics
from tests.steps.tiny import QWEN, ROOT, command, env, experiment, ledger_of, step_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 400

DECLARED = """
from pipeline import Resources, Step, executor_main, this_output
from steps.models import MoeModelConfig
from steps.training.train_moe import train_moe_step
from tests.pipeline.stepfns import WriteConfig, write_value

# A 1.3B-active MoE on 64 H100s for 100,000 steps of 1M tokens: thousands of device-hours.
big = MoeModelConfig(hidden_dim=4096, expert_intermediate_dim=1408, num_layers=28, num_heads=32,
                     num_kv_heads=8, num_experts=64, num_experts_per_token=6)
data = Step("mixture/x", write_value, WriteConfig(this_output()))
training = train_moe_step("train/big", data=data, model=big, batch_size=256, seq_len=4096, num_steps=100_000,
                          vocab_size=1691, resources=Resources(gpus=8, hosts=8, accelerator="H100"))
if __name__ == "__main__":
    executor_main([training])
"""


def drydock(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_plan_whose_estimate_exceeds_the_budget_is_refused_in_one_line(tmp_path):
    exp = tmp_path / "declared.py"
    exp.write_text(DECLARED)
    refused = drydock("plan", str(exp), "--prefix", str(tmp_path / "prefix"), "--budget_device_hours", "1000")
    assert refused.returncode == 2, refused.stderr[-2000:]
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(
        "error: experiment, field `--budget_device_hours`: the steps to run are estimated at "
    ), line
    assert float(re.search(r"estimated at ([\d.e+]+) device-hours", line).group(1)) > 1000
    assert not (tmp_path / "prefix").exists()  # nothing written
    # Without a budget, the plan shows the estimate it went by.
    shown = drydock("plan", str(exp), "--prefix", str(tmp_path / "prefix"))
    assert shown.returncode == 0, shown.stderr[-2000:]
    estimate = r"device time: +1,812 device-hours on 64 H100 \(~\$[\d,]+ at the price table\)"
    assert re.search(estimate, shown.stdout), shown.stdout[-2000:]
    bad = drydock("plan", str(exp), "--prefix", str(tmp_path / "prefix"), "--budget_dollars", "-5")
    assert bad.returncode == 2 and "`--budget_dollars`: must be a positive number" in bad.stderr


def test_a_spent_budget_stops_the_training_at_a_checkpoint_and_a_raised_one_resumes_it(tmp_path, webhook):
    exp = experiment(tmp_path, QWEN, dict(name="adamw", learning_rate=3e-3), steps=STEPS)
    prefix = tmp_path / "prefix"
    # The data steps first, to know what they spent; then 30 more CPU-seconds: the training
    # starts (15-25 s here) and is stopped some way in.
    subprocess.run(command(exp, prefix, "--only", "mixture"), env=env(), cwd=ROOT, check=True, timeout=600)
    # The tokenized corpus is the session's, copied (tests.steps.tiny.seed): its held time came
    # with it. The mixture's is this run's (seconds: it is the first to import Levanter).
    data = ("tokenized/prose", "tokenized/arithmetic", "mixture/test")
    spent = sum(ledger_of(prefix, name)["device_hours"] for name in data)
    budget = spent + 30 / 3600
    url, received = webhook
    stopped = subprocess.run(
        command(exp, prefix, "--budget_device_hours", f"{budget:.6f}", "--notify", url),
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    assert "stopped: the run's budget is spent: its steps have held" in stopped.stderr
    train = step_dir(prefix, "train/test")
    events = [json.loads(line) for line in (train / ".status").read_text().splitlines()]
    events = [e for e in events if e["event"] != "WARNING"]
    assert [e["event"] for e in events] == ["RUNNING", "CANCELLED"], events
    message = events[1]["message"]
    assert message.startswith("stopped by budget (the run's budget is spent"), message
    saved = int(re.search(r"saved the checkpoint of step (\d+)", message).group(1))
    assert 0 <= saved < STEPS - 1 and (train / "checkpoints" / f"step-{saved}" / "metadata.json").exists()
    assert not list(prefix.glob("evaluate/test-*/.status"))  # nothing else started
    # Someone is told: a `budget` alert, then the run's end.
    kinds = [m["body"]["drydock"]["kind"] for m in received]
    assert "budget" in kinds, kinds
    (alert,) = [m["body"]["text"] for m in received if m["body"]["drydock"]["kind"] == "budget"]
    assert "the run's budget is spent: its steps have held" in alert
    # Spent is spent: the same budget is refused at plan, naming what was held.
    again = subprocess.run(
        command(exp, prefix, "--budget_device_hours", f"{budget:.6f}", "--dry_run", "true"),
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 2 and "`--budget_device_hours`: the budget is spent" in again.stderr, (
        again.stderr
    )
    # Raised: the training resumes from its checkpoint and finishes; each step's loss once.
    resumed = subprocess.run(
        command(exp, prefix, "--budget_device_hours", "1"),
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["resumed_from_step"] == saved and outcome["final_step"] == STEPS - 1
    steps = sorted(r["step"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r)
    assert steps == list(range(2, STEPS)), steps[:5]
    assert ledger_of(prefix, "train/test")["redone_steps"] == 0
