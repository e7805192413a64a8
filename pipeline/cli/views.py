"""The CLI commands that look at an experiment's steps instead of running them.

    drydock status FILE|MANIFEST [--watch] [--interval S] [--wait S] [--json] [options]
    drydock dag FILE|MANIFEST [--format mermaid|dot|svg|html] [--output PATH] [options]
    drydock explain FILE|MANIFEST STEP [options]

An experiment FILE is executed as `__main__` (`pipeline.cli.loading`): its `executor_main` call
hands over its steps and options and runs nothing. A MANIFEST is read directly for `status` and `dag`
(labels, paths and deps are all they need, so no experiment code has to be importable) and
rebuilt into steps (`pipeline.run.records.recipe`) for `explain`. Each command returns an exit code: 0,
2 for a user error (one line on stderr, nothing written), 130 when interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from pipeline.cli.common import Parser, find_step, guarded, needs_target
from pipeline.cli.loading import Loaded, load
from pipeline.core.prices import price_table
from pipeline.errors import StepDeclarationError
from pipeline.observe.status import (
    StepEntry,
    StepStatus,
    entries_from_dag,
    entries_from_manifest,
    ledger_table,
    read_ledgers,
    read_status,
    status_json,
    status_table,
    watch,
)
from pipeline.processes import current_owner, runner_alive
from pipeline.run.experiment import prepare
from pipeline.run.options import resolve_prefix
from pipeline.storage.files import Storage
from pipeline.storage.manifests import (
    experiment_name,
    is_manifest,
    list_manifests,
    load_manifest,
    manifest_dir,
    manifest_path,
)
from pipeline.storage.opening import is_local, normalize_prefix, open_storage
from pipeline.storage.step_store import StepStore

__all__ = ["dag_command", "explain_command", "status_command"]

FORMATS = ("mermaid", "dot", "svg", "html")


# -- status -----------------------------------------------------------------------------------------


@dataclass
class _Source:
    entries: list[StepEntry]
    store: StepStore
    prefix: str
    title: str
    planned: dict[str, dict[str, Any]]
    """Label -> plan fields for JSON (`state`, `reason`, ...): the plan's for a FILE, the ones the
    run recorded for a MANIFEST."""
    manifest: str | None = None
    """The run manifest of these steps (a FILE's is where its run will write it)."""

    def run_going(self, rows: Sequence[StepStatus] = ()) -> bool:
        """Whether the run may still be going: its manifest is there, says it has not finished,
        and its runner may be alive, as `status` judges a step's (`rows`): on this host its
        process lives; on another host (no process to ask) none of its steps is STALE, since a
        runner that died leaves the leases of its running steps to expire."""
        if self.manifest is None:
            return False
        data = self.store.storage.read(self.manifest)
        try:
            manifest = json.loads(data) if data is not None else None
            if not isinstance(manifest, dict) or manifest.get("finished"):
                return False
        except ValueError:
            return False
        alive = runner_alive(manifest.get("runner"), current_owner().host)
        if alive is not None:
            return alive
        return not any(row.state == "STALE" for row in rows)


def _manifest_source(target: str, options: Sequence[str]) -> _Source:
    """The steps a MANIFEST lists, read directly: no experiment code needed."""
    parser = Parser(prog="drydock status|dag MANIFEST", add_help=False)
    parser.add_argument("--prefix")
    known, rest = parser.parse_known_args(list(options))
    if rest:
        raise StepDeclarationError(None, f"unknown option(s) for a manifest: {' '.join(rest)}", field="argv")
    manifest = load_manifest(target)
    prefix = normalize_prefix(known.prefix or manifest.get("prefix") or ".")
    entries = entries_from_manifest(manifest)
    if known.prefix and manifest.get("prefix"):
        # The same run read under another prefix (a copied bucket): same labels, new root.
        entries = [StepEntry(e.label, e.name, f"{prefix}/{e.label}", e.deps, e.soft_deps) for e in entries]
    title = f"{manifest.get('experiment', 'experiment')} under {prefix}"
    recorded = {
        str(step["label"]): {k: step[k] for k in ("hash", "state", "reason", "planned") if k in step}
        for step in manifest.get("steps", [])
    }
    return _Source(entries, StepStore(open_storage(prefix)), prefix, title, recorded, target)


def _dag_source(loaded: Loaded, target: str) -> _Source:
    dag, store, plan = prepare(loaded.steps, loaded.config, strict=False)
    planned = {label: sp.to_json() for label, sp in plan.steps.items()}
    manifest = manifest_path(dag.prefix, dag.nodes, experiment_name(loaded.config.experiment, target))
    return _Source(entries_from_dag(dag), store, dag.prefix, f"Status under {dag.prefix}", planned, manifest)


def _with_source(target: str, options: Sequence[str], body: Callable[[_Source], int]) -> int:
    """Call `body` with the steps to show: from a MANIFEST directly, or from a FILE's DAG."""
    if is_manifest(target):
        return body(_manifest_source(target, options))
    return load(target, options, lambda loaded: body(_dag_source(loaded, target)))


def _read(source: _Source) -> list[StepStatus]:
    return read_status(source.entries, source.store, now=time.time(), local_host=current_owner().host)


def status_command(args: Sequence[str]) -> int:
    """`drydock status FILE|MANIFEST [--watch] [--interval S] [--wait S] [--json] [options]`, or
    `drydock status --latest [--prefix P] [...]`: the newest run under the prefix."""
    if "--latest" in args:
        return guarded(_status_latest, [a for a in args if a != "--latest"])
    return needs_target("status", args) or guarded(_status, args[0], args[1:])


def _status_latest(argv: list[str]) -> int:
    """The newest run manifest under the prefix (by when it started), watched like a MANIFEST.
    With `--watch`, a prefix with no run yet is waited for (Ctrl-C stops waiting)."""
    parser = Parser(prog="drydock status --latest", add_help=False)
    parser.add_argument("--prefix")
    parser.add_argument("--interval", type=float, default=2.0)
    known, rest = parser.parse_known_args(argv)
    if known.interval <= 0:
        raise StepDeclarationError(None, "must be positive", field="--interval")
    prefix = normalize_prefix(resolve_prefix(known.prefix))
    storage = open_storage(prefix)
    rest = [*rest, "--interval", str(known.interval)]
    if "--watch" not in rest:
        _check_prefix_exists(prefix, "--latest")
    newest = _newest_manifest(storage, prefix)
    if newest is None and "--watch" in rest:
        print(f"waiting for a run under {prefix} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        try:
            while newest is None:
                time.sleep(known.interval)
                newest = _newest_manifest(storage, prefix)
        except KeyboardInterrupt:
            return 0
    if newest is None:
        raise StepDeclarationError(None, f"no run manifest under {prefix}/experiments yet", field="--latest")
    return _status(newest, ["--prefix", prefix, *rest])


def _newest_manifest(storage: Storage, prefix: str) -> str | None:
    """The path of the run manifest under `prefix` that started last, if any."""
    if is_local(prefix) and not os.path.isdir(prefix):
        return None
    newest: tuple[float, str] | None = None
    for name in list_manifests(storage, prefix):
        path = f"{manifest_dir(prefix)}/{name}"
        try:
            started = float(load_manifest(path).get("started") or 0.0)
        except (StepDeclarationError, TypeError, ValueError):
            continue  # an unreadable manifest is not the newest run
        if newest is None or started > newest[0]:
            newest = (started, path)
    return None if newest is None else newest[1]


def _check_prefix_exists(prefix: str, field: str) -> None:
    if is_local(prefix) and not os.path.isdir(prefix):
        raise StepDeclarationError(
            None, f"prefix {prefix} does not exist: nothing has run there", field=field
        )


def _status(target: str, argv: Sequence[str]) -> int:
    parser = Parser(prog="drydock status", add_help=False)
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--wait", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ledger", action="store_true")
    known, options = parser.parse_known_args(list(argv))
    if known.interval <= 0:
        raise StepDeclarationError(None, "must be positive", field="--interval")
    if known.wait < 0:
        raise StepDeclarationError(None, "must not be negative", field="--wait")
    if known.json and known.watch:
        raise StepDeclarationError(
            None, "--watch shows a live table; it cannot be combined with --json", field="--watch"
        )

    def show(source: _Source) -> int:
        if not known.watch:  # a watch may start before the first run has made the prefix
            _check_prefix_exists(source.prefix, "--prefix")
        if known.json:
            rows = _read(source)
            document = _status_document(source, rows, time.time())
            if known.ledger:
                ledgers = read_ledgers(source.entries, source.store, now=document["time"])
                for step in document["steps"]:
                    if step["label"] in ledgers:
                        step["ledger"] = ledgers[step["label"]].to_json(price_table())
            print(json.dumps(document, indent=2))
            return 0
        console = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)
        if known.watch:
            # Ctrl-C ends watching; the table on screen is the last one read.
            with contextlib.suppress(KeyboardInterrupt):
                watch(
                    lambda: _read(source),
                    console,
                    interval=known.interval,
                    title=source.title,
                    run_going=source.run_going,
                    wait_for_start=known.wait,
                    # Said once on stderr too: the table's footer is not seen when it is piped.
                    on_waiting=lambda: print(
                        f"waiting up to {known.wait:g}s for a run of {target} to start (Ctrl-C to stop)",
                        file=sys.stderr,
                        flush=True,
                    ),
                )
            return 0
        rows = _read(source)
        console.print(status_table(rows, now=time.time(), title=source.title))
        if known.ledger:
            ledgers = read_ledgers(source.entries, source.store, now=time.time())
            console.print(ledger_table(rows, ledgers, price_table(), title=source.title))
        return 0

    return _with_source(target, options, show)


def _status_document(source: _Source, rows: list[StepStatus], now: float) -> dict[str, Any]:
    counts = dict(Counter(str(row.state) for row in rows))
    steps = []
    for shown, row in zip(status_json(rows, now), rows, strict=True):
        entry = {**source.planned.get(row.entry.label, {}), **shown, "deps": list(row.entry.deps)}
        steps.append(entry)
        # `status`: the raw last state event (None if never started), as `drydock status --json` always gave.
        last = row.last_event
        entry["status"] = {
            "CORRUPT": "CORRUPT",
            "NOT STARTED": None,
            "STALE": "RUNNING",
            "QUEUED": "RUNNING",
        }.get(row.state, row.state)
        entry["status_time"] = last.time if last else None
        entry["live"] = row.state in ("RUNNING", "QUEUED")
    return {"prefix": source.prefix, "time": now, "counts": counts, "steps": steps}


# -- dag --------------------------------------------------------------------------------------------


def dag_command(args: Sequence[str]) -> int:
    """`drydock dag FILE|MANIFEST [--format mermaid|dot|svg|html] [--output PATH] [options]`."""
    return needs_target("dag", args) or guarded(_dag, args[0], args[1:])


def _dag(target: str, argv: Sequence[str]) -> int:
    from pipeline.observe import dag_render

    parser = Parser(prog="drydock dag", add_help=False)
    parser.add_argument("--format", default="mermaid")
    parser.add_argument("--output", "-o")
    parser.add_argument("--title")
    known, options = parser.parse_known_args(list(argv))
    if known.format not in FORMATS:
        raise StepDeclarationError(
            None, f"unknown format {known.format!r}; choose one of {', '.join(FORMATS)}", field="--format"
        )

    def draw(source: _Source) -> int:
        nodes = [
            dag_render.DagNode(
                r.entry.label, r.entry.name, r.state, r.entry.deps, r.entry.output_path, r.entry.soft_deps
            )
            for r in _read(source)
        ]
        if known.format == "html":
            text = dag_render.to_html(nodes, known.title or source.title)
        else:
            text = {"mermaid": dag_render.to_mermaid, "dot": dag_render.to_dot, "svg": dag_render.to_svg}[
                known.format
            ](nodes)
        if known.output:
            with open(known.output, "w", encoding="utf-8") as f:  # a local file the user names, not storage
                f.write(text)
            print(f"wrote {known.output} ({len(nodes)} steps, {known.format})", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0

    return _with_source(target, options, draw)


# -- explain ----------------------------------------------------------------------------------------


def explain_command(args: Sequence[str]) -> int:
    """`drydock explain FILE|MANIFEST STEP [options]`: STEP is a step name or label."""
    return needs_target("explain", args) or guarded(_explain, args[0], args[1:])


def _explain(target: str, argv: Sequence[str]) -> int:
    from pipeline.observe.explain import explain_step, format_explanation

    if not argv or argv[0].startswith("-"):
        raise StepDeclarationError(None, "name the step to explain: drydock explain FILE STEP", field="STEP")
    wanted, options = argv[0], list(argv[1:])

    def explain(loaded: Loaded) -> int:
        dag, store, _plan = prepare(loaded.steps, loaded.config, strict=False)
        label = find_step(dag, wanted, target)
        print(format_explanation(explain_step(dag, label, store), dag, now=time.time()), end="")
        return 0

    return load(target, options, explain)


# -- data -----------------------------------------------------------------------------------------


def data_command(args: Sequence[str]) -> int:
    """`drydock data FILE|MANIFEST STEP [--samples N] [--reason R] [--json] [options]`: what a
    curation step removed and why, beside what it kept (`pipeline.observe.evidence`)."""
    return needs_target("data", args) or guarded(_data, args[0], args[1:])


def _data(target: str, argv: Sequence[str]) -> int:
    from pipeline.observe.evidence import read_data_sample, render_data_sample

    if not argv or argv[0].startswith("-"):
        raise StepDeclarationError(None, "name the step to show: drydock data FILE STEP", field="STEP")
    wanted = argv[0]
    parser = Parser(prog="drydock data FILE STEP", add_help=False)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--reason")
    parser.add_argument("--json", action="store_true")
    known, options = parser.parse_known_args(list(argv[1:]))
    if known.samples < 0:
        raise StepDeclarationError(
            None, f"--samples must be 0 or more, got {known.samples}", field="--samples"
        )

    def show(source: _Source) -> int:
        entry = next((e for e in source.entries if wanted in (e.label, e.name)), None)
        if entry is None:
            names = ", ".join(sorted({e.name for e in source.entries}))
            raise StepDeclarationError(None, f"no step {wanted!r} in {target} (steps: {names})", field="STEP")
        # Evidence is data anyone who can write the prefix may have changed: read it confined to
        # the prefix, so a symbolic link in `removed/` cannot have a file from elsewhere printed.
        sample = read_data_sample(
            open_storage(source.prefix, confine=True),
            entry.output_path,
            per_reason=known.samples,
            kept=known.samples,
            reason=known.reason,
        )
        if sample is None:
            raise StepDeclarationError(
                None,
                f"{entry.label} has no evidence of what it removed (not a curation step, or not run yet)",
                field="STEP",
            )
        if known.reason is not None and known.reason not in sample.reasons:
            raise StepDeclarationError(
                None,
                f"{entry.label} removed nothing for {known.reason!r} (reasons: {', '.join(sample.reasons)})",
                field="--reason",
            )
        if known.json:
            print(json.dumps({"step": entry.label, **sample.to_json()}, indent=1))
        else:
            print(render_data_sample(sample, entry.label), end="")
        return 0

    return _with_source(target, options, show)
