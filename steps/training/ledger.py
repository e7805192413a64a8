"""Where an attempt of a training spends its time, kept as it goes: the training's half of the
ledger (the runner's half, `pipeline.core.ledger`, adds the waiting before it and what was
lost after the last account).

A `PhaseClock` gives every second since the step function was called to exactly one activity:

    startup       imports, data, the model's initialization, the first step (less what follows)
    restore       loading the checkpoint a resumed attempt starts from
    compilation   JAX tracing, lowering and compiling, or loading programs from the cache
                  (taken out of whatever activity it interrupted, from JAX's monitoring events)
    steps         training steps after the first: the productive time
    evaluation    in-training evaluations
    checkpoints   checkpoint saves, the part the training waits for
    finishing     after the last step: the final export and the result
    lost          steps computed again after a rewind (their share of `steps`, moved here)

so the activities sum to the time since the call, exactly. The clock says so to the runner
(`step_events.account`) at most every `ACCOUNT_SECONDS` as the steps go, at every change of
activity other than a step's, and when the attempt ends however it ends; a process killed
outright leaves its last account, and the runner counts what came after it as lost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from pipeline.steplib import step_events

__all__ = ["ACCOUNT_SECONDS", "PhaseClock", "active", "keeping", "phase"]

ACCOUNT_SECONDS = 5.0
ACTIVITIES = ("startup", "restore", "compilation", "steps", "evaluation", "checkpoints", "finishing", "lost")


class PhaseClock:
    """Gives the time since `started` to one activity at a time (see the module docstring)."""

    def __init__(self, started: float, context: Any = None, clock: Any = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seconds = dict.fromkeys(ACTIVITIES, 0.0)
        self._current = "startup"
        self._since = started
        self._context = context
        # Captured here, in the step's thread: accounts also come from a checkpoint's commit thread.
        self._guard = step_events.lease_guard()
        self._accounted = float("-inf")
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.steps_done = 0
        """Steps timed under `steps` (each step after the attempt's first)."""
        self.redone = 0
        """Steps computed again after a rewind, in this attempt."""
        self.resumed_from: int | None = None
        self.previous_last_step: int | None = None
        """The last step an earlier attempt logged, when this one resumed from a checkpoint
        before it (the runner counts the steps in between as that attempt's lost work)."""

    @property
    def current(self) -> str:
        return self._current

    def switch(self, activity: str) -> str:
        """From now on the time goes to `activity`; returns the one it went to before."""
        with self._lock:
            now = self._clock()
            previous = self._current
            self._seconds[previous] += now - self._since
            self._current, self._since = activity, now
        return previous

    def carve(self, seconds: float, into: str = "compilation") -> None:
        """`seconds` of the current activity were spent on `into` (a compile inside a step)."""
        with self._lock:
            if self._current == into:
                return
            self._seconds[self._current] -= seconds
            self._seconds[into] += seconds

    def step(self, step: int) -> None:
        """Step `step`'s loss was logged: the first one ends the start-up; each later one is a
        productive step."""
        if self.first_step is None:
            self.first_step = step
            if self._current == "startup":
                self.switch("steps")
        else:
            self.steps_done += 1
        self.last_step = step
        if self._clock() - self._accounted >= ACCOUNT_SECONDS:
            self.account()

    def resumed(self, checkpoint: int, previous_last_step: int) -> None:
        """This attempt resumes from the checkpoint of step `checkpoint`; the attempt before it
        had logged up to `previous_last_step`."""
        self.resumed_from, self.previous_last_step = checkpoint, previous_last_step

    def rewound(self, redone: int) -> None:
        """A rewind: the `redone` steps after the restored checkpoint are computed again; their
        time (at this attempt's mean step time so far) moves from `steps` to `lost`."""
        with self._lock:
            now = self._clock()
            self._seconds[self._current] += now - self._since
            self._since = now
            mean = self._seconds["steps"] / self.steps_done if self.steps_done else 0.0
            moved = min(self._seconds["steps"], mean * redone)
            self._seconds["steps"] -= moved
            self._seconds["lost"] += moved
            self.redone += redone
        self.account()

    def seconds(self) -> dict[str, float]:
        """Each activity's seconds so far (the current one's running time included)."""
        with self._lock:
            out = dict(self._seconds)
            out[self._current] += self._clock() - self._since
        return out

    def account(self) -> None:
        """Tell the runner (`step_events.account`)."""
        self._accounted = self._clock()
        data = {
            "first_step": self.first_step,
            "last_step": self.last_step,
            "steps_done": self.steps_done,
            "redone_steps": self.redone,
            "resumed_from": self.resumed_from,
            "previous_last_step": self.previous_last_step,
        }
        step_events.account(self.seconds(), data, context=self._context, guard=self._guard)


_ACTIVE: list[PhaseClock] = []
_LISTENING: list[bool] = []

# JAX's compile events (jax/_src/dispatch.py): trace, lower, compile or load from the cache.
_COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    }
)


def _on_duration(event: str, duration_secs: float, **_: Any) -> None:
    if event in _COMPILE_EVENTS and _ACTIVE:
        _ACTIVE[0].carve(float(duration_secs))


def active() -> PhaseClock | None:
    """The clock of the training running in this process (one at a time), if any."""
    return _ACTIVE[0] if _ACTIVE else None


@contextlib.contextmanager
def keeping(started: float) -> Iterator[PhaseClock]:
    """The attempt's clock from `started` (the step function's call) while the block runs; its
    last account when the block ends, however it ends."""
    if not _LISTENING:
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(_on_duration)
        _LISTENING.append(True)
    clock = PhaseClock(started, step_events.current())
    _ACTIVE[:] = [clock]
    try:
        yield clock
    finally:
        clock.account()
        _ACTIVE.clear()


@contextlib.contextmanager
def phase(activity: str) -> Iterator[None]:
    """The block's time goes to `activity` (nothing without an active clock)."""
    clock = active()
    if clock is None:
        yield
        return
    previous = clock.switch(activity)
    try:
        yield
    finally:
        clock.switch(previous)
        clock.account()
