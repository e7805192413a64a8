"""The run manifest: `<prefix>/experiments/<experiment>-<hash>.json`.

One file per experiment DAG (the hash is over its step identities, so the same experiment
file run again updates the same manifest). It lists every step with its identity, output
path, function import path, final state and timings, plus the git commit and package versions
of the run. Written when a run starts (states as planned) and again when it ends.

Each step also carries its `recipe` (`pipeline.recipe`): function, config, version and resources
in a reversible form, so that `drydock rerun MANIFEST` rebuilds the same DAG without the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from pipeline.dag import Dag, fn_import_path, join_path
from pipeline.executor import RunReport
from pipeline.identity import HASH_CHARS
from pipeline.plan import Plan
from pipeline.recipe import recipe_entries

__all__ = ["build_manifest", "experiment_name", "manifest_path"]

MANIFEST_DIR = "experiments"


def experiment_name(name: str | None, source_file: str | None) -> str:
    """A file-name-safe experiment name: the given one, else the experiment file's stem."""
    raw = name or (source_file.rsplit("/", 1)[-1].removesuffix(".py") if source_file else "experiment")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("._") or "experiment"


def manifest_path(dag: Dag, experiment: str) -> str:
    """Where the manifest of `dag` lives under its prefix."""
    digest = hashlib.sha256("\n".join(sorted(dag.nodes)).encode()).hexdigest()[:HASH_CHARS]
    return join_path(dag.prefix, f"{MANIFEST_DIR}/{experiment}-{digest}.json")


def build_manifest(
    plan: Plan,
    experiment: str,
    description: str,
    run_id: str,
    env: Mapping[str, Any],
    report: RunReport | None = None,
    started: float | None = None,
    source_file: str | None = None,
    recipes: Mapping[str, Any] | None = None,
) -> bytes:
    """The manifest as JSON bytes; without `report`, states are the planned ones."""
    dag = plan.dag
    if recipes is None:
        recipes = recipe_entries(dag)
    steps = []
    for label, node in dag.nodes.items():
        entry: dict[str, Any] = {
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
        if report is not None:
            outcome = report.outcomes[label]
            entry.update(
                state=outcome.state.value,
                started=outcome.started,
                ended=outcome.ended,
                duration=outcome.duration,
                attempts=outcome.attempts,
                error=outcome.error,
            )
        else:
            entry["state"] = plan.steps[label].state.value
        steps.append(entry)
    manifest = {
        "experiment": experiment,
        "description": description,
        "prefix": dag.prefix,
        "run_id": run_id,
        "started": started,
        "updated": time.time(),
        "finished": report is not None,
        "exit_code": report.exit_code if report is not None else None,
        "roots": list(dag.roots),
        "source_file": os.path.abspath(source_file) if source_file else None,
        **env,
        "steps": steps,
    }
    # One step per line: readable, and without `indent`, which pushes `json` onto its slow
    # pure-Python encoder (seconds for a 100,000-step manifest).
    head = {k: v for k, v in manifest.items() if k != "steps"}
    lines = [json.dumps(step, default=str) for step in steps]
    body = json.dumps(head, default=str)[:-1] + ', "steps": [\n' + ",\n".join(lines) + "\n]}\n"
    return body.encode()
