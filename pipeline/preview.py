"""Previews in the plan: what a step is, or is going to do, in the step library's own terms.

A step function may carry a `preview` attribute, `preview(config) -> str | Mapping | None`,
called with the resolved config of every step in the plan that is not SKIPPED. A string is
shown under the plan table; a mapping (e.g. a training step's parameter and token counts) is
shown as `key: value` lines and its keys join the step's entry in `--json` plans. A preview
that needs its inputs returns None until they exist. A failing preview is shown, never raised:
that is what a dry run is for (e.g. "would fail: component 'code' would be read 3.2 times").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.metadata import resolved_config
from pipeline.plan import Plan, State

__all__ = ["format_preview", "step_previews"]


def step_previews(plan: Plan) -> dict[str, str | Mapping[str, Any]]:
    """Label -> preview, for the steps whose function has a `preview` with something to say."""
    out: dict[str, str | Mapping[str, Any]] = {}
    for label in plan.in_state(State.RUN, State.WAIT, State.CACHED):
        preview = getattr(plan.dag.nodes[label].step.fn, "preview", None)
        if preview is None:
            continue
        try:
            result = preview(resolved_config(plan.dag, label))
        except Exception as e:
            result = f"would fail: {type(e).__name__}: {e}"
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
