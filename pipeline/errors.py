"""Errors a user can cause, each one clear sentence naming the step and field.

The CLI turns any `DrydockError` into that sentence on stderr and exit code 2, without a
traceback: these are mistakes in an experiment or its options, not bugs in Drydock.
"""

from __future__ import annotations


class DrydockError(Exception):
    """Base class for errors caused by the experiment, its options, or its storage."""


class StepDeclarationError(DrydockError):
    """A step, its name, its config or its function is malformed."""

    def __init__(self, step: str | None, message: str, field: str | None = None) -> None:
        self.step = step
        self.field = field
        where = f"step {step!r}" if step else "experiment"
        if field:
            where += f", field `{field}`"
        super().__init__(f"{where}: {message}")


class GraphError(DrydockError):
    """The DAG is malformed: a cycle, a duplicate name, a dangling reference."""


class StorageError(DrydockError):
    """The prefix cannot be read or written, or its metadata is corrupt."""


class StorageAccessDenied(StorageError):
    """The store refused to let us read or write a path (permission denied): the metadata there
    may be fine, so it is never shown as CORRUPT, and retrying does not help."""


class StepCancelled(BaseException):
    """Raised inside a running step function to stop it (lease lost or the run interrupted).

    A BaseException so that a step's own `except Exception` does not swallow it.
    """


class StepStopped(Exception):
    """Raised by a step function that stopped cleanly because its run asked it to (the run's
    budget was reached): its work so far is kept (a training saved a checkpoint), the attempt is
    recorded CANCELLED with this message, and the next run goes on from there."""


class StepPreempted(Exception):
    """The step's machine went away (node died, TPU slice preempted), or its process died under it
    (`crash`: a segfault, an out-of-memory kill). Retried on its own budget; the same crash over
    and over is a failure (`Resources.crash_limit`)."""

    def __init__(self, message: str, crash: bool = False) -> None:
        super().__init__(message)
        self.crash = crash
        """Whether the step's own process died (rather than its host): a crash may be
        deterministic, a lost host never is."""


class StepFailed(Exception):
    """A step function raised on a remote worker; `remote_traceback` is its traceback there."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback
