"""Drydock's engine: declare steps, compute identities, plan against storage, execute.

The public API of an experiment file:

    from pipeline import Step, versioned, output_of, this_output, executor_main, Resources

Names are resolved lazily (PEP 562): declaring steps (`pipeline.step`) loads neither storage nor
the executor, and `executor_main` loads them only when an experiment file first touches it.
Importing this package loads no ML library (no jax, levanter or ray). The layers, and which may
import which, are described in docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.cli.run import executor_main
    from pipeline.core.tpu import tpu_slice
    from pipeline.errors import DrydockError, GraphError, StepDeclarationError, StorageError
    from pipeline.observe.upstream import step_state
    from pipeline.run.experiment import run_experiment
    from pipeline.run.in_step import step_events
    from pipeline.run.in_step.gang import Gang
    from pipeline.run.in_step.step_events import current_gang
    from pipeline.run.options import ExecutorMainConfig
    from pipeline.step import (
        HangPolicy,
        OutputOf,
        Resources,
        Step,
        ThisOutput,
        added_field,
        applies_when,
        output_of,
        step_function,
        this_output,
        unversioned,
        versioned,
    )
    from pipeline.sweeps import Point, choice, grid, log_uniform, random_search, sweep, uniform

# Public name -> the module that defines it.
_PUBLIC = {
    "DrydockError": "pipeline.errors",
    "GraphError": "pipeline.errors",
    "StepDeclarationError": "pipeline.errors",
    "StorageError": "pipeline.errors",
    "ExecutorMainConfig": "pipeline.run.options",
    "executor_main": "pipeline.cli.run",
    "run_experiment": "pipeline.run.experiment",
    "Gang": "pipeline.run.in_step.gang",
    "tpu_slice": "pipeline.core.tpu",
    "current_gang": "pipeline.run.in_step.step_events",
    "step_state": "pipeline.observe.upstream",
    "HangPolicy": "pipeline.step",
    "OutputOf": "pipeline.step",
    "Resources": "pipeline.step",
    "Step": "pipeline.step",
    "ThisOutput": "pipeline.step",
    "added_field": "pipeline.step",
    "applies_when": "pipeline.step",
    "output_of": "pipeline.step",
    "step_function": "pipeline.step",
    "this_output": "pipeline.step",
    "unversioned": "pipeline.step",
    "versioned": "pipeline.step",
    "Point": "pipeline.sweeps",
    "choice": "pipeline.sweeps",
    "grid": "pipeline.sweeps",
    "log_uniform": "pipeline.sweeps",
    "random_search": "pipeline.sweeps",
    "sweep": "pipeline.sweeps",
    "uniform": "pipeline.sweeps",
}
# Submodules step functions use by their old short name (`from pipeline import step_events`).
_MODULES = {"step_events": "pipeline.run.in_step.step_events"}

__all__ = [
    "DrydockError",
    "ExecutorMainConfig",
    "Gang",
    "GraphError",
    "HangPolicy",
    "OutputOf",
    "Point",
    "Resources",
    "Step",
    "StepDeclarationError",
    "StorageError",
    "ThisOutput",
    "added_field",
    "applies_when",
    "choice",
    "current_gang",
    "executor_main",
    "grid",
    "log_uniform",
    "output_of",
    "random_search",
    "run_experiment",
    "step_events",
    "step_function",
    "step_state",
    "sweep",
    "this_output",
    "tpu_slice",
    "uniform",
    "unversioned",
    "versioned",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
