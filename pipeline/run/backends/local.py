"""The `local` backend: step functions run in threads of the executor's process.

For tests, debugging and small steps. Each step function runs in a thread of its own, watched
by the executor thread that holds the step's lease; `cancel` wakes the watcher at once and
raises `StepCancelled` inside the function's thread. Python delivers that exception at the
function's next Python instruction, so a function blocked inside C code stops when it returns
to Python; either way its result is never committed.

When the task carries a lease deadline, the function's thread is fenced (`pipeline.run.in_step.fence`): once
the lease may have expired, its file writes are refused with `LeaseExpired`. That covers a
runner frozen past its lease, whose function resumes before its heartbeat notices the loss.
Threads the function starts itself are not fenced (they do not share its context).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.plan import Plan, State
from pipeline.errors import StepCancelled, StepDeclarationError
from pipeline.run.backends.base import Backend, StepTask
from pipeline.run.in_step.call_step import Placement, call_step
from pipeline.run.in_step.fence import Fence, LeaseExpired
from pipeline.storage.layout import LOGS_DIR, log_name

__all__ = ["LocalBackend", "check_declared"]


@dataclass
class _Running:
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    error: BaseException | None = None
    cancelled: bool = False


def check_declared(plan: Plan) -> None:
    """Every step here is a gang of one: a step to run that asks for several hosts needs Ray."""
    for label in plan.in_state(State.RUN, State.WAIT):
        node = plan.dag.nodes[label]
        resources = node.step.resources
        if resources.hosts > 1:
            raise StepDeclarationError(
                node.name,
                f"asks for {resources.hosts} hosts (a gang of processes); the local backend runs "
                "each step as one process: use --backend ray with a cluster of that many nodes",
                field="resources.hosts",
            )


class LocalBackend(Backend):
    """Runs each step function in a thread of this process."""

    name = "local"

    @classmethod
    def create(cls, options: Any, *, verbose: bool = False) -> LocalBackend:
        return cls(verbose=verbose)

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}

    def default_concurrency(self) -> int:
        return max(2, os.cpu_count() or 2)

    def validate(self, plan: Plan) -> list[str]:
        check_declared(plan)
        return []

    def describe(self) -> str:
        return f"local threads ({os.cpu_count() or 1} CPUs)"

    def run(self, task: StepTask) -> None:
        slot = _Running()
        fence = Fence(task.lease_remaining, task.label) if task.lease_remaining is not None else None

        def call() -> None:
            try:
                call_step(
                    task.fn,
                    task.config,
                    task.context(self.name),
                    placement=Placement.THREAD,
                    fence=fence,
                    log_path=f"{task.output_path}/{LOGS_DIR}/{log_name(task.token)}",
                    echo=self.verbose,
                )
            except BaseException as e:  # reported to the watcher, never lost in a thread
                slot.error = e
            finally:
                slot.wake.set()

        slot.thread = threading.Thread(target=call, name=f"step:{task.name}", daemon=True)
        with self._lock:
            self._running[task.label] = slot
        try:
            slot.thread.start()
            slot.wake.wait()
        finally:
            with self._lock:
                self._running.pop(task.label, None)
        if slot.cancelled:
            raise StepCancelled(task.label)
        if fence is not None and fence.tripped:
            # However the function ended (it may have failed because of the refusal), a refused
            # write means its output is incomplete and its lease may be gone.
            raise LeaseExpired(f"step {task.label}: the lease may have expired; refused {fence.refused}")
        if slot.error is not None:
            raise slot.error

    def cancel(self, label: str) -> None:
        with self._lock:
            slot = self._running.get(label)
            if slot is None or slot.cancelled:
                return
            slot.cancelled = True
            thread = slot.thread
        if thread is not None and thread.ident is not None and thread.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(StepCancelled)
            )
        slot.wake.set()
