"""How long an attempt of a training took to reach its first step, and what compiling cost it.

A retry after a preemption starts a new process, which imports the libraries, restores the
checkpoint and compiles the training step again: on a large model the compilation alone is
minutes, unless JAX's persistent compilation cache has the programs (`steps.compilation_cache`).
`train_moe` calls `attempt_started` first thing; the tracker calls `first_step` when the attempt's
first step is logged. That prints one line in the attempt's log (the seconds in between, and how
many programs came from the cache) and keeps it for the training's result (`train_result.json`,
"start"). The seconds count from the step function's call, not the process's start: Ray may have
started the worker process long before, idle.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from steps.compilation_cache import CompilationStats, compilation_stats

__all__ = ["attempt_start", "attempt_started", "first_step", "libraries_imported", "start_record"]


# Per thread: with the local backend trainings run in threads of one process (one at a time,
# but the next one's start must not be the last one's), and a training's loop, which logs its
# first step, runs in the thread that called the step function.
_ATTEMPT = threading.local()


def attempt_started() -> None:
    """Mark now as the start of this thread's attempt (its step function was called)."""
    _ATTEMPT.started = time.time()
    _ATTEMPT.baseline = None
    _ATTEMPT.record = None


def attempt_start() -> float:
    """When this thread's attempt started (`attempt_started`; now, if it was not called)."""
    return getattr(_ATTEMPT, "started", None) or time.time()


def libraries_imported() -> None:
    """Count compilations from here (JAX is imported): a process may have compiled before."""
    _ATTEMPT.baseline = compilation_stats()


def first_step(step: int, now: float) -> dict[str, Any] | None:
    """Record (and print) that this attempt's first step, `step`, was logged at `now`. Only the
    first call counts: a rewind restarts the loop inside the same attempt. None outside an
    attempt's thread."""
    started = getattr(_ATTEMPT, "started", None)
    if started is None:
        return None
    if _ATTEMPT.record is not None:
        return dict(_ATTEMPT.record)
    stats = _since_start()
    seconds = max(0.0, now - started)
    _ATTEMPT.record = {"step": step, "seconds_from_start": round(seconds, 3), "compilation": stats.to_json()}
    print(
        f"train_moe: first step ({step}) {seconds:.1f} s after the attempt started; compilation: "
        f"{stats.describe()}",
        flush=True,
    )
    return dict(_ATTEMPT.record)


def start_record() -> dict[str, Any] | None:
    """This attempt's first-step record, with its compilation totals so far (None before it)."""
    record = getattr(_ATTEMPT, "record", None)
    if record is None:
        return None
    return {**record, "compilation_total": _since_start().to_json()}


def _since_start() -> CompilationStats:
    stats = compilation_stats()
    baseline = getattr(_ATTEMPT, "baseline", None)
    return stats.since(baseline) if baseline is not None else stats
