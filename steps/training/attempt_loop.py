"""The attempts of one training: Levanter's `train_lm` until `num_steps`, resuming from the
latest checkpoint, and the rewinds a loss spike asks for (checkpoints set aside, batches skipped,
the learning rate lowered), with the decisions a gang takes together. Called by
`steps.training.train_moe.train_moe` while it holds the process's one training."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any

import fsspec

from pipeline.steplib import step_events
from steps.files import local_path, read_text
from steps.models import family
from steps.training import ledger
from steps.training.checkpoints import checkpoint_at, latest_checkpoint
from steps.training.config import TrainMoeConfig, summarize
from steps.training.gang_sync import barrier, exchange
from steps.training.levanter_config import hub_offline, levanter_train_config
from steps.training.spikes import (
    REWINDS_FILE,
    Rewind,
    RewindNeeded,
    TrainingDiverged,
    count_interventions,
    data_batch,
    read_rewinds,
    skipped_ranges,
)
from steps.training.startup import start_record

logger = logging.getLogger(__name__)

__all__ = ["latest_step", "train_attempts"]


def latest_step(checkpoints: str) -> tuple[str | None, int | None]:
    """The latest complete checkpoint under `checkpoints` (a path or URL) and its step."""
    found = latest_checkpoint(checkpoints)
    return found if found is not None else (None, None)


def train_attempts(
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
    from steps.files import write_file
    from steps.training.levanter_fixes import fresh_tensorstore_cache
    from steps.training.metrics_file import read_events

    out = config.output
    rewinds_path = os.path.join(out, REWINDS_FILE)
    first_resumed_from = None
    started = time.time()
    while True:
        # Decided once: every process resumes from the checkpoint the leader found.
        resumed_from = _shared_step(latest_step(checkpoints)[1])
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
            if (clock := ledger.active()) is not None:
                # The steps after the restored checkpoint, up to the spike, are computed again.
                clock.rewound(max(0, e.trigger_step - max(restored, -1)))
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
    if (clock := ledger.active()) is not None:
        clock.switch("finishing")
    # The final checkpoint, as the leader found it: every process of a gang exports the same one.
    final_step = _shared_step(latest_step(checkpoints)[1])
    final = None if final_step is None else checkpoint_at(checkpoints, final_step)
    exported = None
    if config.hf_export and not family(config.model.family).levanter_export and final is not None:
        from steps.training.checkpoints import export_checkpoint

        # No Hugging Face architecture has this model: safetensors and a config.json instead. In a
        # gang every process loads its shards and takes part in gathering them; the leader writes.
        exported = export_checkpoint(
            out,
            final,
            config.model,
            vocab,
            os.path.join(out, "export", f"step-{final_step}"),
            leader=gang.leader,
        )
    if not gang.leader:
        return {"process": gang.index}
    if local_path(out) is not None:  # rewinds set checkpoints aside only for this process
        shutil.rmtree(os.path.join(out, REWOUND_DIR), ignore_errors=True)
    result = {
        **summarize(config, vocab),
        "resumed_from_step": first_resumed_from,
        "final_checkpoint": final,
        "final_step": final_step,
        "wall_seconds": time.time() - started,
        "interventions": count_interventions(read_events(metrics)),
        # This attempt's time to its first step and the compilation cache's part in it.
        "start": start_record(),
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

    from steps.files import local_path
    from steps.training.checkpointer import checkpoint_saved, wait_for_checkpoints
    from steps.training.metrics_file import (
        MetricsUploader,
        begin_metrics,
        read_events,
        read_metrics,
        write_metrics,
    )
    from steps.training.rewinds import fresh_optimizer_state

    out = config.output
    metrics = os.path.join(out, "metrics.jsonl")
    # On object storage the tracker appends to a scratch file, which is published as it grows.
    # The other processes of a gang keep nothing: their scratch only holds Levanter's own log.
    scratch = None if local_path(out) is not None and leader else _scratch_dir()
    appended = metrics if scratch is None else os.path.join(scratch, "metrics.jsonl")
    if leader:
        dropped: list[int] = []
        begin_metrics(metrics, appended, resumed_from, [_rewind_event(r) for r in rewinds], dropped)
        clock = ledger.active()
        if clock is not None and clock.first_step is None and resumed_from is not None:
            # What the attempt before this process logged past the checkpoint: computed again
            # now (a rewind's are counted by the rewind).
            clock.resumed(resumed_from, max(dropped, default=resumed_from))
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
        leader=leader,
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
    from steps.training.checkpoints import complete_checkpoints

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
    from steps.training.checkpoints import delete_checkpoints

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
