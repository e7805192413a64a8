"""Follow a training run checkpoint by checkpoint: evaluate each kept checkpoint once, as it lands.

Used by the `evaluate` and `task_eval` steps with `follow=True`. Each checkpoint's result is written
to `<output>/results/step-N.json` as soon as it is computed, so a restarted follower skips the
checkpoints it has done and evaluates only the rest. After each checkpoint it rewrites
`<output>/curve.json`, the curve so far (`{"ylabel", "steps", "series": {name: [value per step]}}`),
which the dashboard draws on the step's page while the training goes on. The follower ends once
the training's final checkpoint is evaluated.

While no new checkpoint is there it asks the engine for the training step's state
(`pipeline.step_state`): a finished training without its final checkpoint, or one that stays
failed (past `failed_grace_seconds`, which covers the engine's retry) or never runs (past
`patience_seconds`), ends the follower with an error naming the training; rerunning the follower
resumes it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import fsspec

from pipeline import StepDeclarationError
from pipeline.steplib import step_events
from steps.files import read_json, save_figure, write_json
from steps.training.checkpoints import (
    checkpoint_at,
    checkpoint_to_evaluate,
    checkpoints_dir,
    complete_checkpoints,
    kept_steps_of,
)
from steps.training.waiting import FollowSettings, training_waited, wait_for_checkpoint

__all__ = [
    "FollowSettings",
    "check_follow",
    "curve",
    "curve_path",
    "evaluate_checkpoints",
    "follow_checkpoints",
    "plot_curve",
    "read_step_results",
    "step_result_path",
    "wait_for_checkpoint",
]

logger = logging.getLogger(__name__)

_STEP_FILE = re.compile(r"^step-(\d+)\.json$")


def step_result_path(output: str, step: int) -> str:
    """Where a follower keeps the result of the checkpoint of `step`."""
    return f"{output.rstrip('/')}/results/step-{step}.json"


def curve_path(output: str) -> str:
    """Where a follower keeps its curve so far."""
    return f"{output.rstrip('/')}/curve.json"


Series = Callable[[dict[str, Any]], Mapping[str, float | None]]
"""Numbers of one result by name (each task's accuracy, each validation set's loss)."""


def curve(
    done: Mapping[int, dict[str, Any]],
    series: Series,
    ylabel: str,
    errors: Series | None = None,
    levels: Series | None = None,
) -> dict[str, Any]:
    """The curve of `done` results: one series per name `series` gives, one value per step; with
    `errors`, each value's standard error (`errors`: name -> a list like the series), so a chart
    can draw error bars; with `levels`, a reference level per name (chance accuracy) from the
    latest result."""
    steps = sorted(done)
    values = {s: series(done[s]) for s in steps}
    names = list(dict.fromkeys(name for s in steps for name in values[s]))
    out: dict[str, Any] = {
        "ylabel": ylabel,
        "steps": steps,
        "series": {name: [values[s].get(name) for s in steps] for name in names},
    }
    if errors is not None:
        spread = {s: errors(done[s]) for s in steps}
        out["errors"] = {name: [spread[s].get(name) for s in steps] for name in names}
    if levels is not None and steps:
        out["levels"] = {k: v for k, v in levels(done[steps[-1]]).items() if v is not None}
    return out


def read_step_results(output: str) -> dict[int, dict[str, Any]]:
    """The per-checkpoint results a follower has written under `output`, by step."""
    fs, plain = fsspec.core.url_to_fs(f"{output.rstrip('/')}/results")
    fs.invalidate_cache()
    try:
        names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(plain, detail=False)]
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        if (match := _STEP_FILE.match(name)) is not None:
            found[int(match.group(1))] = read_json(step_result_path(output, int(match.group(1))))
    return found


def follow_checkpoints(
    train: str,
    output: str,
    *,
    final_step: int,
    checkpoint_interval: int | None,
    evaluate_one: Callable[[int, str], dict[str, Any]],
    series: Series | None = None,
    ylabel: str = "",
    errors: Series | None = None,
    levels: Series | None = None,
    settings: FollowSettings = FollowSettings(),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, dict[str, Any]]:
    """Evaluate every kept checkpoint of training output `train` with `evaluate_one(step, path)`,
    each once, writing each result to `step_result_path(output, step)`; return all results by
    step once the checkpoint of `final_step` is done. `series(result)` names the numbers of a result
    that `curve.json` plots (`ylabel` says what they are)."""
    done = read_step_results(output)
    if done:
        logger.info("following %s: checkpoints %s already evaluated", train, sorted(done))
    kept = kept_steps_of(final_step, checkpoint_interval)
    # "5/8 checkpoints" in status and on the dashboard: how far the follower is, not just RUNNING.
    wanted = (
        1
        if checkpoint_interval is None
        else final_step // checkpoint_interval + (1 if final_step % checkpoint_interval else 0)
    )
    step_events.progress(len(done), wanted, "checkpoints")
    root = checkpoints_dir(train)
    waiting_since: float | None = None
    finished = False
    while final_step not in done:
        new = {s: p for s, p in complete_checkpoints(root).items() if kept(s) and s not in done}
        for step in sorted(new):
            print(f"evaluating the checkpoint at step {step} ({new[step]})", flush=True)
            result = evaluate_one(step, new[step])
            write_json(step_result_path(output, step), result)
            done[step] = result
            step_events.progress(len(done), wanted, "checkpoints", data={"last": step})
            if series is not None:
                write_json(curve_path(output), curve(done, series, ylabel, errors, levels))
        if new:
            waiting_since = None
            continue
        if finished:
            raise FileNotFoundError(
                f"the training at {train} finished without a checkpoint at its final step {final_step} "
                f"under {root}; evaluated steps {sorted(done)}"
            )
        finished, waiting_since = training_waited(
            train,
            waiting_since,
            settings,
            clock,
            f"its final checkpoint (step {final_step}); evaluated steps {sorted(done)}. Rerun to resume.",
        )
        if not finished:
            sleep(settings.poll_seconds)
    return done


def evaluate_checkpoints(
    config: Any,
    evaluate_one: Callable[[int, str], dict[str, Any]],
    *,
    series: Series,
    ylabel: str,
    levels: Series | None = None,
    errors: Series | None = None,
) -> dict[str, Any]:
    """What an evaluation step (`evaluate`, `task_eval`) does with the checkpoints of its training.

    `config` has `train`, `output`, `checkpoint_step`, `follow`, `final_step`,
    `checkpoint_interval` and `follow_settings`. Following, every kept checkpoint is evaluated as
    it lands and the result of the final one is returned with the whole `curve` (and `curves.png`
    is drawn, with the levels `levels(result)` gives dashed, e.g. chance accuracy); a
    `checkpoint_step` not there yet is waited for the same way; otherwise the checkpoint there is
    evaluated (`checkpoint_step`, else the final one).
    """
    waiting = config.checkpoint_step is not None and (
        checkpoint_at(checkpoints_dir(config.train), config.checkpoint_step) is None
    )
    if not config.follow and not waiting:
        checkpoint, step = checkpoint_to_evaluate(config.train, config.checkpoint_step)
        return evaluate_one(step, checkpoint)
    # Beside the training: each kept checkpoint (or the one asked for) as it lands.
    final = config.final_step if config.checkpoint_step is None else config.checkpoint_step
    done = follow_checkpoints(
        config.train,
        config.output,
        final_step=final,
        checkpoint_interval=config.checkpoint_interval if config.follow else None,
        evaluate_one=evaluate_one,
        series=series,
        ylabel=ylabel,
        errors=errors,
        levels=levels,
        settings=config.follow_settings,
    )
    result = dict(done[final])
    if config.follow:
        result["curve"] = {str(s): dict(series(r)) for s, r in sorted(done.items())}
        dashed = levels(result) if levels is not None else None
        plot_curve(curve(done, series, ylabel), f"{config.output.rstrip('/')}/curves.png", dashed)
    return result


def plot_curve(
    drawn: Mapping[str, Any], png_path: str, dashed: Mapping[str, float | None] | None = None
) -> None:
    """A `curve()` as a PNG: one line per series against the training step; `dashed` draws a
    level per series (a task's chance accuracy) in the series' colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for name, values in drawn["series"].items():
        (line,) = ax.plot(drawn["steps"], values, "o-", label=name, markersize=4)
        level = (dashed or {}).get(name)
        if level is not None:
            ax.axhline(level, linestyle="--", color=line.get_color(), alpha=0.5, linewidth=1)
    ax.set_xlabel("training step")
    ax.set_ylabel(drawn["ylabel"] + (" (dashed: chance)" if dashed and any(dashed.values()) else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png_path)
    plt.close(fig)


# -- declaring a step that evaluates a training ---------------------------------------------------------


def check_follow(name: str, blocking: bool | None, follow: bool, checkpoint_step: int | None) -> bool:
    """Whether step `name` waits for its training (`blocking`, by default: unless it follows).

    A result must say, and be keyed by, the checkpoint it evaluated: a non-blocking evaluation
    (running beside the training) must name its checkpoint or follow them all."""
    blocking = (not follow) if blocking is None else blocking
    if follow and checkpoint_step is not None:
        raise StepDeclarationError(name, "follow evaluates every checkpoint: drop checkpoint_step", "follow")
    if follow and blocking:
        raise StepDeclarationError(name, "follow runs beside the training: drop blocking=True", "blocking")
    if not blocking and not follow and checkpoint_step is None:
        raise StepDeclarationError(
            name,
            "blocking=False evaluates a training that is still going: set follow=True (every "
            "checkpoint) or checkpoint_step=N, so the result says which checkpoint it evaluated",
            "blocking",
        )
    if checkpoint_step is not None and (not isinstance(checkpoint_step, int) or checkpoint_step < 0):
        raise StepDeclarationError(name, f"must be a step number, got {checkpoint_step!r}", "checkpoint_step")
    return blocking
