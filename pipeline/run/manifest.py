"""The content of a run manifest: every step with its identity, path, state, timings and recipe.

Built from the plan (when a run starts: states as planned) and again from the run report (when
it ends), from one `ManifestBuilder` per run, so the per-step entries that do not change (names,
paths, deps, recipes) are computed once. It also holds the git commit and package versions of
the run. Each step carries its `recipe` (`pipeline.run.recipe`): function, config, version and
resources in a reversible form, so that `drydock rerun MANIFEST` rebuilds the same DAG without
the experiment file. Where it is stored: `pipeline.storage.manifests`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from pipeline.core.dag import fn_import_path
from pipeline.core.plan import Plan
from pipeline.core.report import RunReport
from pipeline.run.recipe import recipe_entries

__all__ = ["ManifestBuilder"]


class ManifestBuilder:
    """Builds the manifest document of one run; `document(report)` at its start and its end."""

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
    ) -> None:
        self.plan = plan
        dag = plan.dag
        if recipes is None:
            recipes = recipe_entries(dag, source_file)
        self._steps = [
            {
                "name": node.name,
                "label": label,
                "hash": node.identity.hash,
                "output_path": node.output_path,
                "fn": fn_import_path(node.step.fn),
                "deps": list(node.deps),
                "soft_deps": list(node.soft_deps),
                "planned": plan.steps[label].state.value,
                "reason": plan.steps[label].reason,
                "recipe": recipes[label],
            }
            for label, node in dag.nodes.items()
        ]
        self._head = {
            "experiment": experiment,
            "description": description,
            "prefix": dag.prefix,
            "run_id": run_id,
            "started": started,
        }
        self._tail = {
            "roots": list(dag.roots),
            "source_file": os.path.abspath(source_file) if source_file else None,
            **env,
        }

    def document(self, report: RunReport | None = None) -> dict[str, Any]:
        """The manifest; without `report`, states are the planned ones."""
        steps = []
        for entry in self._steps:
            label = entry["label"]
            if report is not None:
                outcome = report.outcomes[label]
                extra: dict[str, Any] = {
                    "state": outcome.state.value,
                    "started": outcome.started,
                    "ended": outcome.ended,
                    "duration": outcome.duration,
                    "attempts": outcome.attempts,
                    "error": outcome.error,
                }
            else:
                extra = {"state": entry["planned"]}
            steps.append({**entry, **extra})
        return {
            **self._head,
            "updated": time.time(),
            "finished": report is not None,
            "exit_code": report.exit_code if report is not None else None,
            **self._tail,
            "steps": steps,
        }
