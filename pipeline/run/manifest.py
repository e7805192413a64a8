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
from collections.abc import Mapping
from typing import Any

from pipeline.core.dag import fn_import_path
from pipeline.core.plan import Plan
from pipeline.core.report import RunReport
from pipeline.run.recipe import recipe_entries
from pipeline.storage.manifests import encode_lines

__all__ = ["ManifestBuilder"]


class ManifestBuilder:
    """Builds the manifest of one run, written at its start (`encode()`) and its end
    (`encode(report)`). Each step's unchanging part (name, paths, deps, recipe) is encoded to
    JSON once, when the builder is made, and only that text is kept."""

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
        if recipes is None:
            recipes = recipe_entries(dag, source_file)
        self._labels: list[tuple[str, str]] = []
        """(label, planned state) per step, in order."""
        self._static: list[str] = []
        """Each step's unchanging fields as a JSON object without its closing brace."""
        for label, node in dag.nodes.items():
            planned = plan.steps[label].state.value
            entry = {
                "name": node.name,
                "label": label,
                "hash": node.identity.hash,
                "output_path": node.output_path,
                "fn": fn_import_path(node.step.fn),
                "deps": list(node.deps),
                "soft_deps": list(node.soft_deps),
                "planned": planned,
                "reason": plan.steps[label].reason,
                "recipe": recipes[label],
            }
            self._labels.append((label, planned))
            self._static.append(json.dumps(entry, default=str)[:-1])
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

    def encode(self, report: RunReport | None = None) -> bytes:
        """The manifest as JSON bytes, one step per line (`pipeline.storage.manifests.encode_lines`);
        without `report`, states are the planned ones."""
        lines = [
            f"{static}, {json.dumps(_outcome(label, planned, report), default=str)[1:]}"
            for static, (label, planned) in zip(self._static, self._labels, strict=True)
        ]
        head = {
            **self._head,
            "updated": time.time(),
            "finished": report is not None,
            "exit_code": report.exit_code if report is not None else None,
            **self._tail,
        }
        return encode_lines(head, lines)


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
