"""The default experiment end to end, as `make run` runs it: on the default (Ray) backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steps.training.metrics_file import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run(prefix: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "experiments/tiny_moe.py", "--prefix", str(prefix), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_tiny_moe_learns_and_a_rerun_does_nothing(tmp_path):
    prefix = tmp_path / "runs"
    first = run(prefix)
    assert first.returncode == 0, first.stderr[-4000:]
    # The human summary: the evaluation table and how to rerun the run.
    assert "validation set" in first.stdout and "bits/byte" in first.stdout, first.stdout
    assert "rerun anywhere: drydock rerun" in first.stdout
    # A quiet console: where steps run first, a line per state change, no library output, no
    # escape codes (stdout and stderr are pipes here), at most 50 lines in all (eight steps).
    console = (first.stderr + first.stdout).splitlines()
    assert "ray: private local instance (" in console[0], console[0]
    assert len(console) <= 50, "\n".join(console)
    assert "\x1b[" not in first.stderr + first.stdout
    assert not [line for line in console if "levanter" in line or "jax" in line or "it/s]" in line]
    (log,) = (next(prefix.glob("train/tiny-qwen3-moe-*")) / ".logs").glob("attempt-*.log")
    assert "levanter" in log.read_text()  # the library output is in the attempt's log
    (train,) = prefix.glob("train/tiny-qwen3-moe-*")
    losses = [r["loss"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r]
    (evaluation,) = prefix.glob("evaluate/tiny-qwen3-moe-*")
    results = json.loads((evaluation / "results.json").read_text())
    # The model really learns: evaluation loss far below where training started.
    assert results["average"]["loss"] < 0.3 * losses[0], (losses[0], results["average"])
    for values in results["validation_sets"].values():
        assert values["loss"] < 0.5 * losses[0]
    # In-training evaluation reads the sets and batches the evaluate step reads: at the final
    # checkpoint the per-domain losses agree (with 4 batches a set they were 1.650 / 0.963 against
    # 1.560 / 0.960 for the whole sets).
    records = read_metrics(str(train / "metrics.jsonl"))
    final = [r for r in records if any(k.endswith("/loss") and k.startswith("eval/") for k in r)][-1]
    assert final["step"] == results["checkpoint_step"], (final["step"], results["checkpoint_step"])
    for name, values in results["validation_sets"].items():
        assert abs(final[f"eval/{name}/loss"] - values["loss"]) < 1e-3 * values["loss"], (name, final, values)
    # Downstream tasks (lm-eval-harness on the demo suite): the model beats guessing on at least one,
    # by three standard errors, on at least 200 examples.
    assert "chance" in first.stdout and "stories" in first.stdout
    (tasks,) = prefix.glob("tasks/tiny-qwen3-moe-*")
    scores = json.loads((tasks / "results.json").read_text())["tasks"]
    assert set(scores) == {"sums", "stories"}
    assert all(entry["examples"] >= 200 and entry["chance"] == 0.25 for entry in scores.values())
    beaten = [
        name
        for name, entry in scores.items()
        if entry["metrics"]["acc"] >= entry["chance"] + 3 * entry["metrics"]["acc_stderr"]
    ]
    assert beaten, scores
    cached = run(prefix)
    # A table of the eight cached steps and their reports.
    assert cached.returncode == 0 and len((cached.stderr + cached.stdout).splitlines()) <= 30, cached.stderr
    second = run(prefix, "--json")
    assert second.returncode == 0, second.stderr[-4000:]
    assert {s["state"] for s in json.loads(second.stdout)["steps"]} == {"CACHED"}
    # The manifest alone rebuilds the same eight steps: a rerun at the same prefix is fully cached.
    (manifest,) = (prefix / "experiments").glob("tiny_moe-*.json")
    third = subprocess.run(
        [sys.executable, "-m", "pipeline", "rerun", str(manifest), "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert third.returncode == 0, third.stderr[-4000:]
    reran = json.loads(third.stdout)["steps"]
    assert len(reran) == 8 and {s["state"] for s in reran} == {"CACHED"}
