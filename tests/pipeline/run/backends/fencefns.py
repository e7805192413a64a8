"""A step function for the Ray fence test: it writes a time-stamped file every tick.

Module-level and light, so Ray workers import it. The first call (the attempt that will be
frozen) ticks until a stop file appears; later calls tick a few times and return.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from pipeline.run.in_step import step_events

__all__ = ["TicksConfig", "write_ticks"]


@dataclass(frozen=True)
class TicksConfig:
    """Config of `write_ticks`."""

    output: str
    """The step's own output directory (`this_output()`)."""
    claim: str
    """A file outside the prefix: the call that creates it is the first."""
    stop: str
    """A file outside the prefix: the first call ticks until it exists."""
    every: float = 0.2
    """Seconds between ticks."""
    later_ticks: int = 5
    """How many ticks the later calls write."""


def write_ticks(config: TicksConfig) -> None:
    """Write `tick-<token>-<n>` files holding the wall-clock time just before each was opened."""
    context = step_events.current()
    token = context.token if context is not None else 0
    try:
        os.close(os.open(config.claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        first = True
    except FileExistsError:
        first = False
    os.makedirs(config.output, exist_ok=True)
    n = 0
    while (not os.path.exists(config.stop) and n < 3000) if first else n < config.later_ticks:
        now = time.time()
        with open(os.path.join(config.output, f"tick-{token}-{n:04d}"), "w") as f:
            f.write(repr(now))
        n += 1
        time.sleep(config.every)
