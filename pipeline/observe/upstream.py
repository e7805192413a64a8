"""What a running step can learn about another step's directory: the state a view would show.

A step that follows a non-blocking upstream (an evaluation following a training, checkpoint by
checkpoint) asks this to know when the upstream has finished, failed, or lost its runner.
"""

from __future__ import annotations

import time

from pipeline.observe.shown_state import live_state, runner_gone
from pipeline.processes import host_id
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore

__all__ = ["step_state"]


def step_state(step_dir: str) -> str:
    """The state of the step whose output directory is `step_dir` (a path or URL), as
    `drydock status` shows it: NOT STARTED, RUNNING, SUCCESS, FAILED, CANCELLED, PREEMPTED, STALE
    (its runner is gone) or CORRUPT."""
    step_dir = step_dir.rstrip("/")
    record = StepStore(open_storage(step_dir)).record(step_dir, with_metadata=False)
    return str(live_state(record, stale=runner_gone(record, time.time(), host_id())))
