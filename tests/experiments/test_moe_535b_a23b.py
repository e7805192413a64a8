"""The hero recipe plans on a laptop, without its data, with the figures it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    # 24 steps of the run itself, and its scaling ladder: 15 trainings, 15 evaluations, one fit.
    assert len(steps) == 55 and {s["state"] for s in steps.values()} == {"RUN"}
    # The web component from crawl: extraction, language, the published rules, a quality
    # classifier trained as a step, its filter; then dedupe reads the filter's documents.
    labels = {name: s["label"] for name, s in steps.items()}
    assert steps["extract/web"]["deps"] == []  # it reads the raw crawl
    for step, upstream in (
        ("language/web", ["extract/web"]),
        ("heuristics/web", ["language/web"]),
        ("quality/classifier", []),
        ("quality/web", ["heuristics/web", "quality/classifier"]),
        ("dedupe/web", ["quality/web"]),
    ):
        assert sorted(steps[step]["deps"]) == sorted(labels[u] for u in upstream), step
    # Raw data is curated before it is tokenized: dedupe, then decontaminate, per component.
    assert {n for n in steps if n.startswith(("dedupe/", "decontaminate/"))} == {
        f"{kind}/{c}"
        for kind in ("dedupe", "decontaminate")
        for c in ("web", "code", "math", "books", "instruction")
    }
    # Dedupe's global pass is sharded, and the plan says what each band part holds for the web.
    assert "64 part(s) each: 640 tasks" in steps["dedupe/web"]["preview"]
    assert "10,000,000,000 documents: a band part 2.3 GiB" in steps["dedupe/web"]["preview"]
    train = steps["train/moe-535b-a23b"]
    # The published run: 535.3B total / 22.76B active, within 0.2% (counted from the model's own
    # shapes); 390,251 steps of 11,264 x 4,096.
    assert abs(train["total_params"] / 535.3e9 - 1) < 0.002
    assert abs(train["active_params"] / 22.76e9 - 1) < 0.002
    assert train["family"] == "drydock_moe"
    assert train["num_train_steps"] == 390_251
    assert train["train_tokens"] == 390_251 * 11_264 * 4_096 >= 18 * 10**12
    # The published hardware as one gang, its layout, and what the plan says it needs (offline).
    import experiments.moe_535b_a23b as recipe_file

    assert recipe_file.train.resources.hosts == 176 and recipe_file.train.resources.gpus == 4
    assert recipe_file.train.resources.accelerator == "GB200"
    # The recipes table says what the file declares (it once said two v5p-2048 slices).
    (hero_row,) = [
        line
        for line in (ROOT / "docs" / "recipes.md").read_text().splitlines()
        if "`moe_535b_a23b.py`" in line and line.startswith("|")
    ]
    assert "176 hosts (704 GB200 GPUs" in hero_row and "two v5p-2048" not in hero_row
    assert train["mesh"] == "data 88 x expert 8 (704 GB200)"
    assert train["memory per device"].startswith("117.2 GiB of 173.2 GiB (68%)")
    assert train["time"] == "40 days at 40% MFU"
    assert train["predicted eval loss"] == "from scaling/535b-ladder, once it has run"
    ladder = [s for n, s in steps.items() if n.startswith("train/535b-ladder/")]
    assert len(ladder) == 15 and all("(704 GB200)" in s["mesh"] for s in ladder)
    preview = steps["mixture/535b-a23b"]["preview"]
    assert "3 phase(s)" in preview and "from step 108,000:" in preview and "from step 312,192:" in preview
    # The standard base-model tasks, declared by registry name and shots, their data elsewhere.
    tasks = steps["tasks/moe-535b-a23b"]
    assert "hellaswag:10" in tasks["tasks"] and "mmlu:5" in tasks["tasks"]
    assert tasks["task data"] == "gs://your-bucket/eval-tasks"
    assert not tmp_path.joinpath("tokenized").exists()  # planning writes nothing


PLAN_IMPORTS = """
import json, runpy, sys
out, prefix = sys.argv[1:3]
sys.argv = ["drydock", "plan", "experiments/moe_535b_a23b.py", "--prefix", prefix, "--json"]
try:
    runpy.run_module("pipeline", run_name="__main__")
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"jax", "jaxlib", "levanter", "haliax", "equinox"})
with open(out, "w") as f:
    json.dump(heavy, f)
"""


def test_planning_it_imports_no_ml_library(tmp_path):
    # A plan counts every training's parameters (drydock_moe's by arithmetic): importing JAX and
    # Levanter for it made a hero plan 9.6 s instead of 1.0 s.
    out = tmp_path / "imported.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", PLAN_IMPORTS, str(out), str(tmp_path / "prefix")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert '"train/moe-535b-a23b"' in result.stdout  # the plan was made
    assert json.loads(out.read_text()) == []


def test_its_recipe_rebuilds_from_a_manifest_with_the_same_identities():
    import experiments.moe_535b_a23b as recipe_file
    from pipeline.core.dag import build_dag
    from pipeline.run.records.recipe import recipe_entries, steps_from_manifest

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


def test_the_schedule_and_model_follow_the_published_run():
    import experiments.moe_535b_a23b as recipe_file

    config = recipe_file.train.config
    optimizer = config.optimizer.value if hasattr(config.optimizer, "value") else config.optimizer
    assert (optimizer.lr_schedule, optimizer.min_lr_ratio, optimizer.warmup) == ("linear", 0.05, 0.01)
    stability = config.stability.value if hasattr(config.stability, "value") else config.stability
    assert stability.z_loss == 1e-4
    model = config.model.value if hasattr(config.model, "value") else config.model
    assert (model.hidden_dim, model.num_layers, model.num_heads, model.head_dim) == (6144, 48, 48, 128)
    # 12 KV heads on local layers (a window of 2,048), 6 on the global ones, every 4th.
    assert (model.num_kv_heads, model.num_global_kv_heads, model.global_every, model.sliding_window) == (
        12,
        6,
        4,
        2048,
    )
    assert (model.num_experts, model.num_experts_per_token, model.num_shared_experts) == (384, 8, 2)
    assert (model.family, model.balancing, model.qk_norm) == ("drydock_moe", "bias", True)
    assert recipe_file.VOCAB_SIZE == 128_256 and recipe_file.SEQ_LEN == 4_096
    # The widths solved from the published totals (the recipe's docstring), and the counts read
    # from the model's own shapes to the parameter: a width off by one moves them by millions.
    assert (model.expert_intermediate_dim, model.shared_expert_intermediate_dim) == (1540, 3264)
    from steps.models import parameter_counts

    assert parameter_counts(model, recipe_file.VOCAB_SIZE) == (535_079_522_304, 22_781_988_864)


def test_the_plan_shows_the_predicted_final_loss_once_the_ladder_is_fitted(tmp_path):
    """The ladder's evaluations as evaluate writes them (losses of a Chinchilla law, Hoffmann et
    al.'s parameters), the real fit step run on them, then `drydock plan`: offline, the training
    shows the fit's prediction for it."""
    import experiments.moe_535b_a23b as recipe_file
    from pipeline.core.dag import build_dag, resolved_config
    from steps.scaling.fit import active_non_embedding_params, scaling_fit
    from steps.scaling.law import LawFit

    law = LawFit.of("chinchilla", E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)
    dag = build_dag([recipe_file.evaluation, recipe_file.tasks], str(tmp_path))
    (label,) = [label for label, node in dag.nodes.items() if node.name == "scaling/535b-ladder"]
    config = resolved_config(dag, label)
    for point in config.points:
        os.makedirs(point.evaluation)
        loss = float(law.predict(active_non_embedding_params(point.model), point.tokens))
        Path(point.evaluation, "results.json").write_text(json.dumps({"average": {"loss": loss}}))
    fit = scaling_fit(config)["target"]
    true = float(law.predict(fit["active_non_embedding_params"], fit["tokens"]))
    assert fit["predicted_loss"] == pytest.approx(true, rel=0.005)  # 780x the ladder's compute
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "plan", "experiments/moe_535b_a23b.py", "--prefix", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (
        f"predicted eval loss: {fit['predicted_loss']:.4f}, 90% interval [{fit['interval']['low']:.4f}, "
        f"{fit['interval']['high']:.4f}] at the end ({fit['method']} fit of scaling/535b-ladder)"
    ) in result.stdout


SCALED_DOWN = """
from experiments.moe_535b_a23b import scaled_down
from experiments.scaling_sweep import sweep_mixture
from pipeline import executor_main

if __name__ == "__main__":
    executor_main(scaled_down(sweep_mixture(batch_size=4, seq_len=64, mixture_steps=48)))
"""


@pytest.mark.slow
def test_the_ladder_scaled_down_trains_fits_and_watches_its_training(tmp_path):
    """The hero's own ladder code at toy scale on the demo corpus (`scaled_down`): three widths x two
    budgets of the hero's architecture trained and evaluated, the fit, and a tiny "hero" trained
    against the fit's predicted curve. Every evaluation of that training is placed on the curve, and
    `patience` of them in a row outside its interval are one warning, as the hero's would be. (At
    12-48 steps a ladder measures start-up more than size, so how close the toy prediction lands is
    not the point here: tests/experiments/test_scaling_sweep.py bounds a sweep's error.)"""
    from pipeline.observe.metrics import parse_events
    from steps.training.metrics_file import read_metrics

    experiment = tmp_path / "tiny_hero.py"
    experiment.write_text(SCALED_DOWN)
    prefix = tmp_path / "runs"
    # Seven tiny trainings spend most of their time compiling: XLA's cheapest compile is plenty here.
    flags = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "XLA_FLAGS": flags}
    # On the default backend (a private Ray instance), as a user runs it: each rung is a process of
    # its own, two at a time on two cores, so one rung's tracing and compiling (most of its 25 to 45
    # s) overlaps another's. In threads of one process (`--backend local`) they ran one at a time:
    # the rungs and their evaluations took 225 s there, 168 s here (2026-12-08, cold compilation
    # cache). The scaling sweep's rungs are lighter: there Ray's process per rung cost what the
    # overlap saved (253 s vs 249 s), and tests/experiments/test_scaling_sweep.py stays local.
    command = [sys.executable, "-m", "pipeline", "run", str(experiment), "--prefix", str(prefix)]
    result = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    (rung,) = prefix.glob("train/tiny-ladder/d16-s12-*")
    model = json.loads((rung / ".step.json").read_text())["config"]["model"]
    model = model.get("value", model)
    assert (model["family"], model["num_shared_experts"], model["global_every"]) == ("drydock_moe", 2, 4)
    # A field added after identities were made is written only when it differs from its default
    # (pipeline.added_field): the hero's `bias` balancing is that default.
    assert (model.get("balancing", "bias"), model["sliding_window"], model["num_layers"]) == ("bias", 16, 4)
    (fit_dir,) = prefix.glob("scaling/tiny-ladder-*")
    fit = json.loads((fit_dir / "fit.json").read_text())
    assert sorted(p["label"] for p in fit["points"]) == [f"d{h}-s{s}" for h in (16, 24, 32) for s in (12, 24)]
    target = fit["target"]
    assert target["label"] == "tiny-hero" and target["tokens"] == 48 * 4 * 64

    (train,) = prefix.glob("train/tiny-hero-*")
    curve = json.loads((train / "prediction.json").read_text())
    assert curve["source"] == f"{target['method']} fit of scaling/tiny-ladder"
    final = curve["final"]
    assert final["step"] == 48 and final["loss"] == pytest.approx(target["predicted_loss"])
    assert (final["low"], final["high"]) == pytest.approx(
        (target["interval"]["low"], target["interval"]["high"])
    )
    on_curve = {step: (loss, low, high) for step, loss, low, high in curve["points"]}
    records = read_metrics(str(train / "metrics.jsonl"))
    evaluations = [r for r in records if "eval/loss" in r]
    # every `eval_interval` steps, and once more after the last step (Levanter counts it as 47)
    assert [r["step"] for r in evaluations] == [12, 24, 36, 47]
    warned, outside = [], 0
    for record in evaluations:
        _loss, low, high = on_curve[record["step"]]  # each evaluation's step is on the curve
        outside = outside + 1 if not low <= record["eval/loss"] <= high else 0
        if outside == curve["patience"]:
            warned.append(record["step"])
    events = parse_events((train / "metrics.jsonl").read_text().splitlines())
    assert [e["step"] for e in events if e["event"] == "off_prediction"] == warned
    # The toy "hero" trains far faster than a ladder of 12-48 steps predicts (its losses are below
    # the interval from the first evaluation: 6.60 vs a low of 6.85 at step 12, measured): the
    # third evaluation in a row outside it is the one warning.
    assert curve["patience"] == 3 and warned == [36], [(r["step"], r["eval/loss"]) for r in evaluations]
    status = (train / ".status").read_text()
    assert '"event": "WARNING"' in status and "below the predicted" in status, status[-2000:]
