"""Execute a plan: dispatch ready steps to a backend as their dependencies finish.

The loop is event-driven: each step attempt runs in a worker thread that takes the step's
lease, writes `.step.json`, runs the function through the backend, checks it produced output
and commits SUCCESS; it then reports one event to the loop's queue. The loop alone updates
the `RunState` and dispatches newly ready steps, so a step's dependents start as soon as its
event arrives. Only steps held by another runner are polled, at `wait_poll_interval`.

A failure blocks its dependents and lets independent branches finish. A lost lease stops the
step without committing it, and the step is then awaited like any step held elsewhere.
Ctrl-C cancels running steps, records CANCELLED, releases their leases and returns.
"""

from __future__ import annotations

import enum
import json
import logging
import queue
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.dag import fn_import_path, resolved_config
from pipeline.core.drift import listing_digest
from pipeline.core.lease import CLOCK_SKEW, LeaseRecord, LeaseWatch, Owner
from pipeline.core.plan import Plan, State
from pipeline.core.records import Event, may_outlive_runner
from pipeline.core.report import RunReport, StepOutcome
from pipeline.core.run_state import RunState
from pipeline.errors import StepCancelled, StepFailed, StepPreempted
from pipeline.processes import pid_alive
from pipeline.run.alerts import Notifier
from pipeline.run.backends.base import Backend, StepTask
from pipeline.run.crashes import (
    CrashWatch,
    attempt_log_tail,
    attempt_progress,
    crash_signature,
    log_evidence,
)
from pipeline.run.fence import LeaseExpired
from pipeline.run.heartbeat import Heartbeat
from pipeline.run.hooks import call_hook, step_summary
from pipeline.run.provenance import drift_digest_of, input_listing, step_info
from pipeline.run.reporter import Reporter
from pipeline.run.watchdog import Hang, Watchdog
from pipeline.step import hooks_of
from pipeline.storage.layout import LOGS_DIR, started_name
from pipeline.storage.step_store import AlreadyDone, Held, StepStore

__all__ = ["ExecutionOptions", "Reporter", "RunReport", "StepOutcome", "execute"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecutionOptions:
    """How to execute a plan."""

    max_concurrent: int = 8
    lease_timeout: float = 90.0
    heartbeat_interval: float = 30.0
    wait_poll_interval: float = 2.0
    """How often steps held by another runner are checked."""
    clock_skew: float = CLOCK_SKEW
    """Seconds by which runners' clocks may differ: a lease is taken over by its `expires` only
    that long after it, or once this runner has watched it stay unchanged for `lease_timeout`."""
    cancel_grace: float = 10.0
    """After Ctrl-C, how long to wait for running steps to record CANCELLED."""
    run_info: Mapping[str, Any] = field(default_factory=dict)
    alerts: Notifier | None = None
    """Where to tell people about failures, hangs, rewinds and repeated preemptions (`--notify`)."""
    """Extra fields for every `.step.json` (experiment, git, versions)."""


class Ending(enum.Enum):
    """How one attempt ended, as it reports to the loop."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    HELD = "held"
    """Another live runner holds the lease."""
    DONE_ELSEWHERE = "done elsewhere"
    """Another runner committed the step first."""
    LOST = "lost"
    """The lease was lost while running: the result is discarded."""


# Events reported by attempts to the loop.
@dataclass(frozen=True)
class _Event:
    label: str
    kind: Ending
    detail: str = ""
    traceback: str | None = None
    started: float | None = None
    ended: float | None = None
    metrics: Mapping[str, Any] | None = None


def execute(
    plan: Plan,
    store: StepStore,
    backend: Backend,
    owner: Owner,
    options: ExecutionOptions,
    report: Reporter | None = None,
    clock: Callable[[], float] = time.time,
) -> RunReport:
    """Run every RUN step of `plan` (and wait for WAIT steps) until the plan is finished."""
    return _Execution(plan, store, backend, owner, options, report or Reporter(), clock).run()


class _Execution:
    def __init__(
        self,
        plan: Plan,
        store: StepStore,
        backend: Backend,
        owner: Owner,
        options: ExecutionOptions,
        report: Reporter,
        clock: Callable[[], float],
    ) -> None:
        self.plan = plan
        self.dag = plan.dag
        self.store = store
        self.backend = backend
        self.owner = owner
        self.options = options
        self.report = report
        self.clock = clock
        self.state = RunState(plan)
        self.events: queue.Queue[_Event] = queue.Queue()
        self.outcomes: dict[str, StepOutcome] = {
            label: StepOutcome(state=sp.state) for label, sp in plan.steps.items()
        }
        self.lost: set[str] = set()
        # Leases of waiting steps, watched on this runner's own clock (`LeaseWatch`), and the
        # records found stale that way, which the retry may take over.
        self.watch = LeaseWatch(options.lease_timeout)
        self.stale_leases: dict[str, LeaseRecord] = {}
        self.failures: dict[str, int] = {}
        self.preemptions: dict[str, int] = {}
        self.crashes = CrashWatch()
        # With --force, RUNNING may follow the SUCCESS seen at plan time, but not a newer one.
        self.rerun_after = {
            label: len(sp.record.events) if sp.record is not None else 0
            for label, sp in plan.steps.items()
            if sp.state == State.RUN and sp.forced
        }
        self.heartbeat = Heartbeat(
            store, owner, options.lease_timeout, options.heartbeat_interval, self._on_lost, clock
        )
        self.watchdog = Watchdog(store, self._on_hang, on_report=self._on_report, clock=clock)
        self.hung: dict[str, Hang] = {}
        self.alerted: dict[str, dict[str, int]] = {}
        self.tokens: dict[str, int] = {}
        """The fencing token of each attempt in flight (its start marker's name)."""
        self.requeued: set[str] = set()
        """Followers stopped because the step they follow is retried: run again once it starts."""
        self.starts_checked = 0.0
        self.followed = {up for label in plan.in_state(State.RUN) for up in self.dag.nodes[label].soft_deps}
        """Steps that steps of this run follow: they announce their start."""

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> RunReport:
        for label in sorted(self.state.waiting):
            self.report(label, "WAIT", self.plan.steps[label].reason)
        limit = max(1, self.options.max_concurrent)
        pool = ThreadPoolExecutor(limit, thread_name_prefix="drydock-attempt")
        self.heartbeat.start()
        interrupted = False
        try:
            while not self.state.finished:
                for label in self.state.take_ready(limit - len(self.state.in_flight)):
                    self.outcomes[label].attempts += 1
                    pool.submit(self._attempt, label, self.outcomes[label].attempts)
                polling = self.state.waiting or self.state.held_back()
                timeout = self.options.wait_poll_interval if polling else None
                try:
                    event = self.events.get(timeout=timeout)
                except queue.Empty:
                    self._check_waiting()
                    self._check_started()
                    continue
                self._handle(event)
                self._check_started(every=self.options.wait_poll_interval)
        except KeyboardInterrupt:
            interrupted = True
            self._cancel_everything()
        finally:
            self.heartbeat.stop()
            self.watchdog.stop()
            pool.shutdown(wait=not interrupted)
        for label in self.state.cancelled:
            self.outcomes[label].state = State.CANCELLED
        for label, blocker in self.state.blocked.items():
            self.outcomes[label].state = State.BLOCKED
            self.outcomes[label].blocked_by = blocker
        return RunReport(self.plan, self.outcomes, interrupted)

    def _handle(self, event: _Event) -> None:
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
            token = self.tokens.get(label)
            if token is None:
                continue  # its lease is not taken yet
            marker = f"{self.dag.nodes[label].output_path.rstrip('/')}/{LOGS_DIR}/{started_name(token)}"
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
                self._handle(_Event(label, Ending.DONE_ELSEWHERE))
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
                    self.stale_leases[label] = record.lease
                self.watch.forget(label)
                self.report(label, "TAKEOVER", "its runner stopped; running it here")
                self.lost.discard(label)
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
        for step_dir, (label, token) in self.heartbeat.held().items():
            try:
                self.store.append(step_dir, self.owner, token, Event.CANCELLED, "interrupted")
                self.store.release(step_dir, self.owner, token)
            except Exception as e:
                logger.warning("could not release the lease of %s: %s", label, e)
        for label in list(self.state.in_flight):
            self.state.mark_cancelled(label)

    def _on_lost(self, label: str) -> None:
        self.lost.add(label)
        self.backend.cancel(label)

    # -- one attempt, in a worker thread ---------------------------------------------------------

    def _attempt(self, label: str, attempt: int) -> None:
        # Exactly one event per attempt, whatever happens: the loop waits for it.
        event = _Event(label, Ending.FAILED, "internal error")
        try:
            event = self._try(label, attempt)
        except BaseException as e:
            event = _Event(
                label, Ending.FAILED, f"internal error: {type(e).__name__}: {e}", _format_traceback(e)
            )
        finally:
            self.events.put(event)

    def _try(self, label: str, attempt: int) -> _Event:
        step_dir = self.dag.nodes[label].output_path
        forced = label in self.rerun_after
        outside = self.store.storage.resolves_outside(step_dir, self.dag.prefix) if forced else None
        if outside is not None:
            # --force empties the step first: never another prefix's step reached by a link.
            return _Event(
                label,
                Ending.FAILED,
                f"--force would empty {step_dir}, which is {outside} (through a symbolic link), "
                f"outside the prefix {self.dag.prefix}; nothing done: force it under its own prefix",
            )
        asked = self.clock()  # the lease taken below expires no earlier than asked + lease_timeout
        taken = self.store.acquire(
            step_dir,
            self.owner,
            self.options.lease_timeout,
            rerun_after=self.rerun_after.get(label),
            attempt=attempt,
            skew=self.options.clock_skew,
            stale=self.stale_leases.pop(label, None),
            remote_workers=self.backend.remote_workers,
        )
        if isinstance(taken, AlreadyDone):
            return _Event(label, Ending.DONE_ELSEWHERE)
        if isinstance(taken, Held):
            return _Event(label, Ending.HELD, f"held by {taken.lease.describe()}")
        token = taken.token
        self.tokens[label] = token
        self.heartbeat.add(step_dir, label, token, since=asked)
        started = self.clock()
        released = False
        try:
            if forced and attempt == 1:
                # --force redoes the step from nothing: a training must not "resume" from the
                # final checkpoint it left. Retries within this run keep what this run wrote.
                removed = self.store.clear_payload(step_dir)
                if removed:
                    logger.info(
                        "%s: --force removed its previous output (%s)", label, ", ".join(sorted(removed))
                    )
            event = self._run_and_commit(label, attempt, token, started)
            released = True  # the commit released the lease, whether it wrote SUCCESS or not
            self.crashes.reset(label)
            return event
        # SystemExit: a step calling sys.exit() has failed; it must not stop the executor.
        except (Exception, SystemExit, StepCancelled) as e:
            # A step whose writes the fence refused ran past its lease (pipeline/run/fence.py): lost,
            # like a lease the heartbeat found taken, which it may not have noticed yet.
            if label in self.lost or isinstance(e, LeaseExpired):
                why = "lease expired; writes refused" if label not in self.lost else "lease lost"
                return _Event(label, Ending.LOST, f"{why}; step stopped, result discarded", started=started)
            hang = self.hung.pop(label, None)
            if hang is not None:  # the watchdog stopped it: an infrastructure failure, retried
                e = StepPreempted(f"hung: {hang.message.removeprefix('HUNG: ')}", crash=True)
            kind, status, message, tb = _classify(e)
            loop = self._crash_loop(label, step_dir, token, e) if kind is Ending.PREEMPTED else None
            if loop is not None:
                limit = self.dag.nodes[label].step.resources.crash_limit
                kind, status = Ending.FAILED, Event.FAILED
                message = (
                    f"the same crash {limit} times in a row ({message}; {loop}): a deterministic "
                    "crash, not a lost machine (Resources.crash_limit)"
                )
            elif kind is not Ending.PREEMPTED:
                self.crashes.reset(label)
            # Why, in a word, for the run page's list of attempts.
            cause = "hung" if hang is not None else "crash loop" if loop is not None else _CAUSES[kind]
            self.store.append(
                step_dir,
                self.owner,
                token,
                status,
                message,
                data={"cause": cause, **({"traceback": tb} if tb else {})},
            )
            return _Event(label, kind, message, tb, started=started, ended=self.clock())
        finally:
            self.tokens.pop(label, None)
            self.heartbeat.remove(step_dir)
            # Whatever happened, the lease goes (a no-op if no longer ours).
            if not released:
                self.store.release(step_dir, self.owner, token)

    def _crash_loop(self, label: str, step_dir: str, token: int, error: BaseException) -> str | None:
        """The evidence, if this preempted attempt is the `crash_limit`-th identical crash in a
        row (`pipeline.run.crashes`); None otherwise (a lost host, or not yet the limit)."""
        limit = self.dag.nodes[label].step.resources.crash_limit
        if not (isinstance(error, StepPreempted) and error.crash):
            self.crashes.observe(label, None, limit)
            return None
        signature = crash_signature(str(error), attempt_progress(self.store, step_dir, token))
        if not self.crashes.observe(label, signature, limit):
            return None
        evidence = log_evidence(attempt_log_tail(self.store, step_dir, token))
        return signature + (f"; its log ends: {evidence}" if evidence else "")

    def _write_step_json(
        self, label: str, attempt: int, token: int, started: float
    ) -> tuple[Any, str, str | None]:
        """Record `.step.json` for this attempt; returns the resolved config the function gets,
        the file's content digest, and the digest of the step's input listing (if it has one)."""
        node = self.dag.nodes[label]
        config = resolved_config(self.dag, label)
        info = step_info(self.dag, label, config)
        info.update(self.options.run_info)
        summary = step_summary(node.step.fn, config)
        if summary:
            info["summary"] = summary
        # Taken before the step reads them: the record of what this attempt was given. A listing
        # that cannot be read fails the attempt with the hook's error.
        listing = input_listing(self.dag, label, config)
        inputs = None
        if listing is not None:
            info["inputs"] = listing
            inputs = listing_digest(listing)
        info.update(run_id=self.owner.run_id, attempt=attempt, token=token, started=started)
        return config, self.store.write_step_json(node.output_path, info), inputs

    def _run_task(self, label: str, attempt: int, token: int, config: Any) -> None:
        """Hand the attempt to the backend and wait for it."""
        node = self.dag.nodes[label]
        step_dir = node.output_path
        self.backend.run(
            StepTask(
                label,
                node.name,
                node.step.fn,
                config,
                node.step.resources,
                step_dir,
                attempt=attempt,
                token=token,
                run_id=self.owner.run_id,
                followed=label in self.followed,
                lease_remaining=lambda: self.heartbeat.valid_until(step_dir) - self.clock(),
                lease_poll=_lease_poll(self.options),
            )
        )

    def _on_hang(self, label: str, hang: Hang) -> None:
        """The watchdog found the attempt of `label` hung: say so in `.status`, then stop it (the
        attempt then ends as a preemption, `_try`)."""
        held = {entry[0]: (step_dir, entry[1]) for step_dir, entry in self.heartbeat.held().items()}
        if label not in held:
            return  # it ended meanwhile
        step_dir, token = held[label]
        self.hung[label] = hang
        try:
            self.store.note(step_dir, self.owner.run_id, token, Event.WARNING, hang.message, hang.data)
        except Exception as e:  # the note is evidence; stopping the attempt matters more
            logger.warning("could not record the hang of %s: %s", label, e)
        self.report(label, "HUNG", hang.message)
        self._alert("hung", label, hang.message.removeprefix("HUNG: ") + "; retrying from its checkpoint")
        self.backend.cancel(label)

    def _on_report(self, label: str, report: Mapping[str, Any]) -> None:
        """A watched step's new progress report: tell people of what it asks to be told of.

        A step lists such things in its report's `alerts`, `{kind: {"count": n, "message": ...}}`
        (a training's rewinds, its eval loss leaving the predicted interval); each is sent once
        per new count."""
        data = report.get("data")
        alerts = data.get("alerts") if isinstance(data, Mapping) else None
        if not isinstance(alerts, Mapping):
            return
        for kind, entry in alerts.items():
            count = entry.get("count") if isinstance(entry, Mapping) else None
            if type(count) is not int or not isinstance(kind, str):
                continue
            seen = self.alerted.setdefault(label, {})
            if count > seen.get(kind, 0):
                seen[kind] = count
                message = entry.get("message")
                self._alert(kind, label, f"{message if isinstance(message, str) else kind}: see its .status")

    def _run_and_commit(self, label: str, attempt: int, token: int, started: float) -> _Event:
        """Run the step function through the backend, check it wrote output, commit SUCCESS."""
        node = self.dag.nodes[label]
        step_dir = node.output_path
        config, step_json, inputs = self._write_step_json(label, attempt, token, started)
        self.report(label, "RUNNING", f"attempt {attempt}" if attempt > 1 else "")
        pace = hooks_of(node.step.fn).watchdog
        if pace is not None:
            self.watchdog.watch(label, step_dir, token, pace, node.step.resources.hang_timeout)
        try:
            self._run_task(label, attempt, token, config)
        finally:
            self.watchdog.finish(label)
        if label in self.lost:
            raise StepCancelled(label)
        if not self.store.has_payload(step_dir):
            raise RuntimeError(
                f"step function {fn_import_path(node.step.fn)} returned without writing anything "
                f"under its output directory {step_dir}"
            )
        ended = self.clock()
        # The digests let a later plan skip reading and diffing `.step.json` (pipeline.core.drift).
        drift = drift_digest_of(self.dag, label)
        data: dict[str, Any] = {"duration": ended - started, "drift": drift, "step_json": step_json}
        if inputs is not None:
            data["inputs"] = inputs  # a later plan lists the inputs again and compares
        hooks = hooks_of(node.step.fn)
        report = _recordable(call_hook(hooks.report, config, "no report"))
        if report is not None:
            data["report"] = report  # shown by the dashboard, which does not import step code
        metrics = _recordable(call_hook(hooks.metrics, config, "no metrics"))
        if isinstance(metrics, Mapping):
            data["metrics"] = dict(metrics)  # compared across runs (pipeline.observe.compare)
        if not self.store.commit(step_dir, self.owner, token, data=data):
            return _Event(label, Ending.LOST, "lease lost before commit; result discarded", started=started)
        return _Event(label, Ending.SUCCEEDED, started=started, ended=ended, metrics=data.get("metrics"))


def _lease_poll(options: ExecutionOptions) -> float:
    """How often a step in another process re-reads its lease to fence its writes: often enough
    that it sees each renewal before the expiry it last read, i.e. poll + heartbeat < timeout."""
    margin = options.lease_timeout - options.heartbeat_interval
    return max(0.05, min(options.lease_timeout / 4, margin / 2))


def _recordable(value: Any) -> Any:
    """`value` if it can be written into `.status` as JSON, else None."""
    if value is None:
        return None
    try:
        json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return value


def _format_traceback(error: BaseException) -> str:
    """The traceback of `error`, or its repr if formatting fails too (e.g. a broken `linecache`)."""
    try:
        return "".join(traceback.format_exception(error))
    except BaseException:
        return repr(error)


_CAUSES = {Ending.PREEMPTED: "lost machine", Ending.FAILED: "error", Ending.CANCELLED: "interrupted"}


def _classify(error: BaseException) -> tuple[Ending, str, str, str | None]:
    """(event kind, status event, message, traceback) for an attempt that ended in `error`."""
    if isinstance(error, StepCancelled):
        return Ending.CANCELLED, Event.CANCELLED, "interrupted", None
    if isinstance(error, StepPreempted):
        return Ending.PREEMPTED, Event.PREEMPTED, str(error), None
    if isinstance(error, StepFailed):
        return Ending.FAILED, Event.FAILED, str(error), error.remote_traceback
    return Ending.FAILED, Event.FAILED, f"{type(error).__name__}: {error}", _format_traceback(error)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}s"
