"""Sweeps declared as one: grids, seeded random searches, runs named by their values, the template's
fields replaced inside `versioned`, one clear error for each mistake; `explain` finds the other runs."""

from __future__ import annotations

import json
import math
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline import Step, choice, grid, log_uniform, random_search, sweep, this_output, uniform, versioned
from pipeline.core.dag import build_dag
from pipeline.errors import StepDeclarationError
from pipeline.step import Versioned
from tests.pipeline.cli.test_cli import DRYDOCK, ROOT, env


@dataclass(frozen=True)
class Optimizer:
    learning_rate: float = 1e-3
    warmup: float = 0.05


@dataclass(frozen=True)
class TrainConfig:
    output: str
    optimizer: Optimizer
    seed: int
    log_every: int = 10


def train(config: TrainConfig) -> None:
    raise AssertionError("never run")


TEMPLATE = Step("train/code", train, TrainConfig(this_output(), versioned(Optimizer()), versioned(0)))


def test_a_grid_is_every_combination_named_by_its_values():
    points = grid(lr=[1e-3, 3e-3, 1e-2], warmup=[0.05, 0.1])
    assert [p.name("train") for p in points] == [
        "train/lr=0.001,warmup=0.05",
        "train/lr=0.001,warmup=0.1",
        "train/lr=0.003,warmup=0.05",
        "train/lr=0.003,warmup=0.1",
        "train/lr=0.01,warmup=0.05",
        "train/lr=0.01,warmup=0.1",
    ]
    assert points[3]["lr"] == 3e-3 and points[3].as_dict() == {"lr": 3e-3, "warmup": 0.1}


def test_a_random_search_is_the_same_on_every_call_and_inside_its_space():
    space = {"lr": log_uniform(1e-4, 1e-2), "warmup": uniform(0.0, 0.2), "batch": choice(8, 16), "seed": 7}
    points = random_search(space, 12, seed=3)
    assert points == random_search(space, 12, seed=3)
    assert points != random_search(space, 12, seed=4)
    assert len({p.label for p in points}) == 12
    for p in points:
        assert 1e-4 <= p["lr"] <= 1e-2 and 0.0 <= p["warmup"] <= 0.2 and p["batch"] in (8, 16)
        assert p["seed"] == 7
        # Rounded to 3 significant digits: the name shows the very value the run uses.
        assert float(f"{p['lr']:.3g}") == p["lr"] and f"lr={p['lr']!r}" in p.label
    # log_uniform spreads over decades: some points below 1e-3, some above.
    assert any(p["lr"] < 1e-3 for p in points) and any(p["lr"] > 1e-3 for p in points)


def test_a_sweep_puts_each_value_inside_the_versioned_field_and_names_the_run():
    steps = sweep(TEMPLATE, grid({"optimizer.learning_rate": [1e-3, 3e-3]}, seed=[0, 1]))
    assert [s.name for s in steps] == [
        "train/code/learning_rate=0.001,seed=0",
        "train/code/learning_rate=0.001,seed=1",
        "train/code/learning_rate=0.003,seed=0",
        "train/code/learning_rate=0.003,seed=1",
    ]
    last = steps[-1].config
    assert isinstance(last.optimizer, Versioned) and last.optimizer.value == Optimizer(learning_rate=3e-3)
    assert last.seed == Versioned(1)
    assert TEMPLATE.config.optimizer.value == Optimizer()  # the template is left as it was
    dag = build_dag(steps, "/tmp/prefix")
    hashes = {node.identity.hash for node in dag.nodes.values()}
    assert len(hashes) == 4
    payloads = [dag.nodes[label].identity.payload for label in dag.nodes]
    assert sorted(p["versioned"]["optimizer"]["learning_rate"] for p in payloads) == [1e-3, 1e-3, 3e-3, 3e-3]


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (lambda: sweep(TEMPLATE, grid(**{"optimizer.lr": [1.0]})), "optimizer.lr", "has no field 'lr'"),
        (lambda: sweep(TEMPLATE, grid(log_every=[1, 2])), "log_every", "is not versioned"),
        (lambda: sweep(TEMPLATE, grid(**{"seed.x": [1]})), "seed.x", "int has no field 'x'"),
        (lambda: grid(lr=[]), "lr", "non-empty list"),
        (lambda: grid(lr=0.1), "lr", "non-empty list"),
        (lambda: grid(lr=[0.1, 0.1]), "lr", "lists a value twice"),
        (lambda: grid(lr=[math.nan]), "lr", "finite"),
        (lambda: grid(path=["a/b"]), "path", "plain string"),
        (lambda: grid(**{"a.lr": [1.0], "b.lr": [2.0]}), "keys", "would clash"),
        (lambda: random_search({"lr": uniform(0, 1)}, 0), "trials", "positive"),
        (lambda: random_search({"lr": choice(1, 2)}, 5), "trials", "fewer than 5 distinct"),
        (lambda: log_uniform(0.0, 1.0), "log_uniform", "0 < low < high"),
    ],
)
def test_mistakes_are_one_error_naming_the_field(call, field, words):
    with pytest.raises(StepDeclarationError) as err:
        call()
    assert err.value.field == field and words in str(err.value), str(err.value)


SWEEP_FILE = """
from pipeline import Step, executor_main, grid, sweep, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

template = Step("train/code", write_value, WriteConfig(this_output(), versioned(1), name="train"))

if __name__ == "__main__":
    executor_main(sweep(template, grid(value=[1, 2, 3])))
"""


def drydock(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*DRYDOCK, *args, "--backend", "local"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=120,
    )


def test_explain_finds_the_other_runs_of_the_sweep(tmp_path: Path):
    path, prefix = tmp_path / "sweep.py", tmp_path / "prefix"
    path.write_text(textwrap.dedent(SWEEP_FILE))
    ran = drydock("run", str(path), "--prefix", str(prefix), "--only", "value=1$|value=2$")
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name.rsplit("-", 1)[0] for p in (prefix / "train" / "code").iterdir()) == [
        "value=1",
        "value=2",
    ]
    explained = drydock("explain", str(path), "train/code/value=3", "--prefix", str(prefix))
    assert explained.returncode == 0, explained.stderr
    assert "No other run" not in explained.stdout
    others = [line for line in explained.stdout.splitlines() if line.startswith("vs ")]
    assert len(others) == 2 and all("train/code/value=" in line for line in others), explained.stdout
    assert "\n    value 1→3\n" in explained.stdout and "\n    value 2→3\n" in explained.stdout
    # The plan says what the new point changes, against the closest other run of the template.
    planned = drydock("plan", str(path), "--prefix", str(prefix), "--json")
    assert planned.returncode == 0, planned.stderr
    steps = {s["name"]: s for s in json.loads(planned.stdout)["steps"]}
    assert steps["train/code/value=3"]["state"] == "RUN"
    assert [steps[f"train/code/value={v}"]["state"] for v in (1, 2)] == ["CACHED", "CACHED"]
