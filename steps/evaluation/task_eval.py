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
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fsspec

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
    check_rows,
    check_tasks,
    lm_eval_spec,
    resolve_data_path,
    task_manager,
)
from steps.evaluation.follow import FollowSettings, check_follow, evaluate_checkpoints
from steps.files import exists, read_json, write_json, write_text
from steps.imports import LEVANTER_MODELS, import_ml
from steps.training.checkpoints import check_checkpoint_step, training_of

__all__ = ["TaskEvalConfig", "task_eval", "task_eval_step"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskEvalConfig:
    """Configuration of the task_eval step."""

    train: str
    """A train_moe step's output directory."""
    data: str
    """The mixture step the training read (its tokenizer tokenizes the tasks)."""
    output: str
    """The step's output directory (`this_output()`)."""
    tasks: tuple[EvalTask, ...] = ()
    checkpoint_step: int | None = None
    """Evaluate `checkpoints/step-N`; None: the final checkpoint (or each one, with `follow`)."""
    follow: bool = False
    """Evaluate every kept checkpoint as the training writes it (`steps.evaluation.follow`)."""
    final_step: int | None = None
    """The training's last step (its num_steps - 1): where a follower stops."""
    checkpoint_interval: int | None = None
    """The training's checkpoint_interval: which checkpoints it keeps."""
    max_examples: int | None = None
    """At most this many examples per task (lm-eval's `limit`); None: all of them."""
    max_length: int = 128
    """Tokens per packed sequence (at most the model's length); longer requests lose their start."""
    batch_size: int = 8
    log_samples: bool = False
    """Also write samples.jsonl: each example's per-choice log-likelihoods."""
    task_data: str | None = None
    """Registry tasks' rows: `<task_data>/<task>/<split>.jsonl`. None: the datasets cache."""
    datasets_cache: str | None = None
    """A `datasets` cache directory holding registry tasks' datasets (HF_DATASETS_CACHE)."""
    data_root: str | None = None
    """Where inline tasks' relative paths are (not versioned: the same files anywhere)."""
    bootstrap_iters: int = 1000
    """lm-eval's bootstrap iterations for the stderr of metrics without a closed form (acc's is)."""
    follow_settings: FollowSettings = field(default_factory=FollowSettings)


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
    with _offline(config.datasets_cache), _local_task_files(tasks, config) as (files, scratch):
        with _registry_rows(config.task_data, scratch):
            task_dict, chances, names = _build_tasks(tasks, files, config)
        evaluator = _Evaluator(config, task_dict, chances, tasks, names)
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


@contextmanager
def _offline(datasets_cache: str | None) -> Iterator[None]:
    """Nothing from a hub: lm-eval and `datasets` read only what is on this machine."""
    keys = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_CACHE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    if datasets_cache is not None:
        if not os.path.isdir(datasets_cache):
            raise FileNotFoundError(f"datasets_cache: no directory {datasets_cache}")
        os.environ["HF_DATASETS_CACHE"] = datasets_cache
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _local_task_files(
    tasks: Sequence[EvalTask], config: TaskEvalConfig
) -> Iterator[tuple[dict[str, dict[str, str] | None], str]]:
    """Per task, split -> a local file for lm-eval's json loader (URLs copied to scratch first);
    None for a registry task (its rows are found as lm-eval loads them: `_registry_rows`); and
    the scratch directory."""
    scratch = tempfile.mkdtemp(prefix="drydock-tasks-", dir=os.environ.get("DRYDOCK_SCRATCH") or None)
    try:
        files: dict[str, dict[str, str] | None] = {}
        for i, task in enumerate(tasks):
            if task.inline:
                assert task.data is not None
                wanted = {
                    split: resolve_data_path(path, config.data_root) for split, path in task.data.items()
                }
                local = {split: _local_copy(path, scratch, task, split) for split, path in wanted.items()}
                for split, path in wanted.items():
                    if "://" in path and not path.startswith("file://"):  # local files: at declaration
                        check_rows(task, split, local[split], f"tasks[{i}] ({task.name})", shown=path)
                files[task.key] = local
                continue
            # A registry task keeps its own config (templates, splits, process_docs): a spec that
            # named a dataset would make lm-eval build a new task from the spec alone. Its rows
            # under task_data are found as lm-eval loads them (`_registry_rows`).
            files[task.key] = None
        yield files, scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _registry_files(task: EvalTask | str, task_data: str) -> dict[str, str]:
    name = task if isinstance(task, str) else task.name
    directory = f"{task_data.rstrip('/')}/{name}"
    fs, plain = fsspec.core.url_to_fs(directory)
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(plain, detail=False)]
    except FileNotFoundError:
        names = []
    splits = {n[: -len(".jsonl")]: f"{directory}/{n}" for n in names if n.endswith(".jsonl")}
    if not splits:
        raise FileNotFoundError(f"task {name}: task data missing: no <split>.jsonl files in {directory}")
    return splits


def _local_copy(path: str, scratch: str, task: EvalTask | str, split: str) -> str:
    name, key = (task, task) if isinstance(task, str) else (task.name, task.key)
    if "://" not in path or path.startswith("file://"):
        local = path.removeprefix("file://")
        if not os.path.isfile(local):
            raise FileNotFoundError(f"task {name}: task data missing: no file {local} (split {split})")
        return local
    local = os.path.join(scratch, key, f"{split}.jsonl")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    try:
        fsspec.core.url_to_fs(path)[0].get_file(fsspec.core.url_to_fs(path)[1], local)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"task {name}: task data missing: no file {path} (split {split})") from e
    return local


@contextmanager
def _registry_rows(task_data: str | None, scratch: str) -> Iterator[None]:
    """While lm-eval builds the tasks: every registry task (a group's members too: MMLU's 57
    subjects, each with its own dataset) reads its rows from `<task_data>/<its lm-eval
    name>/<split>.jsonl` instead of its Hub dataset. lm-eval loads a task's dataset in
    `ConfigurableTask.download`, the one place to point it elsewhere; the task's config (splits,
    templates, `process_docs`), a group and its aggregation stay lm-eval's."""
    if task_data is None:
        yield
        return
    import datasets
    from lm_eval.api.task import ConfigurableTask

    original = ConfigurableTask.download

    def download(self: Any, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.config.dataset_path == "json":  # inline tasks point at their files already
            return original(self, dataset_kwargs, **kwargs)
        name = self.config.task
        wanted = _registry_files(name, task_data)
        local = {split: _local_copy(path, scratch, name, split) for split, path in wanted.items()}
        self.dataset = datasets.load_dataset("json", data_files=local)

    ConfigurableTask.download = download
    try:
        yield
    finally:
        ConfigurableTask.download = original


def _build_tasks(
    tasks: Sequence[EvalTask], files: dict[str, dict[str, str] | None], config: TaskEvalConfig
) -> tuple[dict[str, Any], dict[str, float | None], dict[str, str]]:
    """lm-eval's task dict for `tasks`, each leaf task's chance accuracy, and the name lm-eval
    reports each task under (by `EvalTask.key`)."""
    from lm_eval.tasks import get_task_dict

    manager = task_manager()
    task_dict: dict[Any, Any] = {}
    names: dict[str, str] = {}
    seen: set[str] = set()
    for task in tasks:
        # A registry task is built by its name, so lm-eval loads its own config (a dict spec
        # would make lm-eval build a new task from the dict alone, without the task's splits,
        # templates or process_docs); the few-shot count is set on it after, as lm-eval's own
        # evaluator does.
        spec = lm_eval_spec(task, files[task.key]) if task.inline else task.name
        try:
            built = get_task_dict([spec], manager)
            if not task.inline:
                for leaf in _leaves(built):
                    leaf.set_config(key="num_fewshot", value=task.num_fewshot)
        except Exception as e:  # lm-eval and datasets raise many kinds; name the task and where
            where = files[task.key] or (
                f"task_data {config.task_data}"
                if config.task_data is not None
                else f"the datasets cache {os.environ.get('HF_DATASETS_CACHE', '(default)')}"
            )
            raise ValueError(
                f"task {task.name}: lm-eval could not load it from {where}: {type(e).__name__}: {e}"
            ) from e
        plain = len(built) == 1 and not isinstance(next(iter(built.values())), dict)
        if plain and task.key != task.name:
            # A few-shot variant of a task is reported under its own name, so that one run can
            # hold, say, hellaswag at 0 and at 10 shots. A group keeps its members' names.
            (leaf,) = built.values()
            leaf.config.task = task.key
            built = {task.key: leaf}
        names[task.key] = task.key if plain else task.name
        if any(str(getattr(k, "group", k)) in seen for k in built):
            raise ValueError(f"task {task.name}: its tasks are already in this step (a group listed twice?)")
        seen.update(str(getattr(k, "group", k)) for k in built)
        task_dict.update(built)
    chances = {leaf.config.task: _chance(leaf, config.max_examples) for leaf in _leaves(task_dict)}
    return task_dict, chances, names


def _leaves(task_dict: dict[Any, Any]) -> list[Any]:
    out = []
    for value in task_dict.values():
        out.extend(_leaves(value) if isinstance(value, dict) else [value])
    return out


def _chance(task: Any, limit: int | None) -> float | None:
    """The accuracy of guessing: the mean of 1/number-of-choices (multiple-choice tasks only)."""
    if task.OUTPUT_TYPE != "multiple_choice":
        return None
    docs = list(task.eval_docs)
    if limit is not None:
        docs = docs[:limit]
    if not docs:
        return None
    return sum(1.0 / len(task.doc_to_choice(doc)) for doc in docs) / len(docs)


class _TruncationCounter(logging.Filter):
    """Counts Levanter's "Request N is too long. Truncating." warnings (one per request, so
    thousands of lines) and drops them: the result says how many instead."""

    def __init__(self) -> None:
        super().__init__()
        self.truncated = 0
        # The logger is the process's: another evaluation in another thread counts its own.
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        message = record.getMessage()
        if message.startswith("Request ") and message.endswith("is too long. Truncating."):
            self.truncated += 1
            return False
        return True


def _request_count(task_dict: dict[str, Any], limit: int | None) -> int:
    """The scoring requests the tasks make: one per choice of each multiple-choice example, one
    per example otherwise."""
    total = 0
    for leaf in _leaves(task_dict):
        docs = list(leaf.eval_docs)
        docs = docs[:limit] if limit is not None else docs
        if leaf.OUTPUT_TYPE == "multiple_choice":
            total += sum(len(leaf.doc_to_choice(doc)) for doc in docs)
        else:
            total += len(docs)
    return total


class _Evaluator:
    """The model-side state kept across checkpoints (mesh, tokenizer, compiled scoring)."""

    def __init__(
        self,
        config: TaskEvalConfig,
        task_dict: dict[str, Any],
        chances: dict[str, float | None],
        tasks: Sequence[EvalTask],
        names: dict[str, str],
    ) -> None:
        from levanter.trainer import TrainerConfig

        from steps.data.mixture import load_data_config

        os.environ.setdefault("MARIN_PREFIX", os.path.join(config.output, ".marin"))
        self.config = config
        self.task_dict = task_dict
        self.chances = chances
        self.tasks = tasks
        self.names = names
        self.tokenizer = load_data_config(config.data).the_tokenizer
        self.trainer = TrainerConfig(require_accelerator=False, per_device_eval_parallelism=config.batch_size)
        self.samples: list[dict[str, Any]] | None = None
        self.requests = _request_count(task_dict, config.max_examples)

    def evaluate(self, step: int, checkpoint: str) -> dict[str, Any]:
        """Run every task on the checkpoint of `step`; its result (samples, if logged, in `samples`)."""
        import haliax as hax
        from levanter.eval_harness import LmEvalHarnessConfig, _actually_run_eval_harness
        from levanter.utils.tree_utils import inference_mode

        from steps.training.checkpoints import load_inference_model

        config, trainer = self.config, self.trainer
        harness = LmEvalHarnessConfig(
            task_spec=[],
            max_examples=config.max_examples,
            max_length=config.max_length,
            log_samples=config.log_samples,
            bootstrap_iters=config.bootstrap_iters,
        )
        started = time.time()
        counter = _TruncationCounter()
        harness_logger = logging.getLogger("levanter.eval_harness")
        harness_logger.addFilter(counter)
        try:
            with (
                hax.partitioning.set_mesh(trainer.device_mesh),
                hax.axis_mapping(trainer.parameter_axis_mapping),
            ):
                model = load_inference_model(
                    config.train, checkpoint, len(self.tokenizer), trainer.parameter_axis_mapping
                )
                model = inference_mode(model, True)
                outputs = _actually_run_eval_harness(
                    harness,
                    model,
                    _fresh(self.task_dict),
                    self.tokenizer,
                    trainer.EvalBatch,
                    trainer.compute_axis_mapping,
                    None,
                )
        finally:
            harness_logger.removeFilter(counter)
        assert outputs is not None  # a single process is process 0
        result = summarize(outputs, self.tasks, self.chances, self.names)
        result.update(checkpoint=checkpoint, checkpoint_step=step, seconds=time.time() - started)
        if counter.truncated:
            result["truncated"] = {
                "requests": counter.truncated,
                "of": self.requests,
                "max_length": config.max_length,
            }
            logger.warning(
                "%d of %d requests were longer than max_length %d: their contexts were cut from the left",
                counter.truncated,
                self.requests,
                config.max_length,
            )
        if config.log_samples:
            self.samples = list(_samples(outputs))  # of the last checkpoint evaluated: the final one
        return result


def _fresh(task_dict: dict[Any, Any]) -> dict[str, Any]:
    """lm-eval's task dict for one checkpoint's evaluation, in the form its evaluator reads
    (`{"tasks": {name: Task}, "groups": {name: Group}}`, each group holding its children), of
    shallow copies: lm-eval's evaluate() stores requests and results on its task objects, so a
    copy per checkpoint keeps one evaluation's instances out of the next. (`get_task_dict`'s
    nested form is read by lm-eval 0.4.13 one level deep only: MMLU, a group of groups, handed
    its category groups to the evaluator as if they were tasks.)"""
    import copy

    tasks: dict[str, Any] = {}
    groups: dict[str, Any] = {}

    def walk(level: dict[Any, Any]) -> list[Any]:
        children = []
        for key, value in level.items():
            if isinstance(value, dict):  # `key` is a group, `value` its members
                group = copy.copy(key)
                group._children = {}
                # Levanter's harness seeds few-shot sampling by walking the dict and calling
                # set_fewshot_seed on everything that is not a dict; a group samples nothing.
                group.set_fewshot_seed = _no_fewshot_seed
                for child in walk(value):
                    group.add(child)
                groups[group.name] = group
                children.append(group)
            else:
                task = copy.copy(value)
                tasks[key] = task
                children.append(task)
        return children

    walk(task_dict)
    return {"tasks": tasks, "groups": groups}


def _no_fewshot_seed(seed: int | None = None) -> None:
    """A group's `set_fewshot_seed`: its tasks are seeded themselves."""


def summarize(
    outputs: dict[str, Any],
    tasks: Sequence[EvalTask],
    chances: dict[str, float | None],
    names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """results.json's tasks from lm-eval's outputs: each requested task (a group's aggregate for a
    group) and, under `subtasks`, a group's members."""
    results = outputs.get("results", {})
    n_samples = outputs.get("n-samples", {})
    group_subtasks = outputs.get("group_subtasks", {})

    def one(name: str, fewshot: int) -> dict[str, Any]:
        metrics = {
            key.removesuffix(",none"): _number(value)
            for key, value in results.get(name, {}).items()
            if key not in ("alias", "name", "samples", "sample_len")
        }
        leaves = _leaf_names(name, group_subtasks)
        examples = sum(n_samples.get(leaf, {}).get("effective", 0) for leaf in leaves)
        leaf_chances = [(chances.get(leaf), n_samples.get(leaf, {}).get("effective", 0)) for leaf in leaves]
        chance = None
        if leaf_chances and all(c is not None for c, _ in leaf_chances) and examples:
            chance = sum(c * n for c, n in leaf_chances if c is not None) / examples
        return {"metrics": metrics, "examples": examples, "num_fewshot": fewshot, "chance": chance}

    out: dict[str, Any] = {"tasks": {}}
    for task in tasks:
        reported = (names or {}).get(task.key, task.key)
        entry = one(reported, task.num_fewshot)
        members = group_subtasks.get(reported) or []
        if members:
            entry["subtasks"] = {m: one(m, task.num_fewshot) for m in members}
        out["tasks"][task.key] = entry
    return out


def _leaf_names(name: str, group_subtasks: dict[str, list[str]]) -> list[str]:
    members = group_subtasks.get(name)
    if not members:
        return [name]
    return [leaf for m in members for leaf in _leaf_names(m, group_subtasks)]


def _number(value: Any) -> Any:
    """A JSON-able metric: numpy scalars as floats, lm-eval's "N/A" as None."""
    if isinstance(value, str):
        return None if value == "N/A" else value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _samples(outputs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for task, samples in outputs.get("samples", {}).items():
        for sample in samples:
            resps = sample.get("resps") or []
            lls = [float(r[0][0]) for r in resps if r and isinstance(r[0], (list, tuple))]
            yield {
                "task": task,
                "doc_id": sample.get("doc_id"),
                "target": sample.get("target"),
                "choices": [a[1] for a in sample.get("arguments", [])],
                "context": sample["arguments"][0][0] if sample.get("arguments") else None,
                "loglikelihoods": lls,
                "acc": _number(sample.get("acc")),
                "acc_norm": _number(sample.get("acc_norm")),
            }


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
