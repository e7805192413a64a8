"""Calling the hooks a step function declares (`pipeline.step.step_function`).

`preview(config) -> str | Mapping | None` is called with the resolved config of every step in
the plan that is not SKIPPED. A string is shown under the plan table; a mapping (e.g. a training
step's parameter and token counts) is shown as `key: value` lines, its keys join the step's
entry in `--json` plans, and it is recorded as the step's `summary` in `.step.json`. A preview
that needs its inputs returns None until they exist. A failing preview is shown, never raised:
that is what a dry run is for (e.g. "would fail: component 'code' would be read 3.2 times").

Likewise `report(config) -> str | Mapping | None`, called for every step that succeeded or was
cached, summarizes its outputs (an evaluation table, where the loss plot is): the end-of-run
summary prints it, and the executor records it with the step's SUCCESS for the dashboard.
Reports read outputs; they never change them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.core.dag import Dag, labels_matching, resolved_config
from pipeline.core.plan import Plan, State
from pipeline.core.report import RunReport
from pipeline.errors import StepDeclarationError
from pipeline.step import StepHooks, hooks_of

__all__ = [
    "call_hook",
    "step_compilations",
    "step_previews",
    "step_reports",
    "step_summary",
    "step_warnings",
]

logger = logging.getLogger(__name__)


def step_previews(plan: Plan) -> dict[str, str | Mapping[str, Any]]:
    """Label -> preview, for the steps whose function has a `preview` with something to say."""
    labels = plan.in_state(State.RUN, State.WAIT, State.CACHED)
    return _call_each(plan.dag, labels, lambda h: h.preview, "would fail")


def step_compilations(
    plan: Plan, only: str | None = None, states: tuple[State, ...] = (State.RUN, State.WAIT, State.CACHED)
) -> dict[str, Mapping[str, Any]]:
    """Label -> what the step's `compile` hook says, for every step of the plan in `states` whose
    name `only` (a regex, as `--only` takes) matches: a training's upstream
    trainings are not compiled with it unless they match too (each may take minutes). A hook's
    `ValueError("field: why")` is a `StepDeclarationError` naming the step and the field (the
    program cannot fit: nothing is reserved for it); any other failure is shown as the step's
    compile result, not raised."""
    out: dict[str, Mapping[str, Any]] = {}
    selected = labels_matching(plan.dag, only) if only else None
    for label in plan.in_state(*states):
        node = plan.dag.nodes[label]
        hook = hooks_of(node.step.fn).compile
        if hook is None or (selected is not None and label not in selected):
            continue
        try:
            result = hook(resolved_config(plan.dag, label))
        except ValueError as e:
            field, _, why = str(e).partition(": ")
            raise StepDeclarationError(node.name, why or field, field=field if why else None) from None
        except Exception as e:  # a program that could not be built is said, not raised
            result = {"compile failed": f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"}
        if result:
            out[label] = dict(result)
    return out


def step_warnings(plan: Plan) -> list[str]:
    """`step 'x': ...` for what the `warnings` hooks of the steps that will run have to say."""
    out: list[str] = []
    for label in plan.in_state(State.RUN):
        node = plan.dag.nodes[label]
        hook = hooks_of(node.step.fn).warnings
        if hook is None:
            continue
        try:
            said = list(hook(resolved_config(plan.dag, label)) or ())
        except Exception as e:  # a warning hook never breaks a plan
            logger.warning("warnings of %s failed: %s", label, e)
            continue
        out.extend(f"step {node.name!r}: {line}" for line in said)
    return out


def step_reports(report: RunReport) -> dict[str, str | Mapping[str, Any]]:
    """Label -> report, for the finished (or cached) steps whose function has a `report`."""
    labels = report.labels(State.SUCCEEDED, State.CACHED)
    return _call_each(report.plan.dag, labels, lambda h: h.report, "no report")


def call_hook(hook: Callable[[Any], Any] | None, config: Any, failed: str) -> str | Mapping[str, Any] | None:
    """`hook(config)`, or the failure as a line of text: a hook never breaks a plan or a run."""
    if hook is None:
        return None
    try:
        result = hook(config)
    except Exception as e:  # shown, never raised
        return f"{failed}: {type(e).__name__}: {e}"
    return result or None


def _call_each(
    dag: Dag, labels: list[str], which: Callable[[StepHooks], Any], failed: str
) -> dict[str, str | Mapping[str, Any]]:
    out: dict[str, str | Mapping[str, Any]] = {}
    for label in labels:
        hook = which(hooks_of(dag.nodes[label].step.fn))
        if hook is None:
            continue
        result = call_hook(hook, resolved_config(dag, label), failed)
        if result:
            out[label] = result
    return out


def step_summary(fn: Any, config: Any) -> dict[str, Any] | None:
    """A step library's facts about this step (e.g. parameter counts) for `.step.json`: what its
    `preview` returns, when that is a mapping."""
    preview = hooks_of(fn).preview
    if preview is None:
        return None
    try:
        result = preview(config)
    except Exception as e:  # facts for the record must never fail the step
        logger.warning("preview of %s failed: %s", getattr(fn, "__qualname__", fn), e)
        return None
    return dict(result) if isinstance(result, Mapping) else None
