"""Running an experiment from code: plan its steps against the prefix, then execute the plan.

    report = run_experiment(steps, ExecutorMainConfig(prefix="/tmp/p", backend="local"))

`prepare` builds the DAG, reads the prefix and plans (writing nothing); `run_experiment` also
executes the plan on a backend and writes the run manifest at the start and the end of the run.
Neither prints results nor exits: that is `executor_main`'s job (`pipeline.cli.run`), the entry
point an experiment file calls.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from pipeline.core.collector import collector_paused
from pipeline.core.dag import Dag, build_dag
from pipeline.core.plan import Plan, State, make_plan
from pipeline.core.prices import price_table
from pipeline.core.records import Event, StepRecord
from pipeline.core.report import RunReport
from pipeline.errors import StorageError
from pipeline.processes import current_owner, host_id, pid_alive
from pipeline.run.backends import check_declared, make_backend
from pipeline.run.console.alerts import AlertLog, Notifier
from pipeline.run.console.console import RunConsole
from pipeline.run.options import ExecutorMainConfig, notify_url, resolve_prefix, validate_options
from pipeline.run.records.hooks import step_compilations, step_warnings
from pipeline.run.records.listing import input_notes
from pipeline.run.records.manifest_builder import ManifestBuilder
from pipeline.run.records.provenance import drift_digest_of, environment_info, step_info
from pipeline.run.scheduler.budget import Budget, BudgetWatch, check_plan
from pipeline.run.scheduler.executor import ExecutionOptions, Reporter, execute
from pipeline.step import Step
from pipeline.storage.layout import alerts_path
from pipeline.storage.manifests import experiment_name, manifest_path, run_record_path
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore

__all__ = ["prepare", "run_experiment", "stderr_line"]

logger = logging.getLogger("drydock")


def prepare(
    steps: Sequence[Step], config: ExecutorMainConfig, *, strict: bool = True
) -> tuple[Dag, StepStore, Plan]:
    """Build the DAG, read the prefix, and plan. Reads storage, writes nothing."""
    dag, store, plan, _digests = _prepare(steps, config, strict=strict)
    return dag, store, plan


def _prepare(
    steps: Sequence[Step], config: ExecutorMainConfig, *, strict: bool = True
) -> tuple[Dag, StepStore, Plan, dict[str, str]]:
    """`prepare`, and the drift digests of the finished steps whose config and code are unchanged
    (`unchanged_steps`)."""
    validate_options(config)
    prefix = resolve_prefix(config.prefix)
    with collector_paused():
        dag = build_dag(list(steps), prefix)
        store = StepStore(open_storage(prefix))
        snapshot = store.records((node.output_path for node in dag.nodes.values()), with_metadata=False)
        unchanged = unchanged_steps(dag, store, snapshot)
        listings = input_notes(dag, store, snapshot)
        plan = make_plan(
            dag,
            snapshot,
            now=time.time(),
            local_host=host_id(),
            alive=pid_alive,
            only=config.only,
            force=config.force,
            current_info=lambda label: step_info(dag, label),
            strict=strict,
            unchanged=unchanged,
            input_notes=listings,
        )
    return dag, store, plan, unchanged


def unchanged_steps(dag: Dag, store: StepStore, snapshot: dict[str, StepRecord]) -> dict[str, str]:
    """The finished steps whose recorded config and code equal the current ones: label -> their
    drift digest (`pipeline.run.records.provenance.drift_digest_of`).

    Their SUCCESS carries a digest of both (`pipeline.core.drift.drift_digest`); when the current
    digest matches, the plan needs no drift notes and `.step.json` is not read at all: one read
    per cached step (its `.status`). SUCCESS, written under the lease by the attempt that ran,
    is the record of what ran; `.step.json` is its readable copy, so a copy edited by hand changes
    no plan (`drydock explain` says so). Every other finished step gets its `.step.json` read into
    the snapshot, for the notes.
    """
    unchanged: dict[str, str] = {}
    for label, node in dag.nodes.items():
        record = snapshot.get(node.output_path)
        last = record.last if record is not None else None
        if last is None or last.event != Event.SUCCESS:
            continue
        recorded = last.data
        digest = drift_digest_of(dag, label)
        # `type is dict` first: what the status parser makes, and cheaper than isinstance(Mapping).
        if (type(recorded) is dict or isinstance(recorded, Mapping)) and recorded.get("drift") == digest:
            unchanged[label] = digest
        else:
            path = node.output_path
            snapshot[path] = replace(snapshot[path], step_json=store.read_step_json(path))
    return unchanged


def run_experiment(
    steps: Sequence[Step],
    config: ExecutorMainConfig | None = None,
    *,
    description: str = "",
    source_file: str | None = None,
    emit: Callable[[str], None] | None = None,
) -> Plan | RunReport:
    """Plan `steps` and, unless `dry_run`, run them. Returns the plan (dry run) or the report.

    Raises `DrydockError` for a malformed experiment, options or prefix, before anything is written.
    `emit` receives one line per state change (default: stderr, with the time).
    """
    config = config or ExecutorMainConfig()
    dag, store, plan, digests = _prepare(steps, config)
    budget = Budget(config.budget_device_hours, config.budget_dollars)
    prices = price_table() if budget.is_set else {}
    # Refused before anything runs; what the steps spent so far is where the run's watch starts.
    spent_before = check_plan(budget, plan, store, time.time(), prices)
    if config.dry_run:
        check_declared(config.backend, plan)  # what `run` would refuse, `plan` refuses too
        return plan
    if config.compile:
        # Compile before anything is reserved: a program that cannot fit its devices stops the
        # run here, as a malformed declaration would (StepDeclarationError).
        step_compilations(plan, config.only, states=(State.RUN,))
    # A fully cached plan runs nothing: do not start Ray (seconds) just to find that out.
    needs_backend = bool(plan.in_state(State.RUN, State.WAIT))
    backend = make_backend(config.backend if needs_backend else "local", config)
    try:
        warnings = [*step_warnings(plan), *backend.validate(plan)]
        store.storage.check_writable(dag.prefix)
    except BaseException:
        backend.close()
        raise
    owner = current_owner()
    name = experiment_name(config.experiment, source_file)
    env = environment_info(source_file)
    started = time.time()
    path = manifest_path(dag.prefix, dag.nodes, name)
    # The manifest is the latest run of this DAG; each run also keeps a record of its own.
    history = run_record_path(path, owner.run_id)
    with collector_paused():  # as in planning: many small, acyclic objects
        runner = {"host": owner.host, "pid": owner.pid, "pid_start": owner.pid_start}
        manifest = ManifestBuilder(
            plan,
            name,
            description,
            owner.run_id,
            env,
            started=started,
            source_file=source_file,
            runner=runner,
            drift=digests,
        )
        if needs_backend:  # a run in progress is visible from its manifest; a cached one ends now
            first = manifest.encode()
            store.storage.write(path, first)
            store.storage.write(history, first)
    url = notify_url(config)
    alerts = None
    if url is not None and needs_backend:
        log = AlertLog(store.storage, alerts_path(dag.prefix, owner.run_id))
        alerts = Notifier(url, name, owner.run_id, record=log.add)
    options = ExecutionOptions(
        max_concurrent=config.max_concurrent or backend.default_concurrency(),
        lease_timeout=config.lease_timeout,
        heartbeat_interval=config.heartbeat_interval,
        wait_poll_interval=config.wait_poll_interval,
        clock_skew=config.clock_skew,
        run_info={"experiment": name, "manifest": path, **env},
        alerts=alerts,
    )
    # The DAG, the plan and the manifest live as long as the run: the collector need not scan
    # them again and again while steps run (for 10,000 steps each full pass costs 0.2 s).
    gc.freeze()
    report: RunReport | None = None
    try:
        # Progress lines are INFO: a run with --log_level WARNING (or quieter) prints none.
        quiet = logging.getLevelName(config.log_level.upper()) > logging.INFO
        active = plan.in_state(State.RUN, State.WAIT)
        console = None
        if emit is None and not quiet and needs_backend:
            paths = {label: dag.nodes[label].output_path for label in active}
            console = RunConsole(store.storage, paths, owner.run_id)
            emit = console.line
        emit = emit or (_silent if quiet else stderr_line)
        if needs_backend:  # where steps run; from now on a second terminal can follow the run
            emit(backend.describe())
            emit(f"manifest {path}; follow it with: drydock status {path} --watch")
            for warning in warnings:
                emit(f"warning: {warning}")
        reporter = Reporter(emit, total=len(active), observe=console.state if console else None)
        watch = BudgetWatch(budget, plan, store, spent_before, prices) if budget.is_set else None
        with console or contextlib.nullcontext():
            report = execute(plan, store, backend, owner, options, reporter, budget=watch)
    finally:
        backend.close()
        gc.unfreeze()
        if alerts is not None:
            # The run's end is always sent, with what the rate limit held back; then wait a
            # little for the last messages to go out (never for a webhook that is down).
            if report is None:
                alerts.alert("interrupted", None, "the run stopped before it finished", force=True)
            else:
                alerts.alert("finished", None, report_counts(report), force=True)
            alerts.close(timeout=30.0)
    assert report is not None  # execute returned (an exception would have left by now)
    with collector_paused():
        # A run that ran nothing may copy the steps of the manifest it replaces (when they are
        # what it would encode: `ManifestBuilder.encode`); one that ran steps has new outcomes.
        previous = None if needs_backend else functools.partial(_read_quietly, store, path)
        final = manifest.encode(report, last=True, previous=previous)
        try:
            store.storage.write(path, final)
            if needs_backend:  # a run that found everything cached adds nothing to the history
                store.storage.write(history, final)
        except StorageError as e:  # a full disk, say: the steps' outcomes stand, the record does not
            report = replace(report, manifest_error=f"could not write the run manifest {path}: {e}")
    logger.debug("manifest: %s", path)  # the end-of-run summary prints it
    return report


def _read_quietly(store: StepStore, path: str) -> bytes | None:
    """A file's bytes, or None if it is missing or cannot be read (the caller can do without)."""
    try:
        return store.storage.read(path)
    except StorageError:
        return None


def report_counts(report: RunReport) -> str:
    """`4 succeeded, 1 failed, 2 blocked (exit 1)`: a run's outcome in one line, for its alert."""
    counts: dict[str, int] = {}
    for outcome in report.outcomes.values():
        counts[outcome.state.value.lower()] = counts.get(outcome.state.value.lower(), 0) + 1
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"{parts} (exit {report.exit_code})"


def _silent(line: str) -> None:
    """Drops a progress line."""


def stderr_line(line: str) -> None:
    """A progress line on stderr, with the time."""
    print(time.strftime("%H:%M:%S ") + line, file=sys.stderr, flush=True)
