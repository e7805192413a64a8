"""Previews in the dry-run plan: what a step that will run is going to do, once its inputs exist.

A step function may carry a `preview` attribute, `preview(config) -> str | None`, called with
the resolved config. The plan shows its text under the step, but only when every upstream step
is already CACHED (so the inputs are there to read). A failing preview is shown, never raised:
that is exactly the information a dry run is for (e.g. "would fail: component 'code' would be
read 3.2 times").
"""

from __future__ import annotations

from pipeline.metadata import resolved_config
from pipeline.plan import Plan, State

__all__ = ["step_previews"]


def step_previews(plan: Plan) -> dict[str, str]:
    """Label -> preview text, for RUN steps whose function has a `preview` and whose inputs exist."""
    out: dict[str, str] = {}
    for label in plan.in_state(State.RUN):
        node = plan.dag.nodes[label]
        preview = getattr(node.step.fn, "preview", None)
        if preview is None:
            continue
        upstream = (*node.deps, *node.soft_deps)
        if any(plan.steps[up].state != State.CACHED for up in upstream):
            continue
        try:
            text = preview(resolved_config(plan.dag, label))
        except Exception as e:
            text = f"would fail: {type(e).__name__}: {e}"
        if text:
            out[label] = text
    return out
