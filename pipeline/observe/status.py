"""What storage says about a run's steps right now, as rows, a rich table, or a live view.

`drydock status FILE|MANIFEST [--watch]` is built from three parts:

* `StepEntry`: the little a status needs about a step (label, name, output path, deps), taken
  from a DAG or read straight from a run manifest, so status works on any machine that can read
  the prefix, without the experiment's code;
* `read_status(entries, store)`: one `StepStatus` per step from its `.status`, `.lease`,
  `.progress` and, for training steps, the tail of `metrics.jsonl` (current step and loss);
* `status_table(rows)` renders them; `watch(...)` refreshes the table with rich `Live` while the
  run goes on (a step is running, or the run's manifest says it has not finished).

Reads only; writes nothing.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from pipeline.core.dag import Dag
from pipeline.core.ledger import StepLedger
from pipeline.core.records import ANNOUNCES_START, Event, StatusEvent
from pipeline.core.training_figures import figures_text, live_figures
from pipeline.core.usable_numbers import finite_number
from pipeline.observe.metrics import read_metrics_tail
from pipeline.observe.render import label_width
from pipeline.observe.shown_state import Shown, live_state, runner_gone
from pipeline.storage.layout import started_path
from pipeline.storage.opening import map_reads
from pipeline.storage.step_store import StepStore

__all__ = [
    "StepEntry",
    "StepStatus",
    "entries_from_dag",
    "entries_from_manifest",
    "ledger_table",
    "read_ledgers",
    "read_status",
    "status_json",
    "status_table",
    "watch",
]

_TAIL_BYTES = 16 * 1024  # a few dozen metrics lines: enough to find the latest step and loss


@dataclass(frozen=True)
class StepEntry:
    """A step as the status view needs it."""

    label: str
    name: str
    output_path: str
    deps: tuple[str, ...] = ()
    soft_deps: tuple[str, ...] = ()
    """Upstreams it reads without waiting for them (`output_of(..., blocking=False)`)."""


@dataclass(frozen=True)
class StepStatus:
    """One step's status at one moment."""

    entry: StepEntry
    state: str
    """NOT STARTED, RUNNING, STALE (RUNNING but its runner is gone), SUCCESS, FAILED, CANCELLED,
    PREEMPTED or CORRUPT."""
    attempt: int | None = None
    started: float | None = None
    """Time of the latest RUNNING event."""
    ended: float | None = None
    """Time of the state event that ended the latest attempt."""
    last_event: StatusEvent | None = None
    """The newest line of `.status`, notes (WARNING) included."""
    holder: str = ""
    """Who holds the lease of a running step."""
    progress: Mapping[str, Any] | None = None
    """The latest `.progress` of the current attempt (done, total, unit, data)."""
    train_step: int | None = None
    loss: float | None = None
    detail: str = ""
    """Why a status is CORRUPT or STALE."""

    def duration(self, now: float) -> float | None:
        """Seconds the latest attempt ran (so far, if it is running)."""
        if self.started is None:
            return None
        going = self.state in (Event.RUNNING, Shown.QUEUED)
        end = self.ended if self.ended is not None else (now if going else None)
        return None if end is None else max(0.0, end - self.started)


def entries_from_dag(dag: Dag) -> list[StepEntry]:
    """Every step of `dag`, in topological order."""
    return [
        StepEntry(label, node.name, node.output_path, node.deps, node.soft_deps)
        for label, node in dag.nodes.items()
    ]


def entries_from_manifest(manifest: Mapping[str, Any]) -> list[StepEntry]:
    """Every step a run manifest lists (labels, names, output paths and deps are all it needs)."""
    out = []
    for step in manifest.get("steps", []):
        out.append(
            StepEntry(
                label=str(step["label"]),
                name=str(step.get("name") or step["label"].rsplit("-", 1)[0]),
                output_path=str(step["output_path"]),
                deps=tuple(step.get("deps", ())),
                soft_deps=tuple(step.get("soft_deps", ())),
            )
        )
    return out


def read_status(
    entries: Sequence[StepEntry], store: StepStore, *, now: float, local_host: str, threads: int = 16
) -> list[StepStatus]:
    """The status of every entry, read from storage now (in parallel on object stores)."""

    def one(entry: StepEntry) -> StepStatus:
        return _status(entry, store, now, local_host)

    return map_reads(store.storage, one, entries, threads=threads, minimum=32)


def _status(entry: StepEntry, store: StepStore, now: float, local_host: str) -> StepStatus:
    record = store.record(entry.output_path, with_metadata=False)
    stale = runner_gone(record, now, local_host)
    state = live_state(record, stale=stale)
    if state == Shown.CORRUPT:
        return StepStatus(entry, state, detail=record.corrupt or "")
    last = record.last
    if last is None:
        return StepStatus(entry, state)
    latest_run = record.latest_run
    detail, holder = "", ""
    if stale:
        detail = "RUNNING, but its runner is gone (its lease is stale)"
    elif state == Event.RUNNING and record.lease is not None:
        holder = f"pid {record.lease.pid} on {record.lease.host.split('/')[0]}"
    attempt = None
    if latest_run is not None:
        attempt = int(latest_run.data.get("attempt", record.attempts)) if latest_run.data else record.attempts
    ended = last.time if last.event != Event.RUNNING else None
    started = latest_run.time if latest_run else None
    announced = latest_run is not None and bool((latest_run.data or {}).get(ANNOUNCES_START))
    if state == Event.RUNNING and announced:
        # The lease is taken when the attempt is handed to the backend; its function starts when
        # Ray finds it resources. Until then it is queued, and its time runs from its start.
        began = _function_started(store, entry.output_path, latest_run.token)
        if began is None:
            state, detail = Shown.QUEUED, "waiting for resources: its function has not started"
        else:
            started = began
    progress = store.progress(entry.output_path, record.events)
    train_step, loss = _metrics_tail(store, entry.output_path)
    return StepStatus(
        entry,
        state,
        attempt=attempt,
        started=started,
        ended=ended,
        last_event=record.events[-1],
        holder=holder,
        progress=progress,
        train_step=train_step,
        loss=loss,
        detail=detail,
    )


def _function_started(store: StepStore, step_dir: str, token: int | None) -> float | None:
    """When the attempt `token`'s function started (its `.started` marker), or None if it has not."""
    if token is None:
        return None
    data = store.storage.read(started_path(step_dir, token))
    if data is None:
        return None
    try:
        when = json.loads(data).get("time")
    except (ValueError, AttributeError):
        return None
    return float(when) if finite_number(when) else None


def read_ledgers(
    entries: Sequence[StepEntry], store: StepStore, *, now: float, threads: int = 16
) -> dict[str, StepLedger]:
    """Each started step's ledger (`pipeline.core.ledger`), by label (`StepStore.ledger`)."""

    def one(entry: StepEntry) -> tuple[str, StepLedger | None]:
        record = store.record(entry.output_path, with_metadata=True)
        return entry.label, store.ledger(entry.output_path, record, now)

    found = map_reads(store.storage, one, entries, threads=threads, minimum=32)
    return {label: ledger for label, ledger in found if ledger is not None}


def _metrics_tail(store: StepStore, step_dir: str) -> tuple[int | None, float | None]:
    """The latest step in the step's metrics and the latest loss logged, from their last few KiB."""
    storage = store.storage
    tail = read_metrics_tail(step_dir, storage.read_tail, storage.listdir, _TAIL_BYTES)
    if not tail:
        return None, None
    lines = tail.split(b"\n")
    step: int | None = None
    loss: float | None = None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written, or cut
        if not isinstance(record, dict) or "event" in record:  # an intervention, not a step's metrics
            continue
        if step is None and isinstance(record.get("step"), int):
            step = record["step"]
        value = record.get("train/loss", record.get("loss"))
        if loss is None and isinstance(value, int | float):
            loss = float(value)
        if step is not None and loss is not None:
            break
    return step, loss


# -- rendering --------------------------------------------------------------------------------------

STATE_STYLES: Mapping[str, str] = {
    Event.SUCCESS: "green",
    Event.RUNNING: "bold yellow",
    "QUEUED": "yellow",
    "STALE": "dark_orange",
    "FAILED": "bold red",
    "CORRUPT": "bold red",
    "CANCELLED": "magenta",
    "PREEMPTED": "dark_orange",
    "NOT STARTED": "dim",
}


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _bar(fraction: float, width: int = 12) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def progress_text(row: StepStatus, now: float | None = None) -> str:
    """`120/1,000 steps  loss 3.21` for training, `███░░ 40% 4/10 shards` for other progress."""
    parts = []
    p = row.progress
    # Done: a bar would only show how far the last (throttled) report had got.
    running = row.state != Event.SUCCESS
    if p is not None and p.get("total"):
        if running:
            parts.append(f"{_bar(p['done'] / p['total'])} {100 * p['done'] / p['total']:.0f}%")
        if row.train_step is None and running:
            parts.append(f"{p['done']:,}/{p['total']:,} {p.get('unit', '')}".rstrip())
    elif p is not None and row.train_step is None and running:
        parts.append(f"{p['done']:,} {p.get('unit', '')}".rstrip())
    if row.train_step is not None:
        total = p.get("total") if p is not None else None
        # metrics.jsonl numbers steps from 0: after step index N, N + 1 steps are done.
        done = row.train_step + 1
        parts.append(f"{done:,}/{total:,} steps" if total else f"{done:,} steps")
    loss = row.loss
    if loss is None and p is not None and isinstance(p.get("data", {}).get("loss"), int | float):
        loss = p["data"]["loss"]
    if loss is not None:
        parts.append(f"loss {loss:.4g}")
    if now is None:
        now = p.get("time", 0.0) if p else 0.0
    figures = live_figures(p, now) if p else {}
    parts.extend(figures_text(figures, running=running))
    return "  ".join(parts)


def _last_event_text(row: StepStatus, now: float) -> str:
    event = row.last_event
    if row.state == "CORRUPT":
        return row.detail
    if event is None:
        return ""
    text = f"{event.event} {_age(now - event.time)} ago"
    if event.message:
        text += f": {event.message.splitlines()[0][:70]}"
    elif row.holder:
        text += f" by {row.holder}"
    return text


def status_table(rows: Sequence[StepStatus], *, now: float, title: str = "Status") -> Table:
    """One row per step: state, attempt, duration, last event and its age, progress, output."""
    counts = Counter(row.state for row in rows)
    summary = ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
    noun = "step" if len(rows) == 1 else "steps"
    table = Table(title=f"{title} — {len(rows)} {noun} ({summary})", title_justify="left")
    table.add_column("step", no_wrap=True, min_width=label_width(row.entry.label for row in rows))
    table.add_column("state", no_wrap=True)
    table.add_column("attempt", justify="right")
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("last event", max_width=40)
    table.add_column("progress", no_wrap=True)
    table.add_column("output", overflow="fold", min_width=20)
    for row in rows:
        table.add_row(
            row.entry.label,
            Text(row.state, style=STATE_STYLES.get(row.state, "")),
            "" if row.attempt is None else str(row.attempt),
            _duration(row.duration(now)),
            _last_event_text(row, now),
            progress_text(row, now),
            row.entry.output_path,
        )
    return table


def status_json(rows: Iterable[StepStatus], now: float) -> list[dict[str, Any]]:
    """The rows as JSON-ready dicts (for `drydock status --json`)."""
    out = []
    for row in rows:
        last = row.last_event
        out.append(
            {
                "label": row.entry.label,
                "name": row.entry.name,
                "output_path": row.entry.output_path,
                "table_state": row.state,
                "attempt": row.attempt,
                "duration": row.duration(now),
                "last_event": last.event if last else None,
                "last_event_time": last.time if last else None,
                "last_message": last.message if last else None,
                "progress": dict(row.progress) if row.progress else None,
                "train_step": row.train_step,
                "loss": row.loss,
                "figures": live_figures(row.progress, now) if row.progress else {},
                "detail": row.detail or None,
            }
        )
    return out


def watch(
    load: Callable[[], list[StepStatus]],
    console: Console,
    *,
    interval: float,
    title: str,
    run_going: Callable[[list[StepStatus]], bool] = lambda rows: False,
    wait_for_start: float = 60.0,
    on_waiting: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> list[StepStatus]:
    """Show the status table and refresh it every `interval` seconds while the run goes on.

    The run goes on while a step is RUNNING or `run_going(rows)` (its manifest says it has not
    finished and its runner may be alive: a killed runner's run is over, though its manifest
    never says so). Otherwise the watch ends at once if every step is done; if not, it waits up to
    `wait_for_start` seconds for a run to begin (a watch started just before the run is), and calls
    `on_waiting` once as it starts to wait. Returns the last rows read. Ctrl-C propagates to the
    caller (which treats it as "stop watching").
    """
    from rich.live import Live

    began = clock()
    rows = load()
    announced = False
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            now = clock()
            going = any(row.state in (Event.RUNNING, Shown.QUEUED) for row in rows) or run_going(rows)
            done = all(row.state == Event.SUCCESS for row in rows)
            waiting = not going and not done and now - began < wait_for_start
            note = f"waiting up to {wait_for_start:g}s for a run to start; " if waiting else ""
            footer = Text(
                f"refreshed {time.strftime('%H:%M:%S', time.localtime(now))}, every {interval:g}s; "
                f"{note}Ctrl-C to stop watching",
                style="dim",
            )
            live.update(Group(status_table(rows, now=now, title=title), footer), refresh=True)
            if not going and not waiting:
                return rows
            if waiting and not announced:
                on_waiting()
                announced = True
            sleep(interval)
            rows = load()


LEDGER_COLUMNS = (
    "waiting",
    "startup",
    "restore",
    "compilation",
    "steps",
    "work",
    "evaluation",
    "checkpoints",
    "finishing",
    "lost",
)


def ledger_table(
    rows: Sequence[StepStatus],
    ledgers: Mapping[str, StepLedger],
    prices: Mapping[str, float],
    *,
    title: str = "Ledger",
) -> Table:
    """Where each step's held time went (seconds by activity), its device-hours, cost at
    `prices` and goodput."""
    shown = [row for row in rows if row.entry.label in ledgers]
    used = [c for c in LEDGER_COLUMNS if any(ledgers[r.entry.label].seconds.get(c) for r in shown)]
    table = Table(title=f"{title} — where the time went (seconds held, by activity)", title_justify="left")
    table.add_column("step", no_wrap=True, min_width=label_width(row.entry.label for row in shown))
    table.add_column("devices", no_wrap=True)
    table.add_column("held", justify="right", no_wrap=True)
    for column in used:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("device-h", justify="right", no_wrap=True)
    table.add_column("cost $", justify="right", no_wrap=True)
    table.add_column("goodput", justify="right", no_wrap=True)
    table.add_column("redone", justify="right", no_wrap=True)
    total_held = total_device_hours = total_productive = total_cost = 0.0
    priced = True
    for row in shown:
        ledger = ledgers[row.entry.label]
        cost = ledger.cost(prices)
        priced = priced and cost is not None
        total_cost += cost or 0.0
        total_held += ledger.held
        total_device_hours += ledger.device_hours
        total_productive += ledger.productive
        table.add_row(
            row.entry.label,
            f"{ledger.devices.count:g} {ledger.devices.kind}",
            _duration(ledger.held),
            *(f"{ledger.seconds.get(c, 0.0):.1f}" for c in used),
            f"{ledger.device_hours:.3g}",
            "" if cost is None else f"{cost:,.4g}",
            "" if ledger.goodput is None else f"{ledger.goodput:.0%}",
            str(ledger.redone_steps) if ledger.redone_steps else "",
        )
    if len(shown) > 1:
        goodput = f"{total_productive / total_held:.0%}" if total_held > 0 else ""
        table.add_row(
            "all",
            "",
            _duration(total_held),
            *("" for _ in used),
            f"{total_device_hours:.3g}",
            f"{total_cost:,.4g}" if priced else "",
            goodput,
            "",
            style="bold",
        )
    return table
