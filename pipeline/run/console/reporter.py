"""The lines a run prints as steps change state: `RUNNING  train/x-...`, `SUCCEEDED  [3/12] ...`.

A run of up to `SUMMARIZE_ABOVE` steps gets one line per state change. A larger one (a sweep of
thousands of steps) would print a wall of them: it gets every line that needs attention (a
failure, a block, a wait, a takeover) and, for the rest, at most one summary line per
`summary_interval` seconds, `progress   [3,412/10,000] 3,400 succeeded, 12 running`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["SUMMARIZE_ABOVE", "Reporter"]

logger = logging.getLogger("pipeline.run.scheduler.executor")

SUMMARIZE_ABOVE = 200
"""Runs with more steps than this print summary lines instead of a line per step."""


class Reporter:
    """Prints the lines of a run's state changes. The CLI passes stderr; tests a list.

    With `total` (the steps this run will run or wait for), a step's final line carries the
    run's count so far, `SUCCEEDED  [3/12] train/x-...  41.20s`: progress without extra lines.
    `observe(label, what)` is told every state change (`pipeline.run.console.console` follows them).
    """

    FINAL = frozenset({"SUCCEEDED", "FAILED", "BLOCKED", "CANCELLED"})
    QUIET = frozenset({"RUNNING", "SUCCEEDED"})
    """What a summarized run folds into its summary lines."""

    def __init__(
        self,
        emit: Callable[[str], None] | None = None,
        total: int | None = None,
        *,
        summary_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[str, str], None] | None = None,
    ) -> None:
        self._emit = emit or (lambda line: logger.info("%s", line))
        self._observe = observe
        self._total = total
        self._summarize = total is not None and total > SUMMARIZE_ABOVE
        self._interval = summary_interval
        self._clock = clock
        self._last_summary = float("-inf")
        self._finished: set[str] = set()
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # attempts report RUNNING from worker threads

    def __call__(self, label: str, what: str, detail: str = "") -> None:
        if self._observe is not None:  # the live display follows which steps run
            self._observe(label, what)
        count = ""
        with self._lock:
            # A failure that will be retried is not final; its line says "retrying".
            if self._total and what in self.FINAL and not detail.endswith("retrying"):
                self._finished.add(label)
                count = f"[{len(self._finished)}/{self._total}] "
            self._counts[what] += 1
            summary = self._summary_due(what)
        if self._summarize and what in self.QUIET:
            if summary:
                self._emit(summary)
            return
        self._emit(f"{what:<10} {count}{label}" + (f"  {detail}" if detail else ""))

    def note(self, text: str) -> None:
        """A line about the run itself, not one step (its budget spent)."""
        self._emit(text)

    def _summary_due(self, what: str) -> str | None:
        """The summary line, if one is due now (called under the lock)."""
        if not self._summarize or what not in self.QUIET:
            return None
        now = self._clock()
        done = len(self._finished)
        if now - self._last_summary < self._interval and done != self._total:
            return None
        self._last_summary = now
        c = self._counts
        running = c["RUNNING"] - c["SUCCEEDED"] - c["FAILED"] - c["CANCELLED"]
        succeeded = c["SUCCEEDED"]
        return f"{'progress':<10} [{done:,}/{self._total:,}] {succeeded:,} succeeded, {running:,} running"
