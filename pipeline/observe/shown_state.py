"""One rule for the state a view shows for a step: `drydock status`, DAG pictures, the dashboard.

`.status` says what happened (`Event`); a run's manifest says what was planned and how the run
ended (`State`). A view shows one `Shown` state, decided here:

  * an unreadable `.status` is CORRUPT;
  * a step that never started shows what its run planned for it, else NOT STARTED;
  * a finished step is SUCCESS (or, within a run, CACHED when the run found it done, else
    SUCCEEDED);
  * a RUNNING step whose runner is gone (its lease stale) is STALE: the next run takes it over;
  * a RUNNING step whose function has not started (its Ray task waits for resources: no
    `.logs/attempt-<token>.started` yet) is QUEUED (`drydock status` reads the marker);
  * otherwise the last state event itself (RUNNING, FAILED, CANCELLED, PREEMPTED).
"""

from __future__ import annotations

import enum

from pipeline.core.plan import State
from pipeline.core.records import Event, StepRecord
from pipeline.processes import pid_alive

__all__ = ["Shown", "live_state", "runner_gone"]


class Shown(enum.StrEnum):
    """States only views show (the others are `Event` and `State` values)."""

    NOT_STARTED = "NOT STARTED"
    STALE = "STALE"
    CORRUPT = "CORRUPT"
    QUEUED = "QUEUED"


def runner_gone(record: StepRecord, now: float, local_host: str) -> bool:
    """Whether a step whose last state is RUNNING has lost its runner: its lease is absent,
    released or expired, or held by a dead process on this very host."""
    return record.state == Event.RUNNING and record.lease_stale(now, local_host, pid_alive)


def live_state(record: StepRecord, *, stale: bool, planned: str | None = None) -> str:
    """The state to show for `record` (see the module docstring). `planned` is the state a run's
    manifest gives the step, for views of a run; None for a plain view of storage."""
    if record.corrupt:
        return Shown.CORRUPT
    if record.state is None:
        return planned if planned is not None else Shown.NOT_STARTED
    if record.state == Event.SUCCESS:
        if planned is None:
            return Event.SUCCESS
        return State.CACHED if planned == State.CACHED else State.SUCCEEDED
    if stale:
        return Shown.STALE
    return record.state
