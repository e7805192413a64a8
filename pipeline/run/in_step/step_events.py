"""What a running step function reports about itself: notes and progress.

The executor binds a `StepContext` (output directory, run id, fencing token) around every call
of a step function, on whichever backend runs it. `warn(...)` appends a WARNING line under that
token, so a note from an attempt that has lost its lease is dropped like any stale write. Notes
never change a step's state. `progress(done, total, unit)` says how far the step is: it replaces
`<output>/.progress` (at most every few seconds, and always once `done` reaches `total`), which
`drydock status` shows from any machine that reads the prefix, and logs one line per 10% so that
a console shows the step advancing without a wall of lines. Outside a step, both only log.

A step that runs as a gang (one process per host, `pipeline.run.in_step.gang`) reports through its leader:
`warn` and `progress` on the other processes only log, so `.status` and `.progress` hear one voice.
`current_gang()` tells a step function its place in the gang (a gang of one outside a gang).

`check_lease(what)` is for the writes the write fence cannot see: an upload to an object store,
a checkpoint handed to a native writer. It raises `LeaseExpired` when the attempt's lease may
have expired, as the fence does for a file write; `lease_guard()` captures the check in the
step's thread for use from threads the step starts. Outside a step they do nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from pipeline.run.in_step.fence import Fence, LeaseExpired, current_fence
from pipeline.run.in_step.gang import ALONE, Gang

__all__ = [
    "PROGRESS_INTERVAL",
    "LeaseGuard",
    "StepContext",
    "account",
    "bind",
    "check_lease",
    "current",
    "current_gang",
    "lease_guard",
    "lease_lost",
    "local_progress",
    "on_stop",
    "progress",
    "warn",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepContext:
    """Which attempt of which step is running."""

    output_path: str
    run_id: str
    token: int
    backend: str = "local"
    """The backend running the step: parallel work inside it is asked of that backend
    (`pipeline.run.in_step.parallel`)."""
    gang: Gang = ALONE
    """This process's place in the step's gang (a gang of one unless the step spans hosts)."""
    followed: bool = False
    """Steps follow this one (`blocking=False`): it says when it starts (`pulse.announce_start`)."""


_CURRENT: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("drydock_step", default=None)


@contextlib.contextmanager
def bind(context: StepContext) -> Iterator[None]:
    """Make `context` current in this thread (or task) while a step function runs."""
    reset = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(reset)


def current() -> StepContext | None:
    """The running step's context; capture it in the step's thread to use it from others."""
    return _CURRENT.get()


def current_gang() -> Gang:
    """The running step's place in its gang: process index, count, coordinator, leader. A gang of
    one outside a step, on the local backend, and for every step on a single host."""
    context = _CURRENT.get()
    return context.gang if context is not None else ALONE


@dataclass(frozen=True)
class LeaseGuard:
    """The lease checks of one step attempt, usable from any thread (`lease_guard`)."""

    fence: Fence | None

    def __call__(self, what: str) -> None:
        """Raise `LeaseExpired` if the attempt's lease may have expired; `what` names the write."""
        if self.fence is not None:
            self.fence.check(what)

    def lost(self, what: str, why: str) -> NoReturn:
        """Stop the attempt, which has found out that another attempt owns its step (say, an
        object it was about to replace was rewritten by someone else): raises `LeaseExpired`
        and marks the attempt's fence, so that it is reported as a lost lease whatever it does
        next."""
        if self.fence is not None:
            self.fence.trip(what, why)
        raise LeaseExpired(f"{why}; refused {what}")


def lease_guard() -> LeaseGuard:
    """The running attempt's lease checks, captured in its thread to use from others later (an
    uploader's thread, a checkpoint's commit callback). Outside a fenced step they do nothing
    (`lost` still raises)."""
    return LeaseGuard(current_fence())


def check_lease(what: str) -> None:
    """Raise `LeaseExpired` if the running attempt's lease may have expired; `what` names the write
    about to happen (say, "upload of s3://b/x/metrics/part-000003.jsonl"). Call it before a write
    the write fence cannot see. Outside a fenced step it does nothing."""
    lease_guard()(what)


def lease_lost(what: str, why: str) -> NoReturn:
    """`LeaseGuard.lost` for the calling thread's attempt."""
    lease_guard().lost(what, why)


def warn(message: str, data: Mapping[str, Any] | None = None, context: StepContext | None = None) -> bool:
    """Record a WARNING note in the running step's `.status`; returns whether it was recorded."""
    from pipeline.core.records import Event
    from pipeline.storage.opening import open_storage
    from pipeline.storage.step_store import StepStore

    logger.warning("%s", message)
    context = context or current()
    if context is None or not context.gang.leader:  # a gang reports through its leader
        return False
    try:
        store = StepStore(open_storage(context.output_path))
        return store.note(context.output_path, context.run_id, context.token, Event.WARNING, message, data)
    except Exception as e:  # a note must never break the step that reports it
        logger.warning("could not record the warning in %s/.status: %s", context.output_path, e)
        return False


_STOP_HANDLERS: list[Callable[[str], None]] = []


@contextlib.contextmanager
def on_stop(handler: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, `handler(message)` is called (from another thread) when the runner
    asks this attempt to stop cleanly (its run's budget is spent): the step should save what it
    has and raise `StepStopped(message)`. A step without a handler is left to finish. Only a step
    that keeps a pace (`step_function(watchdog=...)`) hears the request: its pulse thread looks."""
    _STOP_HANDLERS.append(handler)
    try:
        yield
    finally:
        _STOP_HANDLERS.remove(handler)


def stop_requested(message: str) -> bool:
    """Tell this process's stop handlers (`on_stop`); whether there was one."""
    handlers = list(_STOP_HANDLERS)
    for handler in handlers:
        handler(message)
    return bool(handlers)


def account(
    seconds: Mapping[str, float],
    data: Mapping[str, Any] | None = None,
    context: StepContext | None = None,
    guard: LeaseGuard | None = None,
) -> bool:
    """Say where this attempt's time went so far: `seconds` by activity (the step's own words,
    e.g. `{"startup": 12.0, "compilation": 8.1, "steps": 300.2}`), summing to the time since the
    step function was called; `data` adds counts (`{"first_step": 21, "last_step": 80}`). The
    runner's ledger (`pipeline.core.ledger`) puts the attempt's waiting before it and counts
    the time after the latest account as lost. Each call replaces the last (the leader's, in a
    gang); never raises. Returns whether it was written. `guard` (`lease_guard`, captured in the
    step's thread; else the calling thread's) refuses the write once the lease may have expired:
    an attempt that was paused past its lease changes nothing under the step's output, its own
    ledger included (its last account stands; the pause is not counted)."""
    context = context or current()
    if context is None or not context.gang.leader:
        return False
    record = {"time": time.time(), "seconds": {k: round(float(v), 3) for k, v in seconds.items()}}
    if data:
        record["data"] = dict(data)
    try:
        from pipeline.storage.layout import ledger_path
        from pipeline.storage.opening import open_storage

        path = ledger_path(context.output_path, context.token)
        try:
            (guard or lease_guard())(f"write of {path}")
        except LeaseExpired as e:  # (not an Exception: a step must not swallow it by mistake)
            logger.warning("%s", e)
            return False
        payload = json.dumps(record, default=str).encode()
        open_storage(context.output_path).write(path, payload)
        return True
    except Exception as e:  # the ledger must never break the step that keeps it
        logger.warning("could not record the ledger in %s/.logs: %s", context.output_path, e)
        return False


PROGRESS_INTERVAL = 2.0
"""Seconds between two writes of one step's `.progress` (a report with `done >= total` is always written)."""

# Per output directory: (time of the last write, last 10% mark logged). Reports arrive from the
# step's threads and from callback threads (Levanter's trackers), hence the lock.
_progress_state: dict[str, tuple[float, int]] = {}
_LOCAL: dict[str, tuple[float, float | None, str, float]] = {}


def local_progress(output_path: str) -> tuple[float, float | None, str, float] | None:
    """(done, total, unit, time) of this process's last progress report for the step writing to
    `output_path` (every process of a gang reports, though only the leader's are written)."""
    return _LOCAL.get(output_path)


_progress_lock = threading.Lock()


def progress(
    done: float,
    total: float | None = None,
    unit: str = "",
    data: Mapping[str, Any] | None = None,
    context: StepContext | None = None,
    clock: Callable[[], float] = time.time,
) -> bool:
    """Report that the running step has done `done` of `total` `unit`s (total None: unknown).

    `data` adds a few scalars worth showing (e.g. `{"loss": 2.31}`). Returns whether
    `.progress` was written now; reports closer than `PROGRESS_INTERVAL` apart are folded into
    the next one, except the final one (`done >= total`). Never raises: a report that is not a
    pair of finite numbers (NaN, infinity, a string) is logged and dropped.
    """
    try:
        return _progress(done, total, unit, data, context, clock)
    except Exception as e:  # progress must never break the step that reports it
        logger.warning("progress (%r of %r %s) not recorded: %s: %s", done, total, unit, type(e).__name__, e)
        return False


def _progress(
    done: float,
    total: float | None,
    unit: str,
    data: Mapping[str, Any] | None,
    context: StepContext | None,
    clock: Callable[[], float],
) -> bool:
    if not _finite(done) or not (total is None or _finite(total)):
        raise ValueError("done and total must be finite numbers")
    context = context or current()
    key = context.output_path if context is not None else ""
    now = clock()
    # Every process's own last report, written or not: what its pulse says (pipeline.run.in_step.pulse).
    _LOCAL[key] = (done, total, unit, now)
    percent = int(100 * done / total) if total else None
    with _progress_lock:
        last_write, last_mark = _progress_state.get(key, (float("-inf"), -1))
        mark = percent // 10 * 10 if percent is not None else last_mark
        finished = total is not None and done >= total
        write = finished or now - last_write >= PROGRESS_INTERVAL
        _progress_state[key] = (now if write else last_write, max(mark, last_mark))
    if percent is not None and mark > last_mark:
        where = context.output_path.rstrip("/").rsplit("/", 1)[-1] if context is not None else "step"
        logger.info("%s: %d%% (%s of %s %s)", where, percent, _count(done), _count(total), unit)
    if context is None or not write or not context.gang.leader:  # a gang reports through its leader
        return False
    record = {
        "done": done,
        "total": total,
        "unit": unit,
        "time": now,
        "run_id": context.run_id,
        "token": context.token,
        **({"data": dict(data)} if data else {}),
    }
    try:
        from pipeline.storage.layout import PROGRESS
        from pipeline.storage.opening import open_storage

        payload = json.dumps(record, default=str).encode()
        open_storage(context.output_path).write(f"{context.output_path.rstrip('/')}/{PROGRESS}", payload)
        return True
    except Exception as e:  # progress must never break the step that reports it
        logger.warning("could not record progress in %s/.progress: %s", context.output_path, e)
        return False


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"
