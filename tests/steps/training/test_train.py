"""Training tiny MoEs of both families on the demo corpus, evaluating them, and resuming a
killed run. Each experiment runs in its own `drydock run` process, as it would for a user."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from steps.models import MoeModelConfig, parameter_counts
from steps.training.metrics_file import read_metrics
from tests.steps.tiny import (
    DRYDOCK,
    QWEN,
    ROOT,
    command,
    env,
    experiment,
    ledger_of,
    step_dir,
    train_and_evaluate,
)

pytestmark = pytest.mark.slow


def check_trained_and_evaluated(prefix: Path, model: MoeModelConfig, steps: int) -> None:
    train = step_dir(prefix, "train/test")
    records = read_metrics(str(train / "metrics.jsonl"))
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) >= steps - 3  # Levanter logs the loss from step 2 on
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, f"loss did not go down enough: {first:.3f} -> {last:.3f}"
    assert any("router_max_load_ratio" in r for r in records)
    assert all("learning_rate" in r and "tokens_per_second" in r for r in records if "loss" in r)
    result = json.loads((train / "train_result.json").read_text())
    assert result["final_step"] == steps - 1
    assert result["start"]["step"] == 0 and result["start"]["compilation"]["programs"] > 0, result["start"]
    assert (result["total_params"], result["active_params"]) == parameter_counts(model, result["vocab_size"])
    if model.family == "drydock_moe":  # no Hugging Face architecture: safetensors and config.json
        assert result["export"] == str(train / "export" / f"step-{steps - 1}")
        assert (train / "export" / f"step-{steps - 1}" / "model.safetensors").stat().st_size > 100_000
    else:
        assert (train / "hf" / f"step-{steps - 1}" / "config.json").exists()
    summary = json.loads((train / ".step.json").read_text())["summary"]
    assert summary["total_params"] == result["total_params"] and summary["num_train_steps"] == steps
    evaluation = json.loads((step_dir(prefix, "evaluate/test") / "results.json").read_text())
    assert set(evaluation["validation_sets"]) == {"prose", "arithmetic"}
    for values in evaluation["validation_sets"].values():
        assert values["loss"] < losses[0] and 0 < values["bits_per_byte"] < 8
    assert (step_dir(prefix, "evaluate/test") / "loss.png").stat().st_size > 1000


def test_tiny_qwen3_moe_and_drydock_moe_train_evaluate_and_learn_alike(tmp_path, trained_tiny):
    """The same data, steps and optimizer for both families: each trains, evaluates, and the
    drydock_moe loss falls as far as Qwen3-MoE's (within 10% of its drop). The Qwen3-MoE run is
    the session's `trained_tiny`."""
    _exp, qwen_prefix, qwen_stderr = trained_tiny
    drydock = experiment(tmp_path, DRYDOCK, dict(name="adamw", learning_rate=3e-3, warmup=0.1), steps=40)
    drydock_stderr = train_and_evaluate(drydock, tmp_path / "prefix").stderr
    drops = {}
    for name, model, prefix, stderr in (
        ("qwen", QWEN, qwen_prefix, qwen_stderr),
        ("drydock", DRYDOCK, tmp_path / "prefix", drydock_stderr),
    ):
        check_trained_and_evaluated(prefix, MoeModelConfig(**model), 40)
        # No alarming noise for things that are fine: caches written by Drydock's tokenize, absent
        # optional parameters in a checkpoint, the offline HF export.
        for noise in ("Metadata mismatch", "Unknown leaf type", "Could not load reference HF config"):
            assert noise not in stderr, noise
        records = read_metrics(str(step_dir(prefix, "train/test") / "metrics.jsonl"))
        losses = [r["loss"] for r in records if "loss" in r]
        drops[name] = sum(losses[:5]) / 5 - sum(losses[-5:]) / 5
    assert abs(drops["drydock"] - drops["qwen"]) < 0.1 * drops["qwen"], drops


def test_tiny_mixtral_with_a_shared_expert_trains_with_muon(tmp_path):
    """Its own training: another family and optimizer than the session's tiny model."""
    model = {**QWEN, "family": "mixtral", "num_shared_experts": 1, "qk_norm": False}
    optimizer = dict(name="muon", learning_rate=0.02, adam_learning_rate=3e-3, weight_decay=0.0, warmup=0.1)
    exp = experiment(tmp_path, model, optimizer, steps=40)
    train_and_evaluate(exp, tmp_path / "prefix")
    check_trained_and_evaluated(tmp_path / "prefix", MoeModelConfig(**model), 40)
    # Mixtral's own router statistics (logged inside the loss) survive the fix.
    records = read_metrics(str(step_dir(tmp_path / "prefix", "train/test") / "metrics.jsonl"))
    assert any(key.startswith("train/load_balancing_loss") for r in records for key in r)


def test_killed_after_a_checkpoint_the_rerun_resumes_bit_for_bit_and_ends_at_the_same_step(tmp_path):
    """Drydock's own family (its balancing bias is state too): killed a few steps after the
    checkpoint at step 20 (or a later one), the rerun resumes from it and computes those steps' losses again,
    exactly as the killed run had. Its own training: it kills it."""
    model = dict(DRYDOCK)
    exp = experiment(tmp_path, model, dict(name="adamw", learning_rate=3e-3), steps=60)
    prefix = tmp_path / "prefix"
    proc = subprocess.Popen(
        command(exp, prefix), env=env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600

    def logged() -> dict[int, float]:
        found = list(prefix.glob("train/test-*/metrics.jsonl"))
        return {r["step"]: r["loss"] for r in read_metrics(str(found[0])) if "loss" in r} if found else {}

    while not (
        list(prefix.glob("train/test-*/checkpoints/step-20/metadata.json")) and max(logged(), default=0) >= 23
    ):
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint at step 20"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    train = step_dir(prefix, "train/test")
    assert not (train / "train_result.json").exists()
    # The resume starts at the last whole checkpoint: 20, or a later one if the kill came after it
    # (checkpoints every 10 steps; the poll above is not exact under load). Either way it redoes
    # the steps the killed run logged after it.
    saved = max(int(p.parent.name[5:]) for p in (train / "checkpoints").glob("step-*/metadata.json"))
    assert saved >= 20
    before = {step: loss for step, loss in logged().items() if step > saved}
    train_and_evaluate(exp, prefix)
    outcome = json.loads((train / "train_result.json").read_text())
    assert outcome["resumed_from_step"] == saved
    # The retry loaded what the killed attempt had compiled from the persistent cache, and says so.
    start = outcome["start"]
    assert start["step"] == saved + 1 and start["compilation"]["from_cache"] >= 1, start
    log = "".join(p.read_text() for p in (train / ".logs").glob("attempt-*.log"))
    assert f"train_moe: first step ({saved + 1})" in log and "loaded from the compilation cache" in log
    assert outcome["final_step"] == 59
    after = {r["step"]: r["loss"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r}
    assert sorted(after) == list(range(2, 60))  # every step once: nothing lost, nothing twice
    assert before and all(after[step] == loss for step, loss in before.items()), (before, after)
    # The ledger counts the steps the killed attempt did after its checkpoint, exactly, as lost.
    ledger = ledger_of(prefix, "train/test")
    killed, resumed = ledger["attempts"]
    assert killed["ending"] == "UNFINISHED" and resumed["ending"] == "SUCCESS"
    assert killed["redone_steps"] == max(before) - saved == ledger["redone_steps"], (killed, max(before))
    assert killed["seconds"]["lost"] > 0


def test_force_retrains_from_step_zero_and_evaluates_again(tmp_path, trained_tiny):
    """`drydock run FILE --force 'train/'` as docs/recipes.md shows it: the training is redone from
    nothing (not "resumed" from its final checkpoint) and so is the evaluation reading it. On a
    copy of the session's `trained_tiny` prefix (a prefix moves whole: nothing in it is absolute)."""
    exp, trained, _stderr = trained_tiny
    prefix = tmp_path / "prefix"
    shutil.copytree(trained, prefix, symlinks=True)
    train, evaluation = step_dir(prefix, "train/test"), step_dir(prefix, "evaluate/test")
    first = json.loads((train / "train_result.json").read_text())
    forced = subprocess.run(
        [*command(exp, prefix), "--force", "^train/"],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert forced.returncode == 0, forced.stderr[-3000:]
    again = json.loads((train / "train_result.json").read_text())
    assert again["resumed_from_step"] is None and again["final_step"] == 39
    assert again["wall_seconds"] != first["wall_seconds"]
    steps_logged = [r["step"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r]
    assert steps_logged == list(range(2, 40))  # one fresh run's lines, not two runs' appended
    successes = [line for line in (evaluation / ".status").read_text().splitlines() if '"SUCCESS"' in line]
    assert len(successes) == 2
    # The session's trained model is untouched for the tests that read it after this one.
    assert json.loads((step_dir(trained, "train/test") / "train_result.json").read_text()) == first


def test_retention_deletes_old_checkpoints_as_training_goes(tmp_path):
    """Its own training: `keep_checkpoints` deletes checkpoints while it trains. Otherwise the
    session's `trained_tiny` (retention changes no program): its compiled programs are cached."""
    exp = experiment(tmp_path, dict(QWEN), dict(name="adamw", learning_rate=3e-3, warmup=0.1), steps=40)
    exp.write_text(
        exp.read_text().replace("router_stats_interval=5)", "router_stats_interval=5, keep_checkpoints=1)")
    )
    train_and_evaluate(exp, tmp_path / "prefix")
    train = step_dir(tmp_path / "prefix", "train/test")
    kept = sorted(int(p.name[5:]) for p in (train / "checkpoints").glob("step-*"))
    assert kept == [30, 39]  # the newest interval checkpoint and the final one
    evaluation = json.loads((step_dir(tmp_path / "prefix", "evaluate/test") / "results.json").read_text())
    assert evaluation["checkpoint_step"] == 39
