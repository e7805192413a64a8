"""The state of one run: which steps are pending, ready, in flight, waiting, done, failed.

A small state machine with named sets and `mark_*` transitions. It is fed events by the
executor's loop (and by tests, with made-up events, without running anything). Blocking
dependencies gate readiness. A follower (a step with `blocking=False` inputs: an evaluation of a
running training's checkpoints) is ready with its blocking dependencies done, but is taken only
once each step it follows has finished or has *started* (its function is running: the executor
sees its start marker, `mark_started`). A follower dispatched earlier would take resources (a
Ray CPU, a slot of `max_concurrent`) and wait for checkpoints of a training that, with those
resources gone, never starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.core import graph
from pipeline.core.plan import Plan, State

__all__ = ["RunState"]


class RunState:
    """Run-time state of a plan's steps."""

    def __init__(self, plan: Plan) -> None:
        deps: Mapping[str, Sequence[str]] = plan.dag.deps
        self._deps = deps
        self._downstream = graph.reverse(deps)
        self.cached = set(plan.in_state(State.CACHED))
        self.skipped = set(plan.in_state(State.SKIPPED))
        self.succeeded: set[str] = set()
        self.failed: set[str] = set()
        self.cancelled: set[str] = set()
        self.blocked: dict[str, str] = {}
        """Blocked label -> the failed step that blocks it."""
        self.in_flight: set[str] = set()
        self.waiting = set(plan.in_state(State.WAIT))
        self.ready: list[str] = []
        self.pending: set[str] = set()
        self.started: set[str] = set()
        """In-flight steps whose function is known to be running."""
        self._follows = {label: node.soft_deps for label, node in plan.dag.nodes.items() if node.soft_deps}
        self._order = {label: i for i, label in enumerate(plan.steps)}
        for label in plan.in_state(State.RUN):
            if self._deps_done(label):
                self.ready.append(label)
            else:
                self.pending.add(label)

    def _deps_done(self, label: str) -> bool:
        return all(d in self.succeeded or d in self.cached or d in self.skipped for d in self._deps[label])

    # -- queries ------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Nothing left to run, run, or wait for."""
        return not (self.ready or self.pending or self.in_flight or self.waiting)

    def take_ready(self, limit: int) -> list[str]:
        """Up to `limit` ready steps, moved to in flight; followers only once what they follow
        has started (`held_back`)."""
        taken: list[str] = []
        rest: list[str] = []
        for label in self.ready:
            if len(taken) < limit and self._followed_started(label):
                taken.append(label)
            else:
                rest.append(label)
        self.ready = rest
        self.in_flight.update(taken)
        return taken

    def _followed_started(self, label: str) -> bool:
        """Has every step `label` follows started, finished, or been given up on?"""
        for followed in self._follows.get(label, ()):
            if followed in self.ready or followed in self.pending:
                return False
            if followed in self.in_flight and followed not in self.started:
                return False
        return True

    def held_back(self) -> list[str]:
        """Ready followers waiting for the step they follow to start."""
        return [label for label in self.ready if not self._followed_started(label)]

    def awaited_starts(self) -> list[str]:
        """In-flight steps that a held-back follower waits to see start."""
        wanted = {f for label in self.held_back() for f in self._follows[label]}
        return sorted(wanted & (self.in_flight - self.started))

    def followers_in_flight(self, label: str) -> list[str]:
        """In-flight steps that follow `label`."""
        return sorted(f for f in self.in_flight if label in self._follows.get(f, ()))

    def final_state(self, label: str) -> State:
        if label in self.cached:
            return State.CACHED
        if label in self.succeeded:
            return State.SUCCEEDED
        if label in self.failed:
            return State.FAILED
        if label in self.blocked:
            return State.BLOCKED
        if label in self.cancelled:
            return State.CANCELLED
        if label in self.skipped:
            return State.SKIPPED
        if label in self.waiting:
            return State.WAIT
        return State.RUN

    # -- transitions --------------------------------------------------------------------------

    def mark_started(self, label: str) -> None:
        """The function of in-flight `label` is running: its followers may be taken."""
        if label in self.in_flight:
            self.started.add(label)

    def mark_succeeded(self, label: str) -> list[str]:
        """`label` finished (here or elsewhere). Returns the steps that became ready."""
        self.started.discard(label)
        self.in_flight.discard(label)
        self.waiting.discard(label)
        self.succeeded.add(label)
        newly = []
        for child in sorted(self._downstream[label], key=self._order.__getitem__):
            if child in self.pending and self._deps_done(child):
                self.pending.discard(child)
                self.ready.append(child)
                newly.append(child)
        return newly

    def mark_failed(self, label: str) -> list[str]:
        """`label` failed. Its pending dependents become BLOCKED; returns them."""
        self.started.discard(label)
        self.in_flight.discard(label)
        self.waiting.discard(label)
        self.failed.add(label)
        return self._block_dependents(label)

    def mark_cancelled(self, label: str) -> None:
        self.started.discard(label)
        self.in_flight.discard(label)
        self.waiting.discard(label)
        self.cancelled.add(label)

    def mark_waiting(self, label: str) -> None:
        """Another runner holds `label`'s lease; wait for it instead of running it (its
        followers may run: it runs elsewhere, on resources of its own)."""
        self.started.discard(label)
        self.in_flight.discard(label)
        self.waiting.add(label)

    def mark_retry(self, label: str) -> None:
        """A step we waited for is free again (its runner died or gave up), or an attempt is
        retried: run it here."""
        self.started.discard(label)
        self.waiting.discard(label)
        self.in_flight.discard(label)
        self.ready.append(label)

    def cancel_all(self) -> None:
        """Stop scheduling: ready and pending steps are cancelled."""
        for label in [*self.ready, *self.pending]:
            self.cancelled.add(label)
        self.ready.clear()
        self.pending.clear()
        self.cancelled.update(self.waiting)
        self.waiting.clear()

    def _block_dependents(self, failed: str) -> list[str]:
        blocked = []
        for label in sorted(graph.descendants(self._deps, [failed]), key=self._order.__getitem__):
            if label in self.pending:
                self.pending.discard(label)
                self.blocked[label] = failed
                blocked.append(label)
        return blocked
