"""How one attempt of a step ends, as the run loop hears of it (`pipeline.run.scheduler.executor`): its
`Ending`, the one `AttemptEvent` each attempt reports, and the classification of the error that
ended it (a preemption is retried, a failure is not, a cancel is neither)."""

from __future__ import annotations

import enum
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.core.records import Event
from pipeline.errors import StepCancelled, StepFailed, StepPreempted, StepStopped

__all__ = ["CAUSES", "AttemptEvent", "Ending", "classify", "format_traceback"]


class Ending(enum.Enum):
    """How one attempt ended, as it reports to the loop."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    HELD = "held"
    """Another live runner holds the lease."""
    DONE_ELSEWHERE = "done elsewhere"
    """Another runner committed the step first."""
    LOST = "lost"
    """The lease was lost while running: the result is discarded."""


@dataclass(frozen=True)
class AttemptEvent:
    """What one attempt reports to the run loop: exactly one per attempt, whatever happened."""

    label: str
    kind: Ending
    detail: str = ""
    traceback: str | None = None
    started: float | None = None
    ended: float | None = None
    metrics: Mapping[str, Any] | None = None


def format_traceback(error: BaseException) -> str:
    """The traceback of `error`, or its repr if formatting fails too (e.g. a broken `linecache`)."""
    try:
        return "".join(traceback.format_exception(error))
    except BaseException:
        return repr(error)


CAUSES = {Ending.PREEMPTED: "lost machine", Ending.FAILED: "error", Ending.CANCELLED: "interrupted"}
"""Why an attempt ended, in a word, for the run page's list of attempts."""


def classify(error: BaseException) -> tuple[Ending, str, str, str | None]:
    """(event kind, status event, message, traceback) for an attempt that ended in `error`."""
    if isinstance(error, StepStopped):
        return Ending.CANCELLED, Event.CANCELLED, str(error), None
    if isinstance(error, StepCancelled):
        return Ending.CANCELLED, Event.CANCELLED, "interrupted", None
    if isinstance(error, StepPreempted):
        return Ending.PREEMPTED, Event.PREEMPTED, str(error), None
    if isinstance(error, StepFailed):
        return Ending.FAILED, Event.FAILED, str(error), error.remote_traceback
    return Ending.FAILED, Event.FAILED, f"{type(error).__name__}: {error}", format_traceback(error)
