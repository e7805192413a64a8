"""Drydock's engine: declare steps, compute identities, plan against storage, execute.

The public API of an experiment file:

    from pipeline import Step, versioned, output_of, this_output, executor_main, Resources

Importing this package loads no ML library (no jax, levanter or ray).
"""

from pipeline.errors import DrydockError, GraphError, StepDeclarationError, StorageError
from pipeline.main import ExecutorMainConfig, executor_main, run_experiment
from pipeline.step import OutputOf, Resources, Step, ThisOutput, output_of, this_output, versioned

__all__ = [
    "DrydockError",
    "ExecutorMainConfig",
    "GraphError",
    "OutputOf",
    "Resources",
    "Step",
    "StepDeclarationError",
    "StorageError",
    "ThisOutput",
    "executor_main",
    "output_of",
    "run_experiment",
    "this_output",
    "versioned",
]
