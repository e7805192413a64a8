"""The worker side of a run (`pipeline.run.scheduler.executor` is the scheduler): one attempt of one step,
in a thread of the run's pool. It takes the step's lease, records `.step.json`, hands the step to
the backend and waits, checks that it wrote output and commits SUCCESS; whatever happens it
returns exactly one `AttemptEvent` for the loop. Beside the attempts in flight run the lease
heartbeat (a lost lease stops its attempt) and the watchdog (a hung attempt is stopped and
retried as a preemption; a report's alerts are sent once per new count).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.dag import fn_import_path, resolved_config
from pipeline.core.lease import CLOCK_SKEW, LeaseRecord, Owner
from pipeline.core.plan import Plan, State
from pipeline.core.records import Event
from pipeline.errors import StepCancelled, StepPreempted
from pipeline.run.backends.base import Backend, StepTask
from pipeline.run.console.alerts import Notifier, report_alerts
from pipeline.run.console.reporter import Reporter
from pipeline.run.in_step.fence import LeaseExpired
from pipeline.run.records.provenance import attempt_info, success_data
from pipeline.run.scheduler.crashes import CrashWatch, crash_loop
from pipeline.run.scheduler.endings import CAUSES, AttemptEvent, Ending, classify, format_traceback
from pipeline.run.scheduler.heartbeat import Heartbeat
from pipeline.run.scheduler.watchdog import Hang, Watchdog
from pipeline.step import hooks_of
from pipeline.storage.step_store import AlreadyDone, Held, StepStore

__all__ = ["Attempts", "ExecutionOptions", "RunContext", "lease_poll"]

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
    """Extra fields for every `.step.json` (experiment, git, versions)."""
    alerts: Notifier | None = None
    """Where to tell people about failures, hangs, rewinds and repeated preemptions (`--notify`)."""


@dataclass(frozen=True)
class RunContext:
    """What the scheduler (`pipeline.run.scheduler.executor`) and the attempts it starts share for one run:
    the plan, where steps are recorded, where they run, who runs them, how, what is said, and the
    clock."""

    plan: Plan
    store: StepStore
    backend: Backend
    owner: Owner
    options: ExecutionOptions
    report: Reporter
    clock: Callable[[], float]


def lease_poll(options: ExecutionOptions) -> float:
    """How often a step in another process re-reads its lease to fence its writes: often enough
    that it sees each renewal before the expiry it last read, i.e. poll + heartbeat < timeout."""
    margin = options.lease_timeout - options.heartbeat_interval
    return max(0.05, min(options.lease_timeout / 4, margin / 2))


class Attempts:
    """Attempts of the steps of one run, and what watches them while they are in flight."""

    def __init__(self, run: RunContext, alert: Callable[[str, str, str], None]) -> None:
        plan, store, owner, options, clock = run.plan, run.store, run.owner, run.options, run.clock
        self.dag = plan.dag
        self.store = store
        self.backend = run.backend
        self.owner = owner
        self.options = options
        self.report = run.report
        self.clock = clock
        self.alert = alert
        self.lost: set[str] = set()
        """Steps whose lease the heartbeat found taken: their attempt's result is discarded."""
        self.stale_leases: dict[str, LeaseRecord] = {}
        """Leases the scheduler watched go stale (`LeaseWatch`): the next attempt takes them over."""
        self.crashes = CrashWatch()
        # With --force, RUNNING may follow the SUCCESS seen at plan time, but not a newer one.
        self.rerun_after = {
            label: len(sp.record.events) if sp.record is not None else 0
            for label, sp in plan.steps.items()
            if sp.state == State.RUN and sp.forced
        }
        self.heartbeat = Heartbeat(
            store, owner, options.lease_timeout, options.heartbeat_interval, self.on_lost, clock
        )
        self.watchdog = Watchdog(store, self.on_hang, on_report=self.on_report, clock=clock)
        self.hung: dict[str, Hang] = {}
        self.alerted: dict[str, dict[str, int]] = {}
        self.checkpoints: dict[str, int] = {}
        """The last checkpoint step a watched step's progress report named (a training's)."""
        self.tokens: dict[str, int] = {}
        """The fencing token of each attempt in flight (its start marker's name)."""
        self.followed = {up for label in plan.in_state(State.RUN) for up in self.dag.nodes[label].soft_deps}
        """Steps that steps of this run follow: they announce their start."""

    def on_lost(self, label: str) -> None:
        """The heartbeat found the lease of `label` taken: stop the attempt, discard its result."""
        self.lost.add(label)
        self.backend.cancel(label)

    def run(self, label: str, attempt: int) -> AttemptEvent:
        """Attempt `label` (its `attempt`-th time in this run): exactly one event, whatever happens."""
        try:
            return self._try(label, attempt)
        except BaseException as e:
            return AttemptEvent(
                label, Ending.FAILED, f"internal error: {type(e).__name__}: {e}", format_traceback(e)
            )

    def _try(self, label: str, attempt: int) -> AttemptEvent:
        step_dir = self.dag.nodes[label].output_path
        forced = label in self.rerun_after
        outside = self.store.storage.resolves_outside(step_dir, self.dag.prefix) if forced else None
        if outside is not None:
            # --force empties the step first: never another prefix's step reached by a link.
            return AttemptEvent(
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
            announces_start=self.backend.queues,
        )
        if isinstance(taken, AlreadyDone):
            return AttemptEvent(label, Ending.DONE_ELSEWHERE)
        if isinstance(taken, Held):
            return AttemptEvent(label, Ending.HELD, f"held by {taken.lease.describe()}")
        token = taken.token
        self.tokens[label] = token
        self.heartbeat.add(step_dir, label, token, since=asked)
        started = self.clock()
        released = False
        try:
            # An adoption stopped while moving its files in left them without committing: they
            # are not this step's output, and an attempt starts from only what it writes.
            removed = self.store.clear_interrupted_adoption(step_dir)
            if removed:
                logger.warning(
                    "%s: removed %d entries an interrupted `drydock adopt` had moved in (%s)",
                    label,
                    len(removed),
                    ", ".join(sorted(removed)[:5]) + (", ..." if len(removed) > 5 else ""),
                )
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
            # A step whose writes the fence refused ran past its lease (pipeline/run/in_step/fence.py): lost,
            # like a lease the heartbeat found taken, which it may not have noticed yet.
            if label in self.lost or isinstance(e, LeaseExpired):
                why = "lease expired; writes refused" if label not in self.lost else "lease lost"
                return AttemptEvent(
                    label, Ending.LOST, f"{why}; step stopped, result discarded", started=started
                )
            hang = self.hung.pop(label, None)
            if hang is not None:  # the watchdog stopped it: an infrastructure failure, retried
                e = StepPreempted(f"hung: {hang.message.removeprefix('HUNG: ')}", crash=True)
            kind, status, message, tb = classify(e)
            limit = self.dag.nodes[label].step.resources.crash_limit
            loop = (
                crash_loop(self.crashes, self.store, label, step_dir, token, e, limit)
                if kind is Ending.PREEMPTED
                else None
            )
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
            cause = "hung" if hang is not None else "crash loop" if loop is not None else CAUSES[kind]
            self.store.append(
                step_dir,
                self.owner,
                token,
                status,
                message,
                data={"cause": cause, **({"traceback": tb} if tb else {})},
            )
            return AttemptEvent(label, kind, message, tb, started=started, ended=self.clock())
        finally:
            self.tokens.pop(label, None)
            self.heartbeat.remove(step_dir)
            # Whatever happened, the lease goes (a no-op if no longer ours).
            if not released:
                self.store.release(step_dir, self.owner, token)

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
                lease_poll=lease_poll(self.options),
            )
        )

    def on_hang(self, label: str, hang: Hang) -> None:
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
        # Only a step that reported a checkpoint has one to resume from; say which, or that it
        # starts over (the engine cannot know more of a step's own state).
        saved = self.checkpoints.get(label)
        retry = f"retrying from its checkpoint at step {saved:,}" if saved is not None else "retrying it"
        self.alert("hung", label, f"{hang.message.removeprefix('HUNG: ')}; {retry}")
        self.backend.cancel(label)

    def on_report(self, label: str, report: Mapping[str, Any]) -> None:
        """A watched step's new progress report: tell people of what it asks to be told of.

        A step lists such things in its report's `alerts`, `{kind: {"count": n, "message": ...}}`
        (a training's rewinds, its eval loss leaving the predicted interval); each is sent once
        per new count."""
        data = report.get("data")
        saved = data.get("checkpoint_step") if isinstance(data, Mapping) else None
        if type(saved) is int and saved >= 0:
            self.checkpoints[label] = saved
        seen = self.alerted.setdefault(label, {})
        for kind, count, message in report_alerts(report):
            if count > seen.get(kind, 0):
                seen[kind] = count
                self.alert(kind, label, f"{message}: see its .status")

    def _run_and_commit(self, label: str, attempt: int, token: int, started: float) -> AttemptEvent:
        """Run the step function through the backend, check it wrote output, commit SUCCESS."""
        node = self.dag.nodes[label]
        step_dir = node.output_path
        config = resolved_config(self.dag, label)
        info, inputs = attempt_info(self.dag, label, config, self.options.run_info)
        info.update(run_id=self.owner.run_id, attempt=attempt, token=token, started=started)
        step_json = self.store.write_step_json(step_dir, info)
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
        data = success_data(self.dag, label, config, ended - started, step_json, inputs)
        if not self.store.commit(step_dir, self.owner, token, data=data):
            return AttemptEvent(
                label, Ending.LOST, "lease lost before commit; result discarded", started=started
            )
        return AttemptEvent(
            label, Ending.SUCCEEDED, started=started, ended=ended, metrics=data.get("metrics")
        )
