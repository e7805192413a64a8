"""The scaling sweep: its plan shows the grid; a reduced grid runs end to end (`--backend local`)
to fit.json, and a rerun finds everything cached."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.scaling_sweep import build
from pipeline import StepDeclarationError

ROOT = Path(__file__).resolve().parents[2]

# 3 sizes x 2 budgets: six points for five parameters, and a larger target, each only a few steps.
REDUCED = """
from experiments.scaling_sweep import build
from pipeline import executor_main

if __name__ == "__main__":
    executor_main(build(sizes=(16, 24, 32), budgets=(12, 24), target=(48, 30), batch_size=4, seq_len=64))
"""


def run(experiment: Path, prefix: Path, *extra: str) -> subprocess.CompletedProcess:
    # Seven tiny trainings spend most of their time compiling: XLA's cheapest compile is plenty here.
    flags = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "XLA_FLAGS": flags}
    command = [sys.executable, "-m", "pipeline", "run", str(experiment), "--prefix", str(prefix)]
    return subprocess.run(
        [*command, "--backend", "local", "--max_concurrent", "1", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_plan_shows_the_grid_and_runs_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    command = [sys.executable, "-m", "pipeline", "plan", "experiments/scaling_sweep.py", "--backend", "local"]
    result = subprocess.run(
        [*command, "--prefix", str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    grid = [line.split() for line in lines if line.strip().startswith(("d32-", "d48-", "d64-", "d96-"))]
    assert [row[0] for row in grid] == [
        *(f"d{h}-s{s}" for h in (32, 48, 64) for s in (150, 300, 600)),
        "d96-s1000",
    ]
    assert grid[-1][-2:] == ["<-", "target"]
    assert grid[0][1:3] == ["31,168", "153,600"]  # N (active non-embedding parameters), D (tokens)
    assert not (tmp_path / "runs" / "train").exists()


def test_a_run_longer_than_the_mixture_is_refused_naming_the_step():
    with pytest.raises(StepDeclarationError) as e:
        build(budgets=(150, 300, 1200))
    assert e.value.step == "train/scaling/d32-s1200" and e.value.field == "num_steps"


@pytest.mark.slow
def test_reduced_sweep_fits_predicts_and_reruns_cached(tmp_path):
    experiment = tmp_path / "sweep.py"
    experiment.write_text(REDUCED)
    prefix = tmp_path / "runs"
    first = run(experiment, prefix)
    assert first.returncode == 0, first.stderr[-4000:]

    (fit_dir,) = prefix.glob("scaling/fit-*")
    fit = json.loads((fit_dir / "fit.json").read_text())
    assert (fit_dir / "fit.png").stat().st_size > 0
    assert set(fit) >= {"law", "parameters", "fit", "points", "target"}
    assert set(fit["parameters"]) == {"E", "A", "alpha", "B", "beta"}
    assert all(finite(v) for v in fit["parameters"].values())
    assert all(finite(fit["fit"][k]) for k in ("r2", "rmse", "rmse_log", "objective"))
    assert len(fit["points"]) == 6
    for point in fit["points"]:
        assert all(finite(point[k]) for k in ("loss", "predicted", "residual", "active_non_embedding_params"))
        assert point["loss"] > 0
    # Each point's loss is the one its own evaluation measured.
    by_label = {p["label"]: p for p in fit["points"]}
    (evaluation,) = prefix.glob("evaluate/scaling/d24-s12-*")
    assert (
        json.loads((evaluation / "results.json").read_text())["average"]["loss"]
        == by_label["d24-s12"]["loss"]
    )
    target = fit["target"]
    assert target["label"] == "d48-s30" and target["tokens"] == 30 * 4 * 64
    assert finite(target["predicted_loss"]) and finite(target["measured_loss"])
    assert target["interval"]["low"] <= target["predicted_loss"] <= target["interval"]["high"]
    error = target["error"]
    assert error["absolute"] == pytest.approx(target["measured_loss"] - target["predicted_loss"])
    assert isinstance(error["inside_interval"], bool)

    second = run(experiment, prefix, "--json")
    assert second.returncode == 0, second.stderr[-4000:]
    steps = json.loads(second.stdout)["steps"]
    assert len(steps) == 2 + 1 + 7 + 7 + 1  # tokenize x2, mixture, train x7, evaluate x7, fit
    assert {s["state"] for s in steps} == {"CACHED"}
