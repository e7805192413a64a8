"""`drydock compare`: runs named by manifest, experiment file or step directory, through the real CLI."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

EXPERIMENT = """
import os
from pipeline import Step, executor_main, output_of, this_output, versioned
from tests.pipeline.observe.dashboard.fixture_steps import (
    CorpusConfig, EvalConfig, ScoreConfig, TrainConfig, evaluate_tiny, score_tiny, train_tiny, write_corpus)

corpus = Step("data/corpus", write_corpus, CorpusConfig(this_output(), versioned(3)))
train = Step("train/tiny", train_tiny, TrainConfig(output_of(corpus), this_output(), versioned(10),
             versioned(float(os.environ["LR"])), None))
evaluate = Step("eval/tiny", evaluate_tiny, EvalConfig(output_of(train), this_output()))
tasks = Step("tasks/tiny", score_tiny, ScoreConfig(output_of(train), this_output()))
if __name__ == "__main__":
    executor_main([evaluate, tasks])
"""


def drydock(*args: str, lr: str = "0.001") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "LR": lr}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path, list[Path]]:
    tmp = tmp_path_factory.mktemp("compare_cli")
    exp = tmp / "exp.py"
    exp.write_text(EXPERIMENT)
    prefix = tmp / "prefix"
    for lr in ("0.001", "0.01"):
        done = drydock("run", str(exp), "--prefix", str(prefix), "--backend", "local", lr=lr)
        assert done.returncode == 0, done.stderr[-2000:]
    return exp, prefix, sorted((prefix / "experiments").glob("exp-*.json"))


def test_manifests_side_by_side_only_the_field_that_differs(runs):
    _, _, manifests = runs
    done = drydock("compare", *map(str, manifests), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["params"] == ["learning_rate"]
    assert {"train/loss", "eval/web/loss", "eval/code/loss", "task/arith/acc"} <= set(document["metrics"])
    assert sorted(r["params"]["learning_rate"] for r in document["rows"]) == [0.001, 0.01]
    table = drydock("compare", *map(str, manifests))
    assert table.returncode == 0 and "learning_rate" in table.stdout and "task/arith/acc" in table.stdout


def test_an_experiment_file_and_a_step_directory_and_sorting(runs):
    exp, prefix, _ = runs
    done = drydock("compare", str(exp), "--prefix", str(prefix), "--csv", lr="0.01")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert len(rows) == 1 and rows[0]["step"] == "train/tiny" and float(rows[0]["task/arith/acc"]) == 0.75
    trainings = sorted(str(p) for p in prefix.glob("train/tiny-*"))
    done = drydock("compare", *trainings, "--sort", "train/loss", "--desc", "--json")
    assert done.returncode == 0, done.stderr
    ordered = json.loads(done.stdout)["rows"]
    # A step directory brings its evaluations along (from the manifest its .step.json names).
    assert [r["params"]["learning_rate"] for r in ordered] == [0.01, 0.001]
    assert all("eval/web/loss" in r["metrics"] for r in ordered)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        ((), "give at least one run"),
        (("{tmp}",), "is not a run"),
        (("{tmp}/missing.py",), "does not exist"),
        (("{manifest}", "--json", "--csv"), "--csv"),
        (("{manifest}", "--sort", "nope"), "no metric 'nope'"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(runs, tmp_path, args, expect):
    _, _, manifests = runs
    filled = [a.format(tmp=tmp_path, manifest=manifests[0]) for a in args]
    done = drydock("compare", *filled)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and expect in lines[0], done.stderr


def test_runs_that_share_a_training_list_it_once(runs):
    """A rerun (or a second manifest of the same sweep) shares its trainings with the first: each
    training is one row, under every run that has it."""
    exp, prefix, manifests = runs
    # The same recipe without its task scores: another DAG (another manifest), the same training.
    smaller = exp.with_name("exp_no_tasks.py")
    smaller.write_text(EXPERIMENT.replace("executor_main([evaluate, tasks])", "executor_main([evaluate])"))
    again = drydock("run", str(smaller), "--prefix", str(prefix), "--backend", "local", lr="0.001")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "SUCCEEDED" not in again.stderr  # everything it needs is cached
    (third,) = (prefix / "experiments").glob("exp_no_tasks-*.json")
    done = drydock("compare", *map(str, [*manifests, third]), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert sorted(r["params"]["learning_rate"] for r in rows) == [0.001, 0.01]
    (shared,) = [r for r in rows if r["params"]["learning_rate"] == 0.001]
    assert len(shared["run"].split(", ")) == 2, shared["run"]
