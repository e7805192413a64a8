"""The plan: what each step of a DAG will do in this run, and why. Pure.

`make_plan(dag, snapshot, ...)` takes the step records read from storage as an argument and
never reads storage itself, so the same snapshot always gives the same plan. The plan is an
immutable value; `Plan.subset` returns a new one.

States:
    CACHED   finished under this identity (with drift notes if config or code moved since)
    RUN      will run here (reason: no output yet, forced, previous attempt failed, ...)
    WAIT     a live runner elsewhere holds its lease; this run waits for it
    BLOCKED  cannot run because a dependency failed (set during execution)
    SKIPPED  not selected by `--only`
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from pipeline.core import graph
from pipeline.core.dag import Dag, labels_matching
from pipeline.core.drift import config_drift
from pipeline.core.records import Event, StepRecord
from pipeline.errors import StepDeclarationError, StorageError

__all__ = ["Plan", "State", "StepPlan", "make_plan"]


class State(enum.StrEnum):
    """A step's state in a plan or a run."""

    CACHED = "CACHED"
    RUN = "RUN"
    WAIT = "WAIT"
    BLOCKED = "BLOCKED"
    SKIPPED = "SKIPPED"
    # Final states of a run, used by reports and manifests:
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


# Not frozen, and never assigned to after it is made: a frozen dataclass sets each field in
# __init__ through object.__setattr__, three times the cost of a plain slot, and a plan makes
# one per step (with StepNode, StatusEvent and StepPlan
# unfrozen, a 10,000-step cached plan took 20-40 ms less). `Plan.steps` is a read-only mapping.
@dataclass(slots=True)
class StepPlan:
    """One step's entry in the plan."""

    label: str
    name: str
    hash: str
    output_path: str
    state: State
    reason: str
    notes: tuple[str, ...] = ()
    deps: tuple[str, ...] = ()
    forced: bool = False
    """Selected by `--force`: runs even over an existing SUCCESS (or a corrupt status)."""
    record: StepRecord | None = None
    """The storage snapshot this entry was planned from."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "hash": self.hash,
            "output_path": self.output_path,
            "state": self.state.value,
            "reason": self.reason,
            "notes": list(self.notes),
            "deps": list(self.deps),
        }


@dataclass(frozen=True)
class Plan:
    """An immutable plan, in the DAG's topological order."""

    dag: Dag
    steps: Mapping[str, StepPlan]

    def in_state(self, *states: State) -> list[str]:
        """Labels of the steps in any of `states`, in order."""
        return [label for label, sp in self.steps.items() if sp.state in states]

    def counts(self) -> dict[str, int]:
        return dict(Counter(sp.state.value for sp in self.steps.values()))

    def subset(self, labels: set[str], reason: str = "not selected") -> Plan:
        """A new plan in which steps outside `labels` are SKIPPED; a finished one stays CACHED (it
        is there either way: SKIPPED would read as missing)."""
        steps = {
            label: sp
            if label in labels
            else replace(sp, reason=f"cached ({reason})")
            if sp.state == State.CACHED
            else replace(sp, state=State.SKIPPED, reason=reason, notes=())
            for label, sp in self.steps.items()
        }
        return Plan(self.dag, MappingProxyType(steps))

    def to_json(self, **extra: Any) -> dict[str, Any]:
        return {
            **extra,
            "prefix": self.dag.prefix,
            "counts": self.counts(),
            "steps": [sp.to_json() for sp in self.steps.values()],
        }


def make_plan(
    dag: Dag,
    snapshot: Mapping[str, StepRecord],
    *,
    now: float,
    local_host: str,
    only: str | None = None,
    force: str | None = None,
    current_info: Callable[[str], Mapping[str, Any]] | None = None,
    alive: Callable[[int, str | None], bool] | None = None,
    strict: bool = True,
    unchanged: Collection[str] = (),
    input_notes: Mapping[str, Sequence[str]] | None = None,
) -> Plan:
    """Plan `dag` against `snapshot` (step output path -> record).

    `current_info(label)` gives the current `.step.json` content of a step; with it, cached
    steps get drift notes, except the `unchanged` ones (labels whose recorded config and code are
    known to equal the current ones, by the digests recorded with their SUCCESS). `input_notes`
    (label -> notes) says how the files outside the prefix a cached step read have changed since
    (`pipeline.run.records.listing`); they come first. `only` and
    `force` are regexes on step names. A step whose `.status` is corrupt is an error unless it is
    forced (or `strict` is off, for status displays). `alive(pid, start)` tells a running step
    whose runner died on this host (`pipeline.processes.pid_alive`); without it, only the lease's
    expiry does.
    """
    matched = labels_matching(dag, force)
    # A forced step's dependents are redone too (a retrained model is evaluated again): its
    # identity does not change, so without this they would stay cached on the old output.
    forced: set[str] = set()
    if matched:
        every_input = {label: (*node.deps, *node.soft_deps) for label, node in dag.nodes.items()}
        forced = matched | graph.descendants(every_input, matched)
    notes_of = input_notes or {}
    steps: dict[str, StepPlan] = {}
    for label, node in dag.nodes.items():
        record = snapshot.get(node.output_path) or StepRecord()
        common = {
            "label": label,
            "name": node.name,
            "hash": node.identity.short,
            "output_path": node.output_path,
            "deps": node.deps,
            "record": record,
        }
        if label in forced:
            reason = "forced by --force" if label in matched else "forced: downstream of a --force step"
            reason += "; its corrupt .status is set aside" if record.corrupt else ""
            steps[label] = StepPlan(state=State.RUN, reason=reason, forced=True, **common)
        elif record.corrupt:
            if strict:
                raise StorageError(f"step {node.name!r}: {record.corrupt}")
            steps[label] = StepPlan(state=State.RUN, reason=f"CORRUPT: {record.corrupt}", **common)
        elif record.succeeded:
            drifted = current_info is not None and label not in unchanged
            notes = config_drift(record.step_json, current_info(label)) if drifted else []
            notes = [*notes_of.get(label, ()), *notes]
            reason = "cached" + (f"; {notes[0]}" if notes else "")
            steps[label] = StepPlan(state=State.CACHED, reason=reason, notes=tuple(notes), **common)
        elif record.state == Event.RUNNING and not record.lease_stale(now, local_host, alive):
            assert record.lease is not None
            steps[label] = StepPlan(
                state=State.WAIT, reason=f"running in {record.lease.describe()}", **common
            )
        else:
            steps[label] = StepPlan(state=State.RUN, reason=_run_reason(record, now), **common)

    plan = Plan(dag, MappingProxyType(steps))
    if only:
        selected = labels_matching(dag, only)
        if not selected:
            raise StepDeclarationError(None, f"--only {only!r} matches no step name", field="only")
        plan = plan.subset(selected | graph.ancestors(dag.deps, selected), reason="not selected by --only")
    return plan


def _run_reason(record: StepRecord, now: float) -> str:
    last = record.last
    if last is None:
        return "no output yet"
    if last.event == Event.FAILED:
        return "previous attempt failed" + (f": {last.message.splitlines()[0]}" if last.message else "")
    if last.event == Event.RUNNING:
        lease = record.lease
        if lease is not None and not lease.released and now < lease.expires:
            return f"previous attempt was interrupted (its runner, pid {lease.pid}, is gone)"
        return "previous attempt was interrupted (its lease expired)"
    if last.event in (Event.CANCELLED, Event.PREEMPTED):
        return f"previous attempt was {last.event.lower()}"
    return f"previous attempt ended {last.event}"
