"""The `train_moe` step: train an MoE language model with Levanter's `train_lm`.

Reads the data config a mixture step wrote, builds Levanter's `Qwen3MoeConfig` or
`MixtralConfig` from a `MoeModelConfig`, and calls `levanter.main.train_lm.main` (there is no
second trainer here). Under the step's output directory:

    checkpoints/step-N/     Levanter checkpoints (every `checkpoint_interval` steps, the final one,
                            and time-based ones every `checkpoint_minutes` for preemption)
    metrics.jsonl           one line per step: step, loss, learning_rate, tokens_per_second,
                            router_max_load_ratio, plus every Levanter metric by its own key
                            (on object storage: metrics/part-NNNNNN.jsonl, the same lines in
                            segments of about 1 MiB; `steps.metrics` reads either)
    hf/step-N/              a Hugging Face export of the final model
    levanter_model.json     the Levanter model config (the evaluate step rebuilds the model from it)
    train_result.json       parameters, steps, where it resumed from, wall time
    summary.json            Levanter's run summary
    logs/                   Levanter's log file

The output may be a URL (gs://, s3://): Levanter writes checkpoints and the export there itself,
and every other file goes through fsspec. Object stores cannot append, so the metrics are then
appended to a per-attempt scratch file (under `$DRYDOCK_SCRATCH`, else the system's temporary
directory) and what it gained is uploaded every `metrics_upload_seconds` and at the end, into
the open segment (`steps.metrics.MetricsUploader`); the logs are uploaded at the end.

A rerun after a crash or preemption resumes from the latest checkpoint in `checkpoints/` (the
output directory is the same, since the identity is) and ends at the same step count. Loss
spikes and NaN/Inf losses are handled by `spike_policy` (warn, skip the update, or rewind to a
checkpoint and skip the batches that caused them; `steps.spikes`), each intervention recorded in
`.status`, `metrics.jsonl`, `train_result.json` and, for rewinds, `rewinds.json`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Literal, NoReturn

import fsspec

from pipeline import (
    HangPolicy,
    Resources,
    Step,
    StepDeclarationError,
    added_field,
    applies_when,
    current_gang,
    output_of,
    step_events,
    step_function,
    this_output,
    versioned,
)
from steps.checkpoints import latest_checkpoint
from steps.estimates import Hardware, hardware_of, layout_problems, layout_summary
from steps.files import exists, local_path, read_text
from steps.gang_sync import barrier, exchange, join_gang
from steps.imports import LEVANTER_MODELS, import_ml
from steps.levanter_config import hub_offline, levanter_train_config
from steps.mesh import MeshSpec
from steps.moe import MoeModelConfig, parameter_counts
from steps.prediction import LossPrediction, PredictionError, check_prediction, fit_summary, start_prediction
from steps.spikes import (
    REWINDS_FILE,
    Rewind,
    RewindNeeded,
    SpikePolicy,
    Stability,
    TrainingDiverged,
    count_interventions,
    data_batch,
    read_rewinds,
    skipped_ranges,
)

__all__ = [
    "MeshSpec",
    "OptimizerSpec",
    "SpikePolicy",
    "Stability",
    "TrainMoeConfig",
    "train_moe",
    "train_moe_step",
]

logger = logging.getLogger(__name__)

_ONE_TRAINING = threading.Lock()
"""Held while a training runs: Levanter's tracker (where metrics go) and JAX's distributed state
belong to the process, so two trainings in threads of one process (the local backend) would
write each other's metrics. One runs at a time; the others wait here."""


@dataclass(frozen=True)
class OptimizerSpec:
    """Optimizer and learning-rate schedule (Levanter's AdamW or Muon)."""

    name: Literal["adamw", "muon"] = "adamw"
    learning_rate: float = 3e-3
    """Peak learning rate (for Muon: of the 2-D weight matrices Muon updates)."""
    adam_learning_rate: float = applies_when(3e-3, field="name", equals="muon")
    """Muon only: the AdamW learning rate of embeddings, LM head, norms and experts."""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    warmup: float = 0.1
    """Warm-up, as a fraction of the steps (or a step count if >= 1)."""
    min_lr_ratio: float = 0.1
    lr_schedule: str = "cosine"
    """The shape of the decay: "cosine", "linear" or "constant" (Levanter's names)."""
    max_grad_norm: float = 1.0
    decay: float | None = added_field(None)
    """None: decay over every step after the warm-up. Set, warmup-stable-decay: hold the peak rate
    after the warm-up and decay only over the last `decay` of the steps (a fraction, or a step
    count if >= 1). A cooldown is a branch of such a run taken in its stable phase (`init_from`)."""


@dataclass(frozen=True)
class TrainMoeConfig:
    """Configuration of the train_moe step."""

    data: str
    """The mixture step's output directory (its `data_config.yaml`)."""
    output: str
    """The step's output directory (`this_output()`)."""
    model: MoeModelConfig = field(default_factory=MoeModelConfig)
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    batch_size: int = 8
    seq_len: int = 128
    num_steps: int = 100
    seed: int = 0
    vocab_size: int | None = None
    """Vocabulary size for parameter counts before the data exists; checked against the tokenizer."""
    checkpoint_interval: int = 50
    """Keep a checkpoint every this many steps (the final step is always saved)."""
    checkpoint_minutes: float = 10.0
    """Also save a temporary checkpoint this often, so preemption loses little."""
    keep_checkpoints: int | None = None
    """Retention: keep only the newest this many of the `checkpoint_interval` checkpoints (plus
    `keep_every` ones and the final one), deleting older ones as new ones are saved. None: keep all."""
    keep_every: int | None = None
    """With `keep_checkpoints`: also keep every checkpoint whose step is a multiple of this."""
    eval_interval: int = 50
    max_eval_batches: int | None = 4
    router_stats_interval: int = 10
    """Log router load statistics every this many steps (0: never)."""
    spike_policy: SpikePolicy = field(default_factory=SpikePolicy)
    """What to do about loss spikes and NaN/Inf losses: warn, skip the update, or rewind (see
    `steps.spikes`). Versioned unless it is `warn`, which changes nothing trained."""
    stability: Stability = field(default_factory=Stability)
    """Update clipping and z-loss (AdamW). Versioned unless all off (the default)."""
    hf_export: bool = True
    hub_offline: bool = True
    """Never contact the Hugging Face hub while training. Levanter's HF export looks up the reference
    model's config there; offline it derives the config from the model type instead (same weights)."""
    wandb_project: str | None = None
    """Also log to Weights & Biases (needs W&B configured on the machine)."""
    mesh: MeshSpec | None = None
    """How the training's devices are laid out (data/FSDP, replica, tensor, expert axes;
    `steps.mesh`). None: Levanter's default, every device on the data axis. Not versioned: a
    layout changes where numbers are computed, not which."""
    precision: str = "f32"
    """"f32": compute in float32 (Levanter's default); "bf16": float32 weights, bfloat16 compute,
    what accelerators are built for. Versioned unless f32 (it changes the numbers)."""
    hardware: Hardware | None = None
    """What the step's Resources ask for (accelerator, devices) and the MFU assumed, for the
    plan's memory and time estimates (`steps.estimates`); not versioned."""
    prediction: LossPrediction | None = None
    """The eval loss this training should reach, step by step (`steps.prediction`): drawn beside
    the measured one, and evaluations outside its interval warn. Not versioned."""
    init_from: Any = None
    """A branch: the output of the training (the trunk) whose checkpoint it starts from
    (`output_of(trunk, blocking=False)`: the branch waits for that checkpoint, not the trunk's end)."""
    init_step: int | None = None
    """A branch: the trunk's checkpoint it starts from (versioned when set)."""
    init_name: str | None = None
    """A branch: the trunk's step name, for the plan (not versioned)."""
    init: str | None = None
    """A branch: what it takes from the checkpoint (versioned when set). "weights+optimizer": the
    whole training state, so it continues the trunk exactly (step count, optimizer moments and
    schedule position, data order) under its own settings from step `init_step` + 1. "weights":
    the model only, with a fresh optimizer whose schedule (warm-up included) runs over the
    branch's own steps; step numbering and data order still continue from the trunk's."""
    metrics_upload_seconds: float = 30.0
    """For an output on object storage: upload the new metrics lines this often. A crash loses at most the
    lines of this many seconds; they are of steps after the last checkpoint (the lines up to a
    checkpoint are uploaded before it is saved), which the resumed run computes again."""


def train_moe_step(
    name: str,
    *,
    data: Step | str,
    model: MoeModelConfig,
    optimizer: OptimizerSpec | None = None,
    batch_size: int,
    seq_len: int,
    num_steps: int,
    seed: int = 0,
    vocab_size: int | None = None,
    spike_policy: SpikePolicy | None = None,
    stability: Stability | None = None,
    resources: Resources | None = None,
    mesh: MeshSpec | None = None,
    precision: str = "f32",
    mfu: float = 0.4,
    init_from: Step | None = None,
    init_step: int | None = None,
    init: str = "weights+optimizer",
    **options: Any,
) -> Step:
    """A ready train_moe `Step`: model, optimizer, data, batch, length, steps and seed are versioned,
    and so are `spike_policy` (unless it only warns) and `stability` (unless all off): the
    defaults leave identities as they were before those fields existed.

    `options` sets the unversioned fields of `TrainMoeConfig` (checkpointing, evaluation,
    logging): changing them does not rerun training. Mistakes the plan can see (a non-positive
    or non-finite learning rate, a warm-up longer than the run, sizes that do not match the
    mixture, a run longer than the mixture was sized for, a model Levanter cannot build) are a
    `StepDeclarationError` naming the field, before anything runs.

    `resources` say where it runs (`Resources(gpus=8, hosts=16, accelerator="H100")` for a gang
    of 16 hosts); `mesh` how the devices are laid out (`steps.mesh.MeshSpec`, checked against the
    devices, the batch and the experts), `precision` "bf16" to compute in bfloat16, `mfu` the
    utilization the plan's time estimate assumes. With the vocabulary known (`vocab_size`) and an
    accelerator named, a layout whose estimated memory does not fit a device is refused.

    `init_from=trunk, init_step=N` makes it a branch of train_moe step `trunk`: it starts from
    the trunk's checkpoint N (waiting for it while the trunk runs) and trains on to `num_steps`,
    its step numbers continuing the trunk's. `init` says what it loads ("weights+optimizer", the
    default: the whole state, an exact continuation; "weights": the model only, with a fresh
    optimizer). The trunk's identity, N and `init` are part of the branch's. Refused here: a
    checkpoint the trunk does not keep, a model that differs from the trunk's, and (whole state)
    an optimizer whose state is shaped differently.
    """
    optimizer = optimizer or OptimizerSpec()
    policy, stability = spike_policy or SpikePolicy(), stability or Stability()
    resources = resources or Resources(cpus=1)
    check_declaration(name, data, model, optimizer, batch_size, seq_len, num_steps, options)
    check_guards(name, optimizer, policy, stability)
    if policy.action == "rewind" and options.get("keep_checkpoints") == 1:
        raise StepDeclarationError(
            name,
            "keeps 1 checkpoint, but spike_policy rewind needs at least 2: with one, a spike right "
            "after it leaves nothing from before the spike to go back to",
            field="keep_checkpoints",
        )
    if precision not in ("f32", "bf16"):
        raise StepDeclarationError(name, f"{precision!r} is not 'f32' or 'bf16'", field="precision")
    if not (isinstance(mfu, int | float) and 0 < mfu <= 1):
        raise StepDeclarationError(name, f"must be a fraction in (0, 1], got {mfu!r}", field="mfu")
    if mesh is not None and not isinstance(mesh, MeshSpec):
        raise StepDeclarationError(name, f"must be a MeshSpec, got {type(mesh).__name__}", field="mesh")
    if options.get("prediction") is not None:
        try:
            check_prediction(options["prediction"], model, num_steps * batch_size * seq_len, num_steps)
        except PredictionError as e:
            raise StepDeclarationError(name, e.message, field=e.field) from e
    check_branch(name, init_from, init_step, init, model, optimizer, policy, stability, num_steps)
    hardware = hardware_of(resources, mfu)
    for field_name, message in layout_problems(
        model, mesh or MeshSpec(), hardware, batch_size, seq_len, vocab_size, precision
    ):
        raise StepDeclarationError(name, message, field=field_name)
    return Step(
        name=name,
        fn=train_moe,
        config=TrainMoeConfig(
            data=output_of(data) if isinstance(data, Step) else data,
            output=this_output(),
            model=versioned(model),
            optimizer=versioned(optimizer),
            batch_size=versioned(batch_size),
            seq_len=versioned(seq_len),
            num_steps=versioned(num_steps),
            seed=versioned(seed),
            vocab_size=vocab_size,
            spike_policy=versioned(policy) if policy.changes_training else policy,
            stability=versioned(stability) if stability != Stability() else stability,
            mesh=mesh,
            precision=versioned(precision) if precision != "f32" else precision,
            hardware=hardware,
            **(
                dict(
                    init_from=output_of(init_from, blocking=False),
                    init_step=versioned(init_step),
                    init=versioned(init),
                    init_name=init_from.name,
                )
                if init_from is not None
                else {}
            ),
            **options,
        ),
        description=f"train {model.family} {name}",
        resources=resources,
    )


def check_declaration(
    name: str,
    data: Any,
    model: MoeModelConfig,
    optimizer: OptimizerSpec,
    batch_size: int,
    seq_len: int,
    num_steps: int,
    options: dict[str, Any],
) -> None:
    """What `train_moe_step` refuses before anything runs (see its docstring)."""

    def refuse(field_name: str, message: str) -> NoReturn:
        raise StepDeclarationError(name, message, field=field_name)

    try:
        model.check()
    except ValueError as e:
        field_name, _, message = str(e).partition(": ")
        refuse(field_name, message)
    sizes = {"batch_size": batch_size, "seq_len": seq_len, "num_steps": num_steps}
    sizes.update({k: options[k] for k in ("checkpoint_interval",) if k in options})
    sizes.update({k: options[k] for k in ("keep_checkpoints", "keep_every") if options.get(k) is not None})
    for field_name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            refuse(field_name, f"must be a positive whole number, got {value!r}")
    rates = {"optimizer.learning_rate": optimizer.learning_rate}
    if optimizer.name == "muon":
        rates["optimizer.adam_learning_rate"] = optimizer.adam_learning_rate
    for field_name, value in rates.items():
        if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            refuse(field_name, f"must be a positive finite number, got {value!r}")
    if optimizer.name not in ("adamw", "muon"):
        refuse("optimizer.name", f"unknown {optimizer.name!r}; use 'adamw' or 'muon'")
    warmup = optimizer.warmup
    if not math.isfinite(warmup) or warmup < 0:
        refuse("optimizer.warmup", f"must be a fraction of the run or a step count >= 0, got {warmup!r}")
    if warmup >= 1 and warmup >= num_steps:
        refuse(
            "optimizer.warmup", f"{warmup:g} warm-up steps is not shorter than the run ({num_steps} steps)"
        )
    decay = optimizer.decay
    if decay is not None:
        number = isinstance(decay, int | float) and not isinstance(decay, bool)
        if not number or not math.isfinite(decay) or decay <= 0:
            refuse("optimizer.decay", f"must be a fraction of the run or a step count > 0, got {decay!r}")

        def steps_of(value: float) -> float:  # Levanter's reading: a step count if >= 1, else a fraction
            return value if value >= 1 else value * num_steps

        if steps_of(decay) + steps_of(warmup) > num_steps:
            refuse(
                "optimizer.decay",
                f"warm-up ({warmup:g}) and decay ({decay:g}) together are longer than the run "
                f"({num_steps} steps)",
            )
    mixture = getattr(data, "config", None) if isinstance(data, Step) else None
    if mixture is not None and type(mixture).__name__ == "MixtureConfig":
        planned = {
            k: getattr(getattr(mixture, k), "value", getattr(mixture, k)) for k in ("batch_size", "seq_len")
        }
        for field_name in ("batch_size", "seq_len"):
            if sizes[field_name] != planned[field_name]:
                refuse(
                    field_name,
                    f"{sizes[field_name]} does not match the {planned[field_name]} that mixture "
                    f"{data.name!r} was sized with (its phases are counted in steps of that size)",
                )
        target = getattr(mixture.target_tokens, "value", mixture.target_tokens)
        available = math.ceil(target / (batch_size * seq_len))
        if num_steps > available:
            refuse(
                "num_steps",
                f"{num_steps} steps is longer than the mixture {data.name!r} was sized for ({available} "
                f"steps: target_tokens {target:,} / {batch_size * seq_len:,} per step); raise its "
                "target_tokens or lower num_steps",
            )


BRANCH_INITS = ("weights+optimizer", "weights")
"""What a branch takes from its trunk's checkpoint (`train_moe_step(init=...)`)."""


def check_branch(
    name: str,
    trunk: Any,
    init_step: Any,
    init: Any,
    model: MoeModelConfig,
    optimizer: OptimizerSpec,
    policy: SpikePolicy,
    stability: Stability,
    num_steps: int,
) -> None:
    """What `train_moe_step` refuses about a branch (`init_from`, `init_step`, `init`)."""
    from steps.follow import check_checkpoint_step, plain

    def refuse(field_name: str, message: str) -> NoReturn:
        raise StepDeclarationError(name, message, field=field_name)

    if trunk is None:
        if init_step is not None:
            refuse("init_step", "a checkpoint step without init_from: name the training to branch from")
        return
    if not isinstance(trunk, Step) or not isinstance(trunk.config, TrainMoeConfig):
        refuse("init_from", f"give a train_moe step (train_moe_step(...)), got {type(trunk).__name__}")
    if init not in BRANCH_INITS:
        refuse("init", f"{init!r} is not one of {', '.join(map(repr, BRANCH_INITS))}")
    if isinstance(init_step, bool) or not isinstance(init_step, int) or init_step <= 0:
        refuse("init_step", f"the trunk's checkpoint to start from, a step number > 0; got {init_step!r}")
    source = trunk.config
    check_checkpoint_step(name, source, init_step, field="init_step")
    if init_step >= num_steps - 1:
        refuse(
            "init_step",
            f"the branch starts after step {init_step} and trains to step {num_steps - 1}: raise num_steps",
        )
    trunk_model = plain(source.model)
    if model != trunk_model:
        differ = [
            f"{f.name} {getattr(model, f.name)!r} (trunk: {getattr(trunk_model, f.name)!r})"
            for f in fields(model)
            if getattr(model, f.name) != getattr(trunk_model, f.name)
        ]
        loads = f"differs from the trunk {trunk.name!r}'s, whose weights it loads: "
        refuse("model", loads + ", ".join(differ))
    if init == "weights+optimizer":
        # The whole state is loaded as saved: the optimizer's state must have the same structure.
        def shape(o: OptimizerSpec, p: SpikePolicy, s: Stability) -> tuple[Any, ...]:
            return (o.name, s.update_rms_clipping is None, s.clip_update_sigma is None, p.action == "skip")

        trunk_shape = shape(plain(source.optimizer), plain(source.spike_policy), plain(source.stability))
        if shape(optimizer, policy, stability) != trunk_shape:
            refuse(
                "init",
                f"the optimizer's state is shaped differently from the trunk {trunk.name!r}'s (its "
                "optimizer, update clipping or skip policy differ), so it cannot be loaded: use "
                "init='weights' for a fresh optimizer",
            )


def check_guards(name: str, optimizer: OptimizerSpec, policy: SpikePolicy, stability: Stability) -> None:
    """What train_moe_step refuses in `spike_policy` and `stability` before anything runs."""
    for prefix, value, kind in (("spike_policy", policy, SpikePolicy), ("stability", stability, Stability)):
        if not isinstance(value, kind):
            raise StepDeclarationError(name, f"must be a {kind.__name__}, got {value!r}", field=prefix)
        try:
            value.check()
        except ValueError as e:
            field_name, _, message = str(e).partition(": ")
            raise StepDeclarationError(name, message, field=f"{prefix}.{field_name}") from None
    if optimizer.name == "muon":
        if policy.action == "skip":
            raise StepDeclarationError(
                name,
                "Levanter's Muon has no skip-step wrapper; use 'warn' or 'rewind' with Muon",
                field="spike_policy.action",
            )
        for field_name in ("update_rms_clipping", "clip_update_sigma"):
            if getattr(stability, field_name) is not None:
                raise StepDeclarationError(
                    name,
                    "Levanter's Muon has no update clipping; use it with AdamW",
                    field=f"stability.{field_name}",
                )


# -- summaries (no ML imports: used by plans) ----------------------------------------------------------


def summarize(config: TrainMoeConfig, vocab_size: int | None) -> dict[str, Any]:
    """Parameters, tokens and steps of a training config; what plans and manifests show."""
    summary: dict[str, Any] = {
        "family": config.model.family,
        "num_train_steps": config.num_steps,
        "train_tokens": config.num_steps * config.batch_size * config.seq_len,
        "batch_size": config.batch_size,
        "seq_len": config.seq_len,
    }
    if vocab_size is not None:
        total, active = parameter_counts(config.model, vocab_size)
        summary.update(total_params=total, active_params=active, vocab_size=vocab_size)
    if config.init_from is not None:
        # train_tokens counts what the model has seen, its trunk's steps included.
        summary["branch"] = {"trunk": str(config.init_from), "step": config.init_step, "init": config.init}
    return summary


def preview(config: TrainMoeConfig) -> dict[str, Any]:
    """Shown by `drydock plan`: parameters (if the vocabulary is known), tokens, steps; for a
    declared layout or accelerator, the mesh, the memory per device and the time to train."""
    vocab = config.vocab_size or _tokenizer_size_if_known(config.data)
    out = summarize(config, vocab)
    hardware = config.hardware or Hardware()
    if config.mesh is not None or hardware.spec is not None:
        out.update(
            layout_summary(
                config.model,
                config.mesh or MeshSpec(),
                hardware,
                config.batch_size,
                config.seq_len,
                vocab,
                config.precision,
                out["train_tokens"],
            )
        )
    if config.prediction is not None:
        out["predicted eval loss"] = _predicted_text(config.prediction)
    if config.init_from is not None:
        del out["branch"]  # the same, in words:
        trunk = config.init_name or str(config.init_from)
        out["branches from"] = f"checkpoint {config.init_step} of {trunk} ({config.init})"
    resumes = _resumes_from(config)
    if resumes is not None:
        out["resumes from"] = f"step {resumes} (its newest checkpoint)"
    return out


def _resumes_from(config: TrainMoeConfig) -> int | None:
    """The step an interrupted training's next attempt starts from: its newest complete checkpoint
    before the final step (a finished training has nothing to resume)."""
    from steps.checkpoints import complete_checkpoints

    try:
        found = complete_checkpoints(f"{config.output.rstrip('/')}/checkpoints")
    except Exception:  # a plan only shows it; the training finds its checkpoint itself
        return None
    steps = [step for step in found if step < config.num_steps - 1]
    return max(steps) if steps and max(found) < config.num_steps - 1 else None


def _predicted_text(prediction: LossPrediction) -> str:
    """The prediction's final loss for the plan, or where it will come from."""
    if prediction.fit is None:
        step, loss, low, high = prediction.points[-1]
        return f"{loss:.4f} [{low:.4f}, {high:.4f}] at step {step:,} ({prediction.source or 'given'})"
    summary = fit_summary(str(prediction.fit))
    name = prediction.source or os.path.basename(str(prediction.fit).rstrip("/"))
    if summary is None:
        return f"from {name}, once it has run"
    level = f"{summary['level']:.0%} " if isinstance(summary["level"], float) else ""
    return (
        f"{summary['loss']:.4f}, {level}interval [{summary['low']:.4f}, {summary['high']:.4f}] at the "
        f"end ({summary['method']} fit of {name})"
    )


def report(config: TrainMoeConfig) -> dict[str, Any] | None:
    """The end-of-run summary (pipeline.run.hooks): how far the loss came down, where things are."""
    from steps.metrics import read_metrics

    metrics_path = os.path.join(config.output, "metrics.jsonl")
    if not exists(metrics_path):
        return None
    losses = [(row["step"], row["loss"]) for row in read_metrics(metrics_path) if "loss" in row]
    out: dict[str, Any] = {}
    if losses:
        out["train loss"] = (
            f"{losses[0][1]:.3f} at step {losses[0][0]} -> {losses[-1][1]:.3f} at step {losses[-1][0]}"
        )
    out["metrics"] = metrics_path
    out["checkpoints"] = os.path.join(config.output, "checkpoints")
    return out


def metrics(config: TrainMoeConfig) -> dict[str, float] | None:
    """For `drydock compare`: the last logged training loss, and the steps it took."""
    from steps.metrics import read_metrics

    metrics_path = os.path.join(config.output, "metrics.jsonl")
    if not exists(metrics_path):
        return None
    losses = [(row["step"], row["loss"]) for row in read_metrics(metrics_path) if "loss" in row]
    if not losses:
        return None
    return {"train/loss": float(losses[-1][1]), "train/steps": float(losses[-1][0] + 1)}


def _tokenizer_size_if_known(data: str) -> int | None:
    try:
        import yaml

        with fsspec.open(os.path.join(data, "data_config.yaml"), "r") as f:
            tokenizer = yaml.safe_load(f).get("tokenizer")
        with fsspec.open(os.path.join(tokenizer, "tokenizer.json"), "r") as f:
            raw = json.load(f)
        return len(raw["model"]["vocab"]) + sum(
            1 for t in raw.get("added_tokens", []) if t["content"] not in raw["model"]["vocab"]
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# -- the step function ------------------------------------------------------------------------------


def _check(config: TrainMoeConfig) -> None:
    config.model.check()
    for field_name in ("batch_size", "seq_len", "num_steps", "checkpoint_interval", "metrics_upload_seconds"):
        if getattr(config, field_name) <= 0:
            raise ValueError(f"{field_name} must be positive, got {getattr(config, field_name)}")


def _latest_step(checkpoints: str) -> tuple[str | None, int | None]:
    """The latest complete checkpoint under `checkpoints` (a path or URL) and its step."""
    found = latest_checkpoint(checkpoints)
    return found if found is not None else (None, None)


def train_moe(config: TrainMoeConfig) -> dict[str, Any]:
    """Train (or resume training) the model of `config` to `num_steps`.

    In a gang (a training across hosts: `pipeline.current_gang()`), every process runs this: it
    joins the gang's JAX process group first, trains its share of each global batch, and writes
    its shards of each checkpoint; only the leader writes the step's own files (metrics,
    rewinds, the model config, the result), and every decision to leave the training loop is
    taken together (`steps.gang_sync`).
    """
    import_ml(*LEVANTER_MODELS)
    _check(config)
    gang = current_gang()
    join_gang(gang)  # before anything touches a JAX backend
    os.environ.setdefault("MARIN_PREFIX", os.path.join(config.output, ".marin"))
    import draccus
    from levanter.models.lm_model import LmConfig

    from steps.mixture import load_data_config
    from steps.moe import to_levanter
    from steps.training_hooks import (
        fix_eval_tag_arrays,
        fix_mixtral_jit_log,
        write_file,
    )

    out = config.output
    checkpoints = os.path.join(out, "checkpoints")
    metrics = os.path.join(out, "metrics.jsonl")
    data = load_data_config(config.data)
    vocab = len(data.the_tokenizer)
    if config.vocab_size is not None and config.vocab_size != vocab:
        raise ValueError(f"vocab_size {config.vocab_size} does not match the tokenizer's {vocab} tokens")
    model = to_levanter(config.model, config.seq_len, data.tokenizer)
    if config.model.family == "mixtral":
        fix_mixtral_jit_log()
    fix_eval_tag_arrays()
    if gang.leader:
        write_file(
            os.path.join(out, "levanter_model.json"),
            json.dumps(draccus.encode(model, LmConfig), indent=1).encode(),
        )

    curve = None
    if gang.leader:  # only the leader's tracker compares evaluations with it
        curve = start_prediction(
            config.prediction,
            out,
            model=config.model,
            tokens_per_step=config.batch_size * config.seq_len,
            num_steps=config.num_steps,
            eval_interval=config.eval_interval,
        )
    rewinds_path = os.path.join(out, REWINDS_FILE)
    rewinds = read_rewinds(read_text(rewinds_path) if exists(rewinds_path) else None, rewinds_path)
    branch = None
    if config.init_from is not None and _latest_step(checkpoints)[1] is None:
        # A branch's first attempt starts from its trunk's checkpoint (Levanter's initialize_from:
        # used only while the branch has no checkpoint of its own, so a resume takes its own).
        from steps.follow import wait_for_checkpoint

        branch = wait_for_checkpoint(config.init_from, config.init_step)
    if not _ONE_TRAINING.acquire(blocking=False):
        print("train_moe: waiting for another training in this process to finish", flush=True)
        while not _ONE_TRAINING.acquire(timeout=1.0):
            pass  # back in Python each second, so a cancel (raised at the next instruction) lands
    try:
        return _train(config, gang, data, model, vocab, checkpoints, metrics, curve, rewinds, branch)
    finally:
        _ONE_TRAINING.release()


def _train(
    config: TrainMoeConfig,
    gang: Any,
    data: Any,
    model: Any,
    vocab: int,
    checkpoints: str,
    metrics: str,
    curve: str | None,
    rewinds: list[Rewind],
    branch: str | None,
) -> dict[str, Any]:
    """train_moe's attempts (resumes and rewinds) and its result, under `_ONE_TRAINING`."""
    from steps.training_hooks import fresh_tensorstore_cache, read_events, write_file

    out = config.output
    rewinds_path = os.path.join(out, REWINDS_FILE)
    first_resumed_from = None
    started = time.time()
    while True:
        # Decided once: every process resumes from the checkpoint the leader found.
        resumed_from = _shared_step(_latest_step(checkpoints)[1])
        if first_resumed_from is None and not rewinds:
            first_resumed_from = resumed_from
        try:
            _train_attempt(config, data, model, resumed_from, rewinds, gang.leader, curve, branch)
            break
        except RewindNeeded as e:
            # Every process got here at the same step (the tracker's decision is shared), with
            # the same list of rewinds: all of them give up together when no rewind is left.
            _check_rewinds_left(config, e, rewinds)
            # Where to go back to: the leader looks, every process learns it.
            restored, nowhere = (
                int(v) for v in exchange(_restore_point(checkpoints, e) if gang.leader else [0, 0])[0]
            )
            if nowhere:
                raise TrainingDiverged(
                    f"{e.reason} at step {e.trigger_step}: no checkpoint from before step {e.first_step} to "
                    f"rewind to (a checkpoint of step N is good only if step N + 1 did not spike; the "
                    f"earliest kept is step {nowhere - 1}); nothing deleted. Resume from a checkpoint by "
                    "hand, or keep more (checkpoint_interval, keep_checkpoints)"
                ) from e
            if gang.leader:
                rewind = _rewind(config, e, rewinds, checkpoints, None if restored < 0 else restored)
                payload = {"rewinds": [r.to_json() for r in [*rewinds, rewind]]}
                write_file(rewinds_path, json.dumps(payload, indent=1).encode())
                step_events.warn(rewind.describe(), {"rewind": rewind.number, "step": rewind.trigger_step})
                print(f"train_moe: {rewind.describe()}", flush=True)
            # The others wait until the leader has set the checkpoints aside and said what to skip.
            barrier(f"drydock-rewind-{len(rewinds) + 1}")
            rewinds = read_rewinds(read_text(rewinds_path), rewinds_path)
            fresh_tensorstore_cache()  # the same steps are saved again at the same paths
    if not gang.leader:
        return {"process": gang.index}
    if local_path(out) is not None:  # rewinds set checkpoints aside only for this process
        shutil.rmtree(os.path.join(out, REWOUND_DIR), ignore_errors=True)
    final, final_step = _latest_step(checkpoints)
    exported = None
    if (
        config.hf_export
        and config.model.family == "drydock_moe"
        and final is not None
        and not gang.distributed
    ):
        from steps.drydock_moe import export_checkpoint

        # No Hugging Face architecture has this model: safetensors and a config.json instead.
        exported = export_checkpoint(
            out, final, config.model, vocab, os.path.join(out, "export", f"step-{final_step}")
        )
    result = {
        **summarize(config, vocab),
        "resumed_from_step": first_resumed_from,
        "final_checkpoint": final,
        "final_step": final_step,
        "wall_seconds": time.time() - started,
        "interventions": count_interventions(read_events(metrics)),
        **({"export": exported} if exported else {}),
        **({"processes": gang.size} if gang.distributed else {}),
    }
    write_file(os.path.join(out, "train_result.json"), json.dumps(result, indent=1).encode())
    return result


def _shared_step(step: int | None) -> int | None:
    """The leader's `step` on every process of the gang (-1 stands for None on the wire)."""
    value = int(exchange([-1 if step is None else step])[0, 0])
    return None if value < 0 else value


def _train_attempt(
    config: TrainMoeConfig,
    data: Any,
    model: Any,
    resumed_from: int | None,
    rewinds: list[Rewind],
    leader: bool = True,
    prediction: str | None = None,
    branch: str | None = None,
) -> None:
    """Run Levanter's train_lm from the checkpoint at `resumed_from` (None: from scratch, or from
    the trunk's checkpoint `branch`) to the end, or until the spike guard raises `RewindNeeded`.
    Only the `leader` of a gang keeps the metrics and Levanter's logs."""
    from levanter.main import train_lm

    from steps.training_hooks import (
        MetricsUploader,
        begin_metrics,
        checkpoint_saved,
        fresh_optimizer_state,
        local_path,
        read_events,
        read_metrics,
        wait_for_checkpoints,
        write_metrics,
    )

    out = config.output
    metrics = os.path.join(out, "metrics.jsonl")
    # On object storage the tracker appends to a scratch file, which is published as it grows.
    # The other processes of a gang keep nothing: their scratch only holds Levanter's own log.
    scratch = None if local_path(out) is not None and leader else _scratch_dir()
    appended = metrics if scratch is None else os.path.join(scratch, "metrics.jsonl")
    if leader:
        begin_metrics(metrics, appended, resumed_from, [_rewind_event(r) for r in rewinds])
    if resumed_from is not None:
        checkpoint_saved(appended, resumed_from, _checkpoint_time(config.output, resumed_from))
    levanter_config = levanter_train_config(
        config,
        data,
        model,
        metrics_path=appended,
        log_dir=None if scratch is None else os.path.join(scratch, "logs"),
        rewinds=rewinds,
        prediction=prediction,
        initialize_from=branch if resumed_from is None else None,
    )
    uploader = None
    if scratch is not None and leader:
        uploader = MetricsUploader(appended, metrics, config.metrics_upload_seconds, already_published=True)
    try:
        with uploader or contextlib.nullcontext():
            if resumed_from is not None and resumed_from >= config.num_steps - 1:
                # Killed after training but before the commit: running train_lm again would only
                # repeat its final hooks.
                logger.info("training already reached step %s; nothing to resume", resumed_from)
            else:
                if resumed_from is not None:
                    print(f"train_moe: resuming from the checkpoint at step {resumed_from}", flush=True)
                elif branch is not None:
                    print(f"train_moe: branching from {branch} ({config.init})", flush=True)
                weights_only = branch is not None and config.init == "weights"
                try:
                    with hub_offline(config.hub_offline), fresh_optimizer_state(weights_only):
                        train_lm.main(levanter_config)
                finally:
                    # A rewind deletes checkpoints: none may still be being written.
                    wait_for_checkpoints(appended)
        # On local disk, one line per step from here on. Segments on object storage stay as
        # uploaded: compacting them would re-send the whole run's lines, and a kill part-way
        # through rewriting many segments could double event lines (readers merge lines anyway).
        if uploader is None and leader:
            write_metrics(metrics, read_metrics(appended) + read_events(appended))
    finally:
        if scratch is not None:
            if leader:
                _upload_logs(os.path.join(scratch, "logs"), os.path.join(out, "logs"))
            shutil.rmtree(scratch, ignore_errors=True)


def _check_rewinds_left(config: TrainMoeConfig, needed: RewindNeeded, rewinds: list[Rewind]) -> None:
    """Raise TrainingDiverged when the policy has no rewinds left for `needed`."""
    policy = config.spike_policy
    if len(rewinds) >= policy.max_rewinds:
        history = "; ".join(r.describe() for r in rewinds) or "none allowed"
        raise TrainingDiverged(
            f"{needed.reason} at step {needed.trigger_step} after {len(rewinds)} rewind(s), the most "
            f"spike_policy.max_rewinds allows ({history})"
        )


def _restore_point(checkpoints: str, needed: RewindNeeded) -> list[int]:
    """[the checkpoint a rewind for `needed` restores (-1: none, start again from step 0), and,
    when there is nowhere to go, 1 + the earliest checkpoint kept (0 otherwise)].

    A checkpoint of step N holds the state after step N's update, whose loss is the one logged
    at step N + 1: a state is known good only if step N + 1 did not spike (a bad update shows in
    the next step's loss). With checkpoints but none from before the spike, there is nowhere to
    go: starting again from step 0 would delete every one of them (and months of training)."""
    from steps.checkpoints import complete_checkpoints

    found = complete_checkpoints(checkpoints)
    before = [step for step in found if step + 1 < needed.first_step]
    if before:
        return [max(before), 0]
    return [-1, min(found) + 1 if found else 0]


def _rewind(
    config: TrainMoeConfig,
    needed: RewindNeeded,
    rewinds: list[Rewind],
    checkpoints: str,
    restored: int | None,
) -> Rewind:
    """Record a rewind to `restored` (`_restore_point`; None: the start, when there is no
    checkpoint at all) and set aside the checkpoints it goes back past (the leader of a gang,
    after `_check_rewinds_left`)."""
    from steps.checkpoints import delete_checkpoints

    policy = config.spike_policy
    number = len(rewinds) + 1
    _check_rewinds_left(config, needed, rewinds)
    ranges = skipped_ranges(rewinds)
    if restored is not None:  # with no checkpoint at all, there is nothing to delete
        # Set aside (local disk) until training ends: see delete_checkpoints.
        delete_checkpoints(
            checkpoints,
            after=restored,
            set_aside=os.path.join(os.path.dirname(checkpoints), REWOUND_DIR, f"rewind-{number}"),
        )
    first_batch = data_batch(ranges, needed.first_step)
    last_batch = data_batch(ranges, needed.trigger_step) + policy.skip_batches
    # The lower rate applies from the first step trained again.
    lr_from = 0 if restored is None else restored + 1
    lr_until = lr_from + policy.lr_steps if policy.lr_steps and policy.lr_factor != 1 else None
    return Rewind(
        number=number,
        trigger_step=needed.trigger_step,
        first_step=needed.first_step,
        restored_step=restored,
        skipped=(first_batch, last_batch),
        reason=needed.reason,
        losses={str(k): (v if math.isfinite(v) else repr(v)) for k, v in needed.losses.items()},  # type: ignore[misc]
        median=needed.median,
        lr_factor=policy.lr_factor if lr_until is not None else 1.0,
        lr_from_step=lr_from if lr_until is not None else None,
        lr_until_step=lr_until,
        wall_time=time.time(),
    )


def _checkpoint_time(output: str, step: int) -> float:
    """When the checkpoint of `step` was completed (its metadata.json's modification time)."""
    try:
        fs, plain = fsspec.core.url_to_fs(
            os.path.join(output, "checkpoints", f"step-{step}", "metadata.json")
        )
        modified = fs.modified(plain)
        return modified.timestamp()
    except (OSError, NotImplementedError, AttributeError):
        return time.time()


def _rewind_event(rewind: Rewind) -> dict[str, Any]:
    """The metrics.jsonl event line of a rewind."""
    return {"event": "rewind", "step": rewind.trigger_step, **rewind.to_json(), "message": rewind.describe()}


REWOUND_DIR = "rewound"
"""Where a rewind sets aside the checkpoints it went back past, until the training ends."""


def _scratch_dir() -> str:
    """A fresh local directory for this attempt's files that cannot be written in place."""
    root = os.environ.get("DRYDOCK_SCRATCH") or None
    if root is not None:
        os.makedirs(root, exist_ok=True)
    return tempfile.mkdtemp(prefix="drydock-train-", dir=root)


def _upload_logs(local: str, remote: str) -> None:
    """Copy Levanter's log directory to the output; a failure is logged, since the logs are a
    convenience and must not fail (or hide the error of) a training run."""
    if not os.path.isdir(local):
        return
    try:
        step_events.check_lease(f"upload of the logs to {remote}")  # not a file write: unfenced
        fs, plain = fsspec.core.url_to_fs(remote)
        fs.put(local.rstrip("/") + "/", plain, recursive=True)
    except Exception as e:
        logger.warning("could not upload Levanter's logs from %s to %s: %s", local, remote, e)


# Levanter's trainer leaves global state (tracker, log handlers) in its process: on Ray, each
# training gets its own worker process.
# A training keeps a steady pace, one step after another: the runner's watchdog stops an attempt
# whose steps stop for 10x the median step time (at least 10 minutes: checkpoints and evaluations
# pause it; an hour before the first step, which compiles), and retries it from its checkpoint.
TRAINING_PACE = HangPolicy(factor=10.0, floor=600.0, startup=3600.0)

LEARNING_RATES = (1e-6, 1.0)
"""Peak learning rates outside this range are almost surely a typo (`3e3` for `3e-3`): said by the
plan, not refused (an experiment may mean it)."""


def plan_warnings(config: TrainMoeConfig) -> list[str]:
    """What `drydock plan` says about a training that looks wrong but may be meant."""
    optimizer = config.optimizer
    rates = {"optimizer.learning_rate": optimizer.learning_rate}
    if optimizer.name == "muon":
        rates["optimizer.adam_learning_rate"] = optimizer.adam_learning_rate
    low, high = LEARNING_RATES
    return [
        f"{name} = {rate:g} is far outside the usual range ({low:g} to {high:g}): a typo?"
        for name, rate in rates.items()
        if isinstance(rate, int | float) and not low <= rate <= high
    ]


step_function(
    train_moe,
    preview=preview,
    report=report,
    metrics=metrics,
    warnings=plan_warnings,
    fresh_process=True,
    watchdog=TRAINING_PACE,
)
