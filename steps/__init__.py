"""The step library: step functions and their configs, in one folder per domain.

    steps.models       MoeModelConfig, the model families' registry, Drydock's own MoE family
    steps.data         raw sources, mirror, extract, filters, dedupe, decontaminate, tokenize, mixture
    steps.training     train_moe, its Levanter config and hooks, checkpoints, spikes
    steps.evaluation   evaluate, task_eval and its tasks, following a training
    steps.scaling      scaling-law fits and a training's predicted loss
    steps.files        files by path or URL (every domain)
    steps.imports      importing the heavy ML libraries (every domain)

Steps use only the engine's published API (`pipeline` and `pipeline.steplib`; an import-linter
contract enforces it). docs/architecture.md, "The step library", says how to add a step kind.

Manifests written by earlier layouts name their functions and configs by old module paths (the
flat `steps.train_moe:TrainMoeConfig`, `steps.training.models:MoeModelConfig`): `MOVED` says where
each lives now, and the engine reads it where manifests are decoded
(`pipeline.run.records.recipe_codec.moved_reference`), so `drydock rerun` of an old manifest rebuilds the
same steps. Nothing is installed in the import system: code that imports an old path fails.
"""

from __future__ import annotations

MOVED: dict[str, str] = {
    "steps.sources": "steps.data.sources",
    "steps.mirror": "steps.data.mirror",
    "steps.dedupe": "steps.data.dedupe",
    "steps.decontaminate": "steps.data.decontaminate",
    "steps.tokenize": "steps.data.tokenize",
    "steps.mixture": "steps.data.mixture",
    "steps.train_moe": "steps.training.train_moe",
    "steps.spikes": "steps.training.spikes",
    "steps.moe": "steps.models.config",
    "steps.drydock_moe": "steps.models.drydock_moe",
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
    "steps.metrics": "steps.training.metrics_file",
    "steps.checkpoints": "steps.training.checkpoints",
    "steps.gang_sync": "steps.training.gang_sync",
    "steps.estimates": "steps.training.estimates",
    "steps.task_templates": "steps.evaluation.task_templates",
    # The models left steps/training for steps/models (the bottom of the library) in 2026-12.
    "steps.training.models": "steps.models.config",
    "steps.training.drydock_moe": "steps.models.drydock_moe",
    "steps.training.drydock_moe_export": "steps.models.drydock_moe_export",
    "steps.training.metrics": "steps.training.metrics_file",
    "steps.training.attempts": "steps.training.attempt_loop",
    # Names that left a module that still exists: the scaling step moved into steps/scaling/fit.py.
    "steps.scaling:ScalingFitConfig": "steps.scaling.fit:ScalingFitConfig",
    "steps.scaling:ScalingPoint": "steps.scaling.fit:ScalingPoint",
    "steps.scaling:scaling_fit": "steps.scaling.fit:scaling_fit",
    "steps.scaling:scaling_point": "steps.scaling.fit:scaling_point",
    "steps.scaling:scaling_fit_step": "steps.scaling.fit:scaling_fit_step",
}
"""Old module path -> the module that holds its step functions and config classes now, or an old
`module:name` -> where that name lives now (`pipeline.run.records.recipe_codec.MOVED_TABLE`)."""
