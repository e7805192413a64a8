"""What a run prints while it runs: one line per state change, and the progress of running steps.

On a terminal the running steps are a live display (rich) under the lines: each with a bar, its
count, and the figures it reports (`pipeline.core.training_figures`: loss, tokens/s, ETA, ...), redrawn
every second and gone when the run ends. Anywhere else (CI, `| tee`, a file) there are no escape
codes and no redraws: plain lines, and a running step's progress as a line of its own at most
every `progress_every` seconds. Lines are written whole under one lock, so lines of steps running
in parallel never merge.

Progress is read from each running step's `.progress` (what `step_events.progress` writes): the
same file `drydock status` reads, so it works wherever the step runs.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pipeline.core.training_figures import figures_text, live_figures
from pipeline.storage.files import Storage
from pipeline.storage.step_store import StepStore

__all__ = ["RunConsole"]


class RunConsole:
    """Prints a run's lines and shows its running steps' progress (see the module docstring).

    `line(text)` prints one line with the time; `state(label, what)` tells it which steps run.
    Use it as a context manager around the run: the progress thread runs inside it.
    """

    def __init__(
        self,
        storage: Storage | None,
        paths: dict[str, str],
        run_id: str,
        *,
        stream: TextIO | None = None,
        interactive: bool | None = None,
        progress_every: float = 60.0,
        poll: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._stream = stream or sys.stderr
        self._interactive = self._stream.isatty() if interactive is None else interactive
        self._store = StepStore(storage) if storage is not None else None
        self._paths = paths
        self._run_id = run_id
        self._progress_every = progress_every
        self._poll = poll
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}  # label -> when its RUNNING line was printed
        self._last_line: dict[str, float] = {}  # label -> when its last progress line was printed
        self._stale: dict[str, Any] = {}  # label -> the token of the report there when it started
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None

    # -- lines -------------------------------------------------------------------------------------

    def line(self, text: str) -> None:
        """Print `text` as one line, with the time."""
        stamped = time.strftime("%H:%M:%S ") + text
        with self._lock:
            if self._live is not None:
                self._live.console.print(stamped, markup=False, highlight=False, soft_wrap=True)
            else:
                self._stream.write(stamped + "\n")
                self._stream.flush()

    def state(self, label: str, what: str) -> None:
        """Note a state change of `label` (RUNNING, or a final state)."""
        if what == "RUNNING":
            # A retried or resumed attempt: until it reports, the report there is the stopped
            # attempt's (its step and loss), which says nothing about this one.
            earlier = self._report(label)
            with self._lock:
                self._running[label] = self._clock()
                self._stale[label] = earlier.get("token") if earlier is not None else None
            return
        with self._lock:
            self._running.pop(label, None)
            self._last_line.pop(label, None)
            self._stale.pop(label, None)

    # -- progress ----------------------------------------------------------------------------------

    def progress_text(self, label: str) -> str | None:
        """`train/x-…  96/320 steps  loss 2.28  24.5k tok/s  ETA 20s` from the step's `.progress`
        of this run; None if it has reported none."""
        report = self._report(label)
        if report is None or report.get("run_id") != self._run_id:
            return None  # an earlier run's report
        stale = self._stale.get(label)
        if stale is not None and report.get("token") == stale:
            return None  # the stopped attempt's, not this one's
        return " ".join(_progress_parts(report, self._clock()))

    def _report(self, label: str) -> dict[str, Any] | None:
        if self._store is None or label not in self._paths:
            return None
        return self._store.read_progress(self._paths[label])

    def _tick(self) -> None:
        with self._lock:
            running = dict(self._running)
        now = self._clock()
        texts = {label: self.progress_text(label) for label in running}
        if self._interactive:
            if self._live is not None:
                self._live.update(self._table(running, texts, now))
            return
        for label, text in texts.items():
            # Plain output: a line per running step every `progress_every` seconds, once it has
            # run that long (a step that finishes sooner needs none).
            since = self._last_line.get(label, running[label])
            if text and now - since >= self._progress_every:
                self._last_line[label] = now
                self.line(f"{'progress':<10} {label}  {text}")

    def _table(self, running: dict[str, float], texts: dict[str, str | None], now: float) -> Table:
        table = Table.grid(padding=(0, 2))
        for label, started in running.items():
            table.add_row("RUNNING", label, _clock_text(now - started), texts.get(label) or "")
        return table

    def _loop(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self._tick()
            except Exception:  # a progress display must never fail a run
                continue

    def __enter__(self) -> RunConsole:
        if self._interactive:
            console = Console(file=self._stream, force_terminal=True)
            self._live = Live(Table.grid(), console=console, refresh_per_second=2, transient=True)
            self._live.start()
        self._thread = threading.Thread(target=self._loop, name="drydock-console", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None


def _progress_parts(report: dict[str, Any], now: float) -> list[str]:
    done, total, unit = report.get("done"), report.get("total"), report.get("unit") or ""
    parts = []
    if isinstance(done, int | float):
        count = f"{done:,.0f}/{total:,.0f}" if isinstance(total, int | float) and total else f"{done:,.0f}"
        parts.append(f"{count} {unit}".rstrip())
    figures = live_figures(report, now)
    if isinstance(figures.get("loss"), int | float):
        parts.append(f"loss {figures['loss']:.4g}")
    parts.extend(figures_text(figures))
    return parts


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(max(0.0, seconds)), 60)
    return f"{minutes}:{secs:02d}"
