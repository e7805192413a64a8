"""Telling a deterministic crash from a lost machine.

A step's process that dies under it (a segfault, an out-of-memory kill) is retried on the
preemption budget, like a lost host: most such deaths are the machine's doing. But a crash that
happens at the same point every time is the step's own, and a 1,000-preemption budget would retry
it for days. So each crash gets a signature: how the process died and how far the attempt had got
(its last `.progress` report). A resumable step that is preempted makes progress between
preemptions; one that crashes deterministically crashes at the same place again. The same
signature `Resources.crash_limit` times in a row makes the attempt a failure, with the evidence
(the signatures and the end of the attempt's log) in its error. A lost host (a node that died)
never counts: it is not the step's doing, however often it happens.

`CrashWatch` is pure bookkeeping; `attempt_progress` and `attempt_log_tail` read the facts.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import StepPreempted
from pipeline.storage.layout import LOGS_DIR, log_token
from pipeline.storage.step_store import StepStore

__all__ = ["CrashWatch", "attempt_log_tail", "attempt_progress", "crash_signature", "log_evidence"]

_STAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s*")


def crash_signature(message: str, progress: Mapping[str, Any] | None) -> str:
    """How an attempt crashed: the error's kind (without the addresses and ids in Ray's message)
    and the progress it had reported (`done` and `unit` of its `.progress`, or none)."""
    kind = message.split(":", 1)[0].strip()
    where = "before reporting progress"
    if progress is not None and isinstance(progress.get("done"), int | float):
        where = f"at {progress['done']:g} {progress.get('unit') or ''}".rstrip()
    return f"{kind} {where}"


def log_evidence(tail: str | None, lines: int = 3) -> str:
    """The last few lines of an attempt's log, without their timestamps."""
    if not tail:
        return ""
    kept = [_STAMP.sub("", line).strip() for line in tail.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


@dataclass
class CrashWatch:
    """The consecutive crash signatures of each step of a run."""

    _runs: dict[str, list[str]] = field(default_factory=dict)

    def observe(self, label: str, signature: str | None, limit: int) -> bool:
        """Record an attempt of `label` that was preempted; `signature` None for a lost host (which
        also breaks a run of crashes). True when the last `limit` attempts crashed the same way."""
        if signature is None:
            self._runs.pop(label, None)
            return False
        run = self._runs.setdefault(label, [])
        if run and run[-1] != signature:
            run.clear()
        run.append(signature)
        return len(run) >= limit

    def reset(self, label: str) -> None:
        """An attempt of `label` ended otherwise (succeeded, failed, lost its lease)."""
        self._runs.pop(label, None)


def attempt_progress(store: StepStore, step_dir: str, token: int) -> Mapping[str, Any] | None:
    """The last `.progress` report of the attempt with fencing token `token`, if it made one."""
    with contextlib.suppress(Exception):  # evidence is best effort: a crash is still one
        report = store.read_progress(step_dir)
        if report is not None and report.get("token") == token:
            return report
    return None


def attempt_log_tail(store: StepStore, step_dir: str, token: int, size: int = 4096) -> str | None:
    """The end of the attempt's log (of its first host, for a gang), if it left one."""
    with contextlib.suppress(Exception):
        logs = sorted(n for n in store.storage.listdir(f"{step_dir}/{LOGS_DIR}") if log_token(n) == token)
        if logs:
            raw = store.storage.read_tail(f"{step_dir}/{LOGS_DIR}/{logs[0]}", size)
            return raw.decode("utf-8", "replace") if raw else None
    return None


def crash_loop(
    crashes: CrashWatch,
    store: StepStore,
    label: str,
    step_dir: str,
    token: int,
    error: BaseException,
    limit: int,
) -> str | None:
    """The evidence, if this preempted attempt is the `limit`-th identical crash in a row; None
    otherwise (a lost host, or not yet the limit). Every preempted attempt is observed."""
    if not (isinstance(error, StepPreempted) and error.crash):
        crashes.observe(label, None, limit)
        return None
    signature = crash_signature(str(error), attempt_progress(store, step_dir, token))
    if not crashes.observe(label, signature, limit):
        return None
    evidence = log_evidence(attempt_log_tail(store, step_dir, token))
    return signature + (f"; its log ends: {evidence}" if evidence else "")
