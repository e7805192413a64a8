"""The `drydock` command: run, plan or inspect an experiment file.

    drydock run FILE [options]      plan and run (same as `python FILE [options]`)
    drydock plan FILE [options]     print the plan, run nothing (= `--dry_run`)
    drydock status FILE [options]   what storage says about each step now
    drydock rerun MANIFEST [options]  rebuild a run's DAG from its manifest alone and run it
    drydock dag FILE [--format F]   the DAG as Mermaid, DOT, SVG or one HTML page, states as colours
    drydock explain FILE STEP       why STEP's identity is what it is; diff against its other runs
    drydock gc [--prefix P] ...     list (and delete) step outputs no kept manifest references
    drydock pin PATH|LABEL          protect a step output from `drydock gc`
    drydock dashboard [--prefix P]  a read-only web page of the prefix (pipeline.dashboard)

The commands that look rather than run (status, dag, explain, gc, pin) live in `pipeline.observe`.

Wherever FILE is accepted, a run manifest (`<prefix>/experiments/<name>-<hash>.json`, a local
path or any fsspec URL) may stand in for it: the DAG is rebuilt from the recipe it records.

Options are those of `executor_main` (`--prefix`, `--backend`, `--json`, `--only`, ...). The
file is executed as `__main__`, so its own `executor_main(...)` call receives them.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from pipeline import main as main_module
from pipeline.errors import DrydockError
from pipeline.recipe import is_manifest

__all__ = ["main"]

USAGE = """usage: drydock {run,plan,status,dag} FILE|MANIFEST [options]
       drydock rerun MANIFEST [options]
       drydock explain FILE|MANIFEST STEP [options]
       drydock gc [--prefix P] [--keep MANIFEST ...] [--older-than AGE] [--dry_run] [--yes]
       drydock pin PATH|LABEL [--prefix P] [--unpin]
       drydock dashboard [--prefix P] [--port N] [--host H]

  run     plan the experiment in FILE and run every step that is not done
  plan    print the plan (what would run, and why) without running anything
  status  show what storage says about each step of FILE now
          (--watch: refresh every --interval seconds while steps run; --json)
  dag     draw the DAG with each step's state as a colour: --format mermaid|dot|svg|html,
          --output PATH (default stdout)
  explain say what STEP's identity is made of, and what differs in its other runs under the prefix
  gc      list step outputs that no kept manifest references (default: every manifest under the
          prefix), never running, leased or pinned ones; delete them after confirmation (--yes)
  pin     mark a step output (a path, or a label under --prefix) so that gc keeps it; --unpin
  rerun   rebuild the DAG recorded in a run manifest (no experiment file needed) and run it;
          --prefix defaults to the manifest's own prefix, so a rerun there is fully cached
  dashboard  serve a read-only web page of the prefix: experiments, DAGs, steps, loss curves
          (default http://127.0.0.1:8008)

options (all commands):
  --prefix P               storage prefix (default $DRYDOCK_PREFIX, else ./drydock-runs)
  --backend ray|local      where steps run (default ray: a private local instance, or --ray_address)
  --ray_address HOST:PORT  join a Ray cluster (default $RAY_ADDRESS)
  --json                   machine-readable output on stdout
  --only REGEX             run only matching steps and what they need
  --force REGEX            rerun matching steps even if cached
  --max_concurrent N  --lease_timeout S  --heartbeat_interval S  --wait_poll_interval S
  --experiment NAME  --log_level LEVEL
run `drydock run FILE --help` for every option with its description.
"""

COMMANDS = ("run", "plan", "status", "rerun", "dag", "explain", "gc", "pin", "dashboard")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `drydock` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if command == "dashboard":
        from pipeline.dashboard import main as dashboard_main  # the web stack loads only here

        return dashboard_main(rest)
    if command in ("gc", "pin"):
        from pipeline import observe

        return observe.gc_command(rest) if command == "gc" else observe.pin_command(rest)
    if not rest or rest[0].startswith("-"):
        print(f"error: `drydock {command}` needs an experiment file: drydock {command} FILE", file=sys.stderr)
        return 2
    path, options = rest[0], rest[1:]
    if command in ("status", "dag", "explain"):
        from pipeline import observe

        if not is_manifest(path) and not os.path.isfile(path):
            print(f"error: experiment file {path!r} does not exist", file=sys.stderr)
            return 2
        view = {
            "status": observe.status_command,
            "dag": observe.dag_command,
            "explain": observe.explain_command,
        }
        return view[command](path, options)
    if command == "plan":
        options = [*options, "--dry_run", "true"]
    if command == "rerun" or is_manifest(path):
        return run_manifest(path, options)
    if not os.path.isfile(path):
        print(f"error: experiment file {path!r} does not exist", file=sys.stderr)
        return 2
    return run_file(path, options)


def run_manifest(location: str, options: Sequence[str]) -> int:
    """Rebuild the DAG recorded in the manifest at `location` and run (or plan) it."""
    from pipeline.recipe import load_recipe, rerun_argv

    try:
        manifest, roots = load_recipe(location)
    except DrydockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    main_module._COMMAND_OVERRIDE.clear()
    try:
        main_module.executor_main(
            roots,
            manifest.get("description") or "",
            argv=rerun_argv(manifest, options),
            source_file=manifest.get("source_file"),
        )
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_file(path: str, options: Sequence[str], *, capture: bool = False) -> int:
    """Execute the experiment file as `__main__` with `options` as its command line.

    With `capture`, its `executor_main` call runs nothing and hands its steps and options to
    `pipeline.main._CAPTURED["handler"]` (for `drydock status|dag|explain`).
    """
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *options]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    main_module._COMMAND_OVERRIDE.clear()
    if capture:
        main_module._COMMAND_OVERRIDE["command"] = "capture"
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if main_module._COMMAND_OVERRIDE.get("called") or e.code not in (None, 0):
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    if not main_module._COMMAND_OVERRIDE.get("called"):
        print(
            f'error: {path} did not call executor_main(...) under `if __name__ == "__main__":`',
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
