"""Branching a training from another's checkpoint (`train_moe_step(init_from=, init_step=, init=)`)
and warmup-stable-decay schedules: what is refused at declaration, what identity holds, and real
tiny trainings that branch from a trunk still running."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from pipeline import Step, StepDeclarationError, this_output
from pipeline.core.dag import build_dag
from steps.evaluation.follow import wait_for_checkpoint
from steps.models import TINY_MOE
from steps.training.metrics_file import read_events, read_metrics
from steps.training.rewinds import shift_schedule
from steps.training.train_moe import OptimizerSpec, train_moe_step
from tests.pipeline.stepfns import WriteConfig, write_value
from tests.steps.evaluation.test_follow import SETTINGS, Training
from tests.steps.tiny import ROOT, env
from tests.steps.tiny import command as tiny_command

DATA = Step("mixture/x", write_value, WriteConfig(this_output()))


def trunk(**options) -> Step:
    return train_moe_step(
        "train/trunk",
        data=DATA,
        model=TINY_MOE,
        batch_size=8,
        seq_len=64,
        num_steps=40,
        checkpoint_interval=10,
        **options,
    )


def branch(source: Step, name: str = "train/branch", **options) -> Step:
    settings = dict(
        data=DATA, model=TINY_MOE, batch_size=8, seq_len=64, num_steps=40, init_from=source, init_step=20
    )
    return train_moe_step(name, **{**settings, **options})


def test_a_branch_is_refused_at_declaration_for_what_cannot_be_loaded():
    source = trunk()
    assert branch(source).config.init_step.value == 20
    cases = [
        (dict(init_step=15), "init_step", "every 10 steps and at its final step 39; step 15 is not one"),
        (dict(init_step=None), "init_step", "a step number > 0"),
        (dict(init_step=30, num_steps=31), "init_step", "trains to step 30: raise num_steps"),
        (dict(init="optimizer"), "init", "not one of 'weights\\+optimizer', 'weights'"),
        (dict(model=dataclasses.replace(TINY_MOE, num_experts=8)), "model", "num_experts 8 \\(trunk: 4\\)"),
        (dict(optimizer=OptimizerSpec(name="muon")), "init", "use init='weights' for a fresh optimizer"),
        (dict(init_from=DATA), "init_from", "give a train_moe step"),
    ]
    for options, field, message in cases:
        with pytest.raises(StepDeclarationError, match=f"field `{field}`: .*{message}"):
            branch(source, **options)
    # A fresh optimizer may be another one; a checkpoint the trunk's retention deletes is refused.
    assert branch(source, optimizer=OptimizerSpec(name="muon"), init="weights")
    with pytest.raises(StepDeclarationError, match=r"field `init_step`: .*deletes the checkpoint of step 20"):
        branch(trunk(keep_checkpoints=1))
    with pytest.raises(StepDeclarationError, match="field `init_step`: a checkpoint step without init_from"):
        train_moe_step("b", data=DATA, model=TINY_MOE, batch_size=8, seq_len=64, num_steps=40, init_step=20)


def test_warmup_stable_decay_is_checked_and_reaches_levanter():
    with pytest.raises(StepDeclarationError, match=r"field `optimizer\.decay`: .*longer than the run"):
        trunk(optimizer=OptimizerSpec(warmup=0.5, decay=0.6))
    with pytest.raises(StepDeclarationError, match=r"field `optimizer\.decay`: must be a fraction"):
        trunk(optimizer=OptimizerSpec(decay=0))
    from steps.training.levanter_config import levanter_optimizer

    schedule = levanter_optimizer(
        OptimizerSpec(learning_rate=1.0, warmup=10, decay=0.25, lr_schedule="linear", min_lr_ratio=0.0)
    ).lr_scheduler(100)
    rates = [float(schedule(step)) for step in (5, 10, 50, 74, 75, 87, 99)]
    assert rates[0] == pytest.approx(0.5) and rates[1:4] == [1.0, 1.0, 1.0]  # warm-up, then stable
    assert rates[4] == pytest.approx(1.0) and rates[5] == pytest.approx(0.52) and rates[6] < 0.05  # decay


def test_a_fresh_optimizers_schedule_spans_the_steps_after_the_branch_point():
    from steps.training.levanter_config import levanter_optimizer

    spec = OptimizerSpec(learning_rate=1.0, warmup=0.1, lr_schedule="linear", min_lr_ratio=0.0)
    whole = levanter_optimizer(spec).lr_scheduler(100)
    shifted = shift_schedule(levanter_optimizer(spec), 60).lr_scheduler(100)
    assert float(shifted(4)) == pytest.approx(float(levanter_optimizer(spec).lr_scheduler(40)(4)))
    assert float(shifted(2)) == pytest.approx(0.5) and float(whole(2)) == pytest.approx(0.2)
    assert shift_schedule(spec, 0) is spec


def test_a_branch_identity_holds_its_trunk_its_step_and_what_it_loads(tmp_path):
    def label_of(step: Step) -> str:
        dag = build_dag([step], str(tmp_path))
        return next(label for label in dag.nodes if label.startswith(step.name))

    base = label_of(branch(trunk()))
    assert label_of(branch(trunk())) == base
    assert label_of(branch(trunk(), init_step=30)) != base
    assert label_of(branch(trunk(), init="weights")) != base
    assert label_of(branch(trunk(seed=1))) != base  # the trunk's identity is part of the branch's
    # A training that is no branch keeps the identity it had before branches existed.
    plain = train_moe_step("train/trunk", data=DATA, model=TINY_MOE, batch_size=8, seq_len=64, num_steps=40)
    assert not any(
        "init" in key
        for key in json.dumps(build_dag([plain], str(tmp_path)).nodes[label_of(plain)].identity.payload)
    )
    dag = build_dag([branch(trunk())], str(tmp_path))
    node = dag.nodes[base]
    assert not any(dep.startswith("train/trunk") for dep in node.deps), (
        "it waits for a checkpoint, not the end"
    )


def test_a_branch_waits_for_its_checkpoint_while_the_trunk_runs_and_not_after(tmp_path):
    """The checkpoint lands while the trunk runs: found. A trunk that finished without it, or
    stays failed, is an error naming it (no endless wait)."""
    landing = Training(tmp_path / "a", [[], [10], [20, 30]])
    found = wait_for_checkpoint(
        str(landing.dir), 20, settings=SETTINGS, clock=landing.clock, sleep=landing.sleep
    )
    assert found.endswith("checkpoints/step-20") and landing.sleeps == 3
    finished = Training(tmp_path / "b", [[10]])
    with pytest.raises(FileNotFoundError, match="finished without a checkpoint at step 20"):
        wait_for_checkpoint(
            str(finished.dir), 20, settings=SETTINGS, clock=finished.clock, sleep=finished.sleep
        )
    failed = Training(tmp_path / "c", [[10]], end="FAILED")
    with pytest.raises(RuntimeError, match=r"is FAILED .* before its checkpoint of step 20"):
        wait_for_checkpoint(str(failed.dir), 20, settings=SETTINGS, clock=failed.clock, sleep=failed.sleep)


EXPERIMENT = """
from pipeline import executor_main
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import mix, train as tiny

data = mix("mixture/test", steps=30, validation=["prose", "arithmetic"])
def train(name, lr=3e-3, **branch):
    optimizer = OptimizerSpec(learning_rate=lr, warmup=5, decay=0.3, lr_schedule="linear")
    return tiny(optimizer, name, data=data, num_steps=30, checkpoint_interval=10, eval_interval=1000,
                router_stats_interval=0, **branch)
trunk = train("train/trunk")
same = train("train/same", init_from=trunk, init_step=10)
slower = train("train/slower", lr=3e-4, init_from=trunk, init_step=10)
weights = train("train/weights", init_from=trunk, init_step=20, init="weights")
if __name__ == "__main__":
    executor_main([same, slower, weights])
"""


@pytest.mark.slow
def test_branches_continue_the_trunk_exactly_diverge_with_a_new_rate_and_load_weights_alone(tmp_path):
    """Real tiny trainings on the demo corpus: a branch at step 10 with the trunk's settings
    computes the trunk's own next losses; a lower rate from step 10 diverges from them; a branch
    taking only the weights of step 20 starts near the trunk's loss there, far below a fresh
    model's, and warms its fresh optimizer up again."""
    exp = tmp_path / "exp.py"
    exp.write_text(EXPERIMENT.format(root=str(ROOT)))
    prefix = tmp_path / "prefix"
    command = tiny_command(exp, str(prefix))
    result = subprocess.run(command, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]

    def records(name: str) -> dict[int, dict]:
        (found,) = prefix.glob(f"{name}-*")
        return {r["step"]: r for r in read_metrics(str(found / "metrics.jsonl")) if "loss" in r}

    trunk, same, slower, weights = (records(f"train/{n}") for n in ("trunk", "same", "slower", "weights"))
    assert sorted(same) == list(range(11, 30)), "a branch's steps continue the trunk's numbering"
    assert all(same[s]["loss"] == trunk[s]["loss"] for s in same), "same settings: the trunk's losses"
    assert all(same[s]["learning_rate"] == trunk[s]["learning_rate"] for s in same)
    assert slower[11]["learning_rate"] == pytest.approx(trunk[11]["learning_rate"] / 10)
    assert all(slower[s]["loss"] != trunk[s]["loss"] for s in range(12, 30))
    assert abs(slower[29]["loss"] - trunk[29]["loss"]) > 0.01
    # Weights alone: the model of step 20 (its loss far below step 2's), a fresh warm-up.
    assert min(weights) == 21 and weights[21]["loss"] < 0.8 * trunk[2]["loss"]
    assert weights[21]["learning_rate"] < trunk[21]["learning_rate"]
    plan = subprocess.run(
        [*command[:3], "plan", *command[4:7]], env=env(), cwd=ROOT, capture_output=True, text=True
    )
    shown = "branches from:   checkpoint 10 of train/trunk (weights+optimizer)"
    assert shown in plan.stdout, plan.stdout[-2000:]
    (found,) = prefix.glob("train/same-*")
    # Its metrics say where they leave the trunk's (compare draws the branch from there).
    (event,) = [e for e in read_events(str(found / "metrics.jsonl")) if e["event"] == "branch"]
    (trunk_dir,) = prefix.glob("train/trunk-*")
    assert (event["step"], event["name"], event["trunk"]) == (10, "train/trunk", str(trunk_dir))
    summary = json.loads((found / ".step.json").read_text())["summary"]
    assert summary["branches from"] == shown.split(":", 1)[1].strip(), "the record names its trunk"
