"""Spike policies on real tiny trainings with real faults: a mixture that switches to a corrupt
component (random characters) for a short window mid-run, and a learning rate made absurd for a
few steps so that the loss becomes NaN. Each training runs in its own `drydock run` process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from steps.training.metrics_file import read_events, read_metrics
from tests.steps.tiny import command, env, ledger_of

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
STEPS = 100

EXPERIMENT = """
import os
from pipeline import executor_main
from steps.data.mixture import mixture_step
from steps.models import TINY_MOE
from steps.data.tokenize import tokenize_step
from steps.training.train_moe import OptimizerSpec, SpikePolicy, train_moe_step

ROOT = {root!r}
CORRUPT, POLICY = {corrupt!r}, SpikePolicy(**{policy!r})
prose = tokenize_step("tok/prose", train=["data/corpus/prose/train-*.jsonl"], tokenizer="data/tokenizer",
                      input_root=ROOT)
if CORRUPT:
    bad = tokenize_step("tok/corrupt", train=[{corrupt_glob!r}], tokenizer="data/tokenizer")
    # Steps 60-65 read nothing but the corrupt component.
    components = {{"prose": prose, "corrupt": bad}}
    weights = [(0, {{"prose": 1.0, "corrupt": 0.0}}), (60, {{"prose": 0.0, "corrupt": 1.0}}),
               (66, {{"prose": 1.0, "corrupt": 0.0}})]
else:
    components, weights = {{"prose": prose}}, {{"prose": 1.0}}
mix = mixture_step("mix", components=components, weights=weights, target_tokens=140 * 8 * 64,
                   batch_size=8, seq_len=64)
train = train_moe_step("train", data=mix, model=TINY_MOE, optimizer=OptimizerSpec(learning_rate=3e-3),
                       batch_size=8, seq_len=64, num_steps={steps}, checkpoint_interval=10,
                       eval_interval=1000, router_stats_interval=0, hf_export=False, spike_policy=POLICY)
{fault}
if __name__ == "__main__":
    executor_main([train])
"""

# A real fault, injected by the experiment file (it runs in the training's process): in the first
# training attempt only (a transient fault, as a flipped bit would be), the learning rate is 1e30
# times the schedule for training steps 40-42, which overflows the weights: the loss is NaN.
ABSURD_LR = """
import jax.numpy as jnp
import steps.training.levanter_config as levanter_config
_optimizer, _attempts = levanter_config.levanter_optimizer, []
def _absurd_for_a_few_steps(*args, **kwargs):
    optimizer = _optimizer(*args, **kwargs)
    _attempts.append(1)
    if len(_attempts) > {transient}:
        return optimizer
    scheduler = optimizer.lr_scheduler
    def lr_scheduler(num_train_steps, override_lr=None):
        schedule = scheduler(num_train_steps, override_lr=override_lr)
        def absurd(count):
            return schedule(count) * jnp.where((count >= {start}) & (count < {start} + 3), 1e30, 1.0)
        return absurd
    object.__setattr__(optimizer, "lr_scheduler", lr_scheduler)
    return optimizer
levanter_config.levanter_optimizer = _absurd_for_a_few_steps
"""


def corrupt_corpus(tmp_path: Path) -> str:
    """400 documents of random printable characters: tokens the model has never seen together."""
    import random

    rng = random.Random(0)
    chars = [chr(c) for c in range(33, 127)]
    path = tmp_path / "corrupt" / "train-0000.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for _ in range(400):
            f.write(json.dumps({"text": "".join(rng.choice(chars) for _ in range(400))}) + "\n")
    return str(path)


def write_experiment(tmp_path: Path, name: str, *, corrupt: bool, policy: dict, fault: str = "") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(
        EXPERIMENT.format(
            root=str(ROOT),
            corrupt=corrupt,
            policy=policy,
            corrupt_glob=corrupt_corpus(tmp_path),
            steps=STEPS,
            fault=fault,
        )
    )
    return path


def run(exp: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(exp, prefix), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=900
    )


def train_dir(prefix: Path) -> Path:
    (found,) = prefix.glob("train-*")
    return found


def final_loss(train: Path) -> float:
    """The mean training loss of the last 10 steps (one step's loss is too noisy to compare)."""
    losses = [r["loss"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r]
    return sum(losses[-10:]) / 10


def check_each_step_once(train: Path) -> None:
    steps = [r["step"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r]
    assert steps == list(range(2, STEPS))  # Levanter logs the loss from step 2 on


@pytest.fixture(scope="module")
def corrupt_runs(tmp_path_factory) -> dict[str, Path]:
    """The same recipe trained four ways: without the corrupt window, and with it under `warn`,
    `rewind` (a spike is 1.5x the median, 2 in a row rewind, 6 more batches skipped) and `skip`
    (Levanter's skip-step over a 16-step window)."""
    tmp = tmp_path_factory.mktemp("corrupt")
    runs = {}
    for name, corrupt, policy in (
        ("clean", False, {}),
        ("warn", True, {"action": "warn", "factor": 1.5}),
        ("rewind", True, {"action": "rewind", "factor": 1.5, "patience": 2, "skip_batches": 6}),
        ("skip", True, {"action": "skip", "factor": 1.5, "skip_window": 16}),
    ):
        prefix = tmp / name
        result = run(write_experiment(tmp, name, corrupt=corrupt, policy=policy), prefix)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = train_dir(prefix)
    return runs


def test_warn_records_the_spikes_of_a_corrupt_window_and_trains_through_them(corrupt_runs):
    train = corrupt_runs["warn"]
    spikes = [e["step"] for e in read_events(str(train / "metrics.jsonl")) if e["event"] == "spike"]
    assert spikes and spikes[0] == 60 and all(60 <= s < 70 for s in spikes)
    flagged = [r["step"] for r in read_metrics(str(train / "metrics.jsonl")) if r.get("spike") == "spike"]
    assert flagged == spikes
    status = (train / ".status").read_text()
    assert "loss spike at step 60" in status
    counters = json.loads((train / "train_result.json").read_text())["interventions"]
    assert counters["spike_steps"] == len(spikes) and counters["rewinds"] == 0
    check_each_step_once(train)


def test_rewind_skips_the_corrupt_window_and_ends_near_the_clean_run(corrupt_runs):
    train = corrupt_runs["rewind"]
    (rewind,) = json.loads((train / "rewinds.json").read_text())["rewinds"]
    assert rewind["first_step"] == 60 and rewind["trigger_step"] == 61 and rewind["restored_step"] == 50
    # The ledger: steps 51..61 were computed twice, their time lost.
    ledger = ledger_of(train.parent, "train")
    assert ledger["redone_steps"] == 11 and ledger["seconds"]["lost"] > 0, ledger
    assert rewind["skipped"] == [60, 67]  # the spiking steps' batches and 6 more: past the window
    events = read_events(str(train / "metrics.jsonl"))
    assert [e["event"] for e in events] == ["rewind"]  # the spikes it rewound over were trained again
    assert "rewound to step 50, skipped batches 60-67" in (train / ".status").read_text()
    assert not (train / "rewound").exists()  # the set-aside checkpoints go when training ends
    result = json.loads((train / "train_result.json").read_text())
    assert result["final_step"] == STEPS - 1
    assert result["interventions"] == {
        "nan_steps": 0,
        "inf_steps": 0,
        "spike_steps": 2,
        "skipped_updates": 0,
        "rewinds": 1,
        "batches_skipped": 8,
    }
    check_each_step_once(train)
    clean, rewound = final_loss(corrupt_runs["clean"]), final_loss(train)
    assert abs(rewound - clean) / clean < 0.05, (clean, rewound)
    # No step after the rewind read the corrupt component: nothing spiked again.
    assert not [r for r in read_metrics(str(train / "metrics.jsonl")) if r.get("spike")]


def test_skip_drops_the_update_of_the_first_corrupt_step(corrupt_runs):
    train = corrupt_runs["skip"]
    records = {r["step"]: r for r in read_metrics(str(train / "metrics.jsonl"))}
    skipped = [s for s, r in records.items() if r.get("optim/skipped_step") == 1]
    # Levanter's skip-step puts a skipped step's loss into its window too, so the mean and
    # deviation of the window grow: it drops the first update of a run of bad batches, not all.
    assert skipped == [60]
    events = read_events(str(train / "metrics.jsonl"))
    assert [e["step"] for e in events if e["event"] == "skipped_update"] == [60]
    assert "optimizer update of step 60 skipped" in (train / ".status").read_text()
    counters = json.loads((train / "train_result.json").read_text())["interventions"]
    assert counters["skipped_updates"] == 1 and counters["spike_steps"] >= 1 and counters["rewinds"] == 0
    check_each_step_once(train)


def test_a_nan_loss_rewinds_at_a_lower_learning_rate_and_training_recovers(tmp_path, corrupt_runs):
    policy = {"action": "rewind", "lr_factor": 0.5, "lr_steps": 20}
    exp = write_experiment(
        tmp_path, "nan", corrupt=False, policy=policy, fault=ABSURD_LR.format(transient=1, start=40)
    )
    result = run(exp, tmp_path / "prefix")
    assert result.returncode == 0, result.stderr[-3000:]
    train = train_dir(tmp_path / "prefix")
    (rewind,) = json.loads((train / "rewinds.json").read_text())["rewinds"]
    assert rewind["reason"] == "nan" and rewind["trigger_step"] == rewind["first_step"] == 41
    # Checkpoint 40 holds the state after the first absurd update: the rewind goes back past it.
    assert rewind["restored_step"] == 30 and rewind["skipped"] == [41, 41]
    assert (rewind["lr_from_step"], rewind["lr_until_step"]) == (31, 51)
    counters = json.loads((train / "train_result.json").read_text())["interventions"]
    assert counters == {
        "nan_steps": 1,
        "inf_steps": 0,
        "spike_steps": 0,
        "skipped_updates": 0,
        "rewinds": 1,
        "batches_skipped": 1,
    }
    check_each_step_once(train)
    records = {r["step"]: r for r in read_metrics(str(train / "metrics.jsonl"))}
    clean = {r["step"]: r for r in read_metrics(str(corrupt_runs["clean"] / "metrics.jsonl"))}
    # The same schedule as the clean run, halved for the 20 steps trained again.
    for step in (20, 31, 50, 51, 90):
        expected = clean[step]["learning_rate"] * (0.5 if 31 <= step < 51 else 1.0)
        assert records[step]["learning_rate"] == pytest.approx(expected, rel=1e-5), step
    assert all(r["loss"] == r["loss"] for r in records.values() if "loss" in r)  # no NaN kept
    # Training went on after the rewind; 20 steps at half the rate leave it a little behind the
    # clean run at step 100 (measured: 2.69 against 2.48).
    assert final_loss(train) < records[30]["loss"] - 0.5
    assert final_loss(train) < 1.15 * final_loss(corrupt_runs["clean"])


def test_too_many_rewinds_fail_with_one_error_saying_each(tmp_path):
    # The fault comes back in every attempt, so every retry diverges again.
    policy = {"action": "rewind", "max_rewinds": 2}
    exp = write_experiment(
        tmp_path, "diverges", corrupt=False, policy=policy, fault=ABSURD_LR.format(transient=99, start=40)
    )
    result = run(exp, tmp_path / "prefix")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert re.search(r"TrainingDiverged: nan at step 4\d after 2 rewind\(s\)", out), out[-3000:]
    assert (
        "rewind 1: loss NaN at step 41: rewound to step 30" in out and "rewind 2: loss NaN at step 4" in out
    )
    assert not (train_dir(tmp_path / "prefix") / "train_result.json").exists()
    # A hand-edited rewinds.json: the next attempt fails at once with one error naming the file
    # and what is wrong, not a raw KeyError/TypeError (issue 29, part 5).
    rewinds = train_dir(tmp_path / "prefix") / "rewinds.json"
    record = json.loads(rewinds.read_text())
    for damage, expect in (
        (lambda r: r["rewinds"][0].pop("skipped"), "rewinds[0] has no `skipped`"),
        (lambda r: r["rewinds"][1].update(skipped="all"), "rewinds[1].skipped is 'all', not [first, last]"),
        (lambda r: r.update(rewinds={"a": 1}), "`rewinds` is a dict, not a list"),
    ):
        edited = json.loads(json.dumps(record))
        damage(edited)
        rewinds.write_text(json.dumps(edited))
        again = run(exp, tmp_path / "prefix")
        assert again.returncode != 0
        (failed,) = [line for line in again.stderr.splitlines() if " FAILED " in line and "[1/1]" in line]
        assert f"  RewindsFileError: {rewinds} is damaged: {expect}" in failed, failed


def test_killed_after_a_rewind_the_resumed_run_honours_it(tmp_path):
    policy = {"action": "rewind", "factor": 1.5, "patience": 2, "skip_batches": 6}
    exp = write_experiment(tmp_path, "kill", corrupt=True, policy=policy)
    prefix = tmp_path / "prefix"
    proc = subprocess.Popen(
        command(exp, prefix), env=env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600
    # The checkpoint of step 70 is written after the rewind (training went back to step 50).
    while not list(prefix.glob("train-*/checkpoints/step-70/metadata.json")):
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint at step 70"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    train = train_dir(prefix)
    assert (train / "rewinds.json").exists() and not (train / "train_result.json").exists()
    result = run(exp, prefix)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["final_step"] == STEPS - 1
    assert outcome["interventions"]["rewinds"] == 1  # the resumed run read the same batches: no new spike
    check_each_step_once(train)
    assert [e["event"] for e in read_events(str(train / "metrics.jsonl"))] == ["rewind"]


def test_a_rewind_with_nowhere_to_go_fails_and_deletes_nothing(tmp_path):
    # The update of step 10 overflows the weights: the loss of step 11 is NaN, and the checkpoint
    # of step 10 (the only one) holds the bad state. Going back to step 0 would delete it.
    policy = {"action": "rewind"}
    fault = ABSURD_LR.format(transient=99, start=10)
    exp = write_experiment(tmp_path, "nowhere", corrupt=False, policy=policy, fault=fault)
    result = run(exp, tmp_path / "prefix")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "TrainingDiverged: nan at step 11: no checkpoint from before step 11 to rewind to" in out, out[
        -3000:
    ]
    assert "the earliest kept is step 10); nothing deleted" in out
    train = train_dir(tmp_path / "prefix")
    assert (train / "checkpoints" / "step-10" / "metadata.json").exists()
    assert not (train / "rewinds.json").exists() and not (train / "rewound").exists()
