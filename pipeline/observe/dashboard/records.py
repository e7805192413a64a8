"""What the dashboard shows, as plain frozen values: experiments, step rows, a step's detail."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.lease import LeaseRecord
from pipeline.core.records import StatusEvent
from pipeline.observe.compare import Row

__all__ = [
    "Comparison",
    "EvalResults",
    "ExperimentDetail",
    "ExperimentSummary",
    "Metrics",
    "Progress",
    "StepDetail",
    "StepRow",
]


@dataclass(frozen=True)
class Progress:
    """What a running step last reported with `step_events.progress` (its `.progress` file)."""

    done: float
    total: float | None
    unit: str
    time: float
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def percent(self) -> int | None:
        share = 100 * self.done / self.total if self.total else None
        return int(share) if share is not None and math.isfinite(share) else None


@dataclass(frozen=True)
class StepRow:
    """One step of an experiment: the manifest's entry joined with what `.status` says now."""

    label: str
    name: str
    fn: str
    deps: tuple[str, ...]
    soft_deps: tuple[str, ...]
    manifest_state: str
    """The run's outcome (SUCCEEDED, CACHED, FAILED, BLOCKED, ...) or, while it runs, the plan's."""
    storage_state: str | None
    """The last state event of `.status` now (SUCCESS, RUNNING, FAILED, ...); None if never started."""
    state: str
    """What to show: `live_state` of the two."""
    progress: Progress | None = None
    """The current attempt's progress report, for a step RUNNING now."""
    reason: str = ""
    started: float | None = None
    ended: float | None = None
    duration: float | None = None
    attempts: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class ExperimentSummary:
    """One manifest, as listed on the front page."""

    id: str
    """The manifest's file name without `.json`: `<experiment>-<hash>`, the experiment's URL key."""
    experiment: str
    description: str
    run_id: str
    started: float | None
    updated: float | None
    finished: bool
    exit_code: int | None
    counts: Mapping[str, int]
    """Number of steps per manifest state."""
    error: str | None = None
    """Why the manifest could not be read, if it could not."""
    run: str | None = None
    """The run record this row shows (a run id), or None for the manifest (the latest run)."""
    changed: tuple[str, ...] = ()
    """Steps whose identity differs from the previous run of the same experiment (what it changed)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Step name -> label in this run (to compare runs)."""
    differences: tuple[str, ...] = ()
    """For the changed steps: the versioned values that differ (`train/x: optimizer.learning_rate
    0.003 → 0.01`), read from the two `.step.json`s."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    added: tuple[str, ...] = ()
    """Steps this run has that the previous run of the same experiment file did not (its graph grew:
    a sweep with a new point)."""
    removed: tuple[str, ...] = ()
    """Steps the previous run had that this one does not."""
    previous: str | None = None
    """The id of the run it was compared with (None for an experiment file's first run)."""
    """Headline metrics this run recorded (`<step>: <metric>`), e.g. a training's final loss."""


@dataclass(frozen=True)
class ExperimentDetail:
    """A manifest with every step's live state."""

    summary: ExperimentSummary
    steps: tuple[StepRow, ...]
    """In the manifest's (topological) order."""
    environment: Mapping[str, Any]
    """git, versions, host and argv of the run, as recorded."""


@dataclass(frozen=True)
class Metrics:
    """A metrics.jsonl, one merged record per step, ready to chart."""

    steps: tuple[int, ...]
    loss: tuple[float | None, ...]
    learning_rate: tuple[float | None, ...]
    total_steps: int
    """Records in the file (the chart may show fewer: see MAX_CHART_POINTS)."""
    last: Mapping[str, Any]
    """The last step's record, every key."""
    eval_steps: tuple[int, ...] = ()
    eval_loss: tuple[float | None, ...] = ()
    """The evaluations made during training (`eval/loss`), every one (they are few)."""
    events: tuple[Mapping[str, Any], ...] = ()
    """Interventions (`{"step", "event", "loss", "message"}`: spikes, NaN/Inf, skipped updates,
    rewinds), every one; `loss` is None where it was not finite."""
    tokens_per_second: tuple[float | None, ...] = ()
    mfu: tuple[float | None, ...] = ()
    """Throughput and model FLOPs utilization (percent) at the steps shown, where logged."""
    step_seconds: Mapping[str, Any] | None = None
    """Seconds per step over the whole run: count, p10, median, p90, p99, max, and a histogram
    (`edges`, `counts`); None with fewer than two consecutive steps."""
    router_steps: tuple[int, ...] = ()
    router_max_load_ratio: tuple[float | None, ...] = ()
    router_mean_max_load_ratio: tuple[float | None, ...] = ()
    """Expert balance at the steps router statistics were logged: the most loaded expert's share
    of assignments times the number of experts (1.0 is even), in the worst layer and averaged
    over layers."""


@dataclass(frozen=True)
class EvalResults:
    """An evaluate step's results.json."""

    checkpoint: str | None
    checkpoint_step: int | None
    sets: Mapping[str, Mapping[str, float | None]]
    """Per validation set: loss, bits_per_byte, perplexity."""
    average: Mapping[str, float | None]


@dataclass(frozen=True)
class StepDetail:
    """Everything the step page shows."""

    label: str
    step_json: Mapping[str, Any] | None
    events: tuple[StatusEvent, ...]
    state: str | None
    """The last state event's name; None if the step never started."""
    lease: LeaseRecord | None
    corrupt: str | None
    """Why `.status` could not be read, if it could not."""
    logs: tuple[str, ...]
    """Log file names in `.logs/`, oldest attempt first."""
    files: tuple[str, ...]
    """The payload's top-level entries (Drydock's own files left out)."""
    metrics: Metrics | None
    results: EvalResults | None
    problems: tuple[str, ...] = field(default=())
    """Files that exist but could not be read (a metrics or results file in another format)."""
    stale: bool = False
    """RUNNING, but its runner is gone (see `runner_gone`)."""
    progress: Progress | None = None
    """The latest attempt's progress report."""
    curve: Mapping[str, Any] | None = None
    """A follower's curve so far (`curve.json`: `ylabel`, `steps`, `series` of values per step)."""
    report: str | Mapping[str, Any] | None = None
    """What the step's `report` hook said when it succeeded (recorded with its SUCCESS event):
    text, or a mapping of values and tables (lists of rows), rendered whatever the step kind."""


@dataclass(frozen=True)
class Comparison:
    """The compare page: the runs picked, their rows, the fields that differ, the loss curves."""

    runs: tuple[str, ...]
    params: tuple[str, ...]
    metrics: tuple[str, ...]
    rows: tuple[Row, ...]
    curves: tuple[Mapping[str, Any], ...]
    checkpoint_curves: tuple[Mapping[str, Any], ...] = ()
    """Eval loss and task scores by checkpoint of the steps following the rows' trainings."""
    best_metric: str | None = None
    """The metric the best row is picked by (`eval/prose/loss`: lowest; an accuracy: highest)."""
    best_label: str | None = None
    """The label of the best row's training, if there is one to pick (two rows or more)."""
