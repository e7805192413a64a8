"""Levanter's configs for a `train_moe` step: the optimizer and the whole `TrainLmConfig`.

Everything Drydock decides about a Levanter training run is here: trackers (metrics.jsonl, the
spike guard, optionally Weights & Biases), router statistics, checkpoint policy, HF export.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steps.models import family

if TYPE_CHECKING:
    from steps.training.config import OptimizerSpec, TrainMoeConfig
    from steps.training.spikes import Rewind, SpikePolicy, Stability

__all__ = ["hub_offline", "levanter_optimizer", "levanter_train_config"]


def levanter_optimizer(
    spec: OptimizerSpec, stability: Stability | None = None, policy: SpikePolicy | None = None
) -> Any:
    """Levanter's optimizer config (AdamW or Muon) with the spec's learning-rate schedule; for
    AdamW also `stability`'s update clipping and, under the `skip` policy, Levanter's skip-step
    wrapper (train_moe_step refuses those with Muon, which has neither)."""
    schedule = dict(
        warmup=spec.warmup,
        min_lr_ratio=spec.min_lr_ratio,
        lr_schedule=spec.lr_schedule,
        weight_decay=spec.weight_decay,
        decay=spec.decay,
    )
    if spec.name == "adamw":
        from levanter.optim import AdamConfig
        from levanter.optim.clip_update_norm import ClipUpdateNormConfig
        from levanter.optim.skipstep import SkipStepConfig

        extra: dict[str, Any] = {}
        if stability is not None and stability.update_rms_clipping is not None:
            extra["update_rms_clipping"] = stability.update_rms_clipping
        if stability is not None and stability.clip_update_sigma is not None:
            extra["clip_update_norm"] = ClipUpdateNormConfig(
                rolling_interval_length=stability.clip_update_window, sigma_factor=stability.clip_update_sigma
            )
        if policy is not None and policy.action == "skip":
            extra["skip_bad_steps"] = SkipStepConfig(
                rolling_interval_length=policy.skip_window, sigma_factor=policy.skip_sigma
            )
        return AdamConfig(
            learning_rate=spec.learning_rate,
            beta1=spec.beta1,
            beta2=spec.beta2,
            max_grad_norm=spec.max_grad_norm,
            **schedule,
            **extra,
        )
    if spec.name == "muon":
        from levanter.optim.muon import MuonConfig

        # In this Levanter the Muon rate is OptimizerConfig.learning_rate (MuonConfig.lr is unused).
        return MuonConfig(
            learning_rate=spec.learning_rate,
            adam_lr=spec.adam_learning_rate,
            beta1=spec.beta1,
            beta2=spec.beta2,
            max_grad_norm=spec.max_grad_norm,
            **schedule,
        )
    raise ValueError(f"optimizer.name: unknown {spec.name!r}; use 'adamw' or 'muon'")


@contextlib.contextmanager
def hub_offline(offline: bool) -> Iterator[None]:
    """Fail hub look-ups at once instead of retrying (minutes, on machines without network)."""
    if not offline:
        yield
        return
    import huggingface_hub.constants as hub

    previous = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = previous


def levanter_train_config(
    config: TrainMoeConfig,
    data: Any,
    model: Any,
    *,
    metrics_path: str | None = None,
    log_dir: str | None = None,
    rewinds: list[Rewind] | None = None,
    prediction: str | None = None,
    initialize_from: str | None = None,
    leader: bool = True,
) -> Any:
    """The `TrainLmConfig` that train_moe hands to Levanter's `train_lm.main` for `config`.

    `metrics_path` is the local file the metrics tracker appends to and `log_dir` where Levanter's
    log goes (default: `metrics.jsonl` and `logs/` in the output, which must then be local).
    `rewinds` (the run's so far) skip their data batches and scale the learning rate.
    `initialize_from` is the trunk's checkpoint a branch starts from while it has none of its own.
    The `leader` (process 0 of a gang) records the layout the training runs with (`layout.json`).
    """
    import dataclasses
    import json

    import jax
    import jmp
    from levanter.callbacks.watch import WatchConfig
    from levanter.distributed import DistributedConfig
    from levanter.main.train_lm import TrainLmConfig
    from levanter.trainer import TrainerConfig
    from levanter.utils.mesh import MeshConfig

    from steps.files import local_path
    from steps.training.checkpointer import MetricsCheckpointerConfig
    from steps.training.layout import LAYOUT_FILE
    from steps.training.rewinds import scale_learning_rate, shift_schedule, skip_batches
    from steps.training.spikes import skipped_ranges
    from steps.training.tracker import JsonlTrackerConfig
    from steps.training.watch import DrydockWatchConfig

    out = config.output
    if local_path(out) is None and (metrics_path is None or log_dir is None):
        raise ValueError(
            f"output {out!r} is not on local disk: pass metrics_path and log_dir (local paths) "
            "for the metrics tracker and Levanter's log"
        )
    metrics_path = metrics_path or os.path.join(out, "metrics.jsonl")
    trackers: list[Any] = [
        JsonlTrackerConfig(
            path=metrics_path,
            spike_policy=json.dumps(dataclasses.asdict(config.spike_policy)),
            summary_path=os.path.join(out, "summary.json"),
            prediction=prediction,
            branch=None if config.init_from is None else json.dumps(_branch_event(config)),
        )
    ]
    if config.wandb_project:
        from levanter.tracker.wandb import WandbConfig

        trackers.append(WandbConfig(project=config.wandb_project))
    mesh = config.mesh.to_levanter() if config.mesh is not None else MeshConfig()
    watch = DrydockWatchConfig(
        interval=config.router_stats_interval or WatchConfig.interval,
        data_config=data,
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        compute_mapping=mesh.resolved_compute_mapping,
        router_stats=config.router_stats_interval > 0,
        layout_path=os.path.join(out, LAYOUT_FILE) if leader else None,
    )
    rewinds = rewinds or []
    data = skip_batches(data, skipped_ranges(rewinds), config.batch_size)
    optimizer = levanter_optimizer(config.optimizer, config.stability, config.spike_policy)
    # A branch with a fresh optimizer: its schedule counts from the branch point, over its own steps.
    offset = config.init_step if config.init == "weights" and config.init_step else 0
    optimizer = shift_schedule(optimizer, offset)
    # Under skip and rewind a NaN/Inf loss is the guard's to handle, not a crash.
    guarded = config.spike_policy.action != "warn"
    return TrainLmConfig(
        data=data,
        model=model,
        train_seq_len=config.seq_len,
        optimizer=scale_learning_rate(optimizer, rewinds, offset),
        z_loss_weight=config.stability.z_loss,
        trainer=TrainerConfig(
            id="train",
            seed=config.seed,
            num_train_steps=config.num_steps,
            train_batch_size=config.batch_size,
            steps_per_eval=config.eval_interval,
            max_eval_batches=config.max_eval_batches,
            tracker=tuple(trackers) if len(trackers) > 1 else trackers[0],
            log_dir=Path(log_dir or os.path.join(out, "logs")),
            require_accelerator=False,
            crash_on_nan=not guarded,
            crash_on_inf=not guarded,
            log_jaxprs=False,
            log_xla_hlo=False,
            initialize_from=initialize_from,
            mesh=mesh,
            mp=jmp.get_policy("p=f32,c=bfloat16" if config.precision == "bf16" else "f32"),
            # A gang joined its process group before anything else (steps.training.gang_sync.join_gang);
            # a later attempt in the same process (after a rewind) must not join again.
            distributed=DistributedConfig(initialize_jax_distributed=not jax.distributed.is_initialized()),
            watch=watch,
            # Publishes metrics.jsonl before each checkpoint when the output is on object storage.
            checkpointer=MetricsCheckpointerConfig(
                metrics_path=metrics_path,
                base_path=os.path.join(out, "checkpoints"),
                append_run_id_to_base_path=False,
                save_interval=timedelta(minutes=config.checkpoint_minutes),
                keep=[dict(every=config.checkpoint_interval)],
                retention=None
                if config.keep_checkpoints is None
                else dict(
                    interval=config.checkpoint_interval,
                    keep=config.keep_checkpoints,
                    keep_every=config.keep_every,
                    final_step=config.num_steps - 1,
                ),
            ),
        ),
        # A family without a Hugging Face architecture (drydock_moe): train_moe exports it itself (export/).
        hf_save_path=os.path.join(out, "hf")
        if config.hf_export and family(config.model.family).levanter_export
        else None,
        hf_save_steps=config.num_steps,
        data_seed=config.seed,
    )


def _branch_event(config: Any) -> dict[str, Any]:
    """The `branch` line a branch's metrics start with: which trunk, from which step."""
    from pipeline.steplib import branch_event

    return branch_event(str(config.init_from), config.init_step, name=config.init_name, init=config.init)
