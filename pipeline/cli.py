"""The `drydock` command: run, plan or inspect an experiment file.

    drydock run FILE [options]      plan and run (same as `python FILE [options]`)
    drydock plan FILE [options]     print the plan, run nothing (= `--dry_run`)
    drydock status FILE [options]   what storage says about each step now

Options are those of `executor_main` (`--prefix`, `--backend`, `--json`, `--only`, ...). The
file is executed as `__main__`, so its own `executor_main(...)` call receives them.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from pipeline import main as main_module

__all__ = ["main"]

USAGE = """usage: drydock {run,plan,status} FILE [options]

  run     plan the experiment in FILE and run every step that is not done
  plan    print the plan (what would run, and why) without running anything
  status  show what storage says about each step of FILE now

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

COMMANDS = ("run", "plan", "status")


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
    if not rest or rest[0].startswith("-"):
        print(f"error: `drydock {command}` needs an experiment file: drydock {command} FILE", file=sys.stderr)
        return 2
    path, options = rest[0], rest[1:]
    if not os.path.isfile(path):
        print(f"error: experiment file {path!r} does not exist", file=sys.stderr)
        return 2
    if command == "plan":
        options = [*options, "--dry_run", "true"]
    return run_file(path, options, status=command == "status")


def run_file(path: str, options: Sequence[str], *, status: bool = False) -> int:
    """Execute the experiment file as `__main__` with `options` as its command line."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *options]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    main_module._COMMAND_OVERRIDE.clear()
    if status:
        main_module._COMMAND_OVERRIDE["command"] = "status"
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
