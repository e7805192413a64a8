"""Human-readable views of plans and runs (rich tables). No logic of its own.

The status table lives in `pipeline.observe.status`, DAG pictures in `pipeline.observe.dag_render`.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline.core.plan import Plan, State
from pipeline.core.report import RunReport

__all__ = ["format_preview", "format_size", "is_table", "plan_table", "print_table", "run_summary"]

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


def plan_table(plan: Plan, title: str = "Plan", explanations: Mapping[str, str] | None = None) -> Table:
    """One row per step: state, step, reason and drift notes, output directory.

    `explanations` (label -> line, from `pipeline.observe.explain.plan_explanations`) add, under the
    reason of a step that will run under a new identity, what differs from its closest other run.
    """
    counts = ", ".join(f"{n} {s.lower()}" for s, n in plan.counts().items())
    noun = "step" if len(plan.steps) == 1 else "steps"
    table = Table(title=f"{title} — {len(plan.steps)} {noun} ({counts})", title_justify="left")
    table.add_column("state", no_wrap=True)
    table.add_column("step", no_wrap=True, min_width=label_width(plan.steps))
    table.add_column("why")
    table.add_column("output", overflow="fold")
    for sp in plan.steps.values():
        why = sp.reason
        if len(sp.notes) > 1:
            why += "".join(f"\n  {n}" for n in sp.notes[1:])
        if explanations and sp.label in explanations:
            why += f"\n  {explanations[sp.label]}"
        table.add_row(_state(sp.state), sp.label, why, sp.output_path)
    return table


def run_summary(report: RunReport) -> Table:
    """The end-of-run table: final state, duration and error of every step; without borders or a
    header, one line per step under its title, as the run's own lines look."""
    counts = Counter(o.state.value for o in report.outcomes.values())
    summary = ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
    table = Table(title=f"Run — {summary}", title_justify="left", box=None, show_header=False, pad_edge=False)
    table.add_column("state", no_wrap=True)
    table.add_column("step", no_wrap=True, min_width=label_width(report.outcomes))
    table.add_column("time", justify="right")
    table.add_column("detail")
    for label, o in report.outcomes.items():
        detail = o.error or ""
        if o.blocked_by:
            detail = f"blocked by {report.plan.dag.nodes[o.blocked_by].name}"
        elif o.state in (State.CACHED, State.SKIPPED):
            reason = report.plan.steps[label].reason
            detail = "" if reason == o.state.value.lower() else reason  # "CACHED  cached" says it twice
        elif o.state == State.CANCELLED:
            detail = "interrupted" if o.started is not None else "not started (run interrupted)"
        duration = f"{o.duration:.1f}s" if o.duration is not None else ""
        table.add_row(_state(o.state), label, duration, detail)
    return table


def label_width(labels: Iterable[str]) -> int:
    """The width of a table's step column: its longest label (up to 100), so that a narrow terminal
    squeezes the other columns rather than cutting a step's name short with an ellipsis."""
    return min(100, max((len(label) for label in labels), default=4))


def print_table(table: Table, *, stderr: bool = False) -> None:
    """Print `table` to stdout or stderr: a terminal's width, or 200 columns when the stream is a
    file or a pipe (rich would assume 80 and wrap a failed step's error over several lines)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    Console(stderr=stderr, width=width, soft_wrap=False).print(table)


def is_table(value: Any) -> bool:
    """Whether a report value is a table: a non-empty list of mappings (rows) with the same keys."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(row, Mapping) for row in value)
        and all(list(row) == list(value[0]) for row in value)
    )


def format_preview(preview: str | Mapping[str, Any]) -> str:
    """A preview or report as text.

    A string as it is. A mapping: its tables (values that are lists of rows, see `is_table`) as
    aligned columns, the first column left-aligned; then its other entries as `key: value` lines,
    except nested mappings (figures for `--json` and tools, which the lines beside them say).
    The dashboard renders the same structure as HTML (`pipeline.observe.dashboard`).
    """
    if isinstance(preview, str):
        return preview
    lines: list[str] = []
    for value in preview.values():
        if is_table(value):
            lines.extend(_table_lines(value))
    plain = {k: v for k, v in preview.items() if not is_table(v) and not isinstance(v, Mapping)}
    width = max((len(str(k)) for k in plain), default=0)
    for key, value in plain.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        lines.append(f"  {str(key) + ':':<{width + 1}} {shown}")
    return "\n".join(lines)


def _table_lines(rows: list[Mapping[str, Any]]) -> list[str]:
    columns = list(rows[0])
    cells = [
        [str(c) for c in columns],
        *[["" if row[c] is None else str(row[c]) for c in columns] for row in rows],
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        "  "
        + "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in cells
    ]


def format_size(size: float) -> str:
    """`1.5 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
