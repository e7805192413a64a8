"""Previews and reports: what a step will do (in the plan) and what it did (after the run).

A step function may carry a `preview` attribute, `preview(config) -> str | Mapping | None`,
called with the resolved config of every step in the plan that is not SKIPPED. A string is
shown under the plan table; a mapping (e.g. a training step's parameter and token counts) is
shown as `key: value` lines and its keys join the step's entry in `--json` plans. A preview
that needs its inputs returns None until they exist. A failing preview is shown, never raised:
that is what a dry run is for (e.g. "would fail: component 'code' would be read 3.2 times").

Likewise `report(config) -> str | Mapping | None`, called after a run for every step that
succeeded or was cached, summarizes its outputs for the end-of-run summary (an evaluation
table, where the loss plot is). Reports read outputs; they never change them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.dag import Dag
from pipeline.executor import RunReport
from pipeline.metadata import resolved_config
from pipeline.plan import Plan, State

__all__ = ["format_preview", "step_previews", "step_reports"]


def step_previews(plan: Plan) -> dict[str, str | Mapping[str, Any]]:
    """Label -> preview, for the steps whose function has a `preview` with something to say."""
    labels = plan.in_state(State.RUN, State.WAIT, State.CACHED)
    return _call_each(plan.dag, labels, "preview", "would fail")


def step_reports(report: RunReport) -> dict[str, str | Mapping[str, Any]]:
    """Label -> report, for the finished (or cached) steps whose function has a `report`."""
    return _call_each(report.plan.dag, report.labels(State.SUCCEEDED, State.CACHED), "report", "no report")


def _call_each(
    dag: Dag, labels: list[str], attribute: str, failed: str
) -> dict[str, str | Mapping[str, Any]]:
    out: dict[str, str | Mapping[str, Any]] = {}
    for label in labels:
        hook = getattr(dag.nodes[label].step.fn, attribute, None)
        if hook is None:
            continue
        try:
            result = hook(resolved_config(dag, label))
        except Exception as e:  # shown, never raised: the run itself is over and fine
            result = f"{failed}: {type(e).__name__}: {e}"
        if result:
            out[label] = result
    return out


def format_preview(preview: str | Mapping[str, Any]) -> str:
    """A preview as text: strings as they are, mappings as aligned `key: value` lines."""
    if isinstance(preview, str):
        return preview
    width = max(len(str(k)) for k in preview)
    lines = []
    for key, value in preview.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        lines.append(f"  {str(key) + ':':<{width + 1}} {shown}")
    return "\n".join(lines)
