"""`explain`: identity diffs against earlier runs, checked against known changes, and the plan's one-liner."""

from __future__ import annotations

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.core.dag import build_dag
from pipeline.observe.explain import diff_payloads, explain_step, format_explanation, plan_explanations
from pipeline.run.experiment import prepare
from pipeline.run.scheduler.executor import RunReport
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore
from tests.pipeline.stepfns import WriteConfig, write_value


def steps(
    a_value: int = 1, b_value: int = 10, b_version: str | None = None, extra: bool = False
) -> list[Step]:
    """data/a -> train/b -> eval/c, and eval/c reads data/a too."""
    a = Step("data/a", write_value, WriteConfig(this_output(), versioned(a_value), None, "a"))
    b = Step(
        "train/b",
        write_value,
        WriteConfig(this_output(), versioned(b_value), None, "b", [output_of(a)], log_every=versioned(5))
        if extra
        else WriteConfig(this_output(), versioned(b_value), None, "b", [output_of(a)]),
        version=b_version,
    )
    c = Step(
        "eval/c", write_value, WriteConfig(this_output(), versioned(3), None, "c", [output_of(b), a / ""])
    )
    return [c]


def run(roots: list[Step], prefix) -> RunReport:
    report = run_experiment(roots, ExecutorMainConfig(prefix=str(prefix), backend="local"))
    assert isinstance(report, RunReport) and report.ok
    return report


def label_of(dag, name: str) -> str:
    return next(label for label, node in dag.nodes.items() if node.name == name)


def test_diff_of_payloads_names_each_kind_of_change():
    old = {
        "name": "s",
        "version": None,
        "versioned": {"lr": 0.003, "gone": 1},
        "inputs": {"x": ["a" * 64, None]},
    }
    new = {
        "name": "s",
        "version": "v2",
        "versioned": {"lr": 0.001, "new": 2},
        "inputs": {"x": ["b" * 64, None]},
    }
    described = [c.describe() for c in diff_payloads(old, new, upstream_names={"x": "tok/x"})]
    assert described == [
        "version None→'v2'",
        "gone 1→(absent)",
        "lr 0.003→0.001",
        "new (absent)→2",
        "upstream tok/x changed",
    ]
    assert diff_payloads(old, old) == []
    # A versioned dataclass (a dict in the payload) is diffed field by field.
    opt_old = {"versioned": {"opt": {"__class__": "Spec", "lr": 0.003, "betas": [0.9, 0.95]}}}
    opt_new = {"versioned": {"opt": {"__class__": "Spec", "lr": 0.001, "betas": [0.9, 0.99]}}}
    assert [c.describe() for c in diff_payloads(opt_old, opt_new)] == [
        "opt.betas.1 0.95→0.99",
        "opt.lr 0.003→0.001",
    ]
    # Unhashable values (lists) come through a changed upstream's causes too.
    up_old, up_new = {"versioned": {"layers": [1, 2]}}, {"versioned": {"layers": [1, 2, 3]}}
    same = new | {"version": None, "versioned": old["versioned"]}
    (change,) = diff_payloads(old, same, explain_upstream=lambda *a: tuple(diff_payloads(up_old, up_new)))
    assert change.describe() == "upstream x changed: layers [1, 2]→[1, 2, 3]"


def test_explain_follows_a_changed_upstream_to_the_field_that_moved(tmp_path):
    prefix = tmp_path / "prefix"
    run(steps(a_value=1), prefix)
    dag, store, _plan = prepare(steps(a_value=2), ExecutorMainConfig(prefix=str(prefix)))
    exp = explain_step(dag, label_of(dag, "eval/c"), store)
    assert exp.state is None
    (other,) = exp.others
    assert other.state == "SUCCESS"
    by_path = {c.path: c for c in other.changes}
    assert set(by_path) == {"inputs.0", "inputs.1"}  # both inputs of eval/c moved; nothing of its own
    via_b = by_path["inputs.0"]
    assert via_b.upstream == "train/b"
    (b_change,) = via_b.because
    assert b_change.upstream == "data/a"
    assert [c.describe() for c in b_change.because] == ["value 1→2"]
    direct = by_path["inputs.1"]
    assert [c.describe() for c in direct.because] == ["value 1→2"]
    text = format_explanation(exp, dag, now=other.time + 5)
    assert "vs eval/c-" in text and "(SUCCESS, 5s ago)" in text and "value 1→2" in text
    assert "value = 3" in text and "inputs.0 <- train/b-" in text


def test_explain_lists_every_other_run_with_its_own_diff(tmp_path):
    prefix = tmp_path / "prefix"
    run(steps(b_value=10), prefix)
    run(steps(b_value=20, b_version="v2"), prefix)
    dag, store, _plan = prepare(steps(b_value=30, extra=True), ExecutorMainConfig(prefix=str(prefix)))
    exp = explain_step(dag, label_of(dag, "train/b"), store)
    diffs = {o.label: [c.describe() for c in o.changes] for o in exp.others}
    assert sorted(diffs.values()) == [
        ["log_every (absent)→5", "value 10→30"],
        ["version 'v2'→None", "log_every (absent)→5", "value 20→30"],
    ]
    # The data/a step did not change: explaining it finds its own cached run and no other.
    same = explain_step(dag, label_of(dag, "data/a"), store)
    assert same.state == "SUCCESS" and same.others == ()


def test_a_missing_step_json_is_said_not_guessed(tmp_path):
    prefix = tmp_path / "prefix"
    report = run(steps(a_value=1), prefix)
    old_a = report.plan.dag.nodes[label_of(report.plan.dag, "data/a")].output_path
    (tmp_path / "prefix" / old_a.split("/prefix/", 1)[1] / ".step.json").unlink()
    dag, store, _plan = prepare(steps(a_value=2), ExecutorMainConfig(prefix=str(prefix)))
    (other,) = explain_step(dag, label_of(dag, "data/a"), store).others
    assert other.changes is None
    assert "cannot compare" in format_explanation(
        explain_step(dag, label_of(dag, "data/a"), store), dag, now=0
    )
    # Downstream, the changed upstream is named even though its earlier payload is gone.
    (c_other,) = explain_step(dag, label_of(dag, "eval/c"), store).others
    text = format_explanation(explain_step(dag, label_of(dag, "eval/c"), store), dag, now=0)
    assert all(c.kind == "input" for c in c_other.changes)
    assert "its earlier run is not under the prefix" in text


def test_plan_one_liners_only_for_new_identities(tmp_path):
    prefix = tmp_path / "prefix"
    run(steps(a_value=1), prefix)
    result = run_experiment(steps(a_value=2), ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    lines = plan_explanations(result, LocalStorage())
    by_name = {result.dag.nodes[label].name: line for label, line in lines.items()}
    assert by_name["data/a"].startswith("new identity: value 1→2 (vs data/a-")
    assert by_name["data/a"].endswith(" SUCCESS)")
    assert by_name["train/b"].startswith("new identity: upstream data/a changed: value 1→2")
    # Through two hops, the line names the step where the change is.
    assert by_name["eval/c"].startswith(
        "new identity: upstream train/b changed: data/a value 1→2; upstream data/a changed: value 1→2 (vs"
    )
    # Nothing for cached steps, nor for a step never run under any identity.
    cached = run_experiment(steps(a_value=1), ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    assert plan_explanations(cached, LocalStorage()) == {}
    fresh = run_experiment(steps(), ExecutorMainConfig(prefix=str(tmp_path / "empty"), dry_run=True))
    assert plan_explanations(fresh, LocalStorage()) == {}


def test_build_dag_payload_is_what_step_json_records(tmp_path):
    prefix = tmp_path / "prefix"
    report = run(steps(), prefix)
    dag = build_dag(steps(), str(prefix))
    store = StepStore(LocalStorage())
    for label, node in dag.nodes.items():
        info = store.read_step_json(report.plan.dag.nodes[label].output_path)
        assert info is not None and info["identity"] == dict(node.identity.payload)
