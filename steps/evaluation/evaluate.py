"""The `evaluate` step: loss, bits-per-byte and perplexity per validation set, from a checkpoint.

Inputs are a train_moe step's output (its `checkpoints/` and `levanter_model.json`) and the
validation sets of a mixture step's data config. By default it waits for the training and
evaluates its final checkpoint (or `checkpoint_step`). With `follow=True` it runs beside the
training and evaluates each kept checkpoint as it lands (`steps.evaluation.follow`). Outputs, under the
step's directory:

    results.json        per validation set and averaged: loss, bits_per_byte, perplexity; the
                        checkpoint and its step (with `follow`: the final one, and the curve)
    loss.png            the training loss curve from metrics.jsonl, with the evaluation points
    results/step-N.json with `follow`: the result of each checkpoint
    curves.png          with `follow`: eval loss per validation set against the training step

Both directories may be URLs (gs://, s3://): every file is read and written through fsspec.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline import Resources, Step, output_of, step_function, this_output, unversioned, versioned
from steps.evaluation.follow import FollowSettings, check_follow, evaluate_checkpoints
from steps.files import exists, read_json, save_figure, write_json
from steps.imports import LEVANTER_MODELS, import_ml
from steps.training.checkpoints import check_checkpoint_step
from steps.training.config import training_of

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
    """Evaluate `checkpoints/step-N`; None: the final checkpoint (or each one, with `follow`)."""
    seq_len: int = 128
    batch_size: int = 8
    max_batches: int | None = None
    """At most this many batches per validation set; None: all of it."""
    follow: bool = False
    """Evaluate every kept checkpoint as the training writes it (`steps.evaluation.follow`)."""
    final_step: int | None = None
    """The training's last step (its num_steps - 1): where a follower stops."""
    checkpoint_interval: int | None = None
    """The training's checkpoint_interval: which checkpoints it keeps."""
    follow_settings: FollowSettings = field(default_factory=FollowSettings)


def evaluate_step(
    name: str,
    *,
    train: Step,
    data: Step,
    seq_len: int,
    batch_size: int = 8,
    checkpoint_step: int | None = None,
    max_batches: int | None = None,
    follow: bool = False,
    blocking: bool | None = None,
    resources: Resources | None = None,
) -> Step:
    """A ready evaluate `Step` of train_moe step `train`.

    By default it waits for the training and evaluates its final checkpoint (or `checkpoint_step`).
    `follow=True` runs it beside the training, evaluating each kept checkpoint as it lands.
    `blocking=False` with `checkpoint_step=N` evaluates checkpoint N as soon as it exists.
    """
    train_config = training_of(name, train)
    blocking = check_follow(name, blocking, follow, checkpoint_step)
    check_checkpoint_step(name, train_config, checkpoint_step, follow)
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
            # Versioned only when set: evaluations declared before `follow` existed keep their identity.
            follow=versioned(True) if follow else False,
            final_step=unversioned(train_config.num_steps) - 1,
            checkpoint_interval=train_config.checkpoint_interval,
        ),
        description=f"evaluate {train.name}",
        resources=resources or Resources(cpus=1),
    )


def evaluate(config: EvaluateConfig) -> dict[str, Any]:
    """Evaluate a checkpoint (or, following, each one) on every validation set; write results.json,
    loss.png (and, following, results/step-N.json and curves.png)."""
    import_ml(*LEVANTER_MODELS)
    os.environ.setdefault("MARIN_PREFIX", os.path.join(config.output, ".marin"))
    evaluator = _LossEvaluator(config)
    result = evaluate_checkpoints(
        config,
        evaluator.evaluate,
        series=lambda r: {name: v["loss"] for name, v in r["validation_sets"].items()},
        ylabel="eval loss (nats/token)",
    )
    write_json(os.path.join(config.output, "results.json"), result)
    plot_loss(
        os.path.join(config.train, "metrics.jsonl"),
        os.path.join(config.output, "loss.png"),
        result["checkpoint_step"],
        result["validation_sets"],
    )
    return result


class _LossEvaluator:
    """Loss and bits-per-byte per validation set; the mesh, data and compiled loss are kept across
    checkpoints, so a follower compiles once."""

    def __init__(self, config: EvaluateConfig) -> None:
        from levanter.trainer import TrainerConfig

        from steps.data.mixture import load_data_config

        self.config = config
        self.data = load_data_config(config.data)
        self.trainer = TrainerConfig(require_accelerator=False, per_device_eval_parallelism=config.batch_size)
        self.tokenizer = self.data.the_tokenizer
        self._evaluator: Any = None
        self._tagged: Any = None

    def evaluate(self, step: int, checkpoint: str) -> dict[str, Any]:
        import haliax as hax
        import jax.numpy as jnp
        from haliax import Axis
        from levanter.eval import TaggedEvaluator, eval_model
        from levanter.utils.tree_utils import inference_mode

        from steps.training.checkpoints import load_inference_model

        config, trainer = self.config, self.trainer
        mesh, compute, params = (
            trainer.device_mesh,
            trainer.compute_axis_mapping,
            trainer.parameter_axis_mapping,
        )
        started = time.time()
        with hax.partitioning.set_mesh(mesh), hax.axis_mapping(params):
            model = load_inference_model(config.train, checkpoint, len(self.tokenizer), params)
            if self._evaluator is None:
                pos = model.Pos.resize(config.seq_len)
                self._tagged = self.data.tagged_eval_sets(pos)
                if not self._tagged:
                    raise ValueError(f"data: the data config in {config.data} has no validation sets")

                def loss_fn(m: Any, batch: Any) -> Any:
                    m = inference_mode(m, True)
                    per_position = m.compute_next_token_loss(batch, reduction=None, reduction_axis=()).array
                    return per_position, batch.loss_weight.array, jnp.roll(batch.tokens.array, -1, axis=-1)

                self._evaluator = TaggedEvaluator(
                    Axis(trainer.batch_axis_name, config.batch_size),
                    self._tagged,
                    loss_fn,
                    tokenizer=self.tokenizer,
                    device_mesh=mesh,
                    axis_mapping=compute,
                    max_examples_per_dataset=None
                    if config.max_batches is None
                    else config.max_batches * config.batch_size,
                )
            metrics = eval_model(self._evaluator, model, prefix="eval")
        sets = {}
        for _, tags in self._tagged:
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
        return {
            "checkpoint": checkpoint,
            "checkpoint_step": step,
            "validation_sets": sets,
            "average": average,
            "seconds": time.time() - started,
        }


def report(config: EvaluateConfig) -> dict[str, Any] | None:
    """The end-of-run summary (pipeline.run.records.hooks), also shown on the dashboard: the evaluation
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
    curves = os.path.join(config.output, "curves.png")
    if exists(curves):
        out["eval curves"] = curves
    return out


def metrics(config: EvaluateConfig) -> dict[str, float | None] | None:
    """For `drydock compare`: loss and bits/byte per validation set and averaged."""
    path = os.path.join(config.output, "results.json")
    if not exists(path):
        return None
    result = read_json(path)
    out: dict[str, float | None] = {}
    for name, values in [*result["validation_sets"].items(), ("average", result["average"])]:
        out[f"eval/{name}/loss"] = values.get("loss")
        out[f"eval/{name}/bpb"] = values.get("bits_per_byte")
    return out


def plot_loss(metrics_path: str, png_path: str, eval_step: int, sets: dict[str, dict[str, Any]]) -> None:
    """The training loss curve, with the evaluation points of the run and of this step.

    Both paths may be URLs. The metrics are merged per step (`read_metrics`), so a run still
    going, whose lines are not compacted yet, plots the same as a finished one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from steps.training.metrics_file import read_metrics

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


step_function(evaluate, report=report, metrics=metrics)
