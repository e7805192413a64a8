"""Task specs for `task_eval`: parsing, the checks made when a step is declared, and lm-eval's view
of an inline task (real lm-eval, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import StepDeclarationError
from steps.evaluation.demo_tasks import DEMO_TASKS
from steps.evaluation.eval_tasks import (
    EvalTask,
    _indexed_names,
    as_task,
    check_tasks,
    inline_task,
    lm_eval_spec,
    registry_names,
    registry_task,
)

ROOT = Path(__file__).resolve().parents[3]
CORE = ["hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "boolq", "mmlu", "openbookqa"]


def test_strings_name_registry_tasks_with_shots():
    assert as_task("hellaswag:10") == registry_task("hellaswag", 10)
    assert as_task("piqa") == EvalTask("piqa")
    assert registry_task("mmlu", 5).key == "mmlu_5shot"
    with pytest.raises(ValueError, match="whole number"):
        as_task("hellaswag:ten")


def test_the_core_base_model_tasks_are_known_without_loading_the_registry():
    assert set(CORE) <= _indexed_names()
    assert check_tasks([f"{name}:0" for name in CORE], None, None)


def test_an_unknown_task_name_suggests_close_names():
    with pytest.raises(
        ValueError, match=r"tasks\[1\] \(hellaswog\): lm-eval has no task 'hellaswog'; did you mean hellaswag"
    ):
        check_tasks(["piqa", "hellaswog"], None, None)


def test_the_quick_index_agrees_with_lm_evals_registry_on_what_it_lists():
    # Every name the text index finds but the TaskManager does not would be a false "known".
    assert len(_indexed_names() - registry_names()) <= 2


def test_registry_task_data_directory_must_hold_the_task(tmp_path):
    (tmp_path / "piqa").mkdir()
    assert check_tasks(["piqa"], None, str(tmp_path))
    with pytest.raises(ValueError, match=r"boolq.*its data is missing: no directory .*boolq"):
        check_tasks(["boolq"], None, str(tmp_path))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"output_type": "ranking"}, r"output_type: 'ranking' is not one of"),
        ({"doc_to_choice": None}, r"doc_to_choice: an inline multiple_choice task needs"),
        ({"test_split": "validation"}, r"test_split: no file for split 'validation'"),
        ({"num_fewshot": 2, "fewshot_split": None}, r"fewshot_split: 2-shot needs a split"),
        ({"data": {"test": "data/tasks/sums/nope.jsonl"}}, r"data\['test'\]: task data missing: no file"),
        ({"name": "has space"}, r"name: 'has space' is not a task name"),
    ],
)
def test_malformed_inline_tasks_name_the_field(change, match):
    import dataclasses

    task = dataclasses.replace(DEMO_TASKS[0], **change)
    with pytest.raises(ValueError, match=match):
        check_tasks([task], str(ROOT), None)


def test_a_task_listed_twice_and_no_tasks_are_refused():
    with pytest.raises(ValueError, match="listed twice"):
        check_tasks(["piqa", "piqa:0"], None, None)
    with pytest.raises(ValueError, match="at least one task"):
        check_tasks([], None, None)


def test_the_step_refuses_bad_tasks_at_declaration():
    from steps.evaluation.task_eval import task_eval_step
    from tests.steps.tiny import declared_training

    with pytest.raises(StepDeclarationError, match=r"step 'tasks/x', field `tasks\[0\] \(hellaswog\)`"):
        task_eval_step("tasks/x", train=declared_training(), tasks=["hellaswog"])


def test_an_inline_task_through_lm_eval(tmp_path):
    from lm_eval.tasks import TaskManager, get_task_dict

    rows = [
        {"q": f"{i} + 1 =", "options": [str(i + 1), str(i + 2), "x"][: 2 + i % 2], "answer": 0}
        for i in range(6)
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = inline_task(
        "plus_one",
        {"test": str(path)},
        doc_to_text="{{q}}",
        doc_to_choice="{{options}}",
        doc_to_target="{{answer}}",
    )
    (checked,) = check_tasks([task], None, None)
    built = get_task_dict([lm_eval_spec(checked, {"test": str(path)})], TaskManager())
    lm_task = built["plus_one"]
    docs = list(lm_task.eval_docs)
    assert len(docs) == 6 and lm_task.doc_to_choice(docs[1]) == ["2", "3", "x"]
    from steps.evaluation.harness import chance

    assert chance(lm_task, None) == pytest.approx((3 * 0.5 + 3 / 3) / 6)
    assert chance(lm_task, 2) == pytest.approx((0.5 + 1 / 3) / 2)


def test_a_task_at_two_few_shot_counts_is_two_tasks(tmp_path):
    import dataclasses

    from steps.evaluation.demo_tasks import demo_task
    from steps.evaluation.harness import build_tasks, local_task_files
    from steps.evaluation.task_eval import TaskEvalConfig

    tasks = check_tasks([demo_task("sums"), demo_task("sums", 2)], str(ROOT), None)
    config = TaskEvalConfig(train="t", data="d", output=str(tmp_path), tasks=tasks, data_root=str(ROOT))
    with local_task_files(tasks, config) as (files, _scratch):
        task_dict, chances, names = build_tasks(tasks, files, config)
    assert sorted(task_dict) == ["sums", "sums_2shot"] and names == {
        "sums": "sums",
        "sums_2shot": "sums_2shot",
    }
    assert task_dict["sums_2shot"].config.num_fewshot == 2 and task_dict["sums"].config.num_fewshot == 0
    assert chances == {"sums": 0.25, "sums_2shot": 0.25}
    # The same task twice under one key is refused before lm-eval sees it.
    with pytest.raises(ValueError, match="listed twice"):
        check_tasks(
            [demo_task("sums"), dataclasses.replace(demo_task("sums"), doc_to_text="{{ query }}")],
            str(ROOT),
            None,
        )


def test_registry_tasks_keep_their_own_config_and_read_rows_from_task_data(tmp_path):
    """A registry task is built from lm-eval's own config (its splits, templates and
    process_docs), its rows from `<task_data>/<task>/`, at each few-shot count asked. (lm-eval
    0.4.13 builds a new, config-less task from a dict spec: the rows then had no split to read.)"""
    import sys

    from steps.evaluation.harness import build_tasks, local_task_files, registry_rows
    from steps.evaluation.task_eval import TaskEvalConfig

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_registry_task_rows import write_rows

    write_rows(tmp_path / "rows")
    tasks = check_tasks(["hellaswag:0", "hellaswag:10", "mmlu:5"], None, str(tmp_path / "rows"))
    config = TaskEvalConfig(
        train="t", data="d", output=str(tmp_path), tasks=tasks, task_data=str(tmp_path / "rows")
    )
    with local_task_files(tasks, config) as (files, scratch), registry_rows(config.task_data, scratch):
        task_dict, chances, _names = build_tasks(tasks, files, config)
    zero, ten = task_dict["hellaswag"], task_dict["hellaswag_10shot"]
    assert (zero.config.num_fewshot, ten.config.num_fewshot) == (0, 10)
    doc = next(iter(ten.eval_docs))
    assert doc["query"].startswith("Adding numbers: A student reads")  # HellaSwag's process_docs ran
    assert ten.doc_to_choice(doc) == ["12.", "11.", "10.", "13."] and len(list(ten.eval_docs)) == 4
    subjects = [c for c in chances if c.startswith("mmlu_")]
    assert len(subjects) == 57 and chances["hellaswag_10shot"] == 0.25


BAD_ROWS = [
    (
        '{"query": "1 + 1 =", "choices": ["2", "3"], "gold": 0}\n{"query": "2 + 2 =", "choi',
        "line 2: not JSON",
    ),
    ('{"query": "1 + 1 =", "gold": 0}\n', "line 1: doc_to_choice '{{choices}}' cannot be read from this row"),
    (
        '{"query": "1 + 1 =", "choices": ["2", "3"], "gold": 2}\n',
        "line 1: the answer index 2 is outside its 2",
    ),
    ('{"query": "1 + 1 =", "choices": [], "gold": 0}\n', "line 1: doc_to_choice gives [], not a non-empty"),
    ('["1 + 1 =", ["2"], 0]\n', "line 1: a row is a JSON object, not list"),
]


@pytest.mark.parametrize(("rows", "expect"), BAD_ROWS)
def test_a_task_files_bad_row_is_found_when_the_step_is_declared(tmp_path, rows, expect):
    """A malformed row, a row without choices, an answer outside its choices: lm-eval would take
    them (a wrong accuracy, or a crash mid-evaluation); the declaration names task, file and line."""
    import dataclasses

    (tmp_path / "test.jsonl").write_text(rows)
    task = dataclasses.replace(DEMO_TASKS[0], data={"test": "test.jsonl"}, num_fewshot=0, fewshot_split=None)
    with pytest.raises(ValueError) as err:
        check_tasks([task], str(tmp_path), None)
    message = str(err.value)
    assert message.startswith(f"tasks[0] (sums).data['test']: {tmp_path}/test.jsonl {expect}"), message
    from steps.evaluation.task_eval import task_eval_step
    from tests.steps.tiny import declared_training

    with pytest.raises(StepDeclarationError, match=r"step 'tasks/x', field `tasks\[0\] \(sums\)"):
        task_eval_step("tasks/x", train=declared_training(), tasks=[task], data_root=str(tmp_path))


def test_a_remote_task_files_bad_row_fails_the_step_with_the_same_message(tmp_path):
    import dataclasses

    import fsspec

    from steps.evaluation.harness import local_task_files
    from steps.evaluation.task_eval import TaskEvalConfig

    url = "memory://drydock-tasks/sums/test.jsonl"
    with fsspec.open(url, "w") as f:
        f.write('{"query": "1 + 1 =", "choices": ["2", "3"], "gold": 7}\n')
    task = dataclasses.replace(DEMO_TASKS[0], data={"test": url}, num_fewshot=0, fewshot_split=None)
    check_tasks([task], None, None)  # remote: not read at declaration
    config = TaskEvalConfig(
        train=str(tmp_path), data=str(tmp_path), output=str(tmp_path / "out"), tasks=(task,)
    )
    with (
        pytest.raises(
            ValueError, match=rf"^tasks\[0\] \(sums\).data\['test'\]: {url} line 1: the answer index 7"
        ),
        local_task_files([task], config),
    ):
        pass


def test_lm_eval_renders_an_inline_task_through_the_sandbox(tmp_path):
    """lm-eval renders template strings with its own, unsandboxed Jinja: an inline task's templates
    must reach it as the sandboxed callables. A row that makes a 20-million-character prompt is
    refused by the sandbox's limits; lm-eval's own Jinja would render it."""
    from lm_eval.tasks import TaskManager, get_task_dict

    from steps.evaluation.task_templates import TemplateError

    rows = [{"q": "ab", "n": 1, "options": ["x", "y"], "answer": 0}]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = inline_task(
        "repeat",
        {"test": str(path)},
        doc_to_text="{{ q * n }}",
        doc_to_choice="{{ options }}",
        doc_to_target="{{ answer }}",
    )
    (checked,) = check_tasks([task], None, None)
    lm_task = get_task_dict([lm_eval_spec(checked, {"test": str(path)})], TaskManager())["repeat"]
    assert lm_task.doc_to_text(rows[0]) == "ab"
    with pytest.raises(TemplateError, match="over the limit"):
        lm_task.doc_to_text({**rows[0], "n": 10_000_000})
