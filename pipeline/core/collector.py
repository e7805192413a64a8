"""The cyclic garbage collector around bulk work that only allocates (planning, manifests)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector. Building a DAG, planning and writing manifests allocate
    many small, acyclic objects that all stay alive: from 10,000 steps up the collector would take
    a third of the time, finding nothing. Nests: only the outermost pause re-enables it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What was allocated meanwhile is still counted as new: re-enabled as is, the collector
        # would at once scan all of it (the whole DAG and plan; 7% of a 10,000-step plan), only
        # to find it alive. freeze() + unfreeze() moves it to the oldest generation unscanned
        # and resets the count, as a collection that found nothing would have.
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()
