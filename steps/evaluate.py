"""The `evaluate` step: loss, bits-per-byte and perplexity per validation set, from a checkpoint.

Inputs are a train_moe step's output (its `checkpoints/` and `levanter_model.json`) and the
validation sets of a mixture step's data config. `checkpoint_step=None` takes the latest
complete checkpoint, so `output_of(train, blocking=False)` can evaluate a run that is still
going. Outputs, under the step's directory:

    results.json    per validation set and averaged: loss, bits_per_byte, perplexity; the
                    checkpoint and its step
    loss.png        the training loss curve from metrics.jsonl, with the evaluation points

Both directories may be URLs (gs://, s3://): every file is read and written through fsspec.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from pipeline import Resources, Step, output_of, step_function, this_output, versioned
from steps.checkpoints import checkpoint_at, checkpoints_dir, latest_checkpoint
from steps.files import exists, read_json, save_figure, write_json

__all__ = ["EvaluateConfig", "evaluate", "evaluate_step"]


@dataclass(frozen=True)
class EvaluateConfig:
    """Configuration of the evaluate step."""

    train: str
    """A train_moe step's output directory."""
    data: str
    """A mixture step's output directory: its validation sets are evaluated."""
    output: str
    """The step's output directory (`this_output()`)."""
    checkpoint_step: int | None = None
    """Evaluate `checkpoints/step-N`; None: the latest complete checkpoint."""
    seq_len: int = 128
    batch_size: int = 8
    max_batches: int | None = None
    """At most this many batches per validation set; None: all of it."""


def evaluate_step(
    name: str,
    *,
    train: Step,
    data: Step,
    seq_len: int,
    batch_size: int = 8,
    checkpoint_step: int | None = None,
    max_batches: int | None = None,
    blocking: bool = True,
    resources: Resources | None = None,
) -> Step:
    """A ready evaluate `Step`. `blocking=False` evaluates a training run that is still going."""
    return Step(
        name=name,
        fn=evaluate,
        config=EvaluateConfig(
            train=output_of(train, blocking=blocking),
            data=output_of(data),
            output=this_output(),
            checkpoint_step=versioned(checkpoint_step),
            seq_len=versioned(seq_len),
            batch_size=batch_size,
            max_batches=versioned(max_batches),
        ),
        description=f"evaluate {train.name}",
        resources=resources or Resources(cpus=1),
    )


def _checkpoint(config: EvaluateConfig) -> tuple[str, int]:
    """The checkpoint to evaluate (a path or URL, like `config.train`) and its step."""
    root = checkpoints_dir(config.train)
    if config.checkpoint_step is not None:
        path = checkpoint_at(root, config.checkpoint_step)
        if path is None:
            raise FileNotFoundError(
                f"checkpoint_step {config.checkpoint_step}: no complete checkpoint at "
                f"{root}/step-{config.checkpoint_step}"
            )
        return path, config.checkpoint_step
    found = latest_checkpoint(root)
    if found is None:
        raise FileNotFoundError(f"no complete checkpoint under {root} yet")
    return found


def evaluate(config: EvaluateConfig) -> dict[str, Any]:
    """Evaluate a checkpoint on every validation set; write results.json and loss.png."""
    os.environ.setdefault("MARIN_PREFIX", os.path.join(config.output, ".marin"))
    import draccus
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    from haliax import Axis
    from haliax.partitioning import round_axis_for_partitioning
    from levanter.checkpoint import load_checkpoint
    from levanter.eval import TaggedEvaluator, eval_model
    from levanter.models.lm_model import LmConfig
    from levanter.models.mixtral import MixtralConfig
    from levanter.trainer import TrainerConfig
    from levanter.utils.tree_utils import inference_mode

    from steps.mixture import load_data_config

    data = load_data_config(config.data)
    model_config = draccus.decode(LmConfig, read_json(os.path.join(config.train, "levanter_model.json")))
    if isinstance(model_config, MixtralConfig):
        # Mixtral adds its auxiliary router losses to every position's loss: evaluate pure cross-entropy.
        model_config = dataclasses.replace(model_config, lbl_coef=None, rzl_coef=None)
    checkpoint, step = _checkpoint(config)
    trainer = TrainerConfig(require_accelerator=False, per_device_eval_parallelism=config.batch_size)
    mesh, compute, params = trainer.device_mesh, trainer.compute_axis_mapping, trainer.parameter_axis_mapping
    tokenizer = data.the_tokenizer
    started = time.time()
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping(params):
        vocab = round_axis_for_partitioning(Axis("vocab", len(tokenizer)), params)
        model = eqx.filter_eval_shape(model_config.build, vocab, key=jax.random.PRNGKey(0))
        model = load_checkpoint(model, checkpoint, subpath="model")
        model = hax.shard_with_axis_mapping(model, params)
        pos = model_config.max_Pos.resize(config.seq_len)
        tagged = data.tagged_eval_sets(pos)
        if not tagged:
            raise ValueError(f"the data config in {config.data} has no validation sets")

        def loss_fn(m: Any, batch: Any) -> Any:
            m = inference_mode(m, True)
            per_position = m.compute_next_token_loss(batch, reduction=None, reduction_axis=()).array
            return per_position, batch.loss_weight.array, jnp.roll(batch.tokens.array, -1, axis=-1)

        evaluator = TaggedEvaluator(
            Axis(trainer.batch_axis_name, config.batch_size),
            tagged,
            loss_fn,
            tokenizer=tokenizer,
            device_mesh=mesh,
            axis_mapping=compute,
            max_examples_per_dataset=None
            if config.max_batches is None
            else config.max_batches * config.batch_size,
        )
        metrics = eval_model(evaluator, model, prefix="eval")
    sets = {}
    for _, tags in tagged:
        name = tags[-1]  # tagged_eval_sets puts the component name last
        loss = float(metrics[f"eval/{name}/loss"])
        bpb = metrics.get(f"eval/{name}/bpb")
        sets[name] = {
            "loss": loss,
            "bits_per_byte": None if bpb is None else float(bpb),
            "perplexity": math.exp(loss),
        }
    average = {
        key: sum(s[key] for s in sets.values()) / len(sets)
        if all(s[key] is not None for s in sets.values())
        else None
        for key in ("loss", "bits_per_byte", "perplexity")
    }
    result = {
        "checkpoint": checkpoint,
        "checkpoint_step": step,
        "validation_sets": sets,
        "average": average,
        "seconds": time.time() - started,
    }
    write_json(os.path.join(config.output, "results.json"), result)
    plot_loss(
        os.path.join(config.train, "metrics.jsonl"), os.path.join(config.output, "loss.png"), step, sets
    )
    return result


def report(config: EvaluateConfig) -> dict[str, Any] | None:
    """The end-of-run summary (pipeline.run.hooks), also shown on the dashboard: the evaluation
    table (a list of rows) and where the checkpoint and the loss plot are."""
    path = os.path.join(config.output, "results.json")
    if not exists(path):
        return None
    result = read_json(path)
    rows = []
    for name, values in [*result["validation_sets"].items(), ("average", result["average"])]:
        bpb = values.get("bits_per_byte")
        rows.append(
            {
                "validation set": name,
                "loss": f"{values['loss']:.3f}",
                "bits/byte": "-" if bpb is None else f"{bpb:.3f}",
                "perplexity": f"{values['perplexity']:.2f}",
            }
        )
    out: dict[str, Any] = {
        "validation sets": rows,
        "checkpoint": f"step {result['checkpoint_step']} ({result['checkpoint']})",
    }
    plot = os.path.join(config.output, "loss.png")
    if exists(plot):
        out["loss plot"] = plot
    return out


def plot_loss(metrics_path: str, png_path: str, eval_step: int, sets: dict[str, dict[str, Any]]) -> None:
    """The training loss curve, with the evaluation points of the run and of this step.

    Both paths may be URLs. The metrics are merged per step (`read_metrics`), so a run still
    going, whose lines are not compacted yet, plots the same as a finished one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from steps.metrics import read_metrics

    steps, losses, eval_steps, eval_losses = [], [], [], []
    for record in read_metrics(metrics_path):
        if "loss" in record:
            steps.append(record["step"])
            losses.append(record["loss"])
        if "eval/loss" in record:
            eval_steps.append(record["step"])
            eval_losses.append(record["eval/loss"])
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, losses, label="train loss", linewidth=1.2)
    if eval_steps:
        ax.plot(eval_steps, eval_losses, "o--", label="eval loss (during training)", markersize=4)
    for name, values in sets.items():
        ax.plot([eval_step], [values["loss"]], "s", markersize=7, label=f"{name} (this evaluation)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png_path)
    plt.close(fig)


step_function(evaluate, report=report)
