"""Task evaluation and checkpoint followers on a real tiny training, run as a user runs them.

One experiment: a 40-step training (a checkpoint every 10 steps); beside it, from the start, a loss
follower and a task follower (`follow=True`); after it, a task evaluation of the final checkpoint
that logs its samples. The first run is killed once the loss follower has evaluated step 20; the
second finishes it. Then: every kept checkpoint was evaluated once (what was done before the kill
is untouched), the followers ended after the final checkpoint, and the task scores agree with
log-likelihoods computed here, by hand, from the Levanter model.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.steps.tiny import command as tiny_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
KEPT = [10, 20, 30, 39]
MAX_LENGTH = 64

EXPERIMENT = """
import dataclasses
from pipeline import executor_main
from steps.evaluation.demo_tasks import demo_task
from steps.evaluation.evaluate import evaluate_step
from steps.evaluation.task_eval import task_eval_step
from steps.models import TINY_MOE
from tests.steps.tiny import ROOT, mix, train

data = mix("mixture/test", steps=40, validation=["prose", "arithmetic"])
# Drydock's own family (shared expert, windowed local layer, balancing bias): follow, loss and
# task evaluation read it as they read Levanter's families.
model = dataclasses.replace(TINY_MOE, family="drydock_moe", num_shared_experts=1, sliding_window=16,
                            global_every=2, num_global_kv_heads=1)
training = train(None, "train/test", data=data, model=model, num_steps=40, checkpoint_interval=10,
                 eval_interval=1000)
losses = evaluate_step("evaluate/follow", train=training, data=data, seq_len=64, max_batches=2, follow=True)
curve = task_eval_step("tasks/follow", train=training, tasks=[demo_task("stories")], follow=True,
                       max_examples=24, data_root=ROOT)
final = task_eval_step("tasks/final", train=training, tasks=[demo_task("sums"), demo_task("stories", 2)],
                       max_examples=48, log_samples=True, data_root=ROOT)
if __name__ == "__main__":
    executor_main([losses, curve, final])
"""


def command(exp: Path, prefix: Path, *extra: str) -> list[str]:
    return tiny_command(exp, prefix, "--max_concurrent", "4", *extra)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}


def step_dir(prefix: Path, name: str) -> Path:
    (found,) = prefix.glob(f"{name}-*")
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("task_eval")
    exp = tmp / "exp.py"
    exp.write_text(EXPERIMENT.format(root=str(ROOT)))
    prefix = tmp / "prefix"
    first = subprocess.Popen(
        command(exp, prefix),
        env=env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while not list(prefix.glob("evaluate/follow-*/results/step-20.json")):
        assert time.monotonic() < deadline and first.poll() is None, "the follower never evaluated step 20"
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)  # the run and every process it started
    first.wait(30)
    before = {p: p.stat().st_mtime_ns for p in prefix.glob("*/follow-*/results/step-*.json")}
    second = subprocess.run(
        command(exp, prefix), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert second.returncode == 0, second.stderr[-4000:]
    return prefix, before, second


def test_followers_evaluate_every_kept_checkpoint_once_and_resume_after_a_kill(run):
    prefix, before, _ = run
    assert any("evaluate/follow" in str(p) for p in before)
    for name in ("evaluate/follow", "tasks/follow"):
        out = step_dir(prefix, name)
        assert sorted(int(p.stem[5:]) for p in (out / "results").glob("step-*.json")) == KEPT
        result = json.loads((out / "results.json").read_text())
        assert result["checkpoint_step"] == 39 and sorted(map(int, result["curve"])) == KEPT
        assert (out / "curves.png").stat().st_size > 1000
        curve = json.loads((out / "curve.json").read_text())  # what the dashboard draws
        assert curve["steps"] == KEPT and all(len(v) == 4 for v in curve["series"].values())
    # Whatever was evaluated before the kill was not evaluated again.
    assert {p: p.stat().st_mtime_ns for p in before} == before
    losses = json.loads((step_dir(prefix, "evaluate/follow") / "results.json").read_text())["curve"]
    assert losses["39"]["prose"] < losses["10"]["prose"]  # the curve goes down as training goes on


def test_task_results_and_the_end_of_run_table(run):
    prefix, _, second = run
    result = json.loads((step_dir(prefix, "tasks/final") / "results.json").read_text())
    assert result["checkpoint_step"] == 39 and result["checkpoint"].endswith("checkpoints/step-39")
    assert set(result["tasks"]) == {"sums", "stories_2shot"}
    for entry in result["tasks"].values():
        assert {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"} <= set(entry["metrics"])
        assert entry["examples"] == 48 and entry["chance"] == pytest.approx(0.25)
    assert result["tasks"]["stories_2shot"]["num_fewshot"] == 2
    assert "sums" in second.stdout and "stories_2shot" in second.stdout and "chance" in second.stdout


def test_scores_match_log_likelihoods_computed_by_hand_from_the_model(run):
    """The honesty check: each choice's log-likelihood from the model's logits, here."""
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from levanter.layers.attention import AttentionMask
    from levanter.trainer import TrainerConfig

    from steps.data.mixture import load_data_config
    from steps.training.checkpoints import load_inference_model

    prefix, _, _ = run
    out = step_dir(prefix, "tasks/final")
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    result = json.loads((out / "results.json").read_text())
    for task in ("sums", "stories_2shot"):
        mine = [s for s in samples if s["task"] == task]
        assert len(mine) == 48
        picked = np.mean([float(np.argmax(s["loglikelihoods"]) == s["target"]) for s in mine])
        assert picked == pytest.approx(result["tasks"][task]["metrics"]["acc"])

    tokenizer = load_data_config(str(step_dir(prefix, "mixture/test"))).the_tokenizer
    train = step_dir(prefix, "train/test")
    trainer = TrainerConfig(require_accelerator=False)
    with hax.partitioning.set_mesh(trainer.device_mesh), hax.axis_mapping(trainer.parameter_axis_mapping):
        model = load_inference_model(
            str(train), str(train / "checkpoints" / "step-39"), len(tokenizer), trainer.parameter_axis_mapping
        )

        def loglikelihood(context: str, continuation: str) -> float:
            full = tokenizer.encode(context + continuation, add_special_tokens=False)
            start = len(tokenizer.encode(context, add_special_tokens=False))
            if len(full) > MAX_LENGTH:  # the harness keeps the last max_length tokens
                start -= len(full) - MAX_LENGTH
                full = full[-MAX_LENGTH:]
            ids = hax.named(jnp.array(full, dtype=jnp.int32), model.Pos.resize(len(full)))
            logits = model(ids, attn_mask=AttentionMask.causal()).array.astype(jnp.float32)
            logp = jax.nn.log_softmax(logits, axis=-1)
            return float(sum(logp[i - 1, full[i]] for i in range(max(start, 1), len(full))))

        # Requests longer than max_length (the 2-shot prompts) are cut, and counted in the result.
        cut = sum(
            len(tokenizer.encode(s["context"] + choice, add_special_tokens=False)) > MAX_LENGTH
            for s in samples
            for choice in s["choices"]
        )
        assert cut > 0 and result["truncated"] == {
            "requests": cut,
            "of": 2 * 48 * 4,
            "max_length": MAX_LENGTH,
        }

        checked = [s for s in samples if s["task"] == "sums"][:4] + [
            s for s in samples if s["task"] != "sums"
        ][:3]
        for sample in checked:
            by_hand = [loglikelihood(sample["context"], choice) for choice in sample["choices"]]
            assert by_hand == pytest.approx(sample["loglikelihoods"], abs=2e-3), sample
            assert float(np.argmax(by_hand) == sample["target"]) == sample["acc"]


HERO_TASKS = """
import ast, pathlib
# The hero recipe's own task list, read from its source (importing it would plan the hero).
tree = ast.parse(pathlib.Path({root!r}, "experiments", "moe_535b_a23b.py").read_text())
(HERO,) = [ast.literal_eval(n.value) for n in tree.body
           if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "BASE_MODEL_TASKS"]
hero = task_eval_step("tasks/hero", train=training, tasks=HERO, task_data={task_data!r}, batch_size=16)
if __name__ == "__main__":
    executor_main([hero])
"""


def test_the_heros_registry_suite_runs_offline_on_rows_in_each_tasks_own_schema(run, tmp_path):
    """Every registry task the hero recipe declares, MMLU's 57 subjects included, read from
    hand-written rows in each task's Hub schema (scripts/make_registry_task_rows.py), with the
    recipe's few-shot counts, through the step the recipe uses; the MMLU group aggregated."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_registry_task_rows import write_rows

    prefix, _, _ = run
    task_data = tmp_path / "task-data"
    write_rows(task_data)
    exp = tmp_path / "hero.py"
    declarations = EXPERIMENT.split('if __name__ == "__main__":')[0].format(root=str(ROOT))
    exp.write_text(declarations + HERO_TASKS.format(root=str(ROOT), task_data=str(task_data)))
    result = subprocess.run(
        command(exp, prefix), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads((step_dir(prefix, "tasks/hero") / "results.json").read_text())
    tasks = out["tasks"]
    shots = {
        "hellaswag_10shot": 10,
        "arc_easy_25shot": 25,
        "arc_challenge_25shot": 25,
        "piqa": 0,
        "winogrande_5shot": 5,
        "boolq": 0,
        "openbookqa": 0,
        "commonsense_qa_7shot": 7,
    }
    for name, count in shots.items():
        assert name in tasks, sorted(tasks)
        assert 0 <= tasks[name]["metrics"]["acc"] <= 1 and tasks[name]["num_fewshot"] == count
    mmlu = tasks["mmlu_5shot"]
    assert mmlu["num_fewshot"] == 5 and mmlu["examples"] == 57 * 2  # every subject's 2 test rows
    categories = mmlu["subtasks"]
    assert set(categories) == {"mmlu_stem", "mmlu_other", "mmlu_social_sciences", "mmlu_humanities"}
    assert sum(c["examples"] for c in categories.values()) == 57 * 2
    # The group's aggregate weighs each category by its rows (weight_by_size).
    weighted = sum(c["metrics"]["acc"] * c["examples"] for c in categories.values()) / (57 * 2)
    assert mmlu["metrics"]["acc"] == pytest.approx(weighted)
    assert mmlu["chance"] == pytest.approx(0.25)
    assert tasks["hellaswag_10shot"]["chance"] == pytest.approx(0.25)
    assert tasks["boolq"]["chance"] == pytest.approx(0.5)


def test_a_group_member_without_rows_is_one_error_naming_it_and_its_path(tmp_path):
    from steps.evaluation.eval_tasks import check_tasks

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_registry_task_rows import write_rows

    write_rows(tmp_path)
    check_tasks(["mmlu:5", "hellaswag:10"], None, str(tmp_path))
    shutil.rmtree(tmp_path / "mmlu_anatomy")
    missing = tmp_path / "mmlu_anatomy"
    with pytest.raises(
        ValueError, match=f"group 'mmlu' has 57 tasks.*'mmlu_anatomy'.*no directory {missing}"
    ):
        check_tasks(["mmlu:5"], None, str(tmp_path))
    shutil.rmtree(tmp_path / "piqa")
    with pytest.raises(ValueError, match=f"piqa.*no directory {tmp_path / 'piqa'} \\(task_data\\)"):
        check_tasks(["piqa"], None, str(tmp_path))
