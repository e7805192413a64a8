"""Human-readable views of plans, runs and step statuses (rich tables). No logic of its own."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline.executor import RunReport
from pipeline.plan import Plan, State
from pipeline.storage import StepRecord

__all__ = ["plan_table", "run_summary", "status_table"]

_STYLE = {
    State.CACHED: "green",
    State.SUCCEEDED: "bold green",
    State.RUN: "yellow",
    State.WAIT: "cyan",
    State.BLOCKED: "red",
    State.FAILED: "bold red",
    State.CANCELLED: "magenta",
    State.SKIPPED: "dim",
}


def _state(state: State) -> Text:
    return Text(state.value, style=_STYLE.get(state, ""))


def plan_table(plan: Plan, title: str = "Plan") -> Table:
    """One row per step: state, step, reason and drift notes, output directory."""
    counts = ", ".join(f"{n} {s.lower()}" for s, n in plan.counts().items())
    table = Table(title=f"{title} — {len(plan.steps)} steps ({counts})", title_justify="left")
    table.add_column("state", no_wrap=True)
    table.add_column("step", no_wrap=True)
    table.add_column("why")
    table.add_column("output", overflow="fold")
    for sp in plan.steps.values():
        why = sp.reason
        if len(sp.notes) > 1:
            why += "".join(f"\n  {n}" for n in sp.notes[1:])
        table.add_row(_state(sp.state), sp.label, why, sp.output_path)
    return table


def run_summary(report: RunReport) -> Table:
    """The end-of-run table: final state, duration and error of every step."""
    counts: dict[str, int] = {}
    for o in report.outcomes.values():
        counts[o.state.value] = counts.get(o.state.value, 0) + 1
    summary = ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
    table = Table(title=f"Run — {summary}", title_justify="left")
    table.add_column("state", no_wrap=True)
    table.add_column("step", no_wrap=True)
    table.add_column("time", justify="right")
    table.add_column("detail")
    for label, o in report.outcomes.items():
        detail = o.error or ""
        if o.blocked_by:
            detail = f"blocked by {report.plan.dag.nodes[o.blocked_by].name}"
        elif o.state in (State.CACHED, State.SKIPPED):
            detail = report.plan.steps[label].reason
        elif o.state == State.CANCELLED:
            detail = "interrupted" if o.started is not None else "not started (run interrupted)"
        duration = f"{o.duration:.1f}s" if o.duration is not None else ""
        table.add_row(_state(o.state), label, duration, detail)
    return table


def status_table(plan: Plan, records: Mapping[str, StepRecord], live: Mapping[str, bool]) -> Table:
    """What storage says about each step now: last event, when, by which attempt."""
    table = Table(title=f"Status under {plan.dag.prefix}", title_justify="left")
    table.add_column("status", no_wrap=True)
    table.add_column("step", no_wrap=True)
    table.add_column("attempt", justify="right")
    table.add_column("last event")
    table.add_column("output", overflow="fold")
    for label, node in plan.dag.nodes.items():
        record = records.get(node.output_path) or StepRecord()
        last = record.last
        if record.corrupt:
            table.add_row(Text("CORRUPT", style="bold red"), label, "", record.corrupt, node.output_path)
            continue
        if last is None:
            status = Text("NOT STARTED", style="dim")
            when = ""
            attempt = ""
        else:
            name = last.event
            if name == "RUNNING" and not live.get(label, False):
                name = "STALE"  # RUNNING, but its runner is gone
            status = Text(
                name, style={"SUCCESS": "green", "FAILED": "red", "RUNNING": "yellow"}.get(name, "")
            )
            when = dt.datetime.fromtimestamp(last.time).strftime("%Y-%m-%d %H:%M:%S")
            if last.message:
                when += f"  {last.message.splitlines()[0][:80]}"
            attempt = str(sum(1 for e in record.events if e.event == "RUNNING"))
        table.add_row(status, label, attempt, when, node.output_path)
    return table


def print_table(table: Table, *, stderr: bool = False) -> None:
    Console(stderr=stderr, width=None if stderr else 200, soft_wrap=False).print(table)
