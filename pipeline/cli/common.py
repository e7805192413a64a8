"""What the `drydock` commands share: argument parsing that raises, and one error form."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pipeline.core.dag import Dag
from pipeline.errors import DrydockError, StepDeclarationError
from pipeline.storage.manifests import is_manifest

__all__ = [
    "BROKEN_PIPE",
    "Parser",
    "find_step",
    "guarded",
    "needs_target",
    "output_may_close",
    "quiet_broken_pipe",
]

BROKEN_PIPE = 141
"""The exit code of a command whose stdout reader went away, as a shell reports one killed by SIGPIPE."""


def quiet_broken_pipe(fn: Callable[[], int]) -> int:
    """`fn()`, flushing stdout; if its reader has gone (`drydock plan FILE | head`), stop without a
    traceback, as Unix tools do, and exit with BROKEN_PIPE."""
    try:
        code = fn()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python would try to flush stdout again at exit and print a second error: point it at
        # /dev/null first (the recipe of Python's signal documentation).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE


class _SurvivingStream:
    """A text stream whose reader may go away (`drydock run ... 2>&1 | tee log`, and Ctrl-C ends
    `tee` too): a write that meets a broken pipe is dropped, and so is every later one, instead of
    raising in the middle of whatever printed (cancelling steps and closing the run's record)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return int(self._stream.write(text))
            except OSError as e:
                self._lost(e)
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except OSError as e:
                self._lost(e)

    def _lost(self, error: OSError) -> None:
        if not isinstance(error, BrokenPipeError) and error.errno != errno.EPIPE:
            raise error
        self.broken = True
        # What is still buffered, and what native code or Python's exit would flush, goes nowhere.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def output_may_close() -> Iterator[None]:
    """Meanwhile, stdout and stderr (and the log handlers writing to them) never raise because
    their reader went away: a run cancels its steps and closes its record whatever its output."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _SurvivingStream(saved[0]), _SurvivingStream(saved[1])
    handlers = [
        (h, h.stream)
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and h.stream in saved
    ]
    for handler, stream in handlers:
        handler.setStream(sys.stdout if stream is saved[0] else sys.stderr)
    try:
        yield
    finally:
        for handler, stream in handlers:
            handler.setStream(stream)
        sys.stdout, sys.stderr = saved


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so errors get Drydock's one-line form."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise StepDeclarationError(None, f"{self.prog}: {message}", field="argv")


def guarded(fn: Callable[..., Any], *args: Any) -> int:
    """Call a command body; a DrydockError is one line on stderr and exit code 2."""
    try:
        return int(fn(*args))
    except DrydockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def needs_target(command: str, args: Sequence[str]) -> int | None:
    """Exit code 2 (with the error said) unless `args` start with an existing FILE or a MANIFEST."""
    if not args or args[0].startswith("-"):
        print(f"error: `drydock {command}` needs an experiment file: drydock {command} FILE", file=sys.stderr)
        return 2
    if not is_manifest(args[0]) and not os.path.isfile(args[0]):
        print(f"error: experiment file {args[0]!r} does not exist", file=sys.stderr)
        return 2
    return None


def find_step(dag: Dag, wanted: str, target: str) -> str:
    """The label of the step `wanted` names (a label or a step name) in `dag`; one error naming
    the file otherwise, with the names containing what was typed, else the names close to it (a
    typo: `trian/x`)."""
    for label, node in dag.nodes.items():
        if wanted in (label, node.name):
            return label
    names = sorted({node.name for node in dag.nodes.values()})
    close = [n for n in names if wanted in n][:5] or difflib.get_close_matches(wanted, names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise StepDeclarationError(None, f"no step named {wanted!r} in {target}{hint}", field="STEP")
