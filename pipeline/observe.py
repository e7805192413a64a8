"""The CLI commands that look at runs instead of running them: status, dag, explain, gc, pin.

    drydock status FILE|MANIFEST [--watch] [--interval S] [--json] [options]
    drydock dag FILE|MANIFEST [--format mermaid|dot|svg|html] [--output PATH] [options]
    drydock explain FILE|MANIFEST STEP [options]
    drydock gc [--prefix P] [--keep MANIFEST ...] [--older-than AGE] [--dry_run] [--yes]
    drydock pin PATH|LABEL [--prefix P] [--unpin]

An experiment FILE is executed as `__main__` in capture mode: its `executor_main` call hands
over its steps and options and runs nothing. A MANIFEST is read directly for `status` and `dag`
(labels, paths and deps are all they need, so no experiment code has to be importable) and
rebuilt into steps (`pipeline.recipe`) for `explain`. Each command returns an exit code: 0,
2 for a user error (one line on stderr, nothing written), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from pipeline.errors import DrydockError, StepDeclarationError
from pipeline.lease import Owner
from pipeline.main import ExecutorMainConfig, prepare
from pipeline.recipe import is_manifest
from pipeline.status_view import (
    StepEntry,
    StepStatus,
    entries_from_dag,
    entries_from_manifest,
    read_status,
    status_json,
    status_table,
    watch,
)
from pipeline.step import Step
from pipeline.storage import StepStore, normalize_prefix, open_storage

__all__ = ["dag_command", "explain_command", "gc_command", "pin_command", "print_status", "status_command"]

FORMATS = ("mermaid", "dot", "svg", "html")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so errors get Drydock's one-line form."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise StepDeclarationError(None, f"{self.prog}: {message}", field="argv")


@dataclass
class _Loaded:
    """The steps of a FILE or MANIFEST with the options given for it."""

    steps: list[Step]
    config: ExecutorMainConfig
    description: str


def _with_steps(target: str, options: Sequence[str], body: Callable[[_Loaded], int]) -> int:
    """Call `body` with the steps and options of an experiment file or a manifest's recipe.

    A file is executed in capture mode and `body` runs inside its `executor_main` call, while
    the file is still `__main__` (functions it defines stay importable); errors there are
    reported by `executor_main` as for any run.
    """
    from pipeline import cli
    from pipeline import main as main_module

    if is_manifest(target):
        from pipeline.main import parse_options
        from pipeline.recipe import load_recipe, rerun_argv

        manifest, roots = load_recipe(target)
        config = parse_options(rerun_argv(manifest, options))
        return body(_Loaded(list(roots), config, manifest.get("description") or ""))
    main_module._CAPTURED.clear()
    main_module._CAPTURED["handler"] = lambda steps, config, description: body(
        _Loaded(steps, config, description)
    )
    try:
        return cli.run_file(target, options, capture=True)
    finally:
        main_module._CAPTURED.clear()


def _run(fn: Any, *args: Any) -> int:
    """Call a command body; a DrydockError is one line on stderr and exit code 2."""
    try:
        return int(fn(*args))
    except DrydockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


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


def _manifest_source(target: str, options: Sequence[str]) -> _Source:
    """The steps a MANIFEST lists, read directly: no experiment code needed."""
    from pipeline.recipe import load_manifest

    parser = _Parser(prog="drydock status|dag MANIFEST", add_help=False)
    parser.add_argument("--prefix")
    known, rest = parser.parse_known_args(list(options))
    if rest:
        raise StepDeclarationError(None, f"unknown option(s) for a manifest: {' '.join(rest)}", field="argv")
    manifest = load_manifest(target)
    prefix = normalize_prefix(known.prefix or manifest.get("prefix") or ".")
    entries = entries_from_manifest(manifest)
    if known.prefix and manifest.get("prefix"):
        # The same run read under another prefix (a copied bucket): same labels, new root.
        entries = [StepEntry(e.label, e.name, f"{prefix}/{e.label}", e.deps) for e in entries]
    title = f"{manifest.get('experiment', 'experiment')} under {prefix}"
    recorded = {
        str(step["label"]): {k: step[k] for k in ("hash", "state", "reason", "planned") if k in step}
        for step in manifest.get("steps", [])
    }
    return _Source(entries, StepStore(open_storage(prefix)), prefix, title, recorded)


def _dag_source(loaded: _Loaded) -> _Source:
    dag, store, plan = prepare(loaded.steps, loaded.config, strict=False)
    planned = {label: sp.to_json() for label, sp in plan.steps.items()}
    return _Source(entries_from_dag(dag), store, dag.prefix, f"Status under {dag.prefix}", planned)


def _with_source(target: str, options: Sequence[str], body: Callable[[_Source], int]) -> int:
    """Call `body` with the steps to show: from a MANIFEST directly, or from a FILE's DAG."""
    if is_manifest(target):
        return body(_manifest_source(target, options))
    return _with_steps(target, options, lambda loaded: body(_dag_source(loaded)))


def _read(source: _Source) -> list[StepStatus]:
    return read_status(source.entries, source.store, now=time.time(), local_host=Owner.current().host)


def status_command(target: str, argv: Sequence[str]) -> int:
    """`drydock status FILE|MANIFEST [--watch] [--interval S] [--json] [options]`."""
    return _run(_status, target, argv)


def _status(target: str, argv: Sequence[str]) -> int:
    parser = _Parser(prog="drydock status", add_help=False)
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    known, options = parser.parse_known_args(list(argv))
    if known.interval <= 0:
        raise StepDeclarationError(None, "must be positive", field="--interval")
    if known.json and known.watch:
        raise StepDeclarationError(
            None, "--watch shows a live table; it cannot be combined with --json", field="--watch"
        )

    def show(source: _Source) -> int:
        if known.json:
            rows = _read(source)
            print(json.dumps(_status_document(source, rows, time.time()), indent=2))
            return 0
        console = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)
        if known.watch:
            # Ctrl-C ends watching; the table on screen is the last one read.
            with contextlib.suppress(KeyboardInterrupt):
                watch(lambda: _read(source), console, interval=known.interval, title=source.title)
            return 0
        console.print(status_table(_read(source), now=time.time(), title=source.title))
        return 0

    return _with_source(target, options, show)


def _status_document(source: _Source, rows: list[StepStatus], now: float) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    steps = []
    for shown, row in zip(status_json(rows, now), rows, strict=True):
        entry = {**source.planned.get(row.entry.label, {}), **shown, "deps": list(row.entry.deps)}
        steps.append(entry)
        # `status`: the raw last state event (None if never started), as `drydock status --json` always gave.
        last = row.last_event
        entry["status"] = {"CORRUPT": "CORRUPT", "NOT STARTED": None, "STALE": "RUNNING"}.get(
            row.state, row.state
        )
        entry["status_time"] = last.time if last else None
        entry["live"] = row.state == "RUNNING"
    return {"prefix": source.prefix, "time": now, "counts": counts, "steps": steps}


def print_status(steps: Sequence[Step], config: ExecutorMainConfig) -> int:
    """The status table (or JSON with `config.json`) of `steps` once: `executor_main`'s status mode."""
    source = _dag_source(_Loaded(list(steps), config, ""))
    rows = _read(source)
    if config.json:
        print(json.dumps(_status_document(source, rows, time.time()), indent=2))
    else:
        Console(width=200, soft_wrap=False).print(status_table(rows, now=time.time(), title=source.title))
    return 0


# -- dag --------------------------------------------------------------------------------------------


def dag_command(target: str, argv: Sequence[str]) -> int:
    """`drydock dag FILE|MANIFEST [--format mermaid|dot|svg|html] [--output PATH] [options]`."""
    return _run(_dag, target, argv)


def _dag(target: str, argv: Sequence[str]) -> int:
    from pipeline import dag_render

    parser = _Parser(prog="drydock dag", add_help=False)
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
            dag_render.DagNode(r.entry.label, r.entry.name, r.state, r.entry.deps, r.entry.output_path)
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


def explain_command(target: str, argv: Sequence[str]) -> int:
    """`drydock explain FILE|MANIFEST STEP [options]`: STEP is a step name or label."""
    return _run(_explain, target, argv)


def _explain(target: str, argv: Sequence[str]) -> int:
    from pipeline.explain import explain_step, format_explanation

    if not argv or argv[0].startswith("-"):
        raise StepDeclarationError(None, "name the step to explain: drydock explain FILE STEP", field="STEP")
    wanted, options = argv[0], list(argv[1:])

    def explain(loaded: _Loaded) -> int:
        dag, store, _plan = prepare(loaded.steps, loaded.config, strict=False)
        matches = [label for label, node in dag.nodes.items() if wanted in (label, node.name)]
        if not matches:
            close = sorted(node.name for node in dag.nodes.values() if wanted in node.name)[:5]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise StepDeclarationError(None, f"no step named {wanted!r} in {target}{hint}", field="STEP")
        print(format_explanation(explain_step(dag, matches[0], store), dag, now=time.time()), end="")
        return 0

    return _with_steps(target, options, explain)


# -- gc and pin -------------------------------------------------------------------------------------


def _prefix(value: str | None) -> str:
    from pipeline.main import _resolve_prefix

    return _resolve_prefix(value)


def gc_command(argv: Sequence[str]) -> int:
    """`drydock gc [--prefix P] [--keep MANIFEST ...] [--older-than AGE] [--dry_run] [--yes]`."""
    return _run(_gc, argv)


def _gc(argv: Sequence[str]) -> int:
    from pipeline.prune import delete_planned, format_size, parse_age, plan_gc

    parser = _Parser(prog="drydock gc", add_help=False)
    parser.add_argument("--prefix")
    parser.add_argument("--keep", nargs="+", action="extend")
    parser.add_argument("--older-than", "--older_than", dest="older_than")
    parser.add_argument("--dry_run", "--dry-run", dest="dry_run", action="store_true")
    parser.add_argument("--yes", "-y", action="store_true")
    args = parser.parse_args(list(argv))
    older = parse_age(args.older_than) if args.older_than else None
    prefix = _prefix(args.prefix)
    storage = open_storage(prefix)
    now = time.time()
    host = Owner.current().host
    plan = plan_gc(storage, prefix, keep=args.keep, older_than=older, now=now, local_host=host)
    out = Console(width=200, soft_wrap=False)
    print(f"prefix {plan.prefix}: {len(plan.keep) + len(plan.delete)} step directories")
    if plan.manifests:
        print(f"kept manifests ({len(plan.manifests)}):")
        for path in plan.manifests:
            print(f"  {path}")
    else:
        print("no kept manifest: every step that is not pinned, running or leased is garbage")
    reasons: dict[str, int] = {}
    for d in plan.keep:
        reasons[d.keep_reason] = reasons.get(d.keep_reason, 0) + 1
    if reasons:
        print("keeping " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))
    for d in plan.keep:
        if d.keep_reason not in ("in a kept manifest", "too recent"):
            print(f"  keep {d.label}  ({d.keep_reason})")
    total = sum(d.size for d in plan.delete)
    orphans = plan.orphans
    if not plan.delete and not orphans:
        print("nothing to delete")
        return 0
    from rich.table import Table

    table = Table(
        title=f"garbage: {len(plan.delete)} step directories, {format_size(total)}", title_justify="left"
    )
    table.add_column("step", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("last event", no_wrap=True)
    table.add_column("size", justify="right")
    for d in plan.delete:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(d.last_time)) if d.last_time else ""
        table.add_row(d.label, d.state or "NOT STARTED", when, format_size(d.size))
    out.print(table)
    if orphans:
        print(f"leftover temporary files of interrupted writes: {len(orphans)}")
        for path in orphans[:20]:
            print(f"  {path}")
    if args.dry_run:
        print("dry run: nothing deleted")
        return 0
    if not args.yes:
        try:
            answer = input(f"delete {len(plan.delete)} step directories ({format_size(total)})? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    deleted, skipped = delete_planned(storage, plan, now=time.time(), local_host=host)
    for entry, why in skipped:
        print(f"skipped {entry.label}: {why}")
    print(f"deleted {len(deleted)} step directories, {format_size(sum(d.size for d in deleted))}")
    return 0


def pin_command(argv: Sequence[str]) -> int:
    """`drydock pin PATH|LABEL [--prefix P] [--unpin]`."""
    return _run(_pin, argv)


def _pin(argv: Sequence[str]) -> int:
    from pipeline.prune import pin, resolve_step_dir

    parser = _Parser(prog="drydock pin", add_help=False)
    parser.add_argument("target")
    parser.add_argument("--prefix")
    parser.add_argument("--unpin", action="store_true")
    args = parser.parse_args(list(argv))
    local_target = "://" not in args.target and args.target.startswith((".", "/"))
    target = normalize_prefix(args.target) if local_target else args.target
    prefix = _prefix(args.prefix)
    storage = open_storage(target if "://" in target or target.startswith("/") else prefix)
    step_dir = resolve_step_dir(storage, prefix, target)
    existed = pin(storage, step_dir, unpin=args.unpin, now=time.time())
    if args.unpin:
        print(f"unpinned {step_dir}" if existed else f"{step_dir} was not pinned")
    else:
        print(f"{step_dir} was already pinned" if existed else f"pinned {step_dir}: `drydock gc` keeps it")
    return 0
