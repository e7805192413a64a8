"""`drydock run|plan|rerun` and `executor_main`, the entry point an experiment file calls.

    if __name__ == "__main__":
        executor_main([train, evaluate], description="...")

parses the options (`pipeline.run.options`) from the command line with draccus (`--prefix`,
`--dry_run`, ...), plans the DAG against the prefix, runs what is not done
(`pipeline.run.experiment`), prints the outcome and exits with the run's status. Run from a
`drydock` command, the call goes to that command instead (`pipeline.cli.loading`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pipeline.cli.common import output_may_close, quiet_broken_pipe
from pipeline.cli.loading import ExperimentCall, current_handler, run_file, split_remaps, split_source
from pipeline.core.plan import Plan, State
from pipeline.core.prices import price_table
from pipeline.core.report import RunReport
from pipeline.errors import DrydockError
from pipeline.observe.explain import plan_explanations
from pipeline.observe.render import format_preview, plan_table, print_table, run_summary
from pipeline.run.backends.ray_resources import follower_shortfalls
from pipeline.run.experiment import run_experiment
from pipeline.run.in_step.step_logs import QuietConsole
from pipeline.run.options import parse_options, validate_options
from pipeline.run.records.hooks import step_compilations, step_previews, step_reports, step_warnings
from pipeline.run.scheduler.budget import estimate_text
from pipeline.step import Step
from pipeline.storage.layout import LOGS_DIR, log_token
from pipeline.storage.manifests import experiment_name, is_manifest, manifest_path
from pipeline.storage.opening import open_storage

__all__ = ["executor_main", "plan_command", "rerun_command", "run_command"]


def executor_main(
    steps: Sequence[Step],
    description: str = "",
    *,
    argv: Sequence[str] | None = None,
    source_file: str | None = None,
    notify: str | None = None,
) -> None:
    """Plan and run `steps` with options from the command line, then exit with the run's status.

    `source_file` is the experiment file recorded in the manifest (default: the `__main__` file).
    `notify` is the experiment's webhook for alerts, unless `--notify` names another (read it from
    the environment: a webhook URL is a secret that does not belong in an experiment file).

    Exit codes: 0 all done, 1 a step failed (or was blocked), 2 a malformed experiment or
    option (one sentence on stderr, nothing written), 3 stopped by its budget (the steps that
    could stop saved their work), 130 interrupted.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if source_file is None:
        source_file = getattr(sys.modules.get("__main__"), "__file__", None)
    handler = current_handler() or _run_and_print
    try:
        config = parse_options(args)
        if notify and not config.notify:
            config = dataclasses.replace(config, notify=notify)
        validate_options(config)
        _console_logging(config.log_level.upper())
        with _sigterm_as_interrupt():
            call = ExperimentCall(list(steps), description, config, source_file)
            code = quiet_broken_pipe(lambda: handler(call))
    except DrydockError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


def run_command(args: Sequence[str]) -> int:
    """`drydock run FILE|MANIFEST [options]`: the same as `python FILE [options]`."""
    return _run_target("run", args, [])


def plan_command(args: Sequence[str]) -> int:
    """`drydock plan FILE|MANIFEST [options]`: the plan, nothing run (`--dry_run`)."""
    return _run_target("plan", args, ["--dry_run", "true"])


def rerun_command(args: Sequence[str]) -> int:
    """`drydock rerun MANIFEST [options]`: rebuild the DAG a manifest records and run it."""
    if not args or args[0].startswith("-"):
        print("error: `drydock rerun` needs a run manifest: drydock rerun MANIFEST", file=sys.stderr)
        return 2
    return run_manifest(args[0], args[1:])


def _run_target(command: str, args: Sequence[str], extra: list[str]) -> int:
    if not args or args[0].startswith("-"):
        print(f"error: `drydock {command}` needs an experiment file: drydock {command} FILE", file=sys.stderr)
        return 2
    path, options = args[0], [*args[1:], *extra]
    if is_manifest(path):
        return run_manifest(path, options)
    if not os.path.isfile(path):
        print(f"error: experiment file {path!r} does not exist", file=sys.stderr)
        return 2
    return run_file(path, options, _run_and_print)


def run_manifest(location: str, options: Sequence[str]) -> int:
    """Rebuild the DAG recorded in the manifest at `location` and run (or plan) it."""
    from pipeline.run.records.recipe import rebuild_recipe, recipe_code, remap_recipe, rerun_argv
    from pipeline.storage.manifests import load_manifest

    try:
        source, options = split_source(options)
        remaps, options = split_remaps(options)
        manifest = load_manifest(location)
        if remaps:
            manifest = remap_recipe(manifest, remaps)
        if "--dry_run" in options or any(o.startswith("--dry_run=") for o in options):
            # A recipe may be someone else's: the plan shows the code it would run, first.
            print("code this recipe runs:", file=sys.stderr)
            for ref, names in recipe_code(manifest).items():
                print(f"  {ref}  ({', '.join(names)})", file=sys.stderr)
        roots = rebuild_recipe(manifest, location, source)
    except DrydockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        executor_main(
            roots,
            manifest.get("description") or "",
            argv=rerun_argv(manifest, options),
            source_file=manifest.get("source_file"),
        )
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _console_logging(level: str) -> None:
    """Drydock's messages on stderr at `level`; what steps running in this process's threads
    log goes to their attempt logs instead (`--verbose` streams it here too)."""
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not any(
            isinstance(f, QuietConsole) for f in handler.filters
        ):
            handler.addFilter(QuietConsole())


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


def _run_and_print(call: ExperimentCall) -> int:
    """Run the experiment, then print its outcome: a table on stderr, reports and outputs on stdout."""
    steps, config, description, source_file = call.steps, call.config, call.description, call.source_file
    # Ctrl-C also ends a `| tee`: the run still cancels, closes its record, says what it can and
    # exits with its own code (130), whether or not its output still has a reader.
    with output_may_close():
        if config.json:
            with _stdout_to_stderr():
                result = run_experiment(steps, config, description=description, source_file=source_file)
        else:
            result = run_experiment(steps, config, description=description, source_file=source_file)
        if not isinstance(result, Plan):
            return _print_run(result, config, source_file)
    return _print_plan(result, config)


def _print_plan(result: Plan, config: Any) -> int:
    """Print a plan: the table (or JSON) on stdout, previews, and its warnings on stderr."""
    previews = step_previews(result)
    if config.compile:  # a program that cannot fit is a StepDeclarationError: one line, exit 2
        for label, figures in step_compilations(result, config.only).items():
            preview = previews.get(label)
            base = (
                dict(preview) if isinstance(preview, Mapping) else ({"preview": preview} if preview else {})
            )
            previews[label] = {**base, **figures}
    prices = price_table()
    for label in result.in_state(State.RUN, State.WAIT):
        text = estimate_text(result, label, prices)
        if text is not None:  # the device time the step will hold, for budgets
            preview = previews.get(label)
            base = (
                dict(preview) if isinstance(preview, Mapping) else ({"preview": preview} if preview else {})
            )
            previews[label] = {**base, "device time": text}
    explanations = plan_explanations(result, open_storage(result.dag.prefix))
    warnings = _plan_warnings(result, config)
    if config.json:
        out = result.to_json(dry_run=True)
        if warnings:
            out["warnings"] = warnings
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
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
    return 0


def _print_run(result: RunReport, config: Any, source_file: str | None) -> int:
    """Print a run's outcome: a table on stderr, reports and outputs on stdout; its exit code."""
    reports = step_reports(result)
    dag = result.plan.dag
    manifest = manifest_path(dag.prefix, dag.nodes, experiment_name(config.experiment, source_file))
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
        _print_failures(result)
        _print_results(result, reports, None if result.manifest_error else manifest, source_file)
    failed = [dag.nodes[label].name for label in result.labels(State.FAILED, State.BLOCKED, State.CANCELLED)]
    if result.budget_spent is not None:
        print(
            f"stopped: {result.budget_spent}; {len(failed)} step(s) not finished ({', '.join(failed)}). "
            "Raise the budget and run again: a stopped training resumes from its checkpoint",
            file=sys.stderr,
        )
    elif failed:
        print(f"error: {len(failed)} step(s) did not finish: {', '.join(failed)}", file=sys.stderr)
    if result.manifest_error:
        print(f"error: {result.manifest_error} (what the steps committed stays committed)", file=sys.stderr)
    return result.exit_code


def _plan_warnings(plan: Plan, config: Any) -> list[str]:
    """What a plan can tell before a backend starts: on the default private Ray instance (whose
    CPUs are this machine's, or --ray.num_cpus), followers that cannot run beside what they follow.
    A cluster's resources are known only when the run connects to it (the run warns then)."""
    said = step_warnings(plan)
    if config.backend != "ray" or config.ray.address:
        return said
    return [*said, *follower_shortfalls(plan, {"CPU": float(config.ray.num_cpus or os.cpu_count() or 1)})]


def _print_results(
    result: RunReport, reports: Mapping[str, Any], manifest: str | None, source_file: str | None = None
) -> None:
    """The end of a run for a human: what each step reports, and how to rerun it.

    A report's paths inside the step's own directory are left out here (the dashboard, `drydock
    status` and `--json` have them): the directory is the step's label under the prefix.
    """
    dag = result.plan.dag
    first = True
    for label, report in reports.items():
        shown = _without_own_paths(report, dag.nodes[label].output_path)
        if shown:
            print(("\n" if first else "") + f"{label}:\n{format_preview(shown)}")
            first = False
    if manifest is None:  # it could not be written
        print(f"{'' if first else chr(10)}outputs under {dag.prefix}/")
        return
    rerun = f"drydock rerun {manifest}"
    if source_file and _runs_file_code(manifest):  # its code is in the experiment file: name it
        rerun += f" --source {os.path.abspath(source_file)}"
    print(f"{'' if first else chr(10)}outputs under {dag.prefix}/; rerun anywhere: {rerun}")


def _runs_file_code(manifest: str) -> bool:
    """Whether the manifest's recipe has functions defined in the (unimportable) experiment file."""
    from pipeline.run.records.recipe import MAIN_MODULE, recipe_code
    from pipeline.storage.manifests import load_manifest

    try:
        return any(ref.startswith(f"{MAIN_MODULE}:") for ref in recipe_code(load_manifest(manifest)))
    except DrydockError:
        return False


def _without_own_paths(report: Any, output: str) -> Any:
    """`report` without the entries whose value is a path in `output` (a step's directory)."""
    if not isinstance(report, Mapping):
        return report
    own = output.rstrip("/") + "/"
    return {k: v for k, v in report.items() if not (isinstance(v, str) and v.startswith(own))}


def latest_log(storage: Any, output: str) -> str | None:
    """The log of the step's latest attempt (the highest token in `.logs/`), or None."""
    directory = f"{output.rstrip('/')}/{LOGS_DIR}"
    names = [n for n in storage.listdir(directory) if n.endswith(".log") and log_token(n) is not None]
    if not names:
        return None
    return f"{directory}/{max(names, key=lambda n: (log_token(n), n))}"


FAILURE_LINES = 20
"""Lines of a failed step's log shown on the console."""


def _print_failures(result: RunReport, lines: int = FAILURE_LINES) -> None:
    """For each failed step: the last `lines` lines of its latest attempt's log, and where it is."""
    dag = result.plan.dag
    storage = open_storage(dag.prefix)
    for label in result.labels(State.FAILED):
        path = latest_log(storage, dag.nodes[label].output_path)
        if path is None:
            continue
        data = storage.read(path) or b""
        tail = data.decode("utf-8", "replace").rstrip("\n").splitlines()[-lines:]
        if tail:
            print(f"\n{label}: the last {len(tail)} lines of {path}", file=sys.stderr)
            for line in tail:
                print(f"  {line}", file=sys.stderr)
