"""Waiting on a training that may still be running: for one of its checkpoints (a branch starting
from a training that is still going, `wait_for_checkpoint`), or while a follower evaluates it
(`steps.evaluation.follow`). How long to wait is `FollowSettings`; a training that finishes without
what is waited for, or stays failed or away, is an error naming it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.steplib import step_state
from steps.training.checkpoints import checkpoint_at, checkpoints_dir

__all__ = ["FollowSettings", "training_waited", "wait_for_checkpoint"]


@dataclass(frozen=True)
class FollowSettings:
    """How a follower waits (none of it changes what is computed, so none of it is versioned)."""

    poll_seconds: float = 5.0
    """How often to look for a new checkpoint while none is there."""
    patience_seconds: float = 3600.0
    """Give up if the training has not run (not started, preempted, runner gone) this long."""
    failed_grace_seconds: float = 120.0
    """Give up if the training stays FAILED or CANCELLED this long (a retry restarts it sooner)."""


def wait_for_checkpoint(
    train: str,
    step: int,
    *,
    settings: FollowSettings = FollowSettings(),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """The complete checkpoint of `step` of training output `train`, waiting for it while the
    training runs (a branch starting from a training that is still going). A training that
    finishes without it, or stays failed or away, is an error naming the training."""
    root = checkpoints_dir(train)
    waiting_since: float | None = None
    finished = False
    told = False
    while (found := checkpoint_at(root, step)) is None:
        if finished:
            raise FileNotFoundError(
                f"the training at {train} finished without a checkpoint at step {step} under {root}"
            )
        if not told:
            print(f"waiting for the checkpoint of step {step} under {root}", flush=True)
            told = True
        finished, waiting_since = training_waited(
            train, waiting_since, settings, clock, f"its checkpoint of step {step}. Rerun to resume."
        )
        if not finished:
            sleep(settings.poll_seconds)
    return found


def training_waited(
    train: str,
    waiting_since: float | None,
    settings: FollowSettings,
    clock: Callable[[], float],
    before: str,
) -> tuple[bool, float | None]:
    """While waiting for a checkpoint of training output `train`: (whether it has finished, so a
    last look is due: its checkpoints land before its commit; since when it has not been
    running). A training failed past `failed_grace_seconds`, or away past `patience_seconds`, is
    a RuntimeError saying what was waited `before`."""
    state = step_state(train)
    if state == "SUCCESS":
        return True, waiting_since
    if state == "RUNNING":
        return False, None
    waiting_since = clock() if waiting_since is None else waiting_since
    failed = state in ("FAILED", "CANCELLED", "CORRUPT")
    limit = settings.failed_grace_seconds if failed else settings.patience_seconds
    if clock() - waiting_since > limit:
        raise RuntimeError(f"the training at {train} is {state} (for over {limit:.0f} s) before {before}")
    return False, waiting_since
