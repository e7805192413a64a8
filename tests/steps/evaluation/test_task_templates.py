"""An inline task is data, not code (issue 29, part 1): its templates render in a sandbox, its
metrics are lm-eval's own names, and a shared manifest carrying anything else is refused, naming
the step and field, before anything runs."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from jinja2.exceptions import SecurityError

from pipeline.core.dag import build_dag
from pipeline.run.records.recipe import iter_recipes
from steps.evaluation.demo_tasks import DEMO_TASKS, demo_task
from steps.evaluation.eval_tasks import METRICS, check_tasks, lm_eval_spec
from steps.evaluation.task_templates import TaskTemplate, TemplateError, compile_template
from tests.pipeline.run.records.test_recipe import drydock

ROOT = Path(__file__).resolve().parents[3]


def escapes(marker: Path) -> list[str]:
    """Templates that run `touch marker` under lm-eval's plain Jinja environment."""
    command = f"touch {marker}"
    return [
        "{% set _ = lipsum.__globals__['os'].system('" + command + "') %}{{ choices }}",
        "{{ cycler.__init__.__globals__.os.system('" + command + "') }}{{ choices }}",
        "{{ (choices|attr('__class__')) }}{{ choices }}",
        "{% include '/etc/passwd' %}{{ choices }}",
        "{% import 'os' as os %}{{ choices }}",
        "{% macro m() %}{% endmacro %}{{ choices }}",
    ]


def test_lm_evals_own_environment_runs_the_escape(tmp_path):
    # What the check is for: handed the template as a string, lm-eval runs the command.
    from lm_eval.utils import apply_template

    marker = tmp_path / "pwned"
    apply_template(escapes(marker)[0], {"choices": ["a", "b"]})
    assert marker.exists()


def test_escapes_are_refused_naming_the_field_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    for template in escapes(marker):
        task = dataclasses.replace(demo_task("sums"), doc_to_choice=template)
        with pytest.raises(ValueError, match=r"^tasks\[0\] \(sums\)\.doc_to_choice: .*not allowed"):
            check_tasks([task], str(ROOT), None)
        with pytest.raises(TemplateError):
            TaskTemplate(template, "doc_to_choice", True)
    assert not marker.exists()


def test_what_the_static_check_cannot_see_the_sandbox_refuses_when_rendering():
    # A dunder spelled at run time passes the parse-time check; the sandbox still hides it.
    template = compile_template("{{ query['_' ~ '_class__'] }}")
    with pytest.raises(SecurityError, match="unsafe"):
        template.render(query="x")
    immutable = compile_template("{{ choices.append('x') }}")
    with pytest.raises(SecurityError):
        immutable.render(choices=["a"])


@pytest.mark.parametrize(
    ("metric", "why"),
    [("/tmp/evil.py", "not one of lm-eval's metrics"), ("accuracy", "not one of"), (3, "not one of")],
)
def test_metrics_are_lm_evals_own_names(metric, why):
    task = dataclasses.replace(demo_task("sums"), metrics=("acc", metric))
    with pytest.raises(ValueError, match=rf"tasks\[0\] \(sums\)\.metrics\[1\]: .*{why}"):
        check_tasks([task], str(ROOT), None)


def test_the_metric_allowlist_is_lm_evals_registry():
    import lm_eval.api.metrics  # noqa: F401  (fills the registry)
    from lm_eval.api.registry import METRIC_REGISTRY

    assert set(METRIC_REGISTRY) >= METRICS


def test_templates_that_format_a_row_still_work():
    rows = {"question": "2 + 2 =", "options": ["3", "4"], "answer": 1, "label": "B", "text": "a\nb"}
    cases = {
        "{{question}}": "2 + 2 =",
        "{{ question|trim|upper }}": "2 + 2 =",
        "{{ text.split('\\n')[0] }}": "a",
        "{{ 'ABCD'.index(label) }}": "1",
        "{% for o in options %}{{ loop.index }}. {{ o }} {% endfor %}": "1. 3 2. 4 ",
        "{% set letters = ['A', 'B'] %}{{ letters[answer] }}": "B",
        "{{ text|regex_replace('\\n', ' ') }}": "a b",
    }
    for source, expected in cases.items():
        assert compile_template(source).render(**rows) == expected, source


def test_the_sandbox_gives_what_lm_eval_gave_for_the_demo_tasks():
    from lm_eval.tasks import TaskManager, get_task_dict
    from lm_eval.utils import apply_template

    for task in DEMO_TASKS:
        files = {split: str(ROOT / path) for split, path in (task.data or {}).items()}
        (lm_task,) = get_task_dict([lm_eval_spec(task, files)], TaskManager()).values()
        for doc in list(lm_task.eval_docs)[:50]:
            assert lm_task.doc_to_text(doc) == apply_template(task.doc_to_text, doc)
            assert lm_task.doc_to_choice(doc) == json.loads(json.dumps(doc["choices"]))
            assert lm_task.doc_to_target(doc) == int(apply_template(task.doc_to_target, doc))


def recorded(tmp_path: Path) -> dict:
    """A manifest of a task_eval step on a (not yet run) tiny training, as a run records it."""
    from steps.evaluation.task_eval import task_eval_step
    from tests.steps.tiny import declared_training

    step = task_eval_step(
        "tasks/x", train=declared_training(), tasks=[demo_task("sums")], data_root=str(ROOT)
    )
    prefix = str(tmp_path / "runs")
    dag = build_dag([step], prefix)
    recipes = dict(iter_recipes(dag))
    return {
        "experiment": "tasks",
        "prefix": prefix,
        "roots": list(dag.roots),
        "steps": [
            {"label": label, "name": node.name, "recipe": recipes[label]} for label, node in dag.nodes.items()
        ],
    }


def tasks_of(manifest: dict) -> dict:
    entry = next(e for e in manifest["steps"] if e["name"] == "tasks/x")
    (task,) = entry["recipe"]["config"]["fields"]["tasks"]["__versioned__"]["__tuple__"]
    return task["fields"]


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("doc_to_choice", None, "field `tasks[0] (sums).doc_to_choice`: the name '_' is not allowed"),
        (
            "metrics",
            {"__tuple__": ["acc", "PATH"]},
            "field `tasks[0] (sums).metrics[1]`: 'PATH' is not one of",
        ),
    ],
)
def test_a_shared_manifest_with_code_in_its_tasks_is_refused_before_anything_runs(
    tmp_path, field, value, expect
):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n")
    manifest = recorded(tmp_path)
    fields = tasks_of(manifest)
    if field == "doc_to_choice":
        fields[field] = escapes(marker)[0]
    else:
        value["__tuple__"][1] = str(evil)
        fields[field] = value
        expect = expect.replace("PATH", str(evil))
    path = tmp_path / "shared.json"
    path.write_text(json.dumps(manifest))
    for command in (["plan", str(path)], ["rerun", str(path), "--dry_run"]):
        result = drydock(*command, "--prefix", str(tmp_path / "elsewhere"))
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "step 'tasks/x'" in result.stderr and expect in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert not marker.exists()
    # The untouched manifest plans (the check refuses the edit, not the recipe).
    path.write_text(json.dumps(recorded(tmp_path)))
    result = drydock("plan", str(path), "--prefix", str(tmp_path / "elsewhere"))
    assert result.returncode == 0, result.stderr


COSTLY = {
    # Refused when the template is checked: before any row is rendered.
    "{% if 9**(9**9) %}{% endif %}{{ query }}": "`**` is not allowed",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ query }}": (
        "loops may not nest"
    ),
    "{% for x in [query] recursive %}{{ loop([]) }}{% endfor %}": "a `recursive` loop is not allowed",
    "{% block b %}{{ self.b() }}{% endblock %}": "`block` is not allowed",
}
COSTLY_WHEN_RENDERED = {
    "{{ query|regex_replace('(a|aa)+$', '') }}": "the regular expression '(a|aa)+$' took more than 2 s",
    "{{ query.center(1000000000) }}": "the argument 1,000,000,000 is over the limit",
    "{{ '%9999999999d' % 1 }}": "a format with a width of 1,000,000 or more",
    "{{ '{:>9999999999}'.format(1) }}": "a format with a width of 1,000,000 or more",
    "{{ '{:>9999999999}'['format'](1) }}": "a format with a width of 1,000,000 or more",
    "{{ '%9999999999d'|format(1) }}": "a format with a width of 1,000,000 or more",
    "{{ 'x' * 1000000000 }}": "a value of 1,000,000,000 items is over the limit",
    "{{ (range(100000)|list) * 100 }}": "a value of 10,000,000 items is over the limit",
    "{{ 99999999999999999999 * 99999999999999999999 * 99999999999999999999 * 99999999999999999999"
    " * 99999999999999999999 * 99999999999999999999 * 99999999999999999999 * 99999999999999999999"
    " * 99999999999999999999 * 99999999999999999999 * 99999999999999999999 * 99999999999999999999"
    " }}": None,  # 800 bits: within the limit
    "{% for i in range(100000) %}{{ query * 20 }}{% endfor %}": "the output is over the limit",
    "{% for i in range(100000) %}{{ (range(100000)|list|sort|length) }}{% endfor %}": "took more than 2 s",
}


@pytest.mark.parametrize("source", list(COSTLY))
def test_a_template_whose_cost_is_unbounded_is_refused_when_checked(source):
    with pytest.raises(TemplateError, match=re.escape(COSTLY[source])):
        compile_template(source)


@pytest.mark.parametrize("source", list(COSTLY_WHEN_RENDERED))
def test_a_render_over_a_limit_stops_with_the_limit_named(source):
    template = TaskTemplate(source, "doc_to_text", has_choices=False)
    row = {"query": "a" * 40 + "b"}
    expect = COSTLY_WHEN_RENDERED[source]
    if expect is None:
        assert template(row) == str(99999999999999999999**12)
        return
    with pytest.raises(TemplateError, match=re.escape(expect)):
        template(row)


@pytest.mark.parametrize(
    "template",
    [
        "{% if 9**(9**9) %}{% endif %}{{ question }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ question }}",
        "{{ ('a' * 40 ~ 'b')|regex_replace('(a|aa)+$', '') }}{{ question }}",
    ],
)
def test_a_shared_manifest_whose_templates_never_end_cannot_hang_plan(tmp_path, template):
    """Regression (denial of service): planning rendered these for ever (the first deaf to
    Ctrl-C, folded in C at compile time). Now `plan` ends at once with the step, field and limit."""
    manifest = recorded(tmp_path)
    tasks_of(manifest)["doc_to_text"] = template
    path = tmp_path / "shared.json"
    path.write_text(json.dumps(manifest))
    result = drydock("plan", str(path), "--prefix", str(tmp_path / "elsewhere"), timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "step 'tasks/x'" in result.stderr and "doc_to_text" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
