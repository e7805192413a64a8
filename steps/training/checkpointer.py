"""Levanter's checkpointer for train_moe: the metrics logged so far are published before each
checkpoint, and the tiers of checkpoints kept are pruned after it."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import jax
from levanter.checkpoint import Checkpointer, CheckpointerConfig

from pipeline.steplib import step_events
from steps.files import exists
from steps.training import ledger, preemption
from steps.training.gang_sync import barrier, exchange
from steps.training.metrics_file import publish_metrics

logger = logging.getLogger(__name__)

__all__ = [
    "MetricsCheckpointer",
    "MetricsCheckpointerConfig",
    "checkpoint_saved",
    "last_saved",
    "wait_for_checkpoints",
]


class MetricsCheckpointer(Checkpointer):
    """Levanter's checkpointer, publishing the metrics logged so far before each checkpoint.

    A run resumed from checkpoint N computes (and logs) only the steps after N again, so the lines
    of the steps up to N must be on the output before checkpoint N can be found: uploading only
    every few seconds would lose them for good if the run died in between. The checkpoint's own
    step may log more after the save began (router statistics, evaluation): that is published when
    the checkpoint commits.

    TensorStore writes checkpoints from native code, which the write fence cannot see, so each
    save first checks the step's lease (`LeaseExpired`), and refuses a step whose complete
    checkpoint exists but was not saved by this checkpointer (`LeaseExpired` too): an attempt
    resumes after its latest complete checkpoint, so another attempt must have saved it, and
    overwriting it could change the bytes a newer owner has committed.
    """

    metrics_path: str
    retention: dict[str, Any] | None = None
    """`prune_checkpoints` arguments (interval, keep, keep_every, final_step); None keeps all."""

    def on_step(self, *, tree: Any, step: int, force: bool = False) -> None:
        """Levanter's, but on a preemption notice decided at this step (every process of the
        gang decided at the same one): save it whatever the interval, wait for the commit, and
        end the attempt (`steps.training.preemption`)."""
        notice = preemption.decided()
        if notice is None or int(step) < notice:
            super().on_step(tree=tree, step=step, force=force)
            return
        with ledger.phase("checkpoints"):
            if int(step) != getattr(self, "_last_save_step", None):
                super().on_step(tree=tree, step=step, force=True)
            self.wait_until_finished()
        # Every process past its save (and the leader past the commit) before any of them ends:
        # the runner stops a gang's other processes as soon as one ends.
        barrier(f"drydock-notice-{int(step)}")
        raise preemption.stopped(int(step))

    def save_checkpoint(
        self, tree: Any, step: int, destination: str, commit_callback: Any = None, **kwargs: Any
    ) -> Any:
        _CHECKPOINTERS[self.metrics_path] = self
        # TensorStore writes the checkpoint from native code, which the write fence cannot see:
        # check the lease before handing it over, and never write over another attempt's save.
        # Every process of a gang saves its shards together, so they decide together too.
        what = f"the checkpoint of step {step}"
        guard = step_events.lease_guard()
        lost = guard.fence is not None and guard.fence.remaining() <= 0
        path = os.path.join(kwargs.get("base_path_override") or self.base_path, destination)
        saved = self.__dict__.setdefault("_saved_here", set())
        taken = int(step) not in saved and exists(os.path.join(path, "metadata.json"))
        rows = exchange([int(lost), int(taken)])
        if rows[:, 0].any():
            guard.lost(what, "the lease may have expired (on a process of the gang)")
        if rows[:, 1].any():
            guard.lost(
                f"{what} at {path}",
                "another attempt of this step has saved it (this one lost its lease, or its clock is off)",
            )
        saved.add(int(step))
        publish_metrics(self.metrics_path)

        def committed() -> None:
            checkpoint_saved(self.metrics_path, int(step), time.time())
            try:
                publish_metrics(self.metrics_path)
            except Exception as e:  # the periodic uploads and the final one retry (or stop: lease lost)
                logger.warning("could not upload metrics after the checkpoint at step %s: %s", step, e)
            if commit_callback is not None:
                commit_callback()
            self._prune(kwargs.get("base_path_override") or self.base_path)

        with ledger.phase("checkpoints"):  # the part the training waits for (the rest is async)
            return super().save_checkpoint(tree, step, destination, committed, **kwargs)

    def _prune(self, root: str) -> None:
        """Apply the retention policy under `root` once a checkpoint has committed (one host)."""
        if not self.retention or jax.process_index() != 0:
            return
        from steps.training.checkpoints import prune_checkpoints

        try:
            deleted = prune_checkpoints(root, **self.retention)
        except Exception as e:  # retention must never fail training; the next save tries again
            logger.warning("could not delete old checkpoints under %s: %s", root, e)
            return
        if deleted:
            logger.info("retention: deleted the checkpoints of steps %s", deleted)


# The checkpointer of each training attempt, by metrics path: a rewind waits for its saves.
_CHECKPOINTERS: dict[str, Checkpointer] = {}
# The latest checkpoint saved, (step, time), by metrics path: the tracker reports its age.
_SAVED: dict[str, tuple[int, float]] = {}


def checkpoint_saved(metrics_path: str, step: int, when: float) -> None:
    """Tell the tracker of `metrics_path` that the checkpoint of `step` is complete as of `when`."""
    _SAVED[metrics_path] = (step, when)


def last_saved(metrics_path: str) -> tuple[int, float] | None:
    """(step, time) of the latest complete checkpoint of the training logging to `metrics_path`."""
    return _SAVED.get(metrics_path)


def wait_for_checkpoints(metrics_path: str) -> None:
    """Wait until the checkpoint saves of the attempt logging to `metrics_path` have finished
    (a rewind must not delete checkpoints while one is still being written)."""
    checkpointer = _CHECKPOINTERS.pop(metrics_path, None)
    if checkpointer is not None:
        checkpointer.wait_until_finished()


@dataclasses.dataclass
class MetricsCheckpointerConfig(CheckpointerConfig):
    """`TrainerConfig.checkpointer` whose checkpointer is a `MetricsCheckpointer` for `metrics_path`."""

    metrics_path: str = "metrics.jsonl"
    """The local file the metrics tracker appends to (published only if it has a running uploader)."""
    retention: dict[str, Any] | None = None
    """See `MetricsCheckpointer.retention`."""

    def create(self, run_id: Any) -> Checkpointer:
        checkpointer = super().create(run_id)
        # Levanter builds the checkpointer from its own fields (whatever they are in this version);
        # only the class changes, so that save_checkpoint publishes first.
        checkpointer.__class__ = MetricsCheckpointer
        checkpointer.metrics_path = self.metrics_path  # type: ignore[attr-defined]
        checkpointer.retention = self.retention  # type: ignore[attr-defined]
        return checkpointer
