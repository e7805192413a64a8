"""The tasks a `task_eval` step runs: lm-eval registry names with few-shot counts, or inline specs
whose data are JSON-lines files, and how they become lm-eval task objects, offline.

    registry_task("hellaswag", 10)          lm-eval's own task; its data must be on this machine:
                                            `<task_data>/<name>/<split>.jsonl` (rows as the Hub
                                            dataset has them), or a `datasets` cache directory
    inline_task("sums", {"test": "data/tasks/sums/test.jsonl"},
                doc_to_text="{{query}}", doc_to_choice="{{choices}}", doc_to_target="{{gold}}")

Nothing is fetched from a hub: the step runs with `HF_DATASETS_OFFLINE` and `HF_HUB_OFFLINE` set,
and a task whose data is not where it is said to be is one clear error naming the task and path.
Names are checked when the step is declared, against lm-eval's task files (suggesting close names).

An inline task is data, not code (a shared manifest may carry one that anybody edited): its
templates are a sandboxed subset of Jinja (`steps.evaluation.task_templates`), its metrics are names from
`METRICS` (never a path or a Hub metric, which lm-eval would load and run), and it has no field
for lm-eval's `!function`, `process_docs`, `class` or `include`. A registry task is only named:
its code is the installed lm-eval's.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from steps.evaluation.task_templates import (
    MAX_CHECK_SECONDS,
    TEMPLATE_FIELDS,
    TaskTemplate,
    TemplateError,
    compile_template,
)

__all__ = [
    "METRICS",
    "OUTPUT_TYPES",
    "EvalTask",
    "check_tasks",
    "inline_task",
    "lm_eval_spec",
    "registry_leaves",
    "registry_names",
    "registry_task",
    "task_manager",
]

OUTPUT_TYPES = ("multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until")
METRICS = frozenset(
    {
        "acc", "acc_all", "acc_bytes", "acc_mutual_info", "acc_norm", "bits_per_byte", "bleu",
        "brier_score", "byte_perplexity", "chrf", "exact_match", "f1", "likelihood", "mcc",
        "perplexity", "ter", "word_perplexity",
    }
)  # fmt: skip
"""Metrics an inline task may ask for: lm-eval's own (its metric registry). Any other name would
make lm-eval load it with Hugging Face `evaluate`, which runs the code of a metric script."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class EvalTask:
    """One task: a registry task (`data` is None) or an inline spec (its fields are lm-eval's)."""

    name: str
    """The lm-eval registry name (a task or a group), or the inline task's own name."""
    num_fewshot: int = 0
    data: dict[str, str] | None = None
    """Inline tasks: split -> a JSON-lines file (a path relative to the step's `data_root`, or a URL)."""
    output_type: str = "multiple_choice"
    doc_to_text: str | None = None
    """Jinja2 template: a row -> the context."""
    doc_to_choice: str | None = None
    """Jinja2 template: a row -> the list of choices (multiple_choice)."""
    doc_to_target: str | None = None
    """Jinja2 template: a row -> the index of the right choice (or the target text)."""
    test_split: str = "test"
    fewshot_split: str | None = None
    """The split few-shot examples are drawn from (needed when num_fewshot > 0)."""
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    metrics: tuple[str, ...] = field(default=("acc", "acc_norm"))

    @property
    def inline(self) -> bool:
        return self.data is not None

    @property
    def key(self) -> str:
        """The name results are reported under: the task name, plus the few-shot count if any."""
        return self.name if self.num_fewshot == 0 else f"{self.name}_{self.num_fewshot}shot"


def registry_task(name: str, num_fewshot: int = 0) -> EvalTask:
    """lm-eval's registry task (or group) `name`, with `num_fewshot` examples in each prompt."""
    return EvalTask(name=name, num_fewshot=num_fewshot)


def inline_task(
    name: str,
    data: Mapping[str, str],
    *,
    doc_to_text: str,
    doc_to_target: str,
    doc_to_choice: str | None = None,
    output_type: str = "multiple_choice",
    num_fewshot: int = 0,
    test_split: str = "test",
    fewshot_split: str | None = None,
    target_delimiter: str = " ",
    fewshot_delimiter: str = "\n\n",
    metrics: Iterable[str] = ("acc", "acc_norm"),
) -> EvalTask:
    """A task defined here, its rows in JSON-lines files (`data`: split -> path or URL)."""
    return EvalTask(
        name=name,
        num_fewshot=num_fewshot,
        data=dict(data),
        output_type=output_type,
        doc_to_text=doc_to_text,
        doc_to_choice=doc_to_choice,
        doc_to_target=doc_to_target,
        test_split=test_split,
        fewshot_split=fewshot_split,
        target_delimiter=target_delimiter,
        fewshot_delimiter=fewshot_delimiter,
        metrics=tuple(metrics),
    )


def as_task(task: EvalTask | str) -> EvalTask:
    """`"hellaswag:10"` -> registry_task("hellaswag", 10); tasks pass through."""
    if isinstance(task, EvalTask):
        return task
    if not isinstance(task, str):
        raise TypeError(f"a task is an EvalTask or a 'name[:shots]' string, not {type(task).__name__}")
    name, _, shots = task.partition(":")
    if shots and not shots.isdigit():
        raise ValueError(f"{task!r}: the few-shot count after ':' must be a whole number")
    return registry_task(name, int(shots or 0))


# -- checks at declaration -----------------------------------------------------------------------------


@functools.cache
def _indexed_names() -> frozenset[str]:
    """Task, group and tag names in lm-eval's task files, read as text (a few hundred ms, where
    lm-eval's TaskManager takes seconds to parse them all)."""
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")  # found, not imported: importing it takes a second
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    root = os.path.join(next(iter(spec.submodule_search_locations)), "tasks")
    names: set[str] = set()
    pattern = re.compile(r"^(task|group|tag):[ \t]*(.*)$")
    for directory, _, files in os.walk(root):
        for file in files:
            if not file.endswith(".yaml"):
                continue
            with open(os.path.join(directory, file), encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
            for i, line in enumerate(lines):
                match = pattern.match(line)
                if match is None:
                    continue
                value = match.group(2).strip().strip("'\"")
                if value and not value.startswith(("[", "!", "{")):
                    names.add(value)
                elif match.group(1) == "tag":  # a list of tags follows
                    for item in lines[i + 1 :]:
                        if not item.lstrip().startswith("- "):
                            break
                        names.add(item.strip()[2:].strip().strip("'\""))
    return frozenset(names)


@functools.cache
def registry_names() -> frozenset[str]:
    """Every name lm-eval's registry knows (its TaskManager's, which is authoritative)."""
    from lm_eval.tasks import TaskManager

    return frozenset(TaskManager().all_tasks)


@functools.cache
def task_manager(registry: bool = True) -> Any:
    """lm-eval's TaskManager, indexed once per process. `registry=False`: without lm-eval's own
    task registry, for a step whose tasks are all inline (their specs are whole): indexing the
    registry reads some 14,000 YAML files, about 10 s of every such step."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=registry)


def registry_leaves(name: str) -> list[str]:
    """The lm-eval tasks registry name `name` stands for: itself for a task; for a group (MMLU)
    or a tag, every task under it, through subgroups and tags, in the registry's order. Each
    reads its own dataset, so under `task_data` each has its own directory."""
    index = task_manager().task_index
    entry = index.get(name)
    if entry is None:
        return [name]
    kind = str(getattr(entry.kind, "name", entry.kind)).upper()
    if kind == "GROUP":
        members = entry.cfg.get("task", [])
        members = members if isinstance(members, list) else [members]
        names = [m if isinstance(m, str) else m.get("task") for m in members]
        return [leaf for member in names if isinstance(member, str) for leaf in registry_leaves(member)]
    if kind == "TAG":
        tagged = [other for other, e in index.items() if name in (e.tags or ())]
        return [leaf for other in tagged for leaf in registry_leaves(other)]
    return [name]


def is_registered(name: str) -> bool:
    """Whether lm-eval knows task `name`: the quick text index first, the TaskManager if not there."""
    return name in _indexed_names() or name in registry_names()


def check_tasks(
    tasks: Iterable[EvalTask | str], data_root: str | None, task_data: str | None
) -> tuple[EvalTask, ...]:
    """The tasks as `EvalTask`s, or ValueError naming the field (`tasks[i]...`) at fault."""
    checked: list[EvalTask] = []
    keys: set[str] = set()
    for i, raw in enumerate(tasks):
        where = f"tasks[{i}]"
        try:
            task = as_task(raw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e
        if type(task) is not EvalTask:  # a subclass, as a manifest may name, could carry code
            raise ValueError(f"{where}: a task is an EvalTask, not a {type(task).__name__}")
        if not isinstance(task.name, str) or not _NAME.match(task.name):
            raise ValueError(f"{where}.name: {task.name!r} is not a task name (letters, digits, _ . -)")
        if not isinstance(task.num_fewshot, int) or task.num_fewshot < 0:
            raise ValueError(f"{where}.num_fewshot: must be a whole number >= 0, got {task.num_fewshot!r}")
        if task.key in keys:
            raise ValueError(f"{where}: task {task.key!r} is listed twice")
        keys.add(task.key)
        if task.inline:
            _check_inline(task, f"{where} ({task.name})", data_root)
        else:
            _check_registry(task, f"{where} ({task.name})", task_data)
        checked.append(task)
    if not checked:
        raise ValueError("tasks: give at least one task")
    return tuple(checked)


def _check_registry(task: EvalTask, where: str, task_data: str | None) -> None:
    if not is_registered(task.name):
        close = difflib.get_close_matches(task.name, sorted(registry_names()), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"{where}: lm-eval has no task {task.name!r}{hint}")
    if task_data is not None and "://" not in task_data:
        path = os.path.join(task_data, task.name)
        if os.path.isdir(path):
            return
        # A group (MMLU) has no rows of its own: each of its tasks has a directory.
        leaves = registry_leaves(task.name)
        if leaves == [task.name]:
            raise ValueError(f"{where}: its data is missing: no directory {path} (task_data)")
        for leaf in leaves:
            if not os.path.isdir(os.path.join(task_data, leaf)):
                raise ValueError(
                    f"{where}: group {task.name!r} has {len(leaves)} tasks, each with its own rows; "
                    f"task {leaf!r}'s are missing: no directory {os.path.join(task_data, leaf)} (task_data)"
                )


def _check_inline(task: EvalTask, where: str, data_root: str | None) -> None:
    _check_inline_fields(task, where)
    if task.output_type not in OUTPUT_TYPES:
        raise ValueError(f"{where}.output_type: {task.output_type!r} is not one of {', '.join(OUTPUT_TYPES)}")
    if not isinstance(task.data, dict) or not task.data:
        raise ValueError(f"{where}.data: give a split -> JSON-lines file mapping")
    needed = {"doc_to_text": task.doc_to_text, "doc_to_target": task.doc_to_target}
    if task.output_type == "multiple_choice":
        needed["doc_to_choice"] = task.doc_to_choice
    for name, value in needed.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}.{name}: an inline {task.output_type} task needs this template")
    if task.test_split not in task.data:
        raise ValueError(f"{where}.test_split: no file for split {task.test_split!r} in data")
    if task.num_fewshot > 0 and (task.fewshot_split is None or task.fewshot_split not in task.data):
        raise ValueError(f"{where}.fewshot_split: {task.num_fewshot}-shot needs a split in data to draw from")
    for split, path in task.data.items():
        if not isinstance(path, str):
            raise ValueError(f"{where}.data[{split!r}]: a path or URL, not {type(path).__name__}")
        local = resolve_data_path(path, data_root)
        if "://" not in local and not os.path.isfile(local):
            raise ValueError(f"{where}.data[{split!r}]: task data missing: no file {local}")
        if "://" not in local:  # a remote file is checked where it is read, with the same message
            check_rows(task, split, local, where)


def check_rows(task: EvalTask, split: str, path: str, where: str, shown: str | None = None) -> None:
    """Every row of an inline task's file `path` is a JSON object its templates can read, and for a
    multiple-choice task gives a non-empty list of choices and a target among them; else one
    ValueError naming the task, the file (`shown`, default `path`) and the row's line. (lm-eval
    would take a target outside the choices and score it as always wrong.)"""
    choices = task.output_type == "multiple_choice"
    templates = {
        name: TaskTemplate(getattr(task, name), name, choices)
        for name in TEMPLATE_FIELDS
        if getattr(task, name) is not None
    }
    started = time.monotonic()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            at = f"{where}.data[{split!r}]: {shown or path} line {number}"
            if time.monotonic() - started > MAX_CHECK_SECONDS:  # each row is bounded; so are all
                raise ValueError(f"{at}: the templates took over {MAX_CHECK_SECONDS:g} s on the rows so far")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{at}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{at}: a row is a JSON object, not {type(row).__name__}")
            _check_row(row, templates, at)


def _check_row(row: dict[str, Any], templates: Mapping[str, TaskTemplate], at: str) -> None:
    values: dict[str, Any] = {}
    for name, template in templates.items():
        try:
            values[name] = template(row)
        except Exception as e:  # a template that reads a field the row lacks renders nothing
            raise ValueError(f"{at}: {name} {template.source!r} cannot be read from this row ({e})") from None
    if "doc_to_choice" not in templates:
        return
    choices, target = values["doc_to_choice"], values.get("doc_to_target")
    if not isinstance(choices, list | tuple) or not choices:
        raise ValueError(f"{at}: doc_to_choice gives {choices!r}, not a non-empty list of choices")
    for one in target if isinstance(target, list) else [target]:
        if isinstance(one, bool) or not isinstance(one, int | str):
            raise ValueError(f"{at}: doc_to_target gives {one!r}, not a choice's index or text")
        if isinstance(one, int) and not 0 <= one < len(choices):
            raise ValueError(f"{at}: the answer index {one} is outside its {len(choices)} choices")
        if isinstance(one, str) and one not in choices:
            raise ValueError(f"{at}: the answer {one!r} is not one of its choices {list(choices)!r}")


def _check_inline_fields(task: EvalTask, where: str) -> None:
    """An inline task is data: strings where strings go, templates in the sandboxed subset,
    metrics by lm-eval's own names."""
    for name in ("output_type", "test_split", "target_delimiter", "fewshot_delimiter"):
        if not isinstance(getattr(task, name), str):
            raise ValueError(f"{where}.{name}: a string, not {type(getattr(task, name)).__name__}")
    if task.fewshot_split is not None and not isinstance(task.fewshot_split, str):
        raise ValueError(f"{where}.fewshot_split: a string, not {type(task.fewshot_split).__name__}")
    for name in TEMPLATE_FIELDS:
        value = getattr(task, name)
        if value is None:
            continue
        try:
            compile_template(value)
        except TemplateError as e:
            raise ValueError(f"{where}.{name}: {e}") from e
    if not isinstance(task.metrics, tuple) or not task.metrics:
        raise ValueError(f"{where}.metrics: give a tuple of metric names")
    for i, metric in enumerate(task.metrics):
        if not isinstance(metric, str) or metric not in METRICS:
            raise ValueError(
                f"{where}.metrics[{i}]: {metric!r} is not one of lm-eval's metrics "
                f"({', '.join(sorted(METRICS))}); an inline task names no other code"
            )


def resolve_data_path(path: str, data_root: str | None) -> str:
    """An inline task's file: URLs and absolute paths as they are, others under `data_root`."""
    if "://" in path or os.path.isabs(path) or data_root is None:
        return path
    return f"{data_root.rstrip('/')}/{path}"


# -- lm-eval task specs ---------------------------------------------------------------------------------


def lm_eval_spec(task: EvalTask, files: Mapping[str, str] | None) -> dict[str, Any]:
    """The dict lm-eval's `get_task_dict` takes for `task`. `files` (split -> local file) points
    lm-eval's `json` loader at the task's rows: an inline task's, or a registry task's from
    `task_data`; None keeps a registry task's own dataset (found in the datasets cache, offline)."""
    spec: dict[str, Any] = {"task": task.name, "num_fewshot": task.num_fewshot}
    if task.key != task.name:
        spec["task_alias"] = task.key
    if files is not None:
        spec.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": dict(files)})
    if not task.inline:
        return spec
    # Templates go to lm-eval compiled in the sandbox, as callables: lm-eval then calls them
    # instead of rendering the strings with its own (unsandboxed) Jinja environment.
    choices = task.doc_to_choice is not None
    assert task.doc_to_text is not None and task.doc_to_target is not None  # check_tasks saw to it
    spec.update(
        output_type=task.output_type,
        test_split=task.test_split,
        doc_to_text=TaskTemplate(task.doc_to_text, "doc_to_text", choices),
        doc_to_target=TaskTemplate(task.doc_to_target, "doc_to_target", choices),
        target_delimiter=task.target_delimiter,
        fewshot_delimiter=task.fewshot_delimiter,
        metric_list=[{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in task.metrics],
    )
    if task.doc_to_choice is not None:
        spec["doc_to_choice"] = TaskTemplate(task.doc_to_choice, "doc_to_choice", choices)
    if task.fewshot_split is not None:
        spec["fewshot_split"] = task.fewshot_split
    return spec
