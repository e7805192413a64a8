"""The step side of every backend: how a step function is called wherever it runs.

`call_step` is the one wrapper both backends use around `fn(config)`:

  * binds the attempt's `StepContext` (`pipeline.run.in_step.step_events`: notes, progress, fan-out);
  * fences the step's file writes at its lease's expiry (`pipeline.run.in_step.fence`): the calling
    thread only when the step runs in the executor's process (`Placement.THREAD`), every thread
    of the process when it runs in a worker of its own (`Placement.PROCESS`, a Ray worker);
  * in a worker process, turns `sys.exit()` into a failure (left alone it would end the worker,
    which looks like a lost machine) and SIGTERM into a preemption (`sigterm_preempts`), and
    copies the step's output into `<output>/.logs/attempt-<token>.log` however the attempt ends;
  * raises `LeaseExpired` when a write was refused, even if the function caught the refusal:
    its output is then incomplete.

Backends translate what it raises into the executor's vocabulary (`StepFailed`,
`StepPreempted`, `LeaseExpired`), each in the way its transport needs.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.core.lease import LeaseRecord
from pipeline.errors import StepPreempted
from pipeline.processes import host_id, pid_alive
from pipeline.run.in_step import step_events
from pipeline.run.in_step.fence import Fence, LeaseExpired, fenced_process, fenced_thread, watch_lease
from pipeline.run.in_step.pulse import announce_start, pulse
from pipeline.run.in_step.step_events import StepContext
from pipeline.run.in_step.step_logs import captured, captured_thread
from pipeline.step import hooks_of

__all__ = ["Placement", "WorkerStopped", "call_step", "lease_fence", "sigterm_preempts"]


class Placement(enum.Enum):
    """Where a step function runs, relative to the executor."""

    THREAD = "thread"
    """In a thread of the executor's process (the local backend)."""
    PROCESS = "process"
    """In a worker process that runs one step at a time (a Ray worker)."""


def call_step(
    fn: Callable[[Any], Any],
    config: Any,
    context: StepContext,
    *,
    placement: Placement,
    fence: Fence | None = None,
    log_path: str | None = None,
    echo: bool = True,
) -> None:
    """Call `fn(config)` as an attempt of the step in `context` (see the module docstring).

    With `log_path`, the attempt's output is copied there; in a thread (`Placement.THREAD`) only
    what the step's own thread writes and logs, and it reaches the console only with `echo`.
    """
    fenced = fenced_process if placement is Placement.PROCESS else fenced_thread
    capture: Any = contextlib.nullcontext()
    if log_path and placement is Placement.PROCESS:
        capture = captured(log_path, fence)
    elif log_path:
        capture = captured_thread(log_path, fence, echo)
    with (
        capture,
        step_events.bind(context),
        # Innermost: the log's local temporary file is made and removed outside the fence, and
        # the log copy checks the fence itself.
        fenced(fence) if fence is not None else contextlib.nullcontext(),
    ):
        announce_start(context)
        try:
            # A step that keeps a pace (`step_function(..., watchdog=...)`) says how it is doing
            # every few seconds, and saves its stacks when the runner's watchdog asks.
            with (
                pulse(context) if hooks_of(fn).watchdog is not None else contextlib.nullcontext(),
                sigterm_preempts() if placement is Placement.PROCESS else contextlib.nullcontext(),
            ):
                fn(config)
        except SystemExit as e:
            if placement is Placement.THREAD:
                raise  # the executor records it as the step's failure
            raise RuntimeError(f"the step function called sys.exit({e.code!r})") from e
    if fence is not None and fence.tripped:
        # The function returned although a write was refused (it caught the refusal, or a thread
        # of its own hit it): its output is incomplete.
        raise LeaseExpired(f"step {fence.label}: the lease may have expired; refused {fence.refused}")


class WorkerStopped(StepPreempted):
    """The step's worker process got SIGTERM: its node is being drained, its pod deleted or its
    VM preempted. The attempt ends as PREEMPTED and is retried (elsewhere, or here later)."""


@contextlib.contextmanager
def sigterm_preempts() -> Iterator[None]:
    """While a step runs in a worker process of its own, SIGTERM ends it as preempted.

    Ray, Kubernetes and spot VMs send SIGTERM before they take a machine away. Ray's own handler
    in its workers calls `sys.exit(1)`, which a step's attempt would take for its failure; this
    one raises `WorkerStopped` in the step instead. A step that can do better with the notice
    (a training saves a checkpoint first: `steps.training.preemption`) installs its own handler
    inside. Signal handlers belong to the main thread, where Ray runs a task; elsewhere nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum: int, frame: Any) -> None:
        raise WorkerStopped("the worker got SIGTERM (its node drained, its pod deleted or its VM preempted)")

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Driver:
    """The driver that holds an attempt's lease, as a worker process on the same host sees it.

    A Ray worker outlives its driver by a second or two when the driver is killed (until Ray
    notices and kills the worker), while a rerun on the driver's host takes the step over as
    soon as the driver's pid is gone. The lease's expiry, which the fence otherwise goes by, is
    still ahead then. So a worker on the driver's host also refuses writes once the driver is
    gone: `gone()` is checked at every fenced write (a signal-0 `kill`, about a microsecond; the
    process start time, which tells a reused pid apart, once a second). A worker on another
    host cannot see the driver's pid: there only the lease's expiry fences it.
    """

    def __init__(self) -> None:
        self.owner: tuple[int, str | None] | None = None  # (pid, start time), once known
        self._gone = False
        self._checked = float("-inf")

    def learn(self, lease: LeaseRecord) -> None:
        """Remember the driver from this attempt's own lease, if it runs on this host."""
        if self.owner is None and lease.host == host_id():
            self.owner = (lease.pid, lease.pid_start)

    def gone(self) -> bool:
        """Whether the driver is known to have exited (False while it is not known)."""
        if self._gone or self.owner is None:
            return self._gone
        pid, start = self.owner
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self._gone = True
        except PermissionError:
            pass  # exists, another user's: the start time below tells
        now = time.monotonic()
        if not self._gone and now - self._checked >= 1.0:
            self._checked = now
            self._gone = not pid_alive(pid, start)
        return self._gone


def _lease_deadline(context: StepContext, driver: _Driver | None = None) -> Callable[[], float | None]:
    """Reads when this attempt's lease expires; -inf once it is released or another attempt's,
    or once its driver (learned from the lease) is gone; None for an empty or partial record
    (local disk rewrites `.lease` in place under a lock that readers do not take), which tells
    nothing."""
    from pipeline.storage.opening import open_storage
    from pipeline.storage.step_store import StepStore

    store = StepStore(open_storage(context.output_path))
    driver = driver or _Driver()

    def read() -> float | None:
        lease = store.lease(context.output_path)
        if lease is None:
            return None
        if lease.released or (lease.run_id, lease.token) != (context.run_id, context.token):
            return float("-inf")
        driver.learn(lease)
        return float("-inf") if driver.gone() else lease.expires

    return read


@contextlib.contextmanager
def lease_fence(
    context: StepContext, poll: float | None, valid_until: float | None, label: str
) -> Iterator[Fence | None]:
    """For a step in a worker process: a fence kept at the lease's expiry by re-reading `.lease`
    every `poll` seconds (None without `poll`); until it is read, the deadline is `valid_until`,
    what the driver knew when it submitted the task. On the driver's host the fence also closes
    as soon as the driver exits (`_Driver`)."""
    if poll is None:
        yield None
        return
    initial = float("-inf") if valid_until is None else valid_until
    driver = _Driver()
    with watch_lease(
        _lease_deadline(context, driver), poll, label, initial=initial, gone=driver.gone
    ) as fence:
        yield fence
