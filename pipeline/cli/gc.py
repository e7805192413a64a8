"""`drydock gc` and `drydock pin`: collect step outputs no kept manifest needs, protect others.

    drydock gc [--prefix P] [--keep MANIFEST ...] [--older-than AGE] [--dry_run] [--yes]
    drydock pin PATH|LABEL [--prefix P] [--unpin]

What to keep and delete is decided by `pipeline.observe.prune`; this module asks and reports.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from pipeline.cli.common import Parser, guarded
from pipeline.observe.prune import (
    GcPlan,
    delete_planned,
    parse_age,
    pin,
    plan_gc,
    resolve_step_dir,
)
from pipeline.observe.render import format_size
from pipeline.processes import current_owner
from pipeline.run.options import resolve_prefix
from pipeline.storage.opening import normalize_prefix, open_storage

__all__ = ["gc_command", "pin_command"]


def gc_command(argv: Sequence[str]) -> int:
    """`drydock gc [--prefix P] [--keep MANIFEST ...] [--older-than AGE] [--dry_run] [--yes]`."""
    return guarded(_gc, argv)


def _gc(argv: Sequence[str]) -> int:
    parser = Parser(prog="drydock gc", add_help=False)
    parser.add_argument("--prefix")
    parser.add_argument("--keep", nargs="+", action="extend")
    parser.add_argument("--older-than", "--older_than", dest="older_than")
    parser.add_argument("--dry_run", "--dry-run", dest="dry_run", action="store_true")
    parser.add_argument("--yes", "-y", action="store_true")
    args = parser.parse_args(list(argv))
    older = parse_age(args.older_than) if args.older_than else None
    prefix = resolve_prefix(args.prefix)
    storage = open_storage(prefix, confine=True)  # never follow a symbolic link out of it
    host = current_owner().host
    plan = plan_gc(storage, prefix, keep=args.keep, older_than=older, now=time.time(), local_host=host)
    _show_plan(plan)
    if not plan.delete and not plan.orphans:
        print("nothing to delete")
        return 0
    if args.dry_run:
        print("dry run: nothing deleted")
        return 0
    total = sum(d.size for d in plan.delete)
    if not args.yes and not _confirm(f"delete {len(plan.delete)} step directories ({format_size(total)})?"):
        print("nothing deleted")
        return 1
    deleted, skipped = delete_planned(storage, plan, now=time.time(), local_host=host)
    for entry, why in skipped:
        print(f"skipped {entry.label}: {why}")
    print(f"deleted {len(deleted)} step directories, {format_size(sum(d.size for d in deleted))}")
    return 0


def _show_plan(plan: GcPlan) -> None:
    """What is kept (and why), the garbage as a table, and leftover temporary files."""
    print(f"prefix {plan.prefix}: {len(plan.keep) + len(plan.delete)} step directories")
    if plan.manifests:
        print(f"kept manifests ({len(plan.manifests)}):")
        for path in plan.manifests:
            print(f"  {path}")
    else:
        print("no kept manifest: every step that is not pinned, running or leased is garbage")
    reasons = Counter(d.keep_reason for d in plan.keep)
    if reasons:
        print("keeping " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))
    for d in plan.keep:
        if d.keep_reason not in ("in a kept manifest", "too recent"):
            print(f"  keep {d.label}  ({d.keep_reason})")
    if not plan.delete and not plan.orphans:
        return
    total = sum(d.size for d in plan.delete)
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
    Console(width=200, soft_wrap=False).print(table)
    if plan.orphans:
        print(f"leftover temporary files of interrupted writes: {len(plan.orphans)}")
        for path in plan.orphans[:20]:
            print(f"  {path}")


def _confirm(question: str) -> bool:
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def pin_command(argv: Sequence[str]) -> int:
    """`drydock pin PATH|LABEL [--prefix P] [--unpin]`."""
    return guarded(_pin, argv)


def _pin(argv: Sequence[str]) -> int:
    parser = Parser(prog="drydock pin", add_help=False)
    parser.add_argument("target")
    parser.add_argument("--prefix")
    parser.add_argument("--unpin", action="store_true")
    args = parser.parse_args(list(argv))
    local_target = "://" not in args.target and args.target.startswith((".", "/"))
    target = normalize_prefix(args.target) if local_target else args.target
    prefix = resolve_prefix(args.prefix)
    storage = open_storage(target if "://" in target or target.startswith("/") else prefix)
    step_dir = resolve_step_dir(storage, prefix, target)
    existed = pin(storage, step_dir, unpin=args.unpin, now=time.time())
    if args.unpin:
        print(f"unpinned {step_dir}" if existed else f"{step_dir} was not pinned")
    else:
        print(f"{step_dir} was already pinned" if existed else f"pinned {step_dir}: `drydock gc` keeps it")
    return 0
