"""A cached plan reads and diffs `.step.json` only for steps whose recorded digests differ."""

from __future__ import annotations

import json

import pytest

from pipeline import ExecutorMainConfig, Step, run_experiment, this_output, versioned
from pipeline.core.plan import State
from pipeline.run.experiment import prepare
from pipeline.storage.step_store import StepStore
from tests.pipeline.stepfns import WriteConfig, write_value


def steps(log_every: int = 10) -> list[Step]:
    a = Step("d/a", write_value, WriteConfig(output=this_output(), value=versioned(1), log_every=log_every))
    b = Step("d/b", write_value, WriteConfig(output=this_output(), value=versioned(2)))
    return [a, b]


@pytest.fixture
def done(tmp_path):
    config = ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local")
    assert run_experiment(steps(), config).ok
    return config


def reads_of_step_json(monkeypatch) -> list[str]:
    calls: list[str] = []
    original = StepStore.read_step_json

    def counting(self, step_dir):
        calls.append(step_dir.rsplit("/", 1)[-1])
        return original(self, step_dir)

    monkeypatch.setattr(StepStore, "read_step_json", counting)
    return calls


def test_success_records_the_digests(done):
    _dag, store, plan = prepare(steps(), done)
    for sp in plan.steps.values():
        data = sp.record.last.data
        assert len(data["drift"]) == 16 and data["step_json"] == store.step_json_digest(sp.output_path)


def test_an_unchanged_cached_plan_parses_no_step_json(done, monkeypatch):
    calls = reads_of_step_json(monkeypatch)
    _dag, _store, plan = prepare(steps(), done)
    assert [sp.reason for sp in plan.steps.values()] == ["cached", "cached"]
    assert calls == []


def test_a_changed_unversioned_field_reads_only_that_step_and_notes_it(done, monkeypatch):
    calls = reads_of_step_json(monkeypatch)
    _dag, _store, plan = prepare(steps(log_every=50), done)
    a, b = plan.steps.values()
    assert a.state == State.CACHED and a.reason == "cached; unversioned field `log_every` 10→50"
    assert b.reason == "cached"
    assert [c.rsplit("-", 1)[0] for c in calls] == ["a"]


def test_a_cached_plan_reads_only_status_and_trusts_success_over_a_hand_edited_step_json(done, monkeypatch):
    """One read per cached step: `.step.json` is read only where the drift digest differs; a
    copy edited by hand changes no plan (SUCCESS records what ran)."""
    _dag, _store, plan = prepare(steps(), done)
    a = next(iter(plan.steps.values()))
    path = f"{a.output_path}/.step.json"
    with open(path) as f:
        info = json.load(f)
    info["config"]["log_every"] = 99
    with open(path, "w") as f:
        json.dump(info, f)
    read: list[str] = []
    original = StepStore.read_step_json
    monkeypatch.setattr(StepStore, "read_step_json", lambda self, d: read.append(d) or original(self, d))
    _dag, _store, plan = prepare(steps(), done)
    assert next(iter(plan.steps.values())).reason == "cached" and read == []
    # A changed declaration differs from what SUCCESS recorded: the note compares with the file.
    _dag, _store, plan = prepare(steps(log_every=50), done)
    assert next(iter(plan.steps.values())).reason == "cached; unversioned field `log_every` 99→50"
    assert read == [a.output_path]
