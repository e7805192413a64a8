"""The `train_moe` step: train an MoE language model with Levanter's `train_lm`.

Reads the data config a mixture step wrote, builds Levanter's `Qwen3MoeConfig` or
`MixtralConfig` from a `MoeModelConfig`, and calls `levanter.main.train_lm.main` (there is no
second trainer here). Under the step's output directory:

    checkpoints/step-N/     Levanter checkpoints (every `checkpoint_interval` steps, the final one,
                            and time-based ones every `checkpoint_minutes` for preemption)
    metrics.jsonl           one line per step: step, loss, learning_rate, tokens_per_second,
                            router_max_load_ratio, plus every Levanter metric by its own key
                            (on object storage: metrics/part-NNNNNN.jsonl, the same lines in
                            segments of about 1 MiB; `steps.training.metrics_file` reads either)
    hf/step-N/              a Hugging Face export of the final model
    levanter_model.json     the Levanter model config (the evaluate step rebuilds the model from it)
    layout.json             the mesh and each parameter's sharding as trained (`steps.training.layout`)
    train_result.json       parameters, steps, where it resumed from, wall time
    summary.json            Levanter's run summary
    logs/                   Levanter's log file

The output may be a URL (gs://, s3://): Levanter writes checkpoints and the export there itself,
and every other file goes through fsspec. Object stores cannot append, so the metrics are then
appended to a per-attempt scratch file (under `$DRYDOCK_SCRATCH`, else the system's temporary
directory) and what it gained is uploaded every `metrics_upload_seconds` and at the end, into
the open segment (`steps.training.metrics_file.MetricsUploader`); the logs are uploaded at the end.

A rerun after a crash or preemption resumes from the latest checkpoint in `checkpoints/` (the
output directory is the same, since the identity is) and ends at the same step count. Loss
spikes and NaN/Inf losses are handled by `spike_policy` (warn, skip the update, or rewind to a
checkpoint and skip the batches that caused them; `steps.training.spikes`), each intervention recorded in
`.status`, `metrics.jsonl`, `train_result.json` and, for rewinds, `rewinds.json`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from pipeline import (
    HangPolicy,
    Resources,
    Step,
    StepDeclarationError,
    output_of,
    step_function,
    this_output,
    versioned,
)
from pipeline.steplib import current_gang, format_size
from steps.data.mixture import tokenizer_size_if_known
from steps.files import exists, read_text
from steps.imports import LEVANTER_MODELS, import_ml
from steps.models import MoeModelConfig, family
from steps.scaling.prediction import (
    LossPrediction,
    PredictionError,
    check_prediction,
    fit_summary,
    start_prediction,
)
from steps.training import ledger
from steps.training.attempt_loop import latest_step, train_attempts
from steps.training.compile import compile_layout
from steps.training.config import (
    OptimizerSpec,
    TrainMoeConfig,
    check_branch,
    check_declaration,
    check_guards,
    summarize,
)
from steps.training.estimates import (
    Hardware,
    gathered_experts,
    hardware_of,
    layout_problems,
    layout_summary,
    training_seconds,
)
from steps.training.gang_sync import join_gang
from steps.training.mesh import MeshSpec
from steps.training.preemption import notice_handler
from steps.training.spikes import REWINDS_FILE, SpikePolicy, Stability, read_rewinds
from steps.training.startup import attempt_start, attempt_started, libraries_imported
from steps.training.waiting import wait_for_checkpoint

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
    of 16 hosts); `mesh` how the devices are laid out (`steps.training.mesh.MeshSpec`, checked against the
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


# -- summaries (no ML imports: used by plans) ----------------------------------------------------------


def preview(config: TrainMoeConfig) -> dict[str, Any]:
    """Shown by `drydock plan`: parameters (if the vocabulary is known), tokens, steps; for a
    declared layout or accelerator, the mesh, the memory per device and the time to train."""
    vocab = config.vocab_size or tokenizer_size_if_known(config.data)
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


def estimate(config: TrainMoeConfig) -> float | None:
    """Seconds the training will hold its devices, for a run's budget: 6 x active parameters x
    tokens at the declared accelerator's peak and MFU (`training_seconds`); None without a
    declared accelerator or a known vocabulary."""
    from steps.models import parameter_counts

    vocab = config.vocab_size or tokenizer_size_if_known(config.data)
    hardware = config.hardware or Hardware()
    if vocab is None:
        return None
    tokens = config.batch_size * config.seq_len * config.num_steps
    return training_seconds(parameter_counts(config.model, vocab)[1], tokens, hardware)


def _resumes_from(config: TrainMoeConfig) -> int | None:
    """The step an interrupted training's next attempt starts from: its newest complete checkpoint
    before the final step (a finished training has nothing to resume)."""
    from steps.training.checkpoints import complete_checkpoints

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
    """The end-of-run summary (pipeline.run.records.hooks): how far the loss came down, where things are."""
    from steps.training.metrics_file import read_metrics

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
    from steps.training.metrics_file import read_metrics

    metrics_path = os.path.join(config.output, "metrics.jsonl")
    if not exists(metrics_path):
        return None
    losses = [(row["step"], row["loss"]) for row in read_metrics(metrics_path) if "loss" in row]
    if not losses:
        return None
    return {"train/loss": float(losses[-1][1]), "train/steps": float(losses[-1][0] + 1)}


# -- the step function ------------------------------------------------------------------------------


def _check(config: TrainMoeConfig) -> None:
    config.model.check()
    for field_name in ("batch_size", "seq_len", "num_steps", "checkpoint_interval", "metrics_upload_seconds"):
        if getattr(config, field_name) <= 0:
            raise ValueError(f"{field_name} must be positive, got {getattr(config, field_name)}")


def train_moe(config: TrainMoeConfig) -> dict[str, Any]:
    """Train (or resume training) the model of `config` to `num_steps`.

    In a gang (a training across hosts: `pipeline.current_gang()`), every process runs this: it
    joins the gang's JAX process group first, trains its share of each global batch, and writes
    its shards of each checkpoint; only the leader writes the step's own files (metrics,
    rewinds, the model config, the result), and every decision to leave the training loop is
    taken together (`steps.training.gang_sync`).
    """
    attempt_started()  # before the imports: a restart pays for them too
    import_ml(*LEVANTER_MODELS)
    libraries_imported()
    _check(config)
    gang = current_gang()
    join_gang(gang)  # before anything touches a JAX backend
    os.environ.setdefault("MARIN_PREFIX", os.path.join(config.output, ".marin"))
    import draccus
    from levanter.models.lm_model import LmConfig

    from steps.data.mixture import load_data_config
    from steps.files import write_file
    from steps.models import to_levanter
    from steps.training.levanter_fixes import (
        fix_eval_tag_arrays,
        fix_mixtral_jit_log,
        keep_alive_while_evaluating,
        time_restores,
    )

    out = config.output
    checkpoints = os.path.join(out, "checkpoints")
    metrics = os.path.join(out, "metrics.jsonl")
    data = load_data_config(config.data)
    vocab = len(data.the_tokenizer)
    if config.vocab_size is not None and config.vocab_size != vocab:
        raise ValueError(f"vocab_size {config.vocab_size} does not match the tokenizer's {vocab} tokens")
    model = to_levanter(config.model, config.seq_len, data.tokenizer)
    if family(config.model.family).logs_in_loss:
        fix_mixtral_jit_log()
    fix_eval_tag_arrays()
    keep_alive_while_evaluating()
    time_restores()
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
    if config.init_from is not None and latest_step(checkpoints)[1] is None:
        # A branch's first attempt starts from its trunk's checkpoint (Levanter's initialize_from:
        # used only while the branch has no checkpoint of its own, so a resume takes its own).
        branch = wait_for_checkpoint(config.init_from, config.init_step)
    if not _ONE_TRAINING.acquire(blocking=False):
        print("train_moe: waiting for another training in this process to finish", flush=True)
        while not _ONE_TRAINING.acquire(timeout=1.0):
            pass  # back in Python each second, so a cancel (raised at the next instruction) lands
    try:
        # SIGTERM: save the step in hand and stop, to be retried from it. The clock: the ledger.
        with notice_handler(), ledger.keeping(attempt_start()):
            return train_attempts(
                config, gang, data, model, vocab, checkpoints, metrics, curve, rewinds, branch
            )
    finally:
        _ONE_TRAINING.release()


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
    said = [
        f"{name} = {rate:g} is far outside the usual range ({low:g} to {high:g}): a typo?"
        for name, rate in rates.items()
        if isinstance(rate, int | float) and not low <= rate <= high
    ]
    spec = (config.hardware or Hardware()).spec
    gathered = gathered_experts(config.model, config.mesh or MeshSpec(), config.precision)
    if spec is not None and gathered > spec.memory / 10:
        said.append(
            f"every device holds all {config.model.num_experts} experts of the layer it computes "
            f"({format_size(gathered)} a layer, {gathered / spec.memory:.0%} of a {spec.name}; "
            "Levanter's MoE layer gathers them), which the memory estimate leaves out: "
            "`drydock plan --compile` shows what the program needs"
        )
    return said


step_function(
    train_moe,
    preview=preview,
    report=report,
    metrics=metrics,
    warnings=plan_warnings,
    compile=compile_layout,
    fresh_process=True,
    watchdog=TRAINING_PACE,
    estimate=estimate,
)
