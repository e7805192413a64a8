"""The config of a `train_moe` step and its checks at declaration: the optimizer, the
training (`TrainMoeConfig`), branches from a trunk's checkpoint, and the stability guards.

No ML library is imported here: plans, reruns and the Levanter config (`levanter_config`) read
these types without Levanter. The step itself is `steps.training.train_moe`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal, NoReturn

from pipeline import Step, StepDeclarationError, added_field, applies_when, unversioned
from steps.models import MoeModelConfig, parameter_counts
from steps.scaling.prediction import LossPrediction
from steps.training.checkpoints import check_checkpoint_step
from steps.training.estimates import Hardware
from steps.training.mesh import MeshSpec
from steps.training.spikes import SpikePolicy, Stability

logger = logging.getLogger(__name__)

__all__ = [
    "BRANCH_INITS",
    "OptimizerSpec",
    "TrainMoeConfig",
    "check_branch",
    "check_declaration",
    "check_guards",
    "summarize",
    "training_of",
]


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
    max_eval_batches: int | None = None
    """In-training evaluation: at most this many batches of each validation set (the first ones).
    None: all of each set, the sets and batches the evaluate step reads, so the figures agree.
    Until 2026-12-07 the default was 4: the first 32 sequences of each set, which on a corpus of
    a few documents per set gave per-domain losses far from the whole set's. Not versioned."""
    router_stats_interval: int = 10
    """Log router load statistics every this many steps (0: never)."""
    spike_policy: SpikePolicy = field(default_factory=SpikePolicy)
    """What to do about loss spikes and NaN/Inf losses: warn, skip the update, or rewind (see
    `steps.training.spikes`). Versioned unless it is `warn`, which changes nothing trained."""
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
    `steps.training.mesh`). None: Levanter's default, every device on the data axis. Not versioned: a
    layout changes where numbers are computed, not which."""
    precision: str = "f32"
    """"f32": compute in float32 (Levanter's default); "bf16": float32 weights, bfloat16 compute,
    what accelerators are built for. Versioned unless f32 (it changes the numbers)."""
    hardware: Hardware | None = None
    """What the step's Resources ask for (accelerator, devices) and the MFU assumed, for the
    plan's memory and time estimates (`steps.training.estimates`); not versioned."""
    prediction: LossPrediction | None = None
    """The eval loss this training should reach, step by step (`steps.scaling.prediction`): drawn beside
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
    trunk_model = unversioned(source.model)
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

        trunk_shape = shape(
            unversioned(source.optimizer), unversioned(source.spike_policy), unversioned(source.stability)
        )
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


def training_of(name: str, train: Any) -> TrainMoeConfig:
    """The `TrainMoeConfig` of train_moe step `train`, or the declaration error of step `name`."""
    if not isinstance(train, Step) or not isinstance(train.config, TrainMoeConfig):
        raise StepDeclarationError(name, "give a train_moe step (train_moe_step(...))", field="train")
    return train.config
