"""Levanter checkpoints of a training output: `<output>/checkpoints/step-N/`, found by path or URL.

A checkpoint is complete once its `metadata.json` is there (Levanter writes it last).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import fsspec

from pipeline import StepDeclarationError, unversioned
from steps.files import exists, local_path, read_json
from steps.models.config import MoeModelConfig

__all__ = [
    "check_checkpoint_step",
    "checkpoint_at",
    "checkpoint_to_evaluate",
    "checkpoints_dir",
    "complete_checkpoints",
    "delete_checkpoints",
    "export_checkpoint",
    "kept_steps_of",
    "latest_checkpoint",
    "load_inference_model",
    "prune_checkpoints",
    "retained_steps",
]


def checkpoints_dir(output: str) -> str:
    """Where a training output keeps its checkpoints."""
    return f"{output.rstrip('/')}/checkpoints"


def latest_checkpoint(root: str) -> tuple[str, int] | None:
    """The latest complete checkpoint under `root` (a path or URL) and its step; None if none."""
    # Levanter's discovery lists and reads through fsspec, so URLs work; it returns them as URLs.
    from levanter.checkpoint import discover_latest_checkpoint

    fs, plain = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()  # listings cached by this process may predate checkpoints written since
    if not fs.exists(plain):
        return None
    latest = discover_latest_checkpoint(root)
    if latest is None:
        return None
    return latest, int(read_json(f"{latest}/metadata.json")["step"])


def checkpoint_at(root: str, step: int) -> str | None:
    """The complete checkpoint of `step` under `root`, or None."""
    path = f"{root.rstrip('/')}/step-{step}"
    return path if exists(f"{path}/metadata.json") else None


def checkpoint_to_evaluate(train: str, checkpoint_step: int | None) -> tuple[str, int]:
    """The checkpoint of `checkpoint_step` under training output `train`, else its latest (after
    the training, its final one) and its step; FileNotFoundError naming the field if there is none."""
    root = checkpoints_dir(train)
    if checkpoint_step is not None:
        path = checkpoint_at(root, checkpoint_step)
        if path is None:
            raise FileNotFoundError(f"checkpoint_step {checkpoint_step}: no complete checkpoint under {root}")
        return path, checkpoint_step
    found = latest_checkpoint(root)
    if found is None:
        raise FileNotFoundError(f"train: the training output {train} has no complete checkpoint under {root}")
    return found


def kept_steps_of(final_step: int, interval: int | None) -> Callable[[int], bool]:
    """Which checkpoint steps a training keeps (every `interval` steps, and the final one; None:
    the final one only).
    Levanter deletes its time-based checkpoints once a newer one is saved: a follower must not
    evaluate those, or the files may vanish under it."""
    if interval is None:
        return lambda step: step == final_step
    return lambda step: step == final_step or (step > 0 and step % interval == 0)


def complete_checkpoints(root: str) -> dict[int, str]:
    """Every complete checkpoint under `root` (a path or URL), by step."""
    fs, plain = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()  # a listing cached by this process may predate checkpoints written since
    found: dict[int, str] = {}
    try:
        entries = fs.ls(plain, detail=False)
    except FileNotFoundError:
        return found
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith("step-") and name[5:].isdigit():
            path = f"{root.rstrip('/')}/{name}"
            if exists(f"{path}/metadata.json"):
                found[int(name[5:])] = path
    return found


def load_inference_model(train: str, checkpoint: str, vocab_size: int, parameter_mapping: Any) -> Any:
    """The Levanter model of training output `train` (its `levanter_model.json`), with the weights
    of `checkpoint`, sharded by `parameter_mapping`, for evaluation and export: the training-only
    auxiliary losses (Mixtral's router losses, drydock_moe's balancing loss and z-loss) are switched
    off, so its loss is pure cross-entropy. Call inside the mesh."""
    import dataclasses

    import draccus
    import equinox as eqx
    import haliax as hax
    import jax
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning
    from levanter.checkpoint import load_checkpoint
    from levanter.models.lm_model import LmConfig
    from levanter.models.mixtral import MixtralConfig

    from steps.models.drydock_moe import DrydockMoeConfig  # registers the drydock_moe family with draccus

    model_config = draccus.decode(LmConfig, read_json(f"{train.rstrip('/')}/levanter_model.json"))
    if isinstance(model_config, MixtralConfig):
        # Mixtral adds its auxiliary router losses to every position's loss: evaluate pure cross-entropy.
        model_config = dataclasses.replace(model_config, lbl_coef=None, rzl_coef=None)
    if isinstance(model_config, DrydockMoeConfig):  # likewise its balancing loss and z-loss
        model_config = dataclasses.replace(model_config, load_balancing_loss_coef=0.0, router_z_loss_coef=0.0)
    vocab = round_axis_for_partitioning(Axis("vocab", vocab_size), parameter_mapping)
    model = eqx.filter_eval_shape(model_config.build, vocab, key=jax.random.PRNGKey(0))
    model = load_checkpoint(model, checkpoint, subpath="model")
    return hax.shard_with_axis_mapping(model, parameter_mapping)


def retained(step: int, newest: list[int], final_step: int, keep_every: int | None) -> bool:
    """Whether retention keeps the checkpoint of `step`: the final one, one of the `newest`, or a
    multiple of `keep_every`."""
    return step == final_step or step in newest or (keep_every is not None and step % keep_every == 0)


def retained_steps(
    final_step: int, interval: int, keep: int | None, keep_every: int | None
) -> set[int] | None:
    """Every checkpoint step a finished training keeps under a retention policy (None: all)."""
    if keep is None:
        return None
    steps = [s for s in range(interval, final_step + 1, interval)]
    newest = steps[-keep:] if keep > 0 else []
    return {s for s in [*steps, final_step] if retained(s, newest, final_step, keep_every)}


def delete_checkpoints(root: str, *, after: int, set_aside: str | None = None) -> list[int]:
    """Delete every checkpoint under `root` of a step after `after`, complete or not, newest
    first, so that an interruption leaves the latest survivor an older one. Returns the steps
    deleted. There is no "all of them": a rewind that would go back past every checkpoint has
    nowhere to go, and fails instead (`steps.training.train_moe`).

    With `set_aside` (a local directory), local checkpoints are moved there instead of deleted,
    and kept until the caller is done (train_moe: until training ends), as evidence of what a
    rewind went back past. On object stores they are deleted.
    """
    fs, plain = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()
    try:
        entries = fs.ls(plain, detail=False)
    except FileNotFoundError:
        return []
    steps = {}
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith("step-") and name[5:].isdigit() and int(name[5:]) > after:
            steps[int(name[5:])] = entry
    local = set_aside is not None and local_path(root) is not None
    if local:
        os.makedirs(set_aside, exist_ok=True)
    for step in sorted(steps, reverse=True):
        metadata = f"{steps[step].rstrip('/')}/metadata.json"
        if fs.exists(metadata):  # first: a half-deleted checkpoint is never taken for a complete one
            fs.rm(metadata)
        if local:
            destination = os.path.join(set_aside, f"step-{step}")
            if os.path.exists(destination):  # from an attempt killed mid-rewind: its process is gone
                shutil.rmtree(destination)
            os.replace(steps[step], destination)
        else:
            fs.rm(steps[step], recursive=True)
    return sorted(steps)


def prune_checkpoints(
    root: str, *, interval: int, keep: int, keep_every: int | None, final_step: int
) -> list[int]:
    """Delete the `interval` checkpoints under `root` older than the newest `keep` (but not the
    final one, nor multiples of `keep_every`); time-based ones are Levanter's to delete. Returns
    the steps deleted."""
    found = complete_checkpoints(root)
    kept_by_interval = sorted(s for s in found if s % interval == 0)
    newest = kept_by_interval[-keep:] if keep > 0 else []
    doomed = [s for s in kept_by_interval if not retained(s, newest, final_step, keep_every)]
    if doomed:
        fs, _ = fsspec.core.url_to_fs(root)
        for step in doomed:
            # metadata.json first: a half-deleted checkpoint is then never taken for a complete one.
            fs.rm(fsspec.core.url_to_fs(f"{found[step]}/metadata.json")[1])
            fs.rm(fsspec.core.url_to_fs(found[step])[1], recursive=True)
    return doomed


# -- declaring a step that reads a training's checkpoints ------------------------------------------


def check_checkpoint_step(
    name: str,
    training: Any,
    checkpoint_step: int | None,
    follow: bool = False,
    field: str = "checkpoint_step",
) -> None:
    """A checkpoint the training keeps (every `checkpoint_interval` steps, and its final step, and
    under a retention policy only those it retains), or the declaration error of step `name`: any
    other one never exists, or is deleted under the reader. A follower needs every checkpoint, so it
    cannot follow a training that deletes old ones."""
    final, interval = unversioned(training.num_steps) - 1, training.checkpoint_interval
    keep, keep_every = getattr(training, "keep_checkpoints", None), getattr(training, "keep_every", None)
    if follow and keep is not None:
        raise StepDeclarationError(
            name,
            f"the training deletes all but its newest {keep} checkpoints (keep_checkpoints), so a "
            "follower could miss one: drop keep_checkpoints there, or evaluate fixed checkpoints",
            "follow",
        )
    if checkpoint_step is None:
        return
    kept = retained_steps(final, interval, keep, keep_every)
    if kept is not None and checkpoint_step not in kept and kept_steps_of(final, interval)(checkpoint_step):
        raise StepDeclarationError(
            name,
            f"the training's retention (keep_checkpoints={keep}, keep_every={keep_every}) deletes "
            f"the checkpoint of step {checkpoint_step}; it keeps {sorted(kept)}",
            field,
        )
    if not kept_steps_of(final, interval)(checkpoint_step):
        raise StepDeclarationError(
            name,
            f"the training keeps checkpoints every {interval} steps and at its final step {final}; "
            f"step {checkpoint_step} is not one of them",
            field,
        )


def export_checkpoint(
    train: str,
    checkpoint: str,
    spec: MoeModelConfig,
    vocab_size: int,
    directory: str,
    *,
    leader: bool = True,
) -> str:
    """Export the model of `checkpoint` (of training output `train`) into `directory`. In a gang,
    every process calls it (loading and gathering the shards are collectives); the `leader` writes."""
    import haliax as hax
    from levanter.trainer import TrainerConfig

    from steps.models.drydock_moe_export import export_model

    trainer = TrainerConfig(require_accelerator=False)
    params = trainer.parameter_axis_mapping
    with hax.partitioning.set_mesh(trainer.device_mesh), hax.axis_mapping(params):
        model = load_inference_model(train, checkpoint, vocab_size, params)
        export_model(model, spec, directory, leader=leader)
    return directory
