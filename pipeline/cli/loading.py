"""Loading an experiment: executing an experiment file, or rebuilding a manifest's recipe.

An experiment file declares its steps and ends in `executor_main(steps, ...)` under
`if __name__ == "__main__":`. The commands execute the file as `__main__` with their options as
its command line. What its `executor_main` call then does is decided by an `ExperimentCall`
handler set for the duration (`intercept`): `drydock run` lets it run as usual; `drydock
status|dag|explain` take its steps and options and run nothing. The handler is called while the
file is still `__main__`, so functions the file defines stay importable.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from pipeline.errors import DrydockError, StepDeclarationError
from pipeline.run.options import ExecutorMainConfig, parse_options
from pipeline.step import Step
from pipeline.storage.manifests import is_manifest

__all__ = [
    "ExperimentCall",
    "Loaded",
    "current_handler",
    "intercept",
    "load",
    "run_file",
    "split_remaps",
    "split_source",
]


@dataclass(frozen=True)
class ExperimentCall:
    """An experiment file's `executor_main(steps, description, ...)` call, as it was made."""

    steps: list[Step]
    description: str
    config: ExecutorMainConfig
    """The options parsed from the file's command line."""
    source_file: str | None


Handler = Callable[[ExperimentCall], int]
"""Decides what an `executor_main` call does; returns its exit code."""

_HANDLER: contextvars.ContextVar[Handler | None] = contextvars.ContextVar("drydock_handler", default=None)


@contextlib.contextmanager
def intercept(handler: Handler) -> Iterator[None]:
    """Hand every `executor_main` call made meanwhile (in this context) to `handler`."""
    token = _HANDLER.set(handler)
    try:
        yield
    finally:
        _HANDLER.reset(token)


def current_handler() -> Handler | None:
    """The handler `intercept` set, if any (`executor_main` runs the experiment itself if none)."""
    return _HANDLER.get()


def run_file(path: str, options: Sequence[str], handler: Handler) -> int:
    """Execute the experiment file as `__main__` with `options` as its command line; its
    `executor_main` call goes to `handler`. Returns the exit code."""
    calls: list[ExperimentCall] = []

    def record(call: ExperimentCall) -> int:
        calls.append(call)
        return handler(call)

    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *options]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        with intercept(record):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        asked_help = any(o in ("-h", "--help") for o in options)  # executor_main printed its options
        if calls or e.code not in (None, 0) or asked_help:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except DrydockError as e:
        # A mistake caught while the file declares its steps (a step library's own checks): the
        # same one line and exit code as a mistake executor_main finds.
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if calls:
            raise  # raised by the run itself, not by loading the file
        # A mistake in the file itself (a mistyped keyword, a missing import, a typo in a name):
        # one line naming the error and the file's line, as for the declaration errors above.
        # DRYDOCK_TRACEBACK=1 shows the whole traceback, for a mistake deep in one's own helpers.
        if os.environ.get("DRYDOCK_TRACEBACK"):
            traceback.print_exc()
        print(f"error: cannot load experiment file {path}: {_describe(e, path)}", file=sys.stderr)
        return 2
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    if not calls:
        print(
            f'error: {path} did not call executor_main(...) under `if __name__ == "__main__":`',
            file=sys.stderr,
        )
        return 2
    return 0


def _describe(error: Exception, path: str) -> str:
    """One line for an experiment file that cannot be loaded: the error, and the last line of the
    file the traceback passes through (the file's own line that imports the missing module, or
    that calls a class with a mistyped keyword)."""
    if isinstance(error, SyntaxError):
        where = f"{error.filename}:{error.lineno}" if error.filename else f"line {error.lineno}"
        return f"SyntaxError: {error.msg} ({where})"
    target = os.path.abspath(path)
    line = None
    frame = error.__traceback__
    while frame is not None:
        if os.path.abspath(frame.tb_frame.f_code.co_filename) == target:
            line = frame.tb_lineno
        frame = frame.tb_next
    where = f" ({path}:{line})" if line is not None else ""
    return f"{type(error).__name__}: {error}{where}"


@dataclass
class Loaded:
    """The steps of a FILE or MANIFEST with the options given for it."""

    steps: list[Step]
    config: ExecutorMainConfig
    description: str


def split_source(options: Sequence[str]) -> tuple[str | None, list[str]]:
    """`--source FILE` (or `--source=FILE`) taken out of a manifest command's options: the
    experiment file whose code the user names for the recipe's `__main__` functions."""
    rest: list[str] = []
    source = None
    items = list(options)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg == "--source":
            if i + 1 >= len(items):
                raise StepDeclarationError(None, "needs a file: --source FILE", field="--source")
            source, i = items[i + 1], i + 2
            continue
        if arg.startswith("--source="):
            source = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return source, rest


def split_remaps(options: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """`--remap OLD=NEW` (repeatable; or `--remap=OLD=NEW`) taken out of a manifest command's
    options: recorded paths under OLD are read under NEW (`pipeline.run.records.recipe.remap_recipe`)."""
    remaps: list[tuple[str, str]] = []
    rest: list[str] = []
    items = list(options)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg == "--remap" or arg.startswith("--remap="):
            if arg == "--remap":
                if i + 1 >= len(items):
                    raise StepDeclarationError(None, "needs OLD=NEW: --remap OLD=NEW", field="--remap")
                value, i = items[i + 1], i + 2
            else:
                value, i = arg.split("=", 1)[1], i + 1
            old, sep, new = value.partition("=")
            if not sep or not old or not new:
                raise StepDeclarationError(None, f"{value!r} is not OLD=NEW (two paths)", field="--remap")
            remaps.append((old, new))
            continue
        rest.append(arg)
        i += 1
    return remaps, rest


def load(target: str, options: Sequence[str], body: Callable[[Loaded], int]) -> int:
    """Call `body` with the steps and options of an experiment file or a manifest's recipe.

    A file is executed and `body` runs inside its `executor_main` call (see the module
    docstring); errors there are reported by `executor_main` as for any run.
    """
    if is_manifest(target):
        from pipeline.run.records.recipe import load_recipe, rerun_argv

        source, options = split_source(options)
        remaps, options = split_remaps(options)
        manifest, roots = load_recipe(target, source, remaps)
        config = parse_options(rerun_argv(manifest, options))
        return body(Loaded(list(roots), config, manifest.get("description") or ""))
    if not os.path.isfile(target):
        raise StepDeclarationError(None, f"experiment file {target!r} does not exist", field="FILE")

    def handler(call: ExperimentCall) -> int:
        return body(Loaded(call.steps, call.config, call.description))

    return run_file(target, options, handler)
