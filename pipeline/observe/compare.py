"""Runs side by side: one row per compared step, its versioned fields that differ, its metrics.

A step function may declare a `metrics` hook (`pipeline.step.step_function`); what it returns (a
flat mapping of names to numbers: a final training loss, an evaluation's losses, task scores) is
recorded with the step's SUCCESS. `drydock compare` and the dashboard's compare page read those
records, so neither imports step code.

Rows: every step with recorded metrics whose upstream steps with metrics are none, or only steps
of its own function: each training of a run or a sweep, a cooldown branch of a training included
(it reads its trunk's checkpoint, and is a training of its own). A step with metrics downstream of
exactly one row step and of another function (an evaluation of that training) adds its metrics to
that row; a name already there gets the step's name in front.
Params: the row step's versioned fields, and those of every step its identity is made of (prefixed
with that step's name), flattened to `a.b.c` paths; only the ones that differ among the rows are
shown, like `dvc exp show`. An upstream that does not enter the identity (the scaling fit whose
prediction a training is compared with) brings no params: its hundreds of fields say nothing
about how the rows differ.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.prices import price_table
from pipeline.core.records import Event, StepRecord, last_state
from pipeline.observe.metrics import branch_of, parse_events, parse_metrics, read_metrics_data
from pipeline.storage.opening import map_reads
from pipeline.storage.step_store import StepStore

__all__ = [
    "CompareStep",
    "Row",
    "best_row",
    "checkpoint_curves",
    "compare_rows",
    "differing_params",
    "group_of",
    "leading_params",
    "loss_curves",
    "manifest_steps",
    "merge_shared",
    "read_checkpoint_curve",
    "rows_csv",
    "rows_json",
    "sort_rows",
]


@dataclass(frozen=True)
class CompareStep:
    """A step of a compared run: where it is and what it reads."""

    run: str
    """The run it belongs to, as rows show it (an experiment's name, a manifest, a directory)."""
    label: str
    name: str
    output_path: str
    deps: tuple[str, ...] = ()
    """Labels of its upstream steps, blocking or not."""


@dataclass(frozen=True)
class Row:
    """One compared step: its run, its params (every versioned field), its metrics."""

    run: str
    label: str
    name: str
    output_path: str
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    own: frozenset[str] = frozenset()
    """The params that are the row step's own fields (the rest come from its upstream steps)."""
    device_time: Mapping[str, float | None] = field(default_factory=dict)
    """From the step's ledger (`pipeline.core.ledger`): `device_hours`, `goodput`, `cost_usd`
    (at the price table; None without a price), every attempt of the step together."""


def manifest_steps(manifest: Mapping[str, Any], run: str, root: str) -> list[CompareStep]:
    """The steps a run manifest lists, under `root` (its prefix, or where it was copied to)."""
    out = []
    for step in manifest.get("steps", []):
        if not isinstance(step, Mapping) or "label" not in step:
            continue
        label = str(step["label"])
        deps = (*step.get("deps", ()), *step.get("soft_deps", ()))
        out.append(CompareStep(run, label, str(step.get("name") or label), f"{root}/{label}", tuple(deps)))
    return out


def recorded_metrics(record: StepRecord) -> dict[str, float | None] | None:
    """The metrics recorded with the step's last SUCCESS, or None."""
    last = last_state(record.events)
    if last is None or last.event != Event.SUCCESS or not isinstance(last.data, Mapping):
        return None
    metrics = last.data.get("metrics")
    if not isinstance(metrics, Mapping) or not metrics:
        return None
    return {str(k): _number(v) for k, v in metrics.items()}


def compare_rows(steps: Sequence[CompareStep], store: StepStore) -> list[Row]:
    """The rows of `steps` (every step of every compared run), read from storage."""
    records = store.records([s.output_path for s in steps], with_metadata=True)
    now, prices = time.time(), price_table()
    by_label: dict[tuple[str, str], CompareStep] = {(s.run, s.label): s for s in steps}
    metrics = {
        key: found
        for key, s in by_label.items()
        if (found := recorded_metrics(records[s.output_path])) is not None
    }
    versioned = {key: _versioned(records[s.output_path]) for key, s in by_label.items()}
    function = {key: (records[s.output_path].step_json or {}).get("fn") for key, s in by_label.items()}

    def metric_upstreams(key: tuple[str, str]) -> list[tuple[str, str]]:
        run = key[0]
        return [(run, d) for d in by_label[key].deps if (run, d) in metrics]

    def is_row(key: tuple[str, str]) -> bool:
        # A training branched from a training (init_from) is a row of its own, not its trunk's column.
        return key in metrics and all(function[u] == function[key] for u in metric_upstreams(key))

    roots = [key for key in by_label if is_row(key)]
    merged: dict[tuple[str, str], dict[str, float | None]] = {key: dict(metrics[key]) for key in roots}
    for key in by_label:
        ups = metric_upstreams(key) if key in metrics and key not in merged else []
        if len(ups) != 1 or ups[0] not in merged:
            continue
        row = merged[ups[0]]
        for name, value in metrics[key].items():
            row[f"{by_label[key].name}:{name}" if name in row else name] = value
    rows = []
    for key in roots:
        step = by_label[key]
        params = dict(_flatten(versioned[key]))
        own = frozenset(params)
        for ancestor in _identity_ancestors(key, by_label, records):
            for path, value in _flatten(versioned[ancestor]):
                params[f"{by_label[ancestor].name}.{path}"] = value
        ledger = store.ledger(step.output_path, records[step.output_path], now)
        device_time: dict[str, float | None] = {}
        if ledger is not None:
            device_time = {
                "device_hours": ledger.device_hours,
                "goodput": ledger.goodput,
                "cost_usd": ledger.cost(prices),
            }
        rows.append(
            Row(step.run, step.label, step.name, step.output_path, params, merged[key], own, device_time)
        )
    return rows


def merge_shared(rows: Sequence[Row]) -> list[Row]:
    """One row per step directory: runs that share a training (two manifests of one sweep, a
    rerun, an extended recipe) list it once, under every run that has it (`a.py, b.py`)."""
    merged: dict[str, Row] = {}
    for row in rows:
        seen = merged.get(row.output_path)
        if seen is None:
            merged[row.output_path] = row
        elif row.run not in seen.run.split(", "):
            merged[row.output_path] = dataclasses.replace(seen, run=f"{seen.run}, {row.run}")
    return list(merged.values())


def _identity_ancestors(
    key: tuple[str, str], by_label: Mapping[tuple[str, str], CompareStep], records: Mapping[str, StepRecord]
) -> list[tuple[str, str]]:
    """The steps upstream of `key` that its identity is made of, transitively: the upstream steps
    whose identity hash its `.step.json` records among its identity's inputs."""
    seen: list[tuple[str, str]] = []
    stack = [key]
    while stack:
        here = stack.pop()
        entered = _input_hashes(records[by_label[here].output_path])
        for dep in by_label[here].deps:
            up = (here[0], dep)
            if up in seen or up not in by_label or dep.rsplit("-", 1)[-1] not in entered:
                continue
            seen.append(up)
            stack.append(up)
    return seen


def _input_hashes(record: StepRecord) -> set[str]:
    """The short hashes (a label's last 12 characters) of the upstream identities in a step's
    identity: `identity.inputs` holds each input's full hash."""
    identity = (record.step_json or {}).get("identity")
    inputs = identity.get("inputs") if isinstance(identity, Mapping) else None
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str) and len(value) >= 12:
            found.add(value[:12])
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(inputs)
    return found


def _versioned(record: StepRecord) -> Mapping[str, Any]:
    identity = (record.step_json or {}).get("identity")
    if not isinstance(identity, Mapping):
        return {}
    versioned = identity.get("versioned")
    return versioned if isinstance(versioned, Mapping) else {}


def _flatten(value: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    """(`a.b.c`, leaf) pairs of a JSON value; lists stay whole (a list of tasks is one param)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "__class__":
                continue
            yield from _flatten(item, f"{path}.{key}" if path else str(key))
    else:
        yield path, value


def differing_params(rows: Sequence[Row]) -> list[str]:
    """The params whose values are not the same in every row (absent counts as a value)."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.params))
    missing = object()
    return [
        name
        for name in names
        if len({json.dumps(row.params.get(name, missing), sort_keys=True, default=str) for row in rows}) > 1
    ]


def metric_names(rows: Sequence[Row]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.metrics))
    return list(names)


def sort_rows(rows: Sequence[Row], metric: str, *, descending: bool = False) -> list[Row]:
    """`rows` by `metric` (rows without it last); KeyError if no row has it."""
    if not any(metric in row.metrics for row in rows):
        raise KeyError(metric)
    present = [r for r in rows if r.metrics.get(metric) is not None]
    absent = [r for r in rows if r.metrics.get(metric) is None]
    present.sort(key=lambda r: r.metrics[metric] or 0.0, reverse=descending)
    return present + absent


def rows_json(rows: Sequence[Row]) -> dict[str, Any]:
    """`drydock compare --json`: the differing params, the metric names, and every row whole."""
    return {
        "params": differing_params(rows),
        "metrics": metric_names(rows),
        "rows": [
            {
                "run": r.run,
                "step": r.name,
                "label": r.label,
                "output_path": r.output_path,
                "params": dict(r.params),
                "metrics": dict(r.metrics),
                "device_time": dict(r.device_time),
            }
            for r in rows
        ],
    }


def rows_csv(rows: Sequence[Row]) -> str:
    """`drydock compare --csv`: run, step, the differing params, the metrics."""
    params, metrics = differing_params(rows), metric_names(rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["run", "step", *params, *metrics])
    for r in rows:
        writer.writerow(
            [
                r.run,
                r.name,
                *(_cell(r.params.get(p)) for p in params),
                *(_cell(r.metrics.get(m)) for m in metrics),
            ]
        )
    return out.getvalue()


def table_rows(rows: Sequence[Row], width: int | None = None) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, cells and the columns left out of a human table (numbers rounded for reading).

    Columns come in the order a reader wants them: the step (and the run, when rows come from
    more than one), the rows' own differing fields, the eval losses (the average first), the other
    metrics, then the upstream steps' differing fields. With `width` (the terminal's), columns are
    added in that order while the table fits; the names of the rest are returned."""
    params, metrics = leading_params(rows), _leading_metrics(metric_names(rows))
    own = set().union(*(row.own for row in rows)) if rows else set()
    own_params = [p for p in params if p in own]
    upstream_params = [p for p in params if p not in own]
    runs = len({r.run for r in rows}) > 1
    short = _short_names(params)
    columns: list[tuple[str, list[str]]] = []
    if runs:
        columns.append(("run", [r.run for r in rows]))
    columns.append(("step", [r.name for r in rows]))
    columns += [(short[p], [_cell(r.params.get(p)) for r in rows]) for p in own_params]
    columns += [(m, [_fmt(r.metrics.get(m)) for r in rows]) for m in metrics]
    if any(r.device_time for r in rows):  # what each row cost, from its ledger
        columns.append(("device-h", [_fmt(r.device_time.get("device_hours")) for r in rows]))
        if any(r.device_time.get("cost_usd") is not None for r in rows):
            columns.append(("cost $", [_fmt(r.device_time.get("cost_usd")) for r in rows]))
        goodput = [r.device_time.get("goodput") for r in rows]
        columns.append(("goodput", ["" if g is None else f"{g:.0%}" for g in goodput]))
    columns += [(short[p], [_cell(r.params.get(p)) for r in rows]) for p in upstream_params]
    kept: list[tuple[str, list[str]]] = []
    left_out: list[str] = []
    used = 0
    for i, (name, cells) in enumerate(columns):
        need = max(len(name), *(len(c) for c in cells)) + 3  # a cell's padding and rule
        if width is not None and kept and i >= (2 if runs else 1) and used + need > width:
            left_out.append(name)
            continue
        kept.append((name, cells))
        used += need
    header = [name for name, _cells in kept]
    body = [[cells[i] for _name, cells in kept] for i in range(len(rows))]
    return header, body, left_out


def _leading_metrics(names: Sequence[str]) -> list[str]:
    """Metrics in reading order: the average eval loss, the eval losses per set, then the rest."""

    def rank(name: str) -> int:
        if name == "eval/average/loss":
            return 0
        if name.startswith("eval/") and name.endswith("/loss"):
            return 1
        return 2

    return sorted(names, key=rank)


def _short_names(params: Sequence[str]) -> dict[str, str]:
    """Each param by its last path part, or its whole path where two would read alike."""
    last = [p.rsplit(".", 1)[-1] for p in params]
    return {p: p.rsplit(".", 1)[-1] if last.count(p.rsplit(".", 1)[-1]) == 1 else p for p in params}


GROUP_FIELDS = 3
"""At most this many fields name a group (a legend entry): the first of what differs."""


def leading_params(rows: Sequence[Row], params: Sequence[str] | None = None) -> list[str]:
    """The differing params in the order a reader wants them: the rows' own fields first (what
    was changed), then their upstream steps' (what they read)."""
    params = differing_params(rows) if params is None else list(params)
    own = set().union(*(row.own for row in rows)) if rows else set()
    return [p for p in params if p in own] + [p for p in params if p not in own]


def group_of(row: Row, params: Sequence[str]) -> str:
    """What sets a row apart: its values of the first `GROUP_FIELDS` fields that differ
    (`hidden_dim=24,num_steps=250`), the key the compare page colours and groups curves by."""
    shown = params[:GROUP_FIELDS]
    return ",".join(f"{p.rsplit('.', 1)[-1]}={_cell(row.params.get(p))}" for p in shown) or row.name


def loss_curves(store: StepStore, rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Each row step's training and eval loss per step from its metrics (if it has any).

    A branch (its metrics start with a `branch` line) is drawn from where it left its trunk: its
    curves begin with the trunk's values at the branch step, and `branch` names the trunk and step.
    """
    curves = []
    params = leading_params(rows)
    for row in rows:
        lines = _metrics_lines(store, row.output_path)
        if lines is None:
            continue
        records = parse_metrics(lines)
        train = [[r["step"], _number(r.get("loss"))] for r in records if "loss" in r]
        evals = [[r["step"], _number(r.get("eval/loss"))] for r in records if "eval/loss" in r]
        curve: dict[str, Any] = {
            "run": row.run,
            "step": row.name,
            "label": row.label,
            "group": group_of(row, params),
            "train": train,
            "eval": evals,
        }
        branch = branch_of(parse_events(lines))
        if branch is not None:
            curve["branch"] = {"trunk": branch.get("name") or branch["trunk"], "step": branch["step"]}
            trunk = _metrics_lines(store, branch["trunk"])
            at = [r for r in parse_metrics(trunk or []) if r["step"] == branch["step"]]
            for key, series in (("loss", train), ("eval/loss", evals)):
                if at and key in at[0] and (not series or series[0][0] > branch["step"]):
                    series.insert(0, [branch["step"], _number(at[0][key])])
        curves.append(curve)
    return curves


def _metrics_lines(store: StepStore, output_path: str) -> list[bytes] | None:
    """The lines of the metrics under `output_path`, or None if it has none."""
    storage = store.storage
    data = read_metrics_data(
        output_path,
        storage.read,
        storage.listdir,
        read_all=lambda paths: map_reads(storage, storage.read, paths, minimum=8),
    )
    return None if data is None else data.splitlines()


def checkpoint_curves(
    store: StepStore, steps: Sequence[CompareStep], rows: Sequence[Row]
) -> list[dict[str, Any]]:
    """The curves by checkpoint (`curve.json`, written by an evaluation that follows a training)
    of the steps that read each row's training: eval loss and task scores across runs, each with
    its row's group, its standard errors and reference levels (chance) where it has them."""
    params = leading_params(rows)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for row in rows:
        for step in steps:
            if row.label not in step.deps or step.output_path in seen:
                continue
            seen.add(step.output_path)
            drawn = read_checkpoint_curve(store.storage.read(f"{step.output_path}/curve.json"))
            if drawn is not None:
                out.append({**drawn, "group": group_of(row, params), "step": step.name, "label": step.label})
    return out


def read_checkpoint_curve(data: bytes | None) -> dict[str, Any] | None:
    """A `curve.json` as numbers (None if absent or not one): ylabel, steps, series, and the
    errors and levels it may have."""
    try:
        raw = json.loads(data) if data is not None else None
        steps = [int(s) for s in raw["steps"]]
        series = {
            str(name): [_number(v) for v in values]
            for name, values in raw["series"].items()
            if isinstance(values, list) and len(values) == len(steps)
        }
        errors = {
            str(name): [_number(v) for v in values]
            for name, values in (raw.get("errors") or {}).items()
            if isinstance(values, list) and len(values) == len(steps)
        }
        levels = {str(k): v for k, v in (raw.get("levels") or {}).items() if _number(v) is not None}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not steps or not series:
        return None
    out: dict[str, Any] = {"ylabel": str(raw.get("ylabel") or ""), "steps": steps, "series": series}
    if errors:
        out["errors"] = errors
    if levels:
        out["levels"] = levels
    return out


def best_row(rows: Sequence[Row], metric: str | None = None) -> tuple[str, Row] | None:
    """The row that is best by `metric` (default: the average eval loss, else the first eval loss,
    else the training loss),
    lower for losses, bits and perplexity and higher for anything else (accuracies); None for a
    tie or fewer than two rows with the metric."""
    names = metric_names(rows)
    if metric is None:
        losses = [m for m in names if m.startswith("eval/") and m.endswith("/loss")]
        metric = next((m for m in losses if m == "eval/average/loss"), losses[0] if losses else None)
        metric = metric or ("train/loss" if "train/loss" in names else None)
    if metric is None:
        return None
    scored = [(r, r.metrics.get(metric)) for r in rows if isinstance(r.metrics.get(metric), float)]
    if len(scored) < 2:
        return None
    lower = any(word in metric for word in ("loss", "bpb", "perplexity"))
    best = (min if lower else max)(scored, key=lambda pair: pair[1])
    if sum(1 for _row, value in scored if value == best[1]) > 1:
        return None  # a tie has no winner
    return metric, best[0]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"
