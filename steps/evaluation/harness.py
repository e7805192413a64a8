"""The lm-eval side of the `task_eval` step: its tasks built offline from local files (registry
tasks' rows copied from `task_data`, inline tasks' from their JSON-lines files), and the
`Evaluator` that scores them on each checkpoint with Levanter's harness adapter and summarizes
lm-eval's output as results.json's entries. The step itself is `steps.evaluation.task_eval`."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import fsspec

from steps.evaluation.eval_tasks import (
    EvalTask,
    check_rows,
    lm_eval_spec,
    resolve_data_path,
    task_manager,
)
from steps.evaluation.task_eval_config import TaskEvalConfig

__all__ = ["Evaluator", "build_tasks", "chance", "local_task_files", "offline", "registry_rows", "summarize"]

logger = logging.getLogger(__name__)


@contextmanager
def offline(datasets_cache: str | None) -> Iterator[None]:
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
def local_task_files(
    tasks: Sequence[EvalTask], config: TaskEvalConfig
) -> Iterator[tuple[dict[str, dict[str, str] | None], str]]:
    """Per task, split -> a local file for lm-eval's json loader (URLs copied to scratch first);
    None for a registry task (its rows are found as lm-eval loads them: `registry_rows`); and
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
            # under task_data are found as lm-eval loads them (`registry_rows`).
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
def registry_rows(task_data: str | None, scratch: str) -> Iterator[None]:
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


def build_tasks(
    tasks: Sequence[EvalTask], files: dict[str, dict[str, str] | None], config: TaskEvalConfig
) -> tuple[dict[str, Any], dict[str, float | None], dict[str, str]]:
    """lm-eval's task dict for `tasks`, each leaf task's chance accuracy, and the name lm-eval
    reports each task under (by `EvalTask.key`)."""
    from lm_eval.tasks import get_task_dict

    manager = task_manager(registry=not all(task.inline for task in tasks))
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
    chances = {leaf.config.task: chance(leaf, config.max_examples) for leaf in _leaves(task_dict)}
    return task_dict, chances, names


def _leaves(task_dict: dict[Any, Any]) -> list[Any]:
    out = []
    for value in task_dict.values():
        out.extend(_leaves(value) if isinstance(value, dict) else [value])
    return out


def chance(task: Any, limit: int | None) -> float | None:
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


class Evaluator:
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
