"""A preemption notice, turned into a checkpoint of the step in hand and a clean stop.

Ray draining a node, Kubernetes deleting a pod and a spot or preemptible VM shutting down all send
SIGTERM first and SIGKILL a grace period later (30 s on a GCE spot VM, Kubernetes' default too).
While a training runs, `notice_handler` keeps SIGTERM for itself (in the process's main thread,
where Ray runs a task; elsewhere Python allows no handler, and the signal keeps its usual effect):
the handler only notes the time. At the next step's loss every process of the gang shares whether
any of them got one (`steps.training.tracker.decide_together`) and `decide` marks that step; the
checkpoint hook of the same step (`steps.training.checkpointer.MetricsCheckpointer`) then saves
it whatever the interval, waits until it is committed, and raises `PreemptionNoticed`. The step
function ends with it, the runner records the attempt PREEMPTED (not failed) and retries it, and
the retry resumes from that very step: of the steps done, none is lost.

A Google Cloud VM's metadata announcing its end (a TERMINATE maintenance event, a spot VM's
preemption: `steps.training.maintenance`) is a notice too.

The runner's request to stop (its run's budget is spent: `step_events.on_stop`) takes the same
path, and ends the attempt with `StepStopped` instead: recorded CANCELLED, resumed by the next run.

A second SIGTERM while the checkpoint is being saved is noted again, not obeyed: the save is what
the grace period is for, and SIGKILL comes anyway when it runs out.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from pipeline.steplib import StepPreempted, StepStopped, step_events
from steps.training import maintenance

__all__ = ["PreemptionNoticed", "decide", "decided", "notice_handler", "received"]

logger = logging.getLogger(__name__)


class PreemptionNoticed(StepPreempted):
    """The training saved a checkpoint on a preemption notice and stopped; retried from it."""


_RECEIVED: list[float] = []
_DECIDED: list[int] = []
_WHY: list[str] = []
"""What the notice was, when it was not SIGTERM (a GCE maintenance event)."""
_STOP: list[str] = []
"""The runner's message, when the notice is its request to stop (the run's budget is spent)."""


def received() -> bool:
    """Whether this process got a notice that no step has acted on yet."""
    return bool(_RECEIVED) and not _DECIDED


def decide(step: int) -> None:
    """The gang decided, at `step`'s loss, to save `step` and stop (every process calls this)."""
    if not _DECIDED:
        _DECIDED.append(step)
        logger.warning("preemption notice: saving the checkpoint of step %s, then stopping", step)


def decided() -> int | None:
    """The step whose checkpoint ends this attempt, once the gang decided so."""
    return _DECIDED[0] if _DECIDED else None


def stopped(step: int) -> Exception:
    """The error that ends the attempt once the checkpoint of `step` is committed: a preemption,
    or, when the runner asked, a clean stop (`StepStopped`, recorded CANCELLED, not retried)."""
    if _STOP:
        return StepStopped(
            f"{_STOP[0]}: saved the checkpoint of step {step}; the next run resumes from there"
        )
    waited = time.time() - _RECEIVED[0] if _RECEIVED else 0.0
    why = _WHY[0] if _WHY else "SIGTERM"
    return PreemptionNoticed(
        f"preemption notice ({why}): saved the checkpoint of step {step} {waited:.1f} s after it came; "
        "the retry resumes from there"
    )


def _on_sigterm(signum: int, frame: Any) -> None:
    _RECEIVED.append(time.time())


def _on_maintenance(why: str) -> None:
    """The VM's metadata announces its end (`steps.training.maintenance`): a notice."""
    logger.warning("preemption notice: %s", why)
    _WHY.append(why)
    _RECEIVED.append(time.time())


def _on_stop_request(message: str) -> None:
    """The runner asked the attempt to stop (`step_events.on_stop`): the same path as a notice."""
    _STOP.append(message)
    _RECEIVED.append(time.time())


@contextlib.contextmanager
def notice_handler() -> Iterator[None]:
    """Take SIGTERM as a preemption notice, and the runner's request to stop as a notice to stop,
    while the block runs (a training's attempts)."""
    _RECEIVED.clear()
    _DECIDED.clear()
    _STOP.clear()
    _WHY.clear()
    if threading.current_thread() is not threading.main_thread():
        # A thread of the local backend: signals are the runner's (Ctrl-C cancels the run).
        with step_events.on_stop(_on_stop_request), maintenance.watching(_on_maintenance):
            yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with step_events.on_stop(_on_stop_request), maintenance.watching(_on_maintenance):
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if _RECEIVED and not _DECIDED:
            # After the last step (the export, the result): the training is done, and the
            # attempt ends on its own before the grace period does, or is killed and retried.
            logger.warning("a preemption notice came after the last training step: finishing")
        _RECEIVED.clear()
        _DECIDED.clear()
        _STOP.clear()
        _WHY.clear()
