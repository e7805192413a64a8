"""The data stages as steps of one DAG, on the committed demo corpus and tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, run_experiment
from pipeline.core.plan import Plan, State
from pipeline.run.records.hooks import step_previews
from pipeline.run.scheduler.executor import RunReport
from steps.data.mixture import load_data_config, mixture_step
from steps.data.tokenize import tokenize_step
from steps.models import TINY_MOE

ROOT = Path(__file__).resolve().parents[3]


def dag():
    prose = tokenize_step(
        "tokenized/prose",
        train=["data/corpus/prose/train-*.jsonl"],
        validation=["data/corpus/prose/validation-*.jsonl"],
        tokenizer="data/tokenizer",
        input_root=str(ROOT),
    )
    arithmetic = tokenize_step(
        "tokenized/arithmetic",
        train=["data/corpus/arithmetic/train-*.jsonl"],
        tokenizer="data/tokenizer",
        input_root=str(ROOT),
    )
    mix = mixture_step(
        "mixture/demo",
        components={"prose": prose, "arithmetic": arithmetic},
        weights=[(0, {"prose": 0.5, "arithmetic": 0.5}), (64, {"prose": 0.8, "arithmetic": 0.2})],
        target_tokens=128 * 8 * 128,
        batch_size=8,
        seq_len=128,
        validation=["prose"],
        max_epochs=4,
    )
    return [mix]


def test_tokenize_then_mix_with_a_preview_in_the_plan(tmp_path):
    prefix = str(tmp_path / "prefix")
    report = run_experiment(dag(), ExecutorMainConfig(prefix=prefix, backend="local", only="^tokenized/"))
    assert isinstance(report, RunReport) and report.ok
    plan = run_experiment(dag(), ExecutorMainConfig(prefix=prefix, dry_run=True))
    assert isinstance(plan, Plan)
    (mix_label,) = plan.in_state(State.RUN)
    preview = step_previews(plan)[mix_label]
    assert "128 steps; 2 phase(s)" in preview and "prose" in preview and "arithmetic" in preview
    report = run_experiment(dag(), ExecutorMainConfig(prefix=prefix, backend="local"))
    assert report.ok
    out = Path(plan.dag.nodes[mix_label].output_path)
    table = json.loads((out / "mixture.json").read_text())
    assert table["components"]["prose"]["tokens"] == round(64 * 1024 * 0.5 + 64 * 1024 * 0.8)
    data = load_data_config(str(out))
    assert Path(data.tokenizer).is_absolute() and Path(data.tokenizer, "tokenizer.json").exists()
    # Identities do not depend on where the checkout lives: input paths are versioned relative,
    # the tokenizer by the hash of its files.
    step_json = json.loads(
        (Path(plan.dag.nodes[plan.in_state(State.CACHED)[0]].output_path) / ".step.json").read_text()
    )
    identity = step_json["identity"]["versioned"]["input_identity"]
    assert identity["train"] == ["data/corpus/prose/train-*.jsonl"]
    assert identity["tokenizer"].startswith("sha256:")
    # What the step read is recorded for later plans to compare with.
    assert set(step_json["inputs"]) == {f"train:data/corpus/prose/train-000{i}.jsonl" for i in range(4)} | {
        "validation:data/corpus/prose/validation-0000.jsonl"
    }


def test_the_plan_shows_training_parameters_and_tokens_before_any_data_exists(tmp_path):
    from steps.models import MoeModelConfig, parameter_counts
    from steps.training.train_moe import train_moe_step

    model = MoeModelConfig(hidden_dim=64, expert_intermediate_dim=128, num_experts=8, num_experts_per_token=2)
    train = train_moe_step(
        "train/x", data=dag()[0], model=model, batch_size=8, seq_len=128, num_steps=128, vocab_size=1691
    )
    plan = run_experiment([train], ExecutorMainConfig(prefix=str(tmp_path / "p"), dry_run=True))
    previews = step_previews(plan)
    (label,) = [label for label in plan.steps if label.startswith("train/x-")]
    total, active = parameter_counts(model, 1691)
    assert previews[label]["total_params"] == total and previews[label]["active_params"] == active
    assert previews[label]["train_tokens"] == 128 * 8 * 128 and previews[label]["num_train_steps"] == 128
    # The mixture's inputs do not exist yet: its preview is the schedule alone.
    (mix,) = [text for label, text in previews.items() if label.startswith("mixture/")]
    assert "tokens and epochs per component once the components are tokenized" in mix
    assert "from step 64: arithmetic 0.200, prose 0.800" in mix


@pytest.mark.parametrize(("rate", "warned"), [(3e3, True), (3e-3, False), (1e-9, True)])
def test_the_plan_warns_of_a_learning_rate_far_outside_any_usual_range(tmp_path, rate, warned):
    """`learning_rate=3e3` for `3e-3`: said by the plan (and as a run starts), not refused."""
    from pipeline.run.records.hooks import step_warnings
    from steps.training.train_moe import OptimizerSpec, train_moe_step

    train = train_moe_step(
        "train/x",
        data=dag()[0],
        model=TINY_MOE,
        optimizer=OptimizerSpec(learning_rate=rate),
        batch_size=8,
        seq_len=128,
        num_steps=16,
        vocab_size=1691,
    )
    plan = run_experiment([train], ExecutorMainConfig(prefix=str(tmp_path / "p"), dry_run=True))
    said = step_warnings(plan)
    expect = f"step 'train/x': optimizer.learning_rate = {rate:g} is far outside the usual range"
    assert said == ([f"{expect} (1e-06 to 1): a typo?"] if warned else [])


def test_the_plan_says_where_an_interrupted_training_resumes(tmp_path):
    """A training stopped after its checkpoint at step 64 of 128: the plan says it resumes there;
    a finished one (checkpoint at its final step) says nothing of the kind."""
    from steps.training.train_moe import train_moe_step

    train = train_moe_step(
        "train/x", data=dag()[0], model=TINY_MOE, batch_size=8, seq_len=128, num_steps=128, vocab_size=1691
    )
    plan = run_experiment([train], ExecutorMainConfig(prefix=str(tmp_path / "p"), dry_run=True))
    (label,) = [label for label in plan.steps if label.startswith("train/x-")]
    assert "resumes from" not in step_previews(plan)[label]
    for step in (32, 64):
        checkpoint = tmp_path / "p" / label / "checkpoints" / f"step-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "metadata.json").write_text(json.dumps({"step": step}))
    assert step_previews(plan)[label]["resumes from"] == "step 64 (its newest checkpoint)"
    final = tmp_path / "p" / label / "checkpoints" / "step-127"
    final.mkdir()
    (final / "metadata.json").write_text(json.dumps({"step": 127}))
    assert "resumes from" not in step_previews(plan)[label]
