"""The step library: step functions and their configs, in one folder per domain.

    steps.data         raw sources, mirror, dedupe, decontaminate, tokenize, mixture
    steps.training     train_moe, its Levanter config and hooks, models, checkpoints, spikes
    steps.evaluation   evaluate, task_eval and its tasks, following a training
    steps.scaling      scaling-law fits and a training's predicted loss
    steps.files        files by path or URL (every domain)
    steps.imports      importing the heavy ML libraries (every domain)

Steps use only the engine's published API (`pipeline` and `pipeline.steplib`; an import-linter
contract enforces it). docs/architecture.md, "The step library", says how to add a step kind.

Manifests written before the library had folders name their functions and configs by the old
flat module paths (`steps.train_moe:TrainMoeConfig`): `MOVED` keeps those paths importable, as
the module that now holds each, so `drydock rerun` of an old manifest rebuilds the same steps.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

MOVED: dict[str, str] = {
    "steps.sources": "steps.data.sources",
    "steps.mirror": "steps.data.mirror",
    "steps.dedupe": "steps.data.dedupe",
    "steps.decontaminate": "steps.data.decontaminate",
    "steps.tokenize": "steps.data.tokenize",
    "steps.mixture": "steps.data.mixture",
    "steps.train_moe": "steps.training.train_moe",
    "steps.spikes": "steps.training.spikes",
    "steps.moe": "steps.training.models",
    "steps.drydock_moe": "steps.training.drydock_moe",
    "steps.mesh": "steps.training.mesh",
    "steps.evaluate": "steps.evaluation.evaluate",
    "steps.task_eval": "steps.evaluation.task_eval",
    "steps.eval_tasks": "steps.evaluation.eval_tasks",
    "steps.follow": "steps.evaluation.follow",
    "steps.demo_tasks": "steps.evaluation.demo_tasks",
    "steps.prediction": "steps.scaling.prediction",
    "steps.dedupe_bands": "steps.data.dedupe_bands",
    "steps.dedupe_first_match": "steps.data.dedupe_first_match",
    "steps.minhash": "steps.data.minhash",
    "steps.shards": "steps.data.shards",
    "steps.levanter_config": "steps.training.levanter_config",
    "steps.metrics": "steps.training.metrics",
    "steps.checkpoints": "steps.training.checkpoints",
    "steps.gang_sync": "steps.training.gang_sync",
    "steps.estimates": "steps.training.estimates",
    "steps.task_templates": "steps.evaluation.task_templates",
}
"""Old flat module path -> the module that holds its step functions and config classes now."""


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module it moved to (the same module object)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """The module it moved to is already executed."""


sys.meta_path.append(_Moved())
