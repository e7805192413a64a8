"""A step that keeps a pace, then hangs once (module-level, so workers import it)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from pipeline import HangPolicy, step_events, step_function


@dataclass(frozen=True)
class HangConfig:
    output: str
    steps: int = 6
    hang_at: int = 3
    marker: str = ""
    """Hang only while this file does not exist (it is made when the step hangs: once)."""
    always: bool = False
    """Hang at `hang_at` every time (the same hang on every attempt)."""


def _stuck() -> None:
    """Where a hung step waits (short sleeps, so that a cancellation gets through)."""
    while True:
        time.sleep(0.05)


@step_function(watchdog=HangPolicy(factor=10.0, floor=1.0, startup=60.0))
def hanging(config: HangConfig) -> None:
    """Report progress step by step; at `hang_at`, the first time, stop reporting for good."""
    began = time.time()
    for i in range(1, config.steps + 1):
        step_events.progress(i, config.steps, "steps")
        # Its own account of its time (the ledger): all of it steps, to the last one begun.
        step_events.account({"steps": time.time() - began}, {"last_step": i})
        if i == config.hang_at and config.always:
            _stuck()
        if i == config.hang_at and config.marker and not os.path.exists(config.marker):
            open(config.marker, "w").close()
            _stuck()
        time.sleep(0.3)
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "done"), "w") as f:
        f.write("done\n")
