"""Notes a running step function reports into its own `.status`, such as a loss-spike WARNING.

The executor binds a `StepContext` (output directory, run id, fencing token) around every call
of a step function, on whichever backend runs it. `warn(...)` appends a WARNING line under that
token, so a note from an attempt that has lost its lease is dropped like any stale write. Notes
never change a step's state. Outside a step, `warn` only logs.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["StepContext", "bind", "current", "warn"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepContext:
    """Which attempt of which step is running."""

    output_path: str
    run_id: str
    token: int


_CURRENT: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("drydock_step", default=None)


@contextlib.contextmanager
def bind(context: StepContext) -> Iterator[None]:
    """Make `context` current in this thread (or task) while a step function runs."""
    reset = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(reset)


def current() -> StepContext | None:
    """The running step's context; capture it in the step's thread to use it from others."""
    return _CURRENT.get()


def warn(message: str, data: Mapping[str, Any] | None = None, context: StepContext | None = None) -> bool:
    """Record a WARNING note in the running step's `.status`; returns whether it was recorded."""
    from pipeline.storage import WARNING, StepStore, open_storage

    logger.warning("%s", message)
    context = context or current()
    if context is None:
        return False
    try:
        store = StepStore(open_storage(context.output_path))
        return store.note(context.output_path, context.run_id, context.token, WARNING, message, data)
    except Exception as e:  # a note must never break the step that reports it
        logger.warning("could not record the warning in %s/.status: %s", context.output_path, e)
        return False
