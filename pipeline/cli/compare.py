"""`drydock compare RUN [RUN ...]`: runs side by side, one row per training (or other compared step).

A RUN is a run manifest (`<prefix>/experiments/<name>-<hash>.json`), an experiment file (planned
under `--prefix`, as `drydock status` does) or a step's output directory. Columns are the versioned
fields that differ among the rows, then the metrics each step recorded (`pipeline.observe.compare`).

    drydock compare RUN [RUN ...] [--prefix P] [--sort METRIC [--desc]] [--json | --csv]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from pipeline.cli.common import Parser, guarded
from pipeline.cli.loading import Loaded, load
from pipeline.errors import StepDeclarationError
from pipeline.observe.compare import (
    CompareStep,
    Row,
    compare_rows,
    manifest_steps,
    merge_shared,
    rows_csv,
    rows_json,
    sort_rows,
    table_rows,
)
from pipeline.observe.render import label_width
from pipeline.run.experiment import prepare
from pipeline.storage.manifests import is_manifest, load_manifest
from pipeline.storage.opening import normalize_prefix, open_storage
from pipeline.storage.step_store import StepStore

__all__ = ["compare_command"]

USAGE = "drydock compare RUN [RUN ...] [--prefix P] [--sort METRIC [--desc]] [--all | --json | --csv]"


def compare_command(args: Sequence[str]) -> int:
    """`drydock compare RUN [RUN ...] [options]`."""
    return guarded(_compare, list(args))


def _compare(argv: list[str]) -> int:
    parser = Parser(prog="drydock compare", add_help=False)
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--prefix")
    parser.add_argument("--sort")
    parser.add_argument("--desc", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--csv", action="store_true")
    parser.add_argument("--all", action="store_true")
    known = parser.parse_args(argv)
    if not known.runs:
        raise StepDeclarationError(None, f"give at least one run: {USAGE}", field="RUN")
    if known.json and known.csv:
        raise StepDeclarationError(None, "choose one of --json and --csv", field="--csv")
    rows: list[Row] = []
    for run in known.runs:
        steps, store = _run_steps(run, known.prefix)
        found = compare_rows(steps, store)
        if not found:
            raise StepDeclarationError(
                None,
                f"{run!r} has no finished step with recorded metrics (a training or an evaluation "
                "that succeeded); run it first",
                field="RUN",
            )
        rows.extend(found)
    rows = merge_shared(rows)
    if known.sort:
        try:
            rows = sort_rows(rows, known.sort, descending=known.desc)
        except KeyError:
            names = sorted({m for r in rows for m in r.metrics})
            raise StepDeclarationError(
                None, f"no metric {known.sort!r}; the rows have: {', '.join(names)}", field="--sort"
            ) from None
    if known.json:
        print(json.dumps(rows_json(rows), indent=2))
    elif known.csv:
        sys.stdout.write(rows_csv(rows))
    else:
        # The terminal's width ($COLUMNS, else 100 off a terminal): what differs first, and a line
        # naming what did not fit (--all shows every column, --json and --csv everything).
        width = shutil.get_terminal_size((100, 24)).columns
        header, body, left_out = table_rows(rows, width=None if known.all else width)
        noun = "row" if len(rows) == 1 else "rows"
        table = Table(title=f"{len(rows)} {noun} compared", title_justify="left")
        names = {"run", "step"}
        for i, name in enumerate(header):
            # Run and step names whole (never cut with an ellipsis); long headers fold.
            whole = name in names and i < 2
            fixed = label_width(row[i] for row in body) if whole else None
            table.add_column(name, justify="left" if whole else "right", min_width=fixed, overflow="fold")
        for cells in body:
            table.add_row(*cells)
        Console(width=None if known.all else width, soft_wrap=known.all).print(table)
        if left_out:
            shown = ", ".join(left_out[:8]) + (f" and {len(left_out) - 8} more" if len(left_out) > 8 else "")
            note = f"{len(left_out)} more columns did not fit ({shown}): --all shows them; --csv, --json"
            print(textwrap.fill(note, width=width))
    return 0


def _run_steps(run: str, prefix: str | None) -> tuple[list[CompareStep], StepStore]:
    """The steps of one RUN argument and the store they are read from."""
    if is_manifest(run):
        manifest = load_manifest(run)
        root = normalize_prefix(prefix or manifest.get("prefix") or ".")
        name = os.path.basename(run).removesuffix(".json")
        return manifest_steps(manifest, name, root), StepStore(open_storage(root))
    if run.endswith(".py"):
        if not os.path.isfile(run):
            raise StepDeclarationError(None, f"experiment file {run!r} does not exist", field="RUN")
        found: list[tuple[list[CompareStep], StepStore]] = []

        def plan(loaded: Loaded) -> int:
            dag, store, _ = prepare(loaded.steps, loaded.config, strict=False)
            name = os.path.basename(run).removesuffix(".py")
            steps = [
                CompareStep(name, label, node.name, node.output_path, (*node.deps, *node.soft_deps))
                for label, node in dag.nodes.items()
            ]
            found.append((steps, store))
            return 0

        options = ["--prefix", prefix] if prefix else []
        code = load(run, options, plan)
        if code != 0 or not found:
            raise StepDeclarationError(
                None, f"could not plan experiment file {run!r} (exit {code})", field="RUN"
            )
        return found[0]
    return _step_dir_steps(run)


def _step_dir_steps(path: str) -> tuple[list[CompareStep], StepStore]:
    """A step's output directory: its run's steps (from the manifest its `.step.json` names), with
    the rows narrowed to this step; or the step alone if that manifest is gone."""
    path = normalize_prefix(path)
    store = StepStore(open_storage(path))
    info = store.read_step_json(path)
    if not isinstance(info, dict) or "label" not in info:
        raise StepDeclarationError(
            None,
            f"{path!r} is not a run: give a run manifest (.json), an experiment file (.py) or a "
            "step's output directory (one with a .step.json)",
            field="RUN",
        )
    label = str(info["label"])
    root = path[: -len(label)].rstrip("/") if path.endswith(label) else os.path.dirname(path)
    manifest_path = info.get("manifest")
    if isinstance(manifest_path, str):
        try:
            manifest = load_manifest(manifest_path)
        except StepDeclarationError:
            manifest = None
        if manifest is not None and any(s.get("label") == label for s in manifest.get("steps", [])):
            steps = manifest_steps(manifest, label, root)
            keep = _with_downstream(steps, label)
            return [s for s in steps if s.label in keep], store
    # `.step.json` names its inputs by path: under the same root, a path is a label.
    paths = [*info.get("deps", []), *info.get("soft_deps", [])]
    deps = tuple(d[len(root) + 1 :] if d.startswith(root + "/") else d for d in paths)
    return [CompareStep(label, label, str(info.get("name") or label), path, deps)], store


def _with_downstream(steps: list[CompareStep], label: str) -> set[str]:
    """`label`, everything upstream of it (for its params) and the steps reading it (its evaluations)."""
    by_label = {s.label: s for s in steps}
    keep = {label}
    stack = [label]
    while stack:  # upstream
        for dep in by_label[stack.pop()].deps:
            if dep in by_label and dep not in keep:
                keep.add(dep)
                stack.append(dep)
    keep.update(s.label for s in steps if label in s.deps)
    return keep
