"""Execute a plan: dispatch ready steps to a backend as their dependencies finish.

This is the scheduler; the worker is `pipeline.run.scheduler.attempt`. The loop is event-driven: each step
attempt runs in a thread of the run's pool (`Attempts.run`: lease, `.step.json`, the function
through the backend, the output check, SUCCESS) and reports one event to the loop's queue. The
loop alone updates the `RunState` and dispatches newly ready steps, so a step's dependents start
as soon as its event arrives. Only steps held by another runner are polled, at
`wait_poll_interval`.

A failure blocks its dependents and lets independent branches finish. A lost lease stops the
step without committing it, and the step is then awaited like any step held elsewhere.
Ctrl-C cancels running steps, records CANCELLED, releases their leases and returns.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pipeline.core.lease import LeaseWatch, Owner
from pipeline.core.plan import Plan, State
from pipeline.core.records import Event, may_outlive_runner
from pipeline.core.report import RunReport, StepOutcome
from pipeline.core.run_state import RunState
from pipeline.processes import pid_alive
from pipeline.run.backends.base import Backend
from pipeline.run.console.reporter import Reporter
from pipeline.run.scheduler.attempt import Attempts, ExecutionOptions, RunContext
from pipeline.run.scheduler.budget import BudgetWatch
from pipeline.run.scheduler.endings import AttemptEvent, Ending
from pipeline.storage.layout import started_path
from pipeline.storage.step_store import StepStore

__all__ = ["ExecutionOptions", "Reporter", "RunReport", "StepOutcome", "execute"]

logger = logging.getLogger(__name__)


def execute(
    plan: Plan,
    store: StepStore,
    backend: Backend,
    owner: Owner,
    options: ExecutionOptions,
    report: Reporter | None = None,
    clock: Callable[[], float] = time.time,
    budget: BudgetWatch | None = None,
) -> RunReport:
    """Run every RUN step of `plan` (and wait for WAIT steps) until the plan is finished, or
    until `budget` is spent."""
    run = RunContext(plan, store, backend, owner, options, report or Reporter(), clock)
    return _Execution(run, budget).run()


class _Execution:
    def __init__(self, run: RunContext, budget: BudgetWatch | None = None) -> None:
        plan = run.plan
        self.plan, self.dag, self.store, self.backend = plan, plan.dag, run.store, run.backend
        self.owner, self.options, self.report, self.clock = run.owner, run.options, run.report, run.clock
        self.state = RunState(plan)
        self.events: queue.Queue[AttemptEvent] = queue.Queue()
        self.outcomes: dict[str, StepOutcome] = {
            label: StepOutcome(state=sp.state) for label, sp in plan.steps.items()
        }
        # Leases of waiting steps, watched on this runner's own clock (`LeaseWatch`); the records
        # found stale that way go to `attempts.stale_leases`, which the retry may take over.
        self.watch = LeaseWatch(run.options.lease_timeout)
        self.attempts = Attempts(run, self._alert)
        self.failures: dict[str, int] = {}
        self.preemptions: dict[str, int] = {}
        self.requeued: set[str] = set()
        """Followers stopped because the step they follow is retried: run again once it starts."""
        self.starts_checked = 0.0
        self.budget = budget
        self.budget_checked = 0.0
        self.touched: set[str] = set()
        """Steps this run has started: their ledgers change while it runs."""

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> RunReport:
        for label in sorted(self.state.waiting):
            self.report(label, "WAIT", self.plan.steps[label].reason)
        limit = max(1, self.options.max_concurrent)
        pool = ThreadPoolExecutor(limit, thread_name_prefix="drydock-attempt")
        self.attempts.heartbeat.start()
        interrupted = False
        try:
            while not self.state.finished:
                for label in self.state.take_ready(limit - len(self.state.in_flight)):
                    self.outcomes[label].attempts += 1
                    self.touched.add(label)
                    pool.submit(self._attempt, label, self.outcomes[label].attempts)
                polling = self.state.waiting or self.state.held_back() or self.budget is not None
                timeout = self.options.wait_poll_interval if polling else None
                try:
                    event = self.events.get(timeout=timeout)
                except queue.Empty:
                    self._check_waiting()
                    self._check_started()
                    self._check_budget()
                    continue
                self._handle(event)
                self._check_started(every=self.options.wait_poll_interval)
                self._check_budget()
        except KeyboardInterrupt:
            interrupted = True
            self._cancel_everything()
        finally:
            self.attempts.heartbeat.stop()
            self.attempts.watchdog.stop()
            pool.shutdown(wait=not interrupted)
        for label in self.state.cancelled:
            self.outcomes[label].state = State.CANCELLED
        for label, blocker in self.state.blocked.items():
            self.outcomes[label].state = State.BLOCKED
            self.outcomes[label].blocked_by = blocker
        spent = self.budget.spent if self.budget is not None else None
        return RunReport(self.plan, self.outcomes, interrupted, budget_spent=spent)

    def _check_budget(self) -> None:
        """Once the budget is spent: start nothing more, ask the steps in flight to stop cleanly
        (a training saves a checkpoint; a step that cannot stop finishes), and say so."""
        if self.budget is None:
            return
        if self.budget.spent is not None:
            self.state.cancel_all()  # a retry (a preempted step) does not start either
            return
        now = self.clock()
        if now - self.budget_checked < self.options.wait_poll_interval:
            return
        self.budget_checked = now
        spent = self.budget.check(self.touched, now)
        if spent is None:
            return
        self.state.cancel_all()
        asked = self.budget.ask_to_stop(sorted(self.state.in_flight))
        self.report.note(
            f"STOPPING   {spent}: starting nothing more; asked {len(asked)} running step(s) to stop "
            "at a checkpoint"
        )
        if self.options.alerts is not None:
            self.options.alerts.alert("budget", None, spent)

    def _handle(self, event: AttemptEvent) -> None:
        label, outcome = event.label, self.outcomes[event.label]
        requeue = label in self.requeued  # stopped to make room for what it follows (`_retry`)
        self.requeued.discard(label)
        if event.started is not None:
            outcome.started = event.started
        if event.ended is not None:
            outcome.ended = event.ended
        if event.kind is Ending.SUCCEEDED:
            outcome.state = State.SUCCEEDED
            outcome.metrics = event.metrics
            self.report(label, "SUCCEEDED", _seconds(outcome.duration))
            self.state.mark_succeeded(label)
        elif event.kind is Ending.DONE_ELSEWHERE:
            outcome.state = State.SUCCEEDED
            self.report(label, "SUCCEEDED", "by another runner")
            self.state.mark_succeeded(label)
        elif event.kind is Ending.FAILED:
            outcome.error, outcome.traceback = event.detail, event.traceback
            self.failures[label] = self.failures.get(label, 0) + 1
            if self.failures[label] <= self.dag.nodes[label].step.resources.failure_retries:
                self.report(label, "FAILED", f"{event.detail}; retrying")
                self._retry(label)
                return
            self._fail(label, event.detail)
        elif event.kind is Ending.PREEMPTED:
            self.preemptions[label] = self.preemptions.get(label, 0) + 1
            budget = self.dag.nodes[label].step.resources.preemption_retries
            if self.preemptions[label] <= budget:
                self.report(
                    label, "PREEMPTED", f"{event.detail}; retrying ({self.preemptions[label]}/{budget})"
                )
                if self.preemptions[label] in (3, 10, 100, 1000):  # again and again: someone should look
                    self._alert(
                        "preempted",
                        label,
                        f"{self.preemptions[label]} times (budget {budget}): {event.detail}",
                    )
                self._retry(label)
                return
            outcome.error = f"preempted {self.preemptions[label]} times (budget {budget}): {event.detail}"
            self._fail(label, outcome.error)
        elif event.kind in (Ending.HELD, Ending.LOST):
            outcome.state = State.WAIT
            self.report(label, "WAIT", event.detail)
            self.state.mark_waiting(label)
        elif event.kind is Ending.CANCELLED and requeue:
            self.report(label, "WAIT", "stopped while what it follows is retried; runs again once it starts")
            self.state.mark_retry(label)
        elif event.kind is Ending.CANCELLED:
            outcome.state = State.CANCELLED
            self.report(label, "CANCELLED", event.detail)
            self.state.mark_cancelled(label)

    def _attempt(self, label: str, attempt: int) -> None:
        # Exactly one event per attempt: the loop waits for it.
        self.events.put(self.attempts.run(label, attempt))

    def _retry(self, label: str) -> None:
        """Run `label` again; first stop the steps that follow it, which would otherwise keep
        resources its new attempt may need to start. They run again once it has started (a
        follower resumes: it skips the checkpoints it evaluated)."""
        for follower in self.state.followers_in_flight(label):
            if follower not in self.requeued:
                self.requeued.add(follower)
                self.backend.cancel(follower)
        self.state.mark_retry(label)

    def _check_started(self, every: float = 0.0) -> None:
        """Look for the start marker of each in-flight step a held-back follower waits for."""
        now = time.monotonic()
        if now - self.starts_checked < every:
            return
        self.starts_checked = now
        for label in self.state.awaited_starts():
            token = self.attempts.tokens.get(label)
            if token is None:
                continue  # its lease is not taken yet
            marker = started_path(self.dag.nodes[label].output_path, token)
            try:
                found = self.store.storage.read(marker) is not None
            except Exception as e:
                logger.warning("cannot read %s: %s", marker, e)
                continue
            if found:
                self.state.mark_started(label)

    def _alert(self, kind: str, label: str, text: str) -> None:
        if self.options.alerts is not None:
            self.options.alerts.alert(kind, self.dag.nodes[label].name, text)

    def _fail(self, label: str, detail: str) -> None:
        self.outcomes[label].state = State.FAILED
        self.report(label, "FAILED", detail)
        self._alert("failed", label, detail)
        for blocked in self.state.mark_failed(label):
            self.report(blocked, "BLOCKED", f"by {self.dag.nodes[label].name}")

    def _check_waiting(self) -> None:
        """Poll the steps another runner holds: finished, or free to take over?"""
        for label in sorted(self.state.waiting):
            step_dir = self.dag.nodes[label].output_path
            try:
                record = self.store.record(step_dir, with_metadata=False)
            except Exception as e:
                logger.warning("cannot read the status of %s: %s", label, e)
                continue
            if record.succeeded:
                self.watch.forget(label)
                self._handle(AttemptEvent(label, Ending.DONE_ELSEWHERE))
                continue
            # A step whose workers may be on other hosts outlives a dead runner's process until
            # its lease expires (the workers' fence), and they compare `expires` with their own
            # clocks: then the watch waits the clock-skew margin too.
            remote = may_outlive_runner(record.events, record.lease)
            unchanged = self.watch.unchanged(
                label, record.lease, extra=self.options.clock_skew if remote else 0.0
            )
            if unchanged or record.lease_stale(
                self.clock(), self.owner.host, pid_alive, skew=self.options.clock_skew
            ):
                if unchanged and record.lease is not None:
                    self.attempts.stale_leases[label] = record.lease
                self.watch.forget(label)
                self.report(label, "TAKEOVER", "its runner stopped; running it here")
                self.attempts.lost.discard(label)
                self._retry(label)

    def _cancel_everything(self) -> None:
        self.requeued.clear()  # Ctrl-C: a follower stopped to make room is cancelled, not rerun
        self.state.cancel_all()
        running = sorted(self.state.in_flight)
        for label in running:
            self.backend.cancel(label)
        deadline = time.monotonic() + self.options.cancel_grace
        try:
            while self.state.in_flight and time.monotonic() < deadline:
                try:
                    event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                self._handle(event)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting, just release what we hold
        for step_dir, (label, token) in self.attempts.heartbeat.held().items():
            try:
                self.store.append(step_dir, self.owner, token, Event.CANCELLED, "interrupted")
                self.store.release(step_dir, self.owner, token)
            except Exception as e:
                logger.warning("could not release the lease of %s: %s", label, e)
        for label in list(self.state.in_flight):
            self.state.mark_cancelled(label)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}s"
