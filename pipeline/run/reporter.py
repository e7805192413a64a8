"""The lines a run prints as steps change state: `RUNNING  train/x-...`, `SUCCEEDED  [3/12] ...`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Reporter"]

logger = logging.getLogger("pipeline.run.executor")


class Reporter:
    """Prints one line per state change. The CLI passes a rich console; tests a list.

    With `total` (the steps this run will run or wait for), a step's final line carries the
    run's count so far, `SUCCEEDED  [3/12] train/x-...  41.20s`: progress without extra lines.
    """

    FINAL = frozenset({"SUCCEEDED", "FAILED", "BLOCKED", "CANCELLED"})

    def __init__(self, emit: Callable[[str], None] | None = None, total: int | None = None) -> None:
        self._emit = emit or (lambda line: logger.info("%s", line))
        self._total = total
        self._finished: set[str] = set()
        self._lock = threading.Lock()  # attempts report RUNNING from worker threads

    def __call__(self, label: str, what: str, detail: str = "") -> None:
        count = ""
        # A failure that will be retried is not final; its line says "retrying".
        if self._total and what in self.FINAL and not detail.endswith("retrying"):
            with self._lock:
                self._finished.add(label)
                count = f"[{len(self._finished)}/{self._total}] "
        self._emit(f"{what:<10} {count}{label}" + (f"  {detail}" if detail else ""))
