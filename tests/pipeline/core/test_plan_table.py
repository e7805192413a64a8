"""`make_plan` over hand-made storage records, one row per situation (no storage, no clock).

Like Dagster's tests of its active execution fed with made-up events: each case builds the
records a snapshot would hold and checks the state and reason the pure planner gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pipeline.core.dag import build_dag
from pipeline.core.lease import LeaseRecord
from pipeline.core.plan import State, make_plan
from pipeline.core.records import Event, StatusEvent, StepRecord
from pipeline.errors import StorageError
from pipeline.step import Step, output_of, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

NOW = 1_000_000.0
HERE = "host-a/boot1"


def dag():
    raw = Step("raw/a", write_value, WriteConfig(output=this_output(), value=versioned(1)))
    train = Step("train/b", write_value, WriteConfig(output=this_output(), inputs=[output_of(raw)]))
    evaluate = Step("eval/c", write_value, WriteConfig(output=this_output(), inputs=[output_of(train)]))
    return build_dag([evaluate], "/prefix")


def events(*names: str) -> tuple[StatusEvent, ...]:
    return tuple(StatusEvent(name, token=i + 1, time=NOW - 100 + i) for i, name in enumerate(names))


def lease(*, expires: float, host: str = "host-b/boot9", pid: int = 7, released: bool = False) -> LeaseRecord:
    return LeaseRecord(3, "run-x", host, pid, None, expires, released)


INFO = {"fn": {"import_path": "m:f", "fingerprint": "abc"}, "prefix": "/prefix", "config": {"log_every": 10}}
DONE = StepRecord(events(Event.RUNNING, Event.SUCCESS), step_json=INFO)


@dataclass
class Case:
    id: str
    record: StepRecord
    expected: State
    reason: str
    force: str | None = None
    strict: bool = True
    alive: bool = True
    notes: tuple[str, ...] = ()


CASES = [
    Case("nothing yet", StepRecord(), State.RUN, "no output yet"),
    Case("finished", DONE, State.CACHED, "cached"),
    Case(
        "finished, unversioned field moved",
        StepRecord(DONE.events, step_json={**INFO, "config": {"log_every": 50}}),
        State.CACHED,
        "cached; unversioned field `log_every` 50→10",
        notes=("unversioned field `log_every` 50→10",),
    ),
    Case(
        "finished, code changed",
        StepRecord(DONE.events, step_json={**INFO, "fn": {"import_path": "m:f", "fingerprint": "old"}}),
        State.CACHED,
        "cached; code of `f` changed since",
        notes=("code of `f` changed since",),
    ),
    Case(
        "finished, metadata missing",
        StepRecord(DONE.events),
        State.CACHED,
        "cached; metadata missing (.step.json); identity matches",
        notes=("metadata missing (.step.json); identity matches",),
    ),
    Case("finished, forced", DONE, State.RUN, "forced by --force", force="train"),
    Case(
        "live lease elsewhere",
        StepRecord(events(Event.RUNNING), lease=lease(expires=NOW + 60)),
        State.WAIT,
        "running in run run-x (pid 7 on host-b)",
    ),
    Case(
        "stale lease: expired",
        StepRecord(events(Event.RUNNING), lease=lease(expires=NOW - 1)),
        State.RUN,
        "previous attempt was interrupted (its lease expired)",
    ),
    Case(
        "stale lease: its runner on this host is gone",
        StepRecord(events(Event.RUNNING), lease=lease(expires=NOW + 60, host=HERE)),
        State.RUN,
        "previous attempt was interrupted (its runner, pid 7, is gone)",
        alive=False,
    ),
    Case(
        "live lease of a process on this host",
        StepRecord(events(Event.RUNNING), lease=lease(expires=NOW + 60, host=HERE)),
        State.WAIT,
        "running in run run-x (pid 7 on host-a)",
    ),
    Case(
        "failed before",
        StepRecord((*events(Event.RUNNING), StatusEvent(Event.FAILED, 1, NOW, message="boom\ntrace"))),
        State.RUN,
        "previous attempt failed: boom",
    ),
    Case(
        "cancelled before",
        StepRecord(events(Event.RUNNING, Event.CANCELLED)),
        State.RUN,
        "previous attempt was cancelled",
    ),
    Case(
        "preempted before",
        StepRecord(events(Event.RUNNING, Event.PREEMPTED)),
        State.RUN,
        "previous attempt was preempted",
    ),
    Case(
        "a warning note does not change the state",
        StepRecord(events(Event.RUNNING, Event.SUCCESS, Event.WARNING), step_json=INFO),
        State.CACHED,
        "cached",
    ),
    Case(
        "corrupt, not strict",
        StepRecord(corrupt="line 2 is corrupt"),
        State.RUN,
        "CORRUPT: line 2 is corrupt",
        strict=False,
    ),
    Case(
        "corrupt, forced",
        StepRecord(corrupt="line 2 is corrupt"),
        State.RUN,
        "forced by --force; its corrupt .status is set aside",
        force="train",
    ),
]


def plan_with(record: StepRecord, **options: Any):
    d = dag()
    train = next(label for label, node in d.nodes.items() if node.name == "train/b")
    snapshot = {d.nodes[train].output_path: record}
    alive = options.pop("alive", True)
    plan = make_plan(
        d,
        snapshot,
        now=NOW,
        local_host=HERE,
        current_info=lambda label: INFO,
        alive=lambda pid, start: alive,
        **options,
    )
    return plan, train


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_of_one_step(case: Case):
    plan, train = plan_with(case.record, force=case.force, strict=case.strict, alive=case.alive)
    step = plan.steps[train]
    assert (step.state, step.reason) == (case.expected, case.reason)
    assert step.notes == case.notes
    assert step.forced == (case.force is not None)


def test_corrupt_status_is_an_error_when_strict():
    with pytest.raises(StorageError, match="step 'train/b': line 2 is corrupt"):
        plan_with(StepRecord(corrupt="line 2 is corrupt"))


def test_only_pulls_in_the_ancestors_and_skips_the_rest():
    plan, _train = plan_with(StepRecord(), only="^train/")
    states = {
        plan.steps[label].name: (plan.steps[label].state, plan.steps[label].reason) for label in plan.steps
    }
    assert states == {
        "raw/a": (State.RUN, "no output yet"),
        "train/b": (State.RUN, "no output yet"),
        "eval/c": (State.SKIPPED, "not selected by --only"),
    }


def test_a_finished_step_outside_only_stays_cached():
    """Regression: `--only X` listed a finished step it did not select as SKIPPED, which reads as
    missing; it is there, CACHED, whatever --only says."""
    plan, _train = plan_with(DONE, only="^raw/")
    states = {
        plan.steps[label].name: (plan.steps[label].state, plan.steps[label].reason) for label in plan.steps
    }
    assert states == {
        "raw/a": (State.RUN, "no output yet"),
        "train/b": (State.CACHED, "cached (not selected by --only)"),
        "eval/c": (State.SKIPPED, "not selected by --only"),
    }
