"""What the step library may use of the engine, beside `pipeline`'s public names.

A step kind (`steps/`) is written against two modules: `pipeline` to declare its step (`Step`,
`versioned`, `output_of`, `this_output`, `Resources`, `step_function`, `added_field`, ...) and
this one for what its function does while it runs. An import-linter contract in pyproject.toml
forbids `steps` every other module of `pipeline`, so the engine's internals can move without
touching the step library, and a newcomer has one page to read:

    step_events          notes (`warn`) and progress (`progress`) from inside a step, and the
                         lease check below
    check_lease(what)    call before any write the write fence cannot see: a native writer (a
                         Levanter checkpoint, TensorStore), an upload with its own client. It
                         raises `LeaseExpired` when this attempt may have lost its lease, so a
                         stale attempt never overwrites its successor's files. Writes through
                         `write_atomically` and the `steps.files` helpers are fenced already.
    lease_guard()        the same check, captured in the step's thread for threads it starts
    current_gang()       this process's place in a gang of hosts (a gang of one outside one)
    step_state           the state of another step's directory (for a step that follows one)
    parallel_map         parallel work inside a step, asked of its backend (Ray tasks on Ray)
    write_atomically     one file written whole or not at all (`.tmp-*` first: gc finds leftovers)
    open_storage         the prefix's storage, for steps that write through it
    cache_dir(*parts)    Drydock's cache on this machine ($DRYDOCK_CACHE_DIR, else
                         $XDG_CACHE_HOME/drydock, else ~/.cache/drydock)
    StepCancelled        raised into a step function when its run is cancelled
    StepPreempted        raise it to end an attempt as PREEMPTED, to be retried (a training that
                         saved its checkpoint on a preemption notice)
    StepStopped          raise it to end an attempt its run asked to stop (`step_events.on_stop`),
                         its work kept: recorded CANCELLED, not retried in this run
    metrics.jsonl        the per-step metrics format every reader shares: `METRICS_FILE`,
                         `METRICS_DIR` (segments on object storage), `ALIASES`, `parse_metrics`,
                         `parse_events`, `read_metrics_data`, `metrics_files`, `segment_name`,
                         `segment_index`, `branch_event`
    evidence             a curation step's record of what it removed and why (`EVIDENCE_DIR`),
                         of what it kept (`KEPT_DIR`, `KEPT_SAMPLE`), one line each by
                         `evidence_line`: what `drydock data` and the dashboard read

docs/architecture.md, "The step library", says how to add a step kind with these.
"""

from __future__ import annotations

from pipeline.errors import StepCancelled, StepPreempted, StepStopped
from pipeline.observe.evidence import EVIDENCE_DIR, EXCERPT_CHARS, KEPT_DIR, KEPT_SAMPLE, evidence_line
from pipeline.observe.metrics import (
    ALIASES,
    METRICS_DIR,
    METRICS_FILE,
    branch_event,
    metrics_files,
    parse_events,
    parse_metrics,
    read_metrics_data,
    segment_index,
    segment_name,
)
from pipeline.observe.render import format_size
from pipeline.observe.upstream import step_state
from pipeline.processes import cache_dir
from pipeline.run.in_step import step_events
from pipeline.run.in_step.fence import LeaseExpired
from pipeline.run.in_step.parallel import parallel_map
from pipeline.run.in_step.step_events import LeaseGuard, check_lease, current_gang, lease_guard
from pipeline.storage.files import write_atomically
from pipeline.storage.opening import open_storage

__all__ = [
    "ALIASES",
    "EVIDENCE_DIR",
    "EXCERPT_CHARS",
    "KEPT_DIR",
    "KEPT_SAMPLE",
    "METRICS_DIR",
    "METRICS_FILE",
    "LeaseExpired",
    "LeaseGuard",
    "StepCancelled",
    "StepPreempted",
    "StepStopped",
    "branch_event",
    "cache_dir",
    "check_lease",
    "current_gang",
    "evidence_line",
    "format_size",
    "lease_guard",
    "metrics_files",
    "open_storage",
    "parallel_map",
    "parse_events",
    "parse_metrics",
    "read_metrics_data",
    "segment_index",
    "segment_name",
    "step_events",
    "step_state",
    "write_atomically",
]
