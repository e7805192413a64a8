"""`executor_main`: the entry point an experiment file calls, and its options.

    if __name__ == "__main__":
        executor_main([train, evaluate], description="...")

parses the options below from the command line with draccus (`--prefix`, `--dry_run`, ...),
plans the DAG against the prefix, and runs what is not done. `run_experiment` is the same
without the command line and without exiting, for tests and other tools.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pipeline.backends.base import Backend
from pipeline.dag import Dag, build_dag
from pipeline.errors import DrydockError, StepDeclarationError
from pipeline.executor import ExecutionOptions, Reporter, RunReport, execute
from pipeline.lease import Owner
from pipeline.manifest import build_manifest, experiment_name, manifest_path
from pipeline.metadata import environment_info, step_info
from pipeline.plan import Plan, State, make_plan
from pipeline.preview import format_preview, step_previews, step_reports
from pipeline.recipe import recipe_entries
from pipeline.step import Step
from pipeline.storage import StepStore, normalize_prefix, open_storage

__all__ = ["ExecutorMainConfig", "executor_main", "run_experiment"]

logger = logging.getLogger("drydock")

DEFAULT_PREFIX = "./drydock-runs"
BACKENDS = ("ray", "local")


@dataclass(frozen=True)
class ExecutorMainConfig:
    """Options of `executor_main` and of `drydock run|plan|status`."""

    prefix: str | None = None
    """Storage prefix for step outputs (local path, memory://, gs://, s3://...).
    Default: $DRYDOCK_PREFIX, else ./drydock-runs."""
    backend: str = "ray"
    """Where step functions run: ray (a local Ray instance, or the cluster at --ray_address)
    or local (threads of this process)."""
    ray_address: str | None = None
    """Ray cluster to join (default: $RAY_ADDRESS, else start a local instance for the run)."""
    dry_run: bool = False
    """Print the plan and exit without running anything."""
    json: bool = False
    """Print the plan (or the run's outcome) as JSON on stdout; logs go to stderr."""
    only: str | None = None
    """Regex on step names: run only matching steps and what they need."""
    force: str | None = None
    """Regex on step names: rerun matching steps even if they are cached."""
    max_concurrent: int | None = None
    """Most steps running at once (default: the backend's choice)."""
    lease_timeout: float = 90.0
    """Seconds without a heartbeat after which another runner may take a step over."""
    heartbeat_interval: float = 30.0
    """Seconds between lease renewals."""
    wait_poll_interval: float = 2.0
    """Seconds between checks of steps that another runner is running."""
    experiment: str | None = None
    """Experiment name for the manifest (default: the experiment file's name)."""
    log_level: str = "INFO"
    """Logging level of Drydock's own messages on stderr: DEBUG, INFO, WARNING, ERROR or CRITICAL."""


def _resolve_prefix(prefix: str | None) -> str:
    return normalize_prefix(prefix or os.environ.get("DRYDOCK_PREFIX") or DEFAULT_PREFIX)


def _validate_options(config: ExecutorMainConfig) -> None:
    if config.backend not in BACKENDS:
        raise StepDeclarationError(
            None,
            f"unknown backend {config.backend!r}; choose one of {', '.join(BACKENDS)}",
            field="--backend",
        )
    if config.max_concurrent is not None and config.max_concurrent < 1:
        raise StepDeclarationError(None, "must be at least 1", field="--max_concurrent")
    if config.lease_timeout <= 0 or config.heartbeat_interval <= 0:
        raise StepDeclarationError(None, "must be positive", field="--lease_timeout/--heartbeat_interval")
    if config.wait_poll_interval <= 0:
        raise StepDeclarationError(None, "must be positive", field="--wait_poll_interval")
    if logging.getLevelName(config.log_level.upper()) not in (10, 20, 30, 40, 50):
        raise StepDeclarationError(
            None,
            f"unknown log level {config.log_level!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL",
            field="--log_level",
        )
    if config.heartbeat_interval >= config.lease_timeout:
        raise StepDeclarationError(
            None,
            f"heartbeat interval {config.heartbeat_interval}s must be shorter than the lease timeout "
            f"{config.lease_timeout}s, or leases expire between heartbeats",
            field="--heartbeat_interval",
        )


def _make_backend(config: ExecutorMainConfig) -> Backend:
    # Imported here: a backend may import heavy libraries (Ray) that planning must not load.
    if config.backend == "ray":
        from pipeline.backends.ray import RayBackend

        return RayBackend(address=config.ray_address)
    from pipeline.backends.local import LocalBackend

    return LocalBackend()


@contextmanager
def _gc_paused() -> Any:
    """Pause the cyclic garbage collector. Planning and manifests allocate many small, acyclic
    objects: from 10,000 steps up the collector would take a third of the time, finding nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def prepare(
    steps: Sequence[Step], config: ExecutorMainConfig, *, strict: bool = True
) -> tuple[Dag, StepStore, Plan]:
    """Build the DAG, read the prefix, and plan. Reads storage, writes nothing."""
    _validate_options(config)
    prefix = _resolve_prefix(config.prefix)
    with _gc_paused():
        dag = build_dag(list(steps), prefix)
        store = StepStore(open_storage(prefix))
        snapshot = store.records(node.output_path for node in dag.nodes.values())
        plan = make_plan(
            dag,
            snapshot,
            now=time.time(),
            local_host=Owner.current().host,
            only=config.only,
            force=config.force,
            current_info=lambda label: step_info(dag, label),
            strict=strict,
        )
    return dag, store, plan


def run_experiment(
    steps: Sequence[Step],
    config: ExecutorMainConfig = ExecutorMainConfig(),
    *,
    description: str = "",
    source_file: str | None = None,
) -> Plan | RunReport:
    """Plan `steps` and, unless `dry_run`, run them. Returns the plan (dry run) or the report.

    Raises `DrydockError` for a malformed experiment, options or prefix, before anything is written.
    """
    dag, store, plan = prepare(steps, config)
    if config.dry_run:
        return plan
    # A fully cached plan runs nothing: do not start Ray (seconds) just to find that out.
    needs_backend = bool(plan.in_state(State.RUN, State.WAIT))
    backend = _make_backend(config if needs_backend else ExecutorMainConfig(backend="local"))
    try:
        backend.validate(plan)
        store.storage.check_writable(dag.prefix)
    except BaseException:
        backend.close()
        raise
    owner = Owner.current()
    name = experiment_name(config.experiment, source_file)
    env = environment_info(source_file)
    started = time.time()
    path = manifest_path(dag, name)
    with _gc_paused():  # as in planning: many small, acyclic objects
        recipes = recipe_entries(dag, source_file)
        manifest_args = {"started": started, "source_file": source_file, "recipes": recipes}
        manifest = build_manifest(plan, name, description, owner.run_id, env, **manifest_args)
    store.storage.write(path, manifest)
    options = ExecutionOptions(
        max_concurrent=config.max_concurrent or backend.default_concurrency(),
        lease_timeout=config.lease_timeout,
        heartbeat_interval=config.heartbeat_interval,
        wait_poll_interval=config.wait_poll_interval,
        run_info={"experiment": name, "manifest": path, **env},
    )
    try:
        reporter = Reporter(_stderr_line, total=len(plan.in_state(State.RUN, State.WAIT)))
        report = execute(plan, store, backend, owner, options, reporter)
    finally:
        backend.close()
    with _gc_paused():
        manifest = build_manifest(plan, name, description, owner.run_id, env, report, **manifest_args)
    store.storage.write(path, manifest)
    logger.debug("manifest: %s", path)  # the end-of-run summary prints it
    return report


def _stderr_line(line: str) -> None:
    print(time.strftime("%H:%M:%S ") + line, file=sys.stderr, flush=True)


# -- the command line ---------------------------------------------------------------------------

_BOOL_FLAGS = ("--dry_run", "--json")


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Let boolean flags stand alone (`--dry_run`), as draccus wants `--dry_run true`."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if arg in _BOOL_FLAGS and (nxt is None or nxt.startswith("--")):
            out.append("true")
    return out


def parse_options(argv: Sequence[str]) -> ExecutorMainConfig:
    """Parse executor options; an unknown or malformed flag is a `StepDeclarationError`."""
    import draccus

    try:
        return draccus.parse(ExecutorMainConfig, args=normalize_argv(argv), exit_on_error=False)
    except Exception as e:  # draccus raises its own exception types for parse errors
        # draccus spreads some messages over several lines; the CLI promises one.
        detail = " ".join(str(e).split())
        raise StepDeclarationError(None, f"bad command-line option: {detail}", field="argv") from e


@contextmanager
def _sigterm_as_interrupt() -> Any:
    """Treat SIGTERM (cluster schedulers, `kill`) like Ctrl-C: cancel and release cleanly."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _stdout_to_stderr() -> Any:
    """With --json, stdout carries the JSON and nothing else: whatever steps print, from Python
    or from native code and subprocesses (file descriptor 1), goes to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# Set by the `drydock` CLI. "capture" (`drydock status|dag|explain FILE`): the file's own
# executor_main call runs nothing and hands its steps,
# options and description to `_CAPTURED["handler"]`, whose return value is the exit code. It is
# called while the file is still `__main__`, so functions the file defines stay importable.
_COMMAND_OVERRIDE: dict[str, str] = {}
_CAPTURED: dict[str, Any] = {}


def executor_main(
    steps: Sequence[Step],
    description: str = "",
    *,
    argv: Sequence[str] | None = None,
    source_file: str | None = None,
) -> None:
    """Plan and run `steps` with options from the command line, then exit with the run's status.

    `source_file` is the experiment file recorded in the manifest (default: the `__main__` file).

    Exit codes: 0 all done, 1 a step failed (or was blocked), 2 a malformed experiment or
    option (one sentence on stderr, nothing written), 130 interrupted.
    """
    _COMMAND_OVERRIDE["called"] = "yes"
    args = list(sys.argv[1:] if argv is None else argv)
    if source_file is None:
        source_file = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        config = parse_options(args)
        _validate_options(config)
        logging.basicConfig(
            level=config.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
        )
        if _COMMAND_OVERRIDE.get("command") == "capture":
            code = _CAPTURED["handler"](list(steps), config, description)
        else:
            with _sigterm_as_interrupt():
                code = _run_and_print(steps, config, description, source_file)
    except DrydockError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


def _run_and_print(
    steps: Sequence[Step], config: ExecutorMainConfig, description: str, source_file: str | None
) -> int:
    from pipeline.render import plan_table, print_table, run_summary

    if config.json:
        with _stdout_to_stderr():
            result = run_experiment(steps, config, description=description, source_file=source_file)
    else:
        result = run_experiment(steps, config, description=description, source_file=source_file)
    if isinstance(result, Plan):
        from pipeline.explain import plan_explanations

        previews = step_previews(result)
        explanations = plan_explanations(result, open_storage(result.dag.prefix))
        if config.json:
            out = result.to_json(dry_run=True)
            for entry in out["steps"]:
                if entry["label"] in explanations:
                    entry["explain"] = explanations[entry["label"]]
                preview = previews.get(entry["label"])
                if isinstance(preview, Mapping):
                    entry.update({k: v for k, v in preview.items() if k not in entry})
                elif preview:
                    entry["preview"] = preview
            print(json.dumps(out, indent=2))
        else:
            print_table(plan_table(result, explanations=explanations))
            for label, preview in previews.items():
                print(f"\n{label}:\n{format_preview(preview)}")
        return 0
    reports = step_reports(result)
    manifest = manifest_path(result.plan.dag, experiment_name(config.experiment, source_file))
    if config.json:
        out = result.plan.to_json(dry_run=False, exit_code=result.exit_code, manifest=manifest)
        for entry in out["steps"]:
            outcome = result.outcomes[entry["label"]]
            entry.update(state=outcome.state.value, duration=outcome.duration, error=outcome.error)
            if entry["label"] in reports:
                entry["report"] = reports[entry["label"]]
        print(json.dumps(out, indent=2))
    else:
        print_table(run_summary(result), stderr=True)
        _print_results(result, reports, manifest)
    failed = [
        result.plan.dag.nodes[label].name
        for label in result.labels(State.FAILED, State.BLOCKED, State.CANCELLED)
    ]
    if failed:
        print(f"error: {len(failed)} step(s) did not finish: {', '.join(failed)}", file=sys.stderr)
    return result.exit_code


def _print_results(result: RunReport, reports: Mapping[str, Any], manifest: str) -> None:
    """The end of a run for a human: what each step reports, where its outputs and the manifest are."""
    dag = result.plan.dag
    for label, report in reports.items():
        print(f"\n{label}:\n{format_preview(report)}")
    done = result.labels(State.SUCCEEDED, State.CACHED)
    if done:
        print("\noutputs:")
        width = max(len(dag.nodes[label].name) for label in done)
        for label in done:
            print(f"  {dag.nodes[label].name:<{width}}  {dag.nodes[label].output_path}")
    print(f"\nmanifest: {manifest}\n  rerun it anywhere with: drydock rerun {manifest}")
