"""The outcome of executing a plan: per step, its final state, timings, attempts and error.

A value: the executor produces it, manifests, summaries and the CLI read it. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.core.plan import Plan, State

__all__ = ["RunReport", "StepOutcome"]


@dataclass
class StepOutcome:
    """What happened to one step in this run."""

    state: State
    started: float | None = None
    ended: float | None = None
    attempts: int = 0
    error: str | None = None
    traceback: str | None = None
    blocked_by: str | None = None
    metrics: Mapping[str, Any] | None = None
    """What the step's `metrics` hook recorded when this run committed it."""

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started


@dataclass(frozen=True)
class RunReport:
    """The outcome of executing a plan."""

    plan: Plan
    outcomes: Mapping[str, StepOutcome]
    interrupted: bool = False
    budget_spent: str | None = None
    """Why the run stopped before it finished: its budget was spent (`pipeline.run.scheduler.budget`)."""
    manifest_error: str | None = None
    """Why the run's manifest could not be written at its end (e.g. a full disk): every step's
    outcome stands (what committed stays committed), but the run is not recorded."""

    def labels(self, *states: State) -> list[str]:
        return [label for label, o in self.outcomes.items() if o.state in states]

    @property
    def ok(self) -> bool:
        failed = self.labels(State.FAILED, State.BLOCKED, State.CANCELLED)
        return not self.interrupted and not failed and self.manifest_error is None

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.budget_spent is not None and not self.labels(State.FAILED):
            return 3  # stopped cleanly by its budget: not a failure, not done
        return 0 if self.ok else 1
