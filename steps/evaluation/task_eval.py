"""The `task_eval` step: downstream task scores of a training's checkpoint, with lm-eval-harness.

Runs lm-evaluation-harness's own evaluator on a Levanter model through Levanter's harness adapter
(`levanter.eval_harness`: it packs the requests into sequences and scores them with the model's
fused cross-entropy). Tasks are lm-eval registry names with few-shot counts, or inline specs whose
rows are JSON-lines files (`steps.evaluation.eval_tasks`). Everything runs offline.

Outputs, under the step's directory:

    results.json        per task: lm-eval's metrics (acc, acc_norm, ... and their stderr, under
                        lm-eval's own names, the default filter's ",none" suffix dropped), the
                        number of examples, the few-shot count, `chance` (the accuracy of guessing:
                        the mean of 1/number-of-choices) and the checkpoint step evaluated
    samples.jsonl       with `log_samples`: one line per example and task, each choice's
                        log-likelihood, the right choice, whether the model picked it
    results/step-N.json with `follow`: the result of each checkpoint, as the training writes them
    curves.png          with `follow`: each task's accuracy against the training step

Directories may be URLs (gs://, s3://): task files on URLs are copied to a local scratch
directory first, since lm-eval's loader reads local files.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from pipeline import (
    Resources,
    Step,
    StepDeclarationError,
    output_of,
    step_function,
    this_output,
    unversioned,
    versioned,
)
from steps.evaluation.eval_tasks import (
    EvalTask,
    check_tasks,
)
from steps.evaluation.follow import check_follow, evaluate_checkpoints
from steps.evaluation.harness import Evaluator, build_tasks, local_task_files, offline, registry_rows
from steps.evaluation.task_eval_config import TaskEvalConfig
from steps.files import exists, read_json, write_json, write_text
from steps.imports import LEVANTER_MODELS, import_ml
from steps.training.checkpoints import check_checkpoint_step
from steps.training.config import training_of

__all__ = ["TaskEvalConfig", "task_eval", "task_eval_step"]

logger = logging.getLogger(__name__)


def task_eval_step(
    name: str,
    *,
    train: Step,
    tasks: Sequence[EvalTask | str],
    checkpoint_step: int | None = None,
    follow: bool = False,
    max_examples: int | None = None,
    max_length: int | None = None,
    batch_size: int = 8,
    log_samples: bool = False,
    task_data: str | None = None,
    datasets_cache: str | None = None,
    data_root: str | None = None,
    blocking: bool | None = None,
    resources: Resources | None = None,
) -> Step:
    """A ready task_eval `Step` on train_moe step `train`.

    `tasks`: `EvalTask`s (`registry_task`, `inline_task`) or `"name:shots"` strings. With
    `follow=True` it runs beside the training and evaluates each checkpoint as it lands; otherwise
    it waits for the training and evaluates its final checkpoint (or `checkpoint_step`).
    Tasks, the checkpoint, `follow`, `max_examples`, `max_length` and `log_samples` are versioned;
    where the task data lie is not.
    """
    try:
        checked = check_tasks(tasks, data_root, task_data)
    except ValueError as e:
        raise StepDeclarationError(name, str(e).split(": ", 1)[-1], field=str(e).split(":", 1)[0]) from e
    train_config = training_of(name, train)
    blocking = check_follow(name, blocking, follow, checkpoint_step)
    check_checkpoint_step(name, train_config, checkpoint_step, follow)
    return Step(
        name=name,
        fn=task_eval,
        config=TaskEvalConfig(
            train=output_of(train, blocking=blocking),
            data=train_config.data,
            output=this_output(),
            tasks=versioned(checked),
            checkpoint_step=versioned(checkpoint_step),
            follow=versioned(follow),
            final_step=unversioned(train_config.num_steps) - 1,
            checkpoint_interval=train_config.checkpoint_interval,
            max_examples=versioned(max_examples),
            max_length=versioned(max_length or unversioned(train_config.seq_len)),
            batch_size=batch_size,
            log_samples=versioned(log_samples),
            task_data=task_data,
            datasets_cache=datasets_cache,
            data_root=data_root,
        ),
        description=f"lm-eval tasks on {train.name}",
        resources=resources or Resources(cpus=1),
    )


# -- the step function ------------------------------------------------------------------------------


def task_eval(config: TaskEvalConfig) -> dict[str, Any]:
    """Evaluate the tasks on the checkpoint(s) of `config`; write results.json (and the rest)."""
    import_ml(*LEVANTER_MODELS, "lm_eval.evaluator", "lm_eval.tasks", "levanter.eval_harness")
    tasks = check_tasks(config.tasks, config.data_root, config.task_data)
    with offline(config.datasets_cache), local_task_files(tasks, config) as (files, scratch):
        with registry_rows(config.task_data, scratch):
            task_dict, chances, names = build_tasks(tasks, files, config)
        evaluator = Evaluator(config, task_dict, chances, tasks, names)
        result = evaluate_checkpoints(
            config,
            evaluator.evaluate,
            series=_accuracies,
            ylabel="accuracy",
            levels=lambda r: {name: entry.get("chance") for name, entry in r["tasks"].items()},
            errors=_accuracy_errors,
        )
    samples = evaluator.samples
    write_json(os.path.join(config.output, "results.json"), result)
    if samples is not None:
        write_text(
            os.path.join(config.output, "samples.jsonl"), "".join(json.dumps(s) + "\n" for s in samples)
        )
    return {"checkpoint_step": result["checkpoint_step"], "tasks": _accuracies(result)}


def _accuracies(result: dict[str, Any]) -> dict[str, float | None]:
    """Each task's headline number: acc (else the first metric)."""
    out = {}
    for name, entry in result["tasks"].items():
        metrics = entry["metrics"]
        value = metrics.get("acc")
        if value is None:
            value = next((v for k, v in metrics.items() if "stderr" not in k and isinstance(v, float)), None)
        out[name] = value
    return out


def _accuracy_errors(result: dict[str, Any]) -> dict[str, float | None]:
    """The standard error of each task's headline number (lm-eval's `acc_stderr`)."""
    out = {}
    for name, entry in result["tasks"].items():
        metrics = entry["metrics"]
        key = (
            "acc" if metrics.get("acc") is not None else next((k for k in metrics if "stderr" not in k), None)
        )
        value = metrics.get(f"{key}_stderr") if key else None
        out[name] = value if isinstance(value, float) else None
    return out


def report(config: TaskEvalConfig) -> dict[str, Any] | None:
    """The end-of-run summary and the dashboard's: the task table, the checkpoint, the curves."""
    path = os.path.join(config.output, "results.json")
    if not exists(path):
        return None
    result = read_json(path)
    rows = []
    for name, entry in result["tasks"].items():
        metrics = entry["metrics"]
        rows.append(
            {
                "task": name,
                "shots": entry["num_fewshot"],
                "examples": entry["examples"],
                "acc": _rounded(metrics.get("acc")),
                "±": _rounded(metrics.get("acc_stderr")),
                "acc_norm": _rounded(metrics.get("acc_norm")),
                "chance": _rounded(entry.get("chance")),
            }
        )
    out: dict[str, Any] = {
        "tasks": rows,
        "checkpoint": f"step {result['checkpoint_step']} ({result['checkpoint']})",
    }
    cut = result.get("truncated")
    if isinstance(cut, dict):
        out["truncated"] = (
            f"{cut.get('requests')} of {cut.get('of')} requests longer than max_length "
            f"{cut.get('max_length')}: their contexts were cut from the left"
        )
    curves = os.path.join(config.output, "curves.png")
    if exists(curves):
        out["task curves"] = curves
    return out


def metrics(config: TaskEvalConfig) -> dict[str, float] | None:
    """For `drydock compare`: each task's metrics (acc, acc_norm, ...), without their stderr."""
    path = os.path.join(config.output, "results.json")
    if not exists(path):
        return None
    out = {}
    for name, entry in read_json(path)["tasks"].items():
        for key, value in entry["metrics"].items():
            if isinstance(value, float) and "stderr" not in key:
                out[f"task/{name}/{key}"] = value
    return out


def _rounded(value: Any) -> float | str:
    return round(value, 3) if isinstance(value, float) else "-"


def preview(config: TaskEvalConfig) -> dict[str, Any]:
    """Shown by `drydock plan`: the tasks and their few-shot counts, and where their data are."""
    out: dict[str, Any] = {"tasks": ", ".join(f"{t.name}:{t.num_fewshot}" for t in config.tasks)}
    if config.follow:
        out["follow"] = "every checkpoint"
    if any(not t.inline for t in config.tasks):
        out["task data"] = config.task_data or config.datasets_cache or "the datasets cache"
    return out


def check(config: TaskEvalConfig) -> None:
    """The checks `task_eval_step` makes, for a config rebuilt from a manifest: the tasks are data
    (sandboxed templates, known metrics) and their files are where they are said to be."""
    check_tasks(config.tasks, config.data_root, config.task_data)


step_function(task_eval, preview=preview, report=report, metrics=metrics, check=check)
