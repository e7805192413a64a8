"""The content of a run manifest: every step with its identity, path, state, timings and recipe.

Built from the plan (when a run starts: states as planned) and again from the run report (when
it ends), from one `ManifestBuilder` per run, so the per-step entries that do not change (names,
paths, deps, recipes) are computed once. It also holds the git commit and package versions of
the run. Each step carries its `recipe` (`pipeline.run.recipe`): function, config, version and
resources in a reversible form, so that `drydock rerun MANIFEST` rebuilds the same DAG without
the experiment file. Where it is stored: `pipeline.storage.manifests`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.core.dag import fn_import_path
from pipeline.core.plan import Plan
from pipeline.core.report import RunReport
from pipeline.run.recipe import iter_recipes
from pipeline.storage.manifests import encode_lines

__all__ = ["ManifestBuilder"]


class ManifestBuilder:
    """Builds the manifest of one run, written at its start (`encode()`) and its end
    (`encode(report, last=True)`). Each step's unchanging part (name, paths, deps, recipe) is
    encoded to JSON once: kept as text between the two writes, or, for a run that writes only
    the last one (a cached rerun), made while that one is written and never kept."""

    def __init__(
        self,
        plan: Plan,
        experiment: str,
        description: str,
        run_id: str,
        env: Mapping[str, Any],
        *,
        started: float | None = None,
        source_file: str | None = None,
        recipes: Mapping[str, Any] | None = None,
        runner: Mapping[str, Any] | None = None,
    ) -> None:
        dag = plan.dag
        self._plan, self._source_file, self._recipes = plan, source_file, recipes
        self._labels = [(label, plan.steps[label].state.value) for label in dag.nodes]
        """(label, planned state) per step, in order."""
        self._static: list[bytes] | None = None
        """Each step's unchanging fields as a JSON object without its closing brace, once made."""
        self._head = {
            "experiment": experiment,
            "description": description,
            "prefix": dag.prefix,
            "run_id": run_id,
            "started": started,
            # Who runs it: gc keeps the steps of an unfinished run whose runner may be alive.
            **({"runner": dict(runner)} if runner else {}),
        }
        self._tail = {
            "roots": list(dag.roots),
            "source_file": os.path.abspath(source_file) if source_file else None,
            **env,
        }

    def encode(self, report: RunReport | None = None, *, last: bool = False) -> bytes:
        """The manifest as JSON bytes, one step per line (`pipeline.storage.manifests.encode_lines`);
        without `report`, states are the planned ones. `last`: no later `encode` follows, so the
        steps' unchanging parts need not be kept."""
        if self._static is None and not last:
            self._static = list(self._statics())
        statics = self._static if self._static is not None else self._statics()
        lines = (
            (static, b", ", json.dumps(_outcome(label, planned, report), default=str)[1:].encode())
            for static, (label, planned) in zip(statics, self._labels, strict=True)
        )
        head = {
            **self._head,
            "updated": time.time(),
            "finished": report is not None,
            "exit_code": report.exit_code if report is not None else None,
            **self._tail,
        }
        return encode_lines(head, lines)

    def _statics(self) -> Iterator[bytes]:
        """Each step's unchanging fields, its recipe encoded as it comes (the recipes of a large
        DAG never all exist as objects at once)."""
        plan, dag = self._plan, self._plan.dag
        if self._recipes is None:
            entries = iter_recipes(dag, self._source_file)
        else:
            entries = ((label, self._recipes[label]) for label in dag.nodes)
        # iter_recipes yields in the order of dag.nodes.
        for (label, node), (_, recipe) in zip(dag.nodes.items(), entries, strict=True):
            entry = {
                "name": node.name,
                "label": label,
                "hash": node.identity.hash,
                "output_path": node.output_path,
                "fn": fn_import_path(node.step.fn),
                "deps": list(node.deps),
                "soft_deps": list(node.soft_deps),
                "planned": plan.steps[label].state.value,
                "reason": plan.steps[label].reason,
                "recipe": recipe,
            }
            # Bytes: this JSON is ASCII, and 10,000 steps make a manifest of about 10 MB.
            yield json.dumps(entry, default=str)[:-1].encode()


def _outcome(label: str, planned: str, report: RunReport | None) -> dict[str, Any]:
    """A step's fields that a run fills in: its state, timings, attempts and error."""
    if report is None:
        return {"state": planned}
    outcome = report.outcomes[label]
    return {
        "state": outcome.state.value,
        "started": outcome.started,
        "ended": outcome.ended,
        "duration": outcome.duration,
        "attempts": outcome.attempts,
        "error": outcome.error,
        **({"metrics": dict(outcome.metrics)} if outcome.metrics else {}),
    }
