"""The hero recipe plans on a laptop, without its data, with the figures it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_lists_every_step_with_parameters_tokens_and_steps(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "plan",
            "experiments/moe_535b_a23b.py",
            "--prefix",
            str(tmp_path),
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    steps = {s["name"]: s for s in json.loads(result.stdout)["steps"]}
    assert len(steps) == 19 and {s["state"] for s in steps.values()} == {"RUN"}
    # Raw data is curated before it is tokenized: dedupe, then decontaminate, per component.
    assert {n for n in steps if n.startswith(("dedupe/", "decontaminate/"))} == {
        f"{kind}/{c}"
        for kind in ("dedupe", "decontaminate")
        for c in ("web", "code", "math", "books", "instruction")
    }
    train = steps["train/moe-535b-a23b"]
    assert abs(train["total_params"] / 535e9 - 1) < 0.03
    assert abs(train["active_params"] / 23e9 - 1) < 0.03
    assert train["num_train_steps"] == 390_140
    assert train["train_tokens"] == 390_140 * 11_264 * 4_096 >= 18 * 10**12
    assert "3 phase(s)" in steps["mixture/535b-a23b"]["preview"]
    # The standard base-model tasks, declared by registry name and shots, their data elsewhere.
    tasks = steps["tasks/moe-535b-a23b"]
    assert "hellaswag:10" in tasks["tasks"] and "mmlu:5" in tasks["tasks"]
    assert tasks["task data"] == "gs://your-bucket/eval-tasks"
    assert not tmp_path.joinpath("tokenized").exists()  # planning writes nothing


def test_its_recipe_rebuilds_from_a_manifest_with_the_same_identities():
    import experiments.moe_535b_a23b as recipe_file
    from pipeline.core.dag import build_dag
    from pipeline.run.recipe import recipe_entries, steps_from_manifest

    dag = build_dag([recipe_file.evaluation, recipe_file.tasks], "gs://bucket/runs")
    recipes = recipe_entries(dag, recipe_file.__file__)
    assert all(isinstance(r, dict) for r in recipes.values()), recipes
    manifest = json.loads(
        json.dumps(
            {
                "steps": [
                    {"label": label, "name": n.name, "recipe": recipes[label]}
                    for label, n in dag.nodes.items()
                ],
                "roots": list(dag.roots),
            }
        )
    )
    _steps, roots = steps_from_manifest(manifest)
    assert list(build_dag(roots, "/elsewhere").nodes) == list(dag.nodes)
